// AppliedRulesCache: the rules in the kernel, parsed, per IP family, kept current without reading
// the kernel again (iptables-save takes seconds at 10,000 services): the agent's own writes are
// applied to the cached rules as the proxier reports them (the chains a partial sync wrote, or the
// rules a full sync read back), and a change by anyone else (RulesetChanges) makes the next request
// read the kernel.
import {deflateRawSync, inflateRawSync} from 'node:zlib';
import type {IPFamily} from '../../core/model/index.ts';
import type {ChainsWritten, WrittenRules} from '../sync/types.ts';
import {releaseGarbage} from '../sync/sync-bookkeeping.ts';
import type {ParsedRules} from './rules-backend.ts';
import type {RulesetChanges} from './ruleset-changes.ts';

export interface AppliedRules {
  family: IPFamily;
  /** The rules as the kernel tools print them. */
  readonly text: string;
  rules: ParsedRules;
  /** When the rules were last taken from the kernel, or from one of the agent's own writes (ms). */
  readAt: number;
}

export interface AppliedRulesOptions {
  /** The proxy's tables as the kernel tools print them (iptables-save -t filter + -t nat). */
  read(family: IPFamily): Promise<string>;
  parse(text: string): ParsedRules;
  /**
   * The text parsed rules were read from, when they keep it (iptables' ChainIndexedRuleset does):
   * the cache then keeps no text of its own. Without it the cache keeps the text compressed once
   * the rules are parsed (nftables' JSON listing is large, and only shown).
   */
  textOf?(rules: ParsedRules): string | undefined;
  /** Replaces the written chains in parsed rules (a new value; the old one stays as it was); without it, writes of chains make the next request read the kernel. */
  patch?(rules: ParsedRules, tables: ChainsWritten[]): ParsedRules;
  /** The text of patched rules. */
  format?(rules: ParsedRules): string;
  changes: RulesetChanges;
  now(): number;
  /** Longest wait for the change monitor to report what the kernel committed (default 5 s); past it, the kernel is read. */
  settleWaitMs?: number;
  /** Longest wait for a write in progress to be reported (default 60 s); past it, the kernel is read. */
  writeWaitMs?: number;
}

interface Entry extends AppliedRules {
  /** Changes reported after this time may be missing from the rules. */
  basisAt: number;
  /** The family's write count the rules include. */
  writes: number;
}

interface FamilyWrites {
  /** Writes started. */
  count: number;
  /** Set while a write runs: resolves when it is reported. */
  running?: {done: Promise<void>; finish(): void};
}

export class AppliedRulesCache {
  readonly #options: AppliedRulesOptions;
  readonly #current = new Map<IPFamily, Entry>();
  readonly #writes = new Map<IPFamily, FamilyWrites>();
  readonly #reading = new Map<IPFamily, {writes: number; startedAt: number; promise: Promise<AppliedRules>}>();

  constructor(options: AppliedRulesOptions) {
    this.#options = options;
  }

  /** The rules as the kernel holds them now: cached when only the agent's own writes changed them since they were read. */
  async get(family: IPFamily): Promise<AppliedRules> {
    const {changes} = this.#options;
    const running = this.#familyWrites(family).running;
    if (running) await Promise.race([running.done, new Promise((resolve) => setTimeout(resolve, this.#options.writeWaitMs ?? 60_000).unref())]);
    const settled = changes.watching() && (await changes.settled(this.#options.settleWaitMs ?? 5000));
    const writes = this.#familyWrites(family);
    const foreignAt = changes.lastForeignChangeAt();
    const cached = this.#current.get(family);
    if (settled && !writes.running && cached && cached.writes === writes.count && cached.basisAt > foreignAt) return this.#materialize(cached);
    // Requests that arrive together share a reading that began after everything they must see.
    const reading = this.#reading.get(family);
    if (settled && !writes.running && reading && reading.writes === writes.count && reading.startedAt > foreignAt) return reading.promise;
    const startedAt = this.#options.now();
    const promise = this.#read(family, writes.count, startedAt).finally(() => {
      if (this.#reading.get(family)?.promise === promise) this.#reading.delete(family);
    });
    this.#reading.set(family, {writes: writes.count, startedAt, promise});
    return promise;
  }

  /**
   * The cached rules when nothing reported so far makes them stale (no write running, no foreign
   * change seen since they were read), without waiting for the change monitor; else undefined.
   */
  current(family: IPFamily): AppliedRules | undefined {
    const cached = this.#current.get(family);
    const writes = this.#familyWrites(family);
    const {changes} = this.#options;
    return changes.watching() && cached && !writes.running && cached.writes === writes.count && cached.basisAt > changes.lastForeignChangeAt() ? cached : undefined;
  }

  /** The last rules known, however old, without touching the kernel. */
  last(family: IPFamily): AppliedRules | undefined {
    return this.#current.get(family);
  }

  /** One of the agent's writes begins: until it is reported, the cached rules are not current. */
  writeStarted(family: IPFamily): void {
    const writes = this.#familyWrites(family);
    writes.count++;
    if (!writes.running) {
      let finish = (): void => {};
      const done = new Promise<void>((resolve) => (finish = resolve));
      writes.running = {done, finish};
    }
  }

  /** The write ended: `written` is what it left, undefined when that is not known (it failed, or it was a full write not read back). */
  writeEnded(family: IPFamily, written: WrittenRules | undefined): void {
    const writes = this.#familyWrites(family);
    const previous = this.#current.get(family);
    this.#current.delete(family);
    if (written?.kind === 'read') {
      // Parsed when first asked for: at 10,000 services parsing takes seconds the sync need not wait.
      this.#current.set(family, this.#entryOf(family, written.text, {readAt: written.readStartedAt, basisAt: written.readStartedAt, writes: writes.count}));
    } else if (written?.kind === 'chains' && previous && previous.writes === writes.count - 1 && this.#options.patch) {
      const rules = this.#options.patch(previous.rules, written.tables);
      const format = this.#options.format;
      let text: string | undefined;
      this.#current.set(family, {
        family,
        get text() {
          return (text ??= format ? format(rules) : '');
        },
        rules,
        readAt: written.writtenAt,
        basisAt: previous.basisAt,
        writes: writes.count,
      });
    }
    writes.running?.finish();
    writes.running = undefined;
  }

  #familyWrites(family: IPFamily): FamilyWrites {
    let writes = this.#writes.get(family);
    if (!writes) this.#writes.set(family, (writes = {count: 0}));
    return writes;
  }

  #materialize(entry: Entry): AppliedRules {
    void entry.rules;
    return entry;
  }

  /** A reading's entry: its rules parsed when first asked for, its text then kept as compactly as the backend allows. */
  #entryOf(family: IPFamily, text: string, times: Pick<Entry, 'readAt' | 'basisAt' | 'writes'>): Entry {
    const {parse, textOf} = this.#options;
    let raw: string | undefined = text;
    let rules: ParsedRules | undefined;
    let compressed: Buffer | undefined;
    return {
      family,
      ...times,
      get rules() {
        if (rules) return rules;
        rules = parse(raw!);
        if (!textOf?.(rules)) compressed = deflateRawSync(raw!, {level: 1});
        raw = undefined;
        return rules;
      },
      get text() {
        if (raw !== undefined) return raw;
        return textOf?.(rules!) ?? inflateRawSync(compressed!).toString();
      },
    };
  }

  async #read(family: IPFamily, writes: number, startedAt: number): Promise<AppliedRules> {
    const entry = this.#entryOf(family, await this.#options.read(family), {readAt: startedAt, basisAt: startedAt, writes});
    void entry.rules;
    // Reading and parsing a whole table leaves garbage the size of several tables (nftables' JSON
    // listing, parsed): collected once the request is answered, not held until V8 gets to it.
    setImmediate(releaseGarbage);
    const known = this.#current.get(family);
    // A write that started meanwhile may be missing from this reading: the caller gets it, the cache does not keep it.
    if (writes === this.#familyWrites(family).count && (!known || known.writes < writes || known.basisAt <= startedAt)) this.#current.set(family, entry);
    return entry;
  }
}
