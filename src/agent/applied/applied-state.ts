// AppliedState: what the kernel holds, per IP family: the agent's one copy of the kernel's rules
// (the proxier keeps only a record of what it wrote, to compare its readings with). The proxier
// publishes into it (RulesWriteListener): each write it starts and what the write left (the
// chains a partial sync wrote, or the rules a full sync read back), and each reading of the tables
// it takes for its drift check. The plugin's API reads it; when it holds nothing current, the
// proxier's own reader reads the kernel (iptables-save is slow on a large node, so a
// reading the drift check already took is not taken again). Changes by anyone else are seen in one
// place, the ruleset monitor (RulesetChanges): a foreign change makes the next request read the
// kernel, and the proxier's next drift check repairs it.
import {deflateRawSync, inflateRawSync} from 'node:zlib';
import type {IPFamily} from '../../core/model/index.ts';
import type {Host} from '../host/host.ts';
import type {ChainsWritten, RulesWriteListener, WrittenRules} from '../sync/types.ts';
import {releaseGarbageSoon} from '../garbage.ts';
import type {RulesetChanges, TouchedObjects} from './ruleset-changes.ts';

/** Rules as the API's backend parsed them; only the backend looks inside. */
export type ParsedRules = {readonly __parsedRules?: never};

export interface AppliedRules {
  family: IPFamily;
  /** The rules as the kernel tools print them. */
  readonly text: string;
  rules: ParsedRules;
  /** When the rules were last taken from the kernel, or from one of the agent's own writes (ms). */
  readAt: number;
}

export interface AppliedStateOptions {
  /** Reads the proxy's tables as the kernel tools print them (iptables-save -t filter + -t nat): the proxier's reader. */
  read(family: IPFamily): Promise<string>;
  parse(text: string): ParsedRules;
  /**
   * Reads back the text parsed rules were read from, when they keep it (iptables'
   * ChainIndexedRuleset does, deflated): the cache then keeps no text of its own. Without it the cache keeps the text compressed once
   * the rules are parsed (nftables' JSON listing is large, and only shown), and their parsed form
   * only while requests use it (parsedIdleMs).
   */
  textOf?(rules: ParsedRules): (() => string) | undefined;
  /** How long parsed rules that do not hold their text are kept after the last request for them (default 2 s). */
  parsedIdleMs?: number;
  /**
   * Replaces the written chains in parsed rules (a new value; the old one stays as it was); without
   * it, writes of chains make the next request read the kernel.
   */
  patch?(rules: ParsedRules, tables: ChainsWritten[]): ParsedRules;
  /** The text of patched rules. */
  format?(rules: ParsedRules): string;
  /**
   * The rules brought up to date with foreign changes by reading only the objects they touched
   * (`touched`: every table of the family the monitor named; the backend knows which it reads):
   * the same rules when none of its tables was touched; undefined when the changes cannot be
   * followed so (the whole tables are read again).
   */
  follow?(family: IPFamily, rules: ParsedRules, touched: Map<string, TouchedObjects>): Promise<ParsedRules | undefined>;
  changes: RulesetChanges;
  now(): number;
  /** Longest wait for the change monitor to report what the kernel committed (default 5 s); past it, the kernel is read. */
  settleWaitMs?: number;
  /** Longest wait for a write in progress to be reported (default 60 s); past it, the kernel is read. */
  writeWaitMs?: number;
  /**
   * The processes the host starts: those that write rules (`writer`, default iptables-restore and
   * nft) while a reported write runs are the agent's own, and the changes the monitor reports for
   * them are not foreign.
   */
  spawns?: Host['onSpawn'];
  writer?: RegExp;
  /** Told of each whole reading once its rules are parsed: how long from running the command, and its size. */
  onRead?(family: IPFamily, reading: {seconds: number; characters: number}): void;
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
  /** When the last write was reported (a reading that started before may miss it). */
  lastEndedAt?: number;
}

/** `entry` as of other times: its rules and text read through it, however it holds them. */
function entryAsOf(entry: Entry, times: Pick<Entry, 'readAt' | 'basisAt' | 'writes'>): Entry {
  return {
    family: entry.family,
    get text() {
      return entry.text;
    },
    get rules() {
      return entry.rules;
    },
    ...times,
  };
}

export class AppliedState implements RulesWriteListener {
  readonly #options: AppliedStateOptions;
  readonly #current = new Map<IPFamily, Entry>();
  readonly #writes = new Map<IPFamily, FamilyWrites>();
  readonly #reading = new Map<IPFamily, {writes: number; startedAt: number; promise: Promise<AppliedRules>}>();

  /** Writes started and not yet reported, all families. */
  #writesRunning = 0;
  #ownWritersEnded: (() => void)[] = [];
  readonly #stopWatchingSpawns?: () => void;

  constructor(options: AppliedStateOptions) {
    this.#options = options;
    const writer = options.writer ?? /(?:^|\/)(?:ip6?tables-restore|nft)$/;
    this.#stopWatchingSpawns = options.spawns?.((pid, command) => {
      if (this.#writesRunning > 0 && command.some((word) => writer.test(word))) this.#ownWritersEnded.push(options.changes.ownWriter(pid));
    });
  }

  close(): void {
    this.#stopWatchingSpawns?.();
    this.#options.changes.close();
  }

  /**
   * A reading of the tables the proxier took (its drift check), starting at `startedAt` with no
   * write of its own in flight: kept when it is newer than what is known, so that the next request
   * need not read the kernel itself. A reading that adds nothing (the rules known are current) is
   * dropped, so that answers prepared from them (the drift check) stay valid; so is every reading
   * while the monitor does not watch (each request reads the kernel then).
   */
  reading(family: IPFamily, text: string, startedAt: number): void {
    // Unwatched, no request trusts what is kept: it would only hold the text.
    if (!this.#options.changes.watching()) return;
    const writes = this.#familyWrites(family);
    if (writes.running || startedAt <= (writes.lastEndedAt ?? -Infinity)) return;
    if (this.current(family)) return;
    const known = this.#current.get(family);
    if (known && known.writes === writes.count && known.basisAt >= startedAt) return;
    this.#current.set(family, this.#entryOf(family, text, {readAt: startedAt, basisAt: startedAt, writes: writes.count}));
  }

  /**
   * True when the change monitor watches, has reported everything the kernel committed, and saw
   * no change since `since` but the agent's own writes: the rules are what the proxier wrote.
   */
  async untouchedSince(since: number): Promise<boolean> {
    const {changes} = this.#options;
    if (!changes.watching() || !(await changes.settled(this.#options.settleWaitMs ?? 5000))) return false;
    return changes.watching() && changes.lastForeignChangeAt() < since;
  }

  /** How many writes of the family's rules have started: a reading taken while the count moved may hold some of them. */
  writesStarted(family: IPFamily): number {
    return this.#familyWrites(family).count;
  }

  /** The rules as get() gives them, parsed: for the proxier's drift check. */
  async rulesNow(family: IPFamily): Promise<{rules: unknown; readAt: number}> {
    const applied = await this.get(family);
    return {rules: applied.rules, readAt: applied.readAt};
  }

  /**
   * The rules as the kernel holds them now: cached when only the agent's own writes changed them
   * since they were read. `settle: false` takes them as the changes reported so far leave them,
   * without waiting for the change monitor to report what the kernel committed before the call
   * (in ipvs mode a look begun after it): for work in the background, started by a change the
   * monitor reported, which is in what it has.
   */
  async get(family: IPFamily, {settle = true}: {settle?: boolean} = {}): Promise<AppliedRules> {
    const {changes} = this.#options;
    const running = this.#familyWrites(family).running;
    if (running)
      await Promise.race([running.done, new Promise((resolve) => setTimeout(resolve, this.#options.writeWaitMs ?? 60_000).unref())]);
    const settled = changes.watching() && (!settle || (await changes.settled(this.#options.settleWaitMs ?? 5000)));
    const writes = this.#familyWrites(family);
    const foreignAt = changes.lastForeignChangeAt();
    const cached = this.#current.get(family);
    if (settled && !writes.running && cached && cached.writes === writes.count && cached.basisAt > foreignAt)
      return this.#materialize(cached);
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
    return changes.watching() &&
      cached &&
      !writes.running &&
      cached.writes === writes.count &&
      cached.basisAt > changes.lastForeignChangeAt()
      ? cached
      : undefined;
  }

  /** The last rules known, however old, without touching the kernel. */
  last(family: IPFamily): AppliedRules | undefined {
    return this.#current.get(family);
  }

  /** One of the agent's writes begins: until it is reported, the cached rules are not current. */
  started(family: IPFamily): void {
    const writes = this.#familyWrites(family);
    writes.count++;
    this.#writesRunning++;
    if (!writes.running) {
      let finish = (): void => {};
      const done = new Promise<void>((resolve) => (finish = resolve));
      writes.running = {done, finish};
    }
  }

  /** The write ended: `written` is what it left, undefined when that is not known (it failed, or it was a full write not read back). */
  ended(family: IPFamily, written: WrittenRules | undefined): void {
    const writes = this.#familyWrites(family);
    const previous = this.#current.get(family);
    this.#current.delete(family);
    if (written?.kind === 'read') {
      // Parsed when first asked for: at 10,000 services parsing takes seconds the sync need not wait.
      this.#current.set(
        family,
        this.#entryOf(family, written.text, {readAt: written.readStartedAt, basisAt: written.readStartedAt, writes: writes.count}),
      );
    } else if (written?.kind === 'chains' && previous && previous.writes === writes.count - 1 && this.#options.patch) {
      const rules = this.#options.patch(previous.rules, written.tables);
      this.#current.set(
        family,
        this.#patchedEntry(family, rules, {readAt: written.writtenAt, basisAt: previous.basisAt, writes: writes.count}),
      );
    }
    writes.running?.finish();
    writes.running = undefined;
    writes.lastEndedAt = this.#options.now();
    this.#writesRunning = Math.max(0, this.#writesRunning - 1);
    for (const ownEnded of this.#ownWritersEnded) ownEnded();
    this.#ownWritersEnded = [];
  }

  #patchedEntry(family: IPFamily, rules: ParsedRules, times: Pick<Entry, 'readAt' | 'basisAt' | 'writes'>): Entry {
    const format = this.#options.format;
    let text: string | undefined;
    return {
      family,
      get text() {
        return (text ??= format ? format(rules) : '');
      },
      rules,
      ...times,
    };
  }

  /**
   * The cached rules brought up to date by reading only the objects foreign changes touched since
   * they were read (the backend's follow), when the monitor named them all; undefined otherwise
   * (the caller reads the whole tables).
   */
  async #followForeignChanges(family: IPFamily, writes: number, startedAt: number): Promise<Entry | undefined> {
    const {follow, changes} = this.#options;
    const cached = this.#current.get(family);
    if (!follow || !cached || cached.writes !== writes) return undefined;
    const byFamily = changes.foreignObjectsSince(cached.basisAt);
    if (!byFamily) return undefined;
    const followed = await follow(family, cached.rules, byFamily.get(family) ?? new Map());
    if (!followed) return undefined;
    const times = {readAt: startedAt, basisAt: startedAt, writes};
    // Nothing of the backend's tables changed (the change was to another table): the same rules, and text, as of now.
    if (followed === cached.rules) return entryAsOf(cached, times);
    return this.#patchedEntry(family, followed, times);
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
    const {parse, textOf, follow} = this.#options;
    const idleMs = this.#options.parsedIdleMs ?? 2000;
    let raw: string | undefined = text;
    let rules: ParsedRules | undefined;
    let compressed: Buffer | undefined;
    // Rules that do not hold their text (nftables' parsed listing, tens of MiB at 10,000 services)
    // are kept while requests come, so that a burst of traces parses once, and let go once none
    // has asked for them for idleMs: the next request parses them again from the compressed text.
    let parsed: ParsedRules | undefined;
    let letGo: NodeJS.Timeout | undefined;
    const keepParsed = (fresh: ParsedRules) => {
      parsed = fresh;
      if (letGo) letGo.refresh();
      else {
        letGo = setTimeout(() => {
          parsed = undefined;
          letGo = undefined;
          releaseGarbageSoon();
        }, idleMs);
        letGo.unref();
      }
    };
    return {
      family,
      ...times,
      get rules() {
        const known = rules ?? parsed;
        if (known) {
          if (known === parsed) keepParsed(known);
          return known;
        }
        const again = raw === undefined;
        const fresh = parse(raw ?? inflateRawSync(compressed!).toString());
        // Parsing a whole listing again leaves its garbage: collected once the request is answered.
        if (again) releaseGarbageSoon();
        if (textOf?.(fresh)) rules = fresh;
        else {
          compressed ??= deflateRawSync(raw!, {level: 1});
          // A backend that follows foreign changes patches these rules: kept, or each change would parse the whole listing again.
          if (follow) rules = fresh;
          else keepParsed(fresh);
        }
        raw = undefined;
        return fresh;
      },
      get text() {
        if (raw !== undefined) return raw;
        return (rules && textOf?.(rules)?.()) ?? inflateRawSync(compressed!).toString();
      },
    };
  }

  async #read(family: IPFamily, writes: number, startedAt: number): Promise<AppliedRules> {
    const followed = await this.#followForeignChanges(family, writes, startedAt);
    if (followed) {
      if (writes === this.#familyWrites(family).count) this.#current.set(family, followed);
      return followed;
    }
    const reading = performance.now();
    const text = await this.#options.read(family);
    const entry = this.#entryOf(family, text, {readAt: startedAt, basisAt: startedAt, writes});
    void entry.rules;
    this.#options.onRead?.(family, {seconds: (performance.now() - reading) / 1000, characters: text.length});
    // Reading and parsing a whole table leaves garbage the size of several tables (nftables' JSON
    // listing, parsed): collected once the request is answered, not held until V8 gets to it.
    releaseGarbageSoon();
    const known = this.#current.get(family);
    // A write that started meanwhile may be missing from this reading: the caller gets it, the cache does not keep it.
    if (writes === this.#familyWrites(family).count && (!known || known.writes < writes || known.basisAt <= startedAt))
      this.#current.set(family, entry);
    return entry;
  }
}
