// Which iptables chains and rules belong to the proxy (kube-proxy's names, so that rules left by
// kube-proxy are ours to replace), and the normalised view of them in iptables-save output that
// drift detection compares and --cleanup removes. Chains of kubelet (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-MARK-DROP) and of anyone else are foreign and never touched.
import {createHash} from 'node:crypto';
import type {IptablesTable} from '../../core/iptables/chains.ts';

/** Fixed chain names the proxy owns, per table. */
export const ownedChainNames: Record<IptablesTable, readonly string[]> = {
  nat: ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', 'KUBE-PROXY-CANARY'],
  filter: ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-FORWARD', 'KUBE-NODEPORTS', 'KUBE-PROXY-FIREWALL', 'KUBE-PROXY-CANARY'],
  mangle: ['KUBE-PROXY-CANARY'],
  raw: [],
};

/** Prefixes of the per-service and per-endpoint chains (hashed names). */
export const ownedChainPrefixes: readonly string[] = ['KUBE-SVC-', 'KUBE-SVL-', 'KUBE-SEP-', 'KUBE-EXT-', 'KUBE-FW-', 'KUBE-XLB-'];

/** The kernel's own chains, which hold the jump rules into the proxy's. */
const builtinChainNames: ReadonlySet<string> = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);

/** The tables the iptables backend writes. */
export const proxyTables: readonly IptablesTable[] = ['filter', 'nat'];

export function isOwnedChain(table: IptablesTable, chain: string): boolean {
  return ownedChainNames[table].includes(chain) || ownedChainPrefixes.some((prefix) => chain.startsWith(prefix));
}

/** isOwnedChain for the chain name at `at` in `text`, up to the next space, without cutting it out. */
function isOwnedChainAt(table: IptablesTable, text: string, at: number): boolean {
  for (const prefix of ownedChainPrefixes) if (text.startsWith(prefix, at)) return true;
  for (const name of ownedChainNames[table]) {
    if (text.startsWith(name, at) && (text.length === at + name.length || text.charCodeAt(at + name.length) === 0x20)) return true;
  }
  return false;
}

export interface OwnedRules {
  table: IptablesTable;
  /** Owned chains that exist. */
  chains: string[];
  /** Rules inside owned chains, and rules elsewhere that jump or go to an owned chain, as iptables-save prints them, in order. */
  rules: string[];
  /** The subset of rules that sit in foreign (mostly built-in) chains: the jump rules. */
  jumpRules: string[];
  /**
   * Rules in foreign chains that jump to any KUBE- chain, kubelet's KUBE-FIREWALL included: which
   * of the jump rules the proxy keeps in place are there already.
   */
  kubeJumps?: string[];
}

/** readOwnedRules picks the proxy's part of one table out of `iptables-save -t TABLE` output. */
export function readOwnedRules(table: IptablesTable, saveText: string): OwnedRules {
  const chains: string[] = [];
  const rules: string[] = [];
  const jumpRules: string[] = [];
  const kubeJumps: string[] = [];
  let inTable = false;
  // Line by line without splitting: at 10,000 services the dump has 430,000 lines, and an array of
  // them all would be garbage the size of the dump again.
  for (let start = 0; start < saveText.length; ) {
    let end = saveText.indexOf('\n', start);
    if (end < 0) end = saveText.length;
    const raw = saveText.slice(start, end);
    start = end + 1;
    const line = raw.charCodeAt(0) === 0x2d && raw.charCodeAt(raw.length - 1) > 0x20 ? raw : raw.trim();
    if (line.startsWith('*')) {
      inTable = line === `*${table}`;
      continue;
    }
    if (!inTable || line === '' || line.startsWith('#') || line === 'COMMIT') continue;
    if (line.startsWith(':')) {
      // ":CHAIN POLICY [packets:bytes]"
      const space = line.indexOf(' ');
      const chain = space > 0 ? line.slice(1, space) : line.slice(1).split(/\s+/)[0];
      if (isOwnedChain(table, chain)) chains.push(chain);
      continue;
    }
    // Packet counters ("[12:3456] -A ...", iptables-save -c) never mean a rule changed.
    const text = line.charCodeAt(0) === 0x5b ? line.replace(/^\[\d+:\d+\]\s+/, '') : line;
    // Most rules are in the proxy's chains: those are told without a match object or a chain name
    // cut out per rule (in a large cluster that was most of a reading's garbage).
    if (text.startsWith('-A ') && isOwnedChainAt(table, text, 3)) {
      rules.push(text);
      continue;
    }
    const rule = /^-A\s+(\S+)/.exec(text);
    if (!rule) continue;
    if (isOwnedChain(table, rule[1])) {
      rules.push(text);
      continue;
    }
    const target = /\s-[jg]\s+(\S+)/.exec(text);
    if (target?.[1].startsWith('KUBE-')) kubeJumps.push(text);
    if (target && isOwnedChain(table, target[1])) {
      rules.push(text);
      jumpRules.push(text);
    }
  }
  return {table, chains, rules, jumpRules, kubeJumps};
}

/** The rules of each chain, in order, keyed by the chain they sit in. */
export function rulesByChain(owned: OwnedRules): Map<string, string[]> {
  const chains = new Map<string, string[]>();
  for (const rule of owned.rules) {
    const chain = /^-A\s+(\S+)/.exec(rule)![1];
    const list = chains.get(chain);
    if (list) list.push(rule);
    else chains.set(chain, [rule]);
  }
  return chains;
}

/**
 * OwnedRecord: the proxy's part of one table as the proxier keeps it from one sync to the next,
 * to compare with what the kernel holds later. At 10,000 services a table's OwnedRules is 430,000
 * rule strings, sliced out of an iptables-save output that they keep alive whole. The record
 * keeps instead, per owned chain, either its rules (joined, in fresh strings: the fixed chains
 * such as KUBE-SERVICES, so that drift in them is logged rule by rule) or, for the hashed
 * per-service chains (KUBE-SVC-, KUBE-SEP- ...), a 96-bit digest of its rules and their count in
 * one 15-character string, instead of the chain's text.
 * After a full write that was not read back, a per-service chain is known only by its rule count
 * (a 3-character value, see countedValue) until the next reading settles it (settleRecord).
 */
export interface OwnedRecord {
  table: IptablesTable;
  /** Per owned chain that exists: its rules joined by newlines, their digest (digestedChain), or only their count. */
  chains: Map<string, string>;
  /** The jump rules from foreign chains, as iptables-save prints them, joined by newlines, per chain they sit in. */
  jumps: Map<string, string>;
  /** How many rules OwnedRules.rules held. */
  ruleCount: number;
  /** How many chains are known by their rule count alone. */
  countedChains: number;
}

/** Chains whose rules an OwnedRecord keeps as a digest: the hashed per-service ones. */
function digestedChain(chain: string): boolean {
  return ownedChainPrefixes.some((prefix) => chain.startsWith(prefix));
}

/**
 * A copy of `text` that shares nothing with the string it was cut from (V8 keeps the parent of a
 * sliced string alive as long as the slice).
 */
function freshString(text: string): string {
  return JSON.parse(JSON.stringify(text)) as string;
}

/** What an OwnedRecord keeps of one chain's rules. */
function chainValue(chain: string, rules: readonly string[]): string {
  if (digestedChain(chain)) {
    // 12 bytes of SHA-1, then the rule count in 3 bytes: one flat 15-character string.
    const value = Buffer.alloc(15);
    createHash('sha1').update(rules.join('\n')).digest().copy(value, 0, 0, 12);
    value.writeUIntBE(Math.min(rules.length, 0xffffff), 12, 3);
    return value.toString('latin1');
  }
  // join makes a new string, except of a single rule, which it returns as it is.
  return rules.length === 1 ? freshString(rules[0]) : rules.join('\n');
}

function splitRules(text: string): string[] {
  return text === '' ? [] : text.split('\n');
}

/** The value of a per-service chain whose rules are known by their count alone: the count in 3 bytes. */
function countedValue(count: number): string {
  const capped = Math.min(count, 0xffffff);
  return String.fromCharCode((capped >> 16) & 0xff, (capped >> 8) & 0xff, capped & 0xff);
}

function isCounted(chain: string, value: string): boolean {
  return value.length === 3 && digestedChain(chain);
}

/** How many rules a chain's value stands for: a digest is followed by the count. */
function ruleCountOf(chain: string, value: string): number {
  if (!digestedChain(chain)) return splitRules(value).length;
  const at = value.length - 3;
  return (value.charCodeAt(at) << 16) | (value.charCodeAt(at + 1) << 8) | value.charCodeAt(at + 2);
}

/** Whether `rules` are what a chain's recorded value stands for (by count alone for a counted chain). */
function chainMatches(chain: string, value: string, rules: readonly string[]): boolean {
  return isCounted(chain, value) ? rules.length === ruleCountOf(chain, value) : value === chainValue(chain, rules);
}

/** recordOwned makes the record kept between syncs of what `owned` shows. */
export function recordOwned(owned: OwnedRules): OwnedRecord {
  const byChain = rulesByChain(owned);
  const chains = new Map<string, string>();
  for (const chain of owned.chains) chains.set(freshString(chain), chainValue(chain, byChain.get(chain) ?? []));
  const jumps = new Map<string, string>();
  for (const [chain, rules] of byChain) if (!isOwnedChain(owned.table, chain)) jumps.set(freshString(chain), chainValue(chain, rules));
  return {table: owned.table, chains, jumps, ruleCount: owned.rules.length, countedChains: 0};
}

/**
 * settleRecord: `record`, which `now` matches, with the chains it knew by count alone recorded
 * from `now` in full: from then on an edited rule in them is drift too.
 */
export function settleRecord(record: OwnedRecord, now: OwnedRules): OwnedRecord {
  if (record.countedChains === 0) return record;
  const nowRules = rulesByChain(now);
  const chains = new Map<string, string>();
  for (const [chain, value] of record.chains) chains.set(chain, isCounted(chain, value) ? chainValue(chain, nowRules.get(chain) ?? []) : value);
  return {...record, chains, countedChains: 0};
}

/**
 * matchesRecord: the kernel's view `now` has the recorded chains, and each chain the same rules in
 * the same order. The order of the chains themselves does not matter: iptables-save lists them in
 * the order the kernel keeps them, which a rewrite can change.
 */
export function matchesRecord(record: OwnedRecord, now: OwnedRules): boolean {
  if (record.chains.size !== now.chains.length || record.ruleCount !== now.rules.length) return false;
  // Same size, and every chain the kernel has recorded: the record's chains are the kernel's.
  for (const chain of now.chains) if (!record.chains.has(chain)) return false;
  // iptables-save prints each chain's rules together: compared run by run, nothing is grouped
  // or kept (grouping every rule by chain held a large part of the reading again through the check).
  const rules = now.rules;
  const compared = new Set<string>();
  let foreignChains = 0;
  for (let from = 0; from < rules.length; ) {
    const chain = chainOfRule(rules[from]);
    let to = from + 1;
    while (to < rules.length && inChain(rules[to], chain)) to++;
    // A chain in two runs, or a run that differs (perhaps only a part of its chain): the rules
    // are grouped after all, for the answer the whole chains give. Drift is rare; so is this.
    if (compared.has(chain)) return matchesRecordGrouped(record, now);
    compared.add(chain);
    const run = rules.slice(from, to);
    const value = record.chains.get(chain);
    if (value !== undefined) {
      if (!chainMatches(chain, value, run)) return matchesRecordGrouped(record, now);
    } else {
      // Rules in foreign chains (the jumps), and rules of chains iptables-save did not declare.
      foreignChains++;
      if (record.jumps.get(chain) !== chainValue(chain, run)) return matchesRecordGrouped(record, now);
    }
    from = to;
  }
  // Chains with no rules.
  for (const [chain, value] of record.chains) if (!compared.has(chain) && !chainMatches(chain, value, [])) return false;
  return foreignChains === record.jumps.size;
}

/** The chain a rule ("-A CHAIN ...") sits in. */
function chainOfRule(rule: string): string {
  if (rule.startsWith('-A ')) {
    const end = rule.indexOf(' ', 3);
    const chain = end < 0 ? rule.slice(3) : rule.slice(3, end);
    if (chain !== '' && !/\s/.test(chain)) return chain;
  }
  return /^-A\s+(\S+)/.exec(rule)![1];
}

/** Whether `rule` sits in `chain`, without cutting the chain out of it. */
function inChain(rule: string, chain: string): boolean {
  if (rule.startsWith('-A ') && rule.startsWith(chain, 3)) {
    const after = rule.charCodeAt(3 + chain.length);
    if (Number.isNaN(after) || after === 0x20) return true;
  }
  return chainOfRule(rule) === chain;
}

/** matchesRecord by grouping the rules by chain first, for a reading whose chains are not each in one piece. */
function matchesRecordGrouped(record: OwnedRecord, now: OwnedRules): boolean {
  const nowRules = rulesByChain(now);
  for (const chain of now.chains) {
    const value = record.chains.get(chain);
    if (value === undefined || !chainMatches(chain, value, nowRules.get(chain) ?? [])) return false;
    nowRules.delete(chain);
  }
  // What is left: rules in foreign chains (the jumps), and rules of chains iptables-save did not declare.
  if (nowRules.size !== record.jumps.size) return false;
  for (const [chain, rules] of nowRules) if (record.jumps.get(chain) !== chainValue(chain, rules)) return false;
  return true;
}

/**
 * applyPartialWrite updates `record`, what the proxy's part of a table was after the previous
 * write, to what it should be after a write that replaced only the `written` chains: those as
 * `now` shows them (what the write's input spelled, or the kernel read back), every other owned
 * chain and every jump rule as recorded. Taking the whole table from the kernel instead would
 * adopt whatever someone changed meanwhile in chains the write did not touch, and that drift would
 * never be repaired while partial syncs keep coming. In place, at the cost of the written chains
 * alone: at 10,000 services the record holds over 100,000 chains.
 */
export function applyPartialWrite(record: OwnedRecord, now: OwnedRules, written: ReadonlySet<string>): void {
  for (const chain of written) {
    const value = record.chains.get(chain);
    if (value === undefined) continue;
    record.ruleCount -= ruleCountOf(chain, value);
    if (isCounted(chain, value)) record.countedChains--;
    record.chains.delete(chain);
  }
  // A written chain the kernel no longer has was deleted by the write (a stale chain): gone from both.
  const nowRules = rulesByChain(now);
  for (const chain of now.chains) {
    if (!written.has(chain)) continue;
    const rules = nowRules.get(chain) ?? [];
    record.chains.set(freshString(chain), chainValue(chain, rules));
    record.ruleCount += rules.length;
  }
}

/** The chains an iptables-restore input declares (and so replaces), per table. */
export function declaredChains(input: string): Map<IptablesTable, Set<string>> {
  const declared = new Map<IptablesTable, Set<string>>();
  let current: Set<string> | undefined;
  for (const line of input.split('\n')) {
    if (line.startsWith('*')) {
      current = new Set();
      declared.set(line.slice(1).trim() as IptablesTable, current);
    } else if (line.startsWith(':') && current) {
      current.add(line.slice(1).split(/\s+/)[0]);
    }
  }
  return declared;
}

/** describeDrift names a few differences between what was written and what is there now, for the log. */
export function describeDrift(written: OwnedRecord, now: OwnedRules, limit = 3): string {
  const differences: string[] = [];
  const nowChains = new Set(now.chains);
  for (const chain of written.chains.keys()) if (!nowChains.has(chain)) differences.push(`chain ${chain} missing`);
  for (const chain of now.chains) if (!written.chains.has(chain)) differences.push(`chain ${chain} added`);
  const nowRules = rulesByChain(now);
  const nowRuleSet = new Set(now.rules);
  const writtenRuleSet = new Set<string>();
  for (const [chain, value] of [...written.jumps, ...written.chains]) {
    if (digestedChain(chain)) {
      // Kept as a digest: the chain is known to differ, not which rule.
      if (nowChains.has(chain) && !chainMatches(chain, value, nowRules.get(chain) ?? [])) differences.push(`rules of ${chain} changed (${ruleCountOf(chain, value)} written, ${nowRules.get(chain)?.length ?? 0} now)`);
      continue;
    }
    for (const rule of splitRules(value)) {
      writtenRuleSet.add(rule);
      if (!nowRuleSet.has(rule)) differences.push(`rule missing: ${rule}`);
    }
  }
  for (const [chain, rules] of nowRules) {
    if (digestedChain(chain) && written.chains.has(chain)) continue;
    for (const rule of rules) if (!writtenRuleSet.has(rule)) differences.push(`rule added: ${rule}`);
  }
  if (differences.length === 0 && !matchesRecord(written, now)) differences.push('rules reordered');
  const shown = differences.slice(0, limit);
  if (differences.length > limit) shown.push(`${differences.length - limit} more`);
  return `${written.table}: ${shown.join('; ')}`;
}

/**
 * cleanupRestoreInput is iptables-restore --noflush input that removes the proxy's rules from one
 * table: every jump rule from a foreign chain is deleted, every owned chain flushed (by declaring
 * it) and then deleted. Foreign chains and rules stay. Empty when there is nothing to remove.
 */
export function cleanupRestoreInput(owned: OwnedRules): string {
  if (owned.chains.length === 0 && owned.jumpRules.length === 0) return '';
  const lines = [`*${owned.table}`];
  for (const chain of owned.chains) lines.push(`:${chain} - [0:0]`);
  for (const rule of owned.jumpRules) lines.push(rule.replace(/^-A\s/, '-D '));
  for (const chain of owned.chains) lines.push(`-X ${chain}`);
  lines.push('COMMIT', '');
  return lines.join('\n');
}

/**
 * SpellRules reads iptables-restore input and gives each chain's rules as iptables-save would
 * print them once loaded, per table; undefined when it cannot (the caller then reads the kernel).
 */
export type SpellRules = (input: string) => Map<IptablesTable, Map<string, string[]>> | undefined;

/** What a full write leaves, worked out from its input as it goes out (InputSpelling.fullWriteReader). */
export interface FullWriteReader {
  /** The next piece of the input. */
  add(piece: string): void;
  /** The record after the write (see recordAfterFullWrite); undefined for input it does not follow. */
  finish(before: ReadonlyMap<IptablesTable, OwnedRules>): Map<IptablesTable, OwnedRecord> | undefined;
}

/**
 * InputSpelling tells what a write left in the chains it declared, in iptables-save's spelling,
 * without reading the kernel back (iptables-save is slow on a large ruleset). Spellings are
 * kept per input line from one write to the next: a partial sync that rewrites KUBE-SERVICES
 * changes few of its lines.
 */
export class InputSpelling {
  readonly #spell: SpellRules;
  #known = new Map<string, string>();

  constructor(spell: SpellRules) {
    this.#spell = spell;
  }

  /** The proxy's part of each table in the chains `input` declares, or undefined for input it does not follow (jumps into built-in chains). */
  ownedAfter(input: string): Map<IptablesTable, OwnedRules> | undefined {
    const chains = new Map<IptablesTable, string[]>();
    const deleted = new Set<string>();
    const lines: Array<{table: IptablesTable; chain: string; line: string}> = [];
    let table: IptablesTable | undefined;
    for (const line of input.split('\n')) {
      if (line === '' || line === 'COMMIT' || line === '-Z' || line.startsWith('#')) continue;
      if (line.startsWith('*')) {
        table = line.slice(1) as IptablesTable;
        if (!chains.has(table)) chains.set(table, []);
      } else if (!table) {
        return undefined;
      } else if (line.startsWith(':')) {
        const chain = line.slice(1).split(' ')[0];
        if (isOwnedChain(table, chain)) chains.get(table)!.push(chain);
      } else if (line.startsWith('-X ')) {
        deleted.add(`${table} ${line.slice(3).trim()}`);
      } else if (line.startsWith('-A ')) {
        const chain = line.slice(3, line.indexOf(' ', 3));
        if (isOwnedChain(table, chain)) {
          lines.push({table, chain, line});
          continue;
        }
        // Other chains (kubelet's KUBE-FIREWALL) are not part of the proxy's view unless they jump into it.
        const target = /\s-[jg]\s+(\S+)/.exec(line)?.[1];
        if (target !== undefined && isOwnedChain(table, target)) return undefined;
      } else {
        return undefined;
      }
    }

    const fresh = this.#spellNew(lines.filter((entry) => !this.#known.has(entry.line)));
    if (!fresh) return undefined;
    const known = new Map<string, string>();
    const rules = new Map<IptablesTable, string[]>();
    for (const {table: name, line} of lines) {
      const text = this.#known.get(line) ?? fresh.get(line)!;
      known.set(line, text);
      const list = rules.get(name);
      if (list) list.push(text);
      else rules.set(name, [text]);
    }
    this.#known = known;
    const owned = new Map<IptablesTable, OwnedRules>();
    for (const name of proxyTables) {
      owned.set(name, {table: name, chains: (chains.get(name) ?? []).filter((chain) => !deleted.has(`${name} ${chain}`)), rules: rules.get(name) ?? [], jumpRules: []});
    }
    return owned;
  }

  /**
   * recordAfterFullWrite: the proxy's part of each table after a full write of `input`, without
   * reading the kernel back (slow on a large ruleset: docs/agent.md, Drift repair) and without
   * spelling all of it (parsing every rule costs about as much). The fixed chains
   * and the jump rules the input adds are spelled; the per-service chains are recorded by rule
   * count until the next reading settles them (settleRecord); owned chains the input leaves alone
   * and the jump rules already in place are as `before`, read just before the write, shows them.
   * Undefined for input it does not follow.
   */
  recordAfterFullWrite(input: string, before: ReadonlyMap<IptablesTable, OwnedRules>): Map<IptablesTable, OwnedRecord> | undefined {
    const reader = this.fullWriteReader();
    reader.add(input);
    return reader.finish(before);
  }

  /**
   * fullWriteReader: recordAfterFullWrite for an input taken in pieces as it goes out to
   * iptables-restore, so that a full sync's input is never held whole. A piece may end in the
   * middle of a line.
   */
  fullWriteReader(): FullWriteReader {
    /** Per table, the per-service chains the input declares, and how many rules it gives each. */
    const counted = new Map<IptablesTable, Map<string, number>>(proxyTables.map((name) => [name, new Map()]));
    const fixed = new Map<IptablesTable, Set<string>>(proxyTables.map((name) => [name, new Set()]));
    const deleted = new Map<IptablesTable, Set<string>>(proxyTables.map((name) => [name, new Set()]));
    const spelledLines: Array<{table: IptablesTable; chain: string; line: string}> = [];
    const addedJumps: Array<{table: IptablesTable; chain: string; line: string; prepend: boolean}> = [];
    let table: IptablesTable | undefined;
    // The rules of a per-service chain are counted while they follow one another (the renderer
    // writes each chain's rules together), without a string or a map update per rule: at 10,000
    // services there are 320,000 of them in 110,000 chains.
    let run: {counts: Map<string, number>; chain: string; count: number} | undefined;
    const endRun = (): boolean => {
      if (!run) return true;
      const sofar = run.counts.get(run.chain);
      // Rules appended to a chain the input does not declare (so does not flush): not followed.
      if (sofar === undefined) return false;
      run.counts.set(run.chain, sofar + run.count);
      run = undefined;
      return true;
    };
    /** Reads the lines of `input` before `limit`; false when the input is not one it follows. */
    const readLines = (input: string, limit: number): boolean => {
      // Line by line without splitting.
      for (let start = 0; start < limit; ) {
        let end = input.indexOf('\n', start);
        if (end < 0 || end > limit) end = limit;
        const lineStart = start;
        start = end + 1;
        if (run && input.startsWith('-A ', lineStart) && input.startsWith(run.chain, lineStart + 3) && input.charCodeAt(lineStart + 3 + run.chain.length) === 0x20) {
          run.count++;
          continue;
        }
        const line = input.slice(lineStart, end);
        if (line === '' || line === 'COMMIT' || line === '-Z' || line.startsWith('#')) continue;
        if (line.startsWith('*')) {
          if (!endRun()) return false;
          table = line.slice(1) as IptablesTable;
          if (!counted.has(table)) return false;
          continue;
        }
        if (!table) return false;
        const space = line.indexOf(' ', 3);
        const chain = line.slice(line.startsWith(':') ? 1 : 3, space < 0 ? line.length : space);
        if (line.startsWith(':')) {
          if (digestedChain(chain)) counted.get(table)!.set(chain, 0);
          else if (isOwnedChain(table, chain)) fixed.get(table)!.add(chain);
        } else if (line.startsWith('-X ')) {
          deleted.get(table)!.add(chain);
        } else if (line.startsWith('-A ') && isOwnedChain(table, chain)) {
          if (digestedChain(chain)) {
            if (!endRun()) return false;
            run = {counts: counted.get(table)!, chain, count: 1};
          } else {
            spelledLines.push({table, chain, line});
          }
        } else if (line.startsWith('-A ') || line.startsWith('-I ')) {
          const target = /\s-[jg]\s+(\S+)/.exec(line)?.[1];
          if (target !== undefined && isOwnedChain(table, target)) addedJumps.push({table, chain, line: `-A ${line.slice(3)}`, prepend: line.startsWith('-I ')});
        } else {
          return false;
        }
      }
      return true;
    };

    let followed = true;
    /** The start of a line whose end is in the next piece. */
    let carry = '';
    return {
      add: (piece) => {
        if (!followed) return;
        const text = carry === '' ? piece : carry + piece;
        const last = text.lastIndexOf('\n');
        carry = text.slice(last + 1);
        if (last >= 0) followed = readLines(text, last + 1);
      },
      finish: (before) => {
        if (followed && carry !== '') followed = readLines(carry, carry.length);
        carry = '';
        if (!followed || !endRun()) return undefined;
        const fresh = this.#spellNew([...spelledLines.filter((entry) => !this.#known.has(entry.line)), ...addedJumps]);
        if (!fresh) return undefined;
        // Kept for the partial writes to come, which rewrite the fixed chains whole; in fresh strings,
        // since slices would keep the whole input alive.
        const known = new Map<string, string>();
        for (const {line} of spelledLines) known.set(line, this.#known.get(line) ?? fresh.get(line)!);
        this.#known = new Map([...known].map(([line, spelled]) => [freshString(line), spelled]));

        const records = new Map<IptablesTable, OwnedRecord>();
        for (const name of proxyTables) {
          const previous = before.get(name);
          const previousRules = previous ? rulesByChain(previous) : new Map<string, string[]>();
          const gone = deleted.get(name)!;
          const fixedRules = new Map<string, string[]>();
          for (const entry of spelledLines) {
            if (entry.table !== name) continue;
            const rules = fixedRules.get(entry.chain);
            if (rules) rules.push(known.get(entry.line)!);
            else fixedRules.set(entry.chain, [known.get(entry.line)!]);
          }
          const chains = new Map<string, string>();
          let countedChains = 0;
          let ruleCount = 0;
          for (const chain of previous?.chains ?? []) {
            if (counted.get(name)!.has(chain) || fixed.get(name)!.has(chain) || gone.has(chain)) continue;
            const rules = previousRules.get(chain) ?? [];
            chains.set(freshString(chain), chainValue(chain, rules));
            ruleCount += rules.length;
          }
          for (const [chain, count] of counted.get(name)!) {
            if (gone.has(chain)) continue;
            chains.set(freshString(chain), countedValue(count));
            countedChains++;
            ruleCount += count;
          }
          for (const chain of fixed.get(name)!) {
            if (gone.has(chain)) continue;
            const rules = fixedRules.get(chain) ?? [];
            chains.set(freshString(chain), chainValue(chain, rules));
            ruleCount += rules.length;
          }
          // -I puts each rule first in its chain, so the last one added ends up first.
          const jumpRules = new Map<string, string[]>();
          for (const [chain, rules] of previousRules) if (!isOwnedChain(name, chain)) jumpRules.set(chain, rules);
          for (const {table: jumpTable, chain, line, prepend} of addedJumps) {
            if (jumpTable !== name) continue;
            const rules = jumpRules.get(chain) ?? [];
            const spelled = fresh.get(line)!;
            jumpRules.set(chain, prepend ? [spelled, ...rules] : [...rules, spelled]);
          }
          const jumps = new Map<string, string>();
          for (const [chain, rules] of jumpRules) {
            jumps.set(freshString(chain), chainValue(chain, rules));
            ruleCount += rules.length;
          }
          records.set(name, {table: name, chains, jumps, ruleCount, countedChains});
        }
        return records;
      },
    };
  }

  #spellNew(lines: Array<{table: IptablesTable; chain: string; line: string}>): Map<string, string> | undefined {
    const spelled = new Map<string, string>();
    if (lines.length === 0) return spelled;
    const byTable = new Map<IptablesTable, Map<string, string[]>>();
    for (const {table, chain, line} of lines) {
      const chains = byTable.get(table) ?? new Map<string, string[]>();
      byTable.set(table, chains);
      const list = chains.get(chain);
      if (list) list.push(line);
      else chains.set(chain, [line]);
    }
    const dump: string[] = [];
    for (const [table, chains] of byTable) {
      // Built-in chains (the jump rules' PREROUTING, INPUT ...) are declared with a policy, as iptables-save does.
      dump.push(`*${table}`, ...[...chains.keys()].map((chain) => `:${chain} ${builtinChainNames.has(chain) ? 'ACCEPT' : '-'} [0:0]`));
      for (const list of chains.values()) dump.push(...list);
      dump.push('COMMIT');
    }
    const result = this.#spell(`${dump.join('\n')}\n`);
    if (!result) return undefined;
    for (const [table, chains] of byTable) {
      for (const [chain, list] of chains) {
        const texts = result.get(table)?.get(chain);
        // One input line, one rule: anything else (a list of addresses expanded) is not followed.
        if (!texts || texts.length !== list.length) return undefined;
        list.forEach((line, index) => spelled.set(line, texts[index]));
      }
    }
    return spelled;
  }
}
