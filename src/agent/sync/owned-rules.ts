// Which iptables chains and rules belong to the proxy (kube-proxy's names, so that rules left by
// kube-proxy are ours to replace), and the normalised view of them in iptables-save output that
// drift detection compares and --cleanup removes. Chains of kubelet (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-MARK-DROP) and of anyone else are foreign and never touched.
import {createHash} from 'node:crypto';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {WrittenTable} from './iptables-rules.ts';

/** Fixed chain names the proxy owns, per table. */
export const ownedChainNames: Record<IptablesTable, readonly string[]> = {
  nat: ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', 'KUBE-PROXY-CANARY'],
  filter: ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-FORWARD', 'KUBE-NODEPORTS', 'KUBE-PROXY-FIREWALL', 'KUBE-PROXY-CANARY'],
  mangle: ['KUBE-PROXY-CANARY'],
  raw: [],
};

/** Prefixes of the per-service and per-endpoint chains (hashed names). */
export const ownedChainPrefixes: readonly string[] = ['KUBE-SVC-', 'KUBE-SVL-', 'KUBE-SEP-', 'KUBE-EXT-', 'KUBE-FW-', 'KUBE-XLB-'];

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
  for (const [chain, value] of record.chains)
    chains.set(chain, isCounted(chain, value) ? chainValue(chain, nowRules.get(chain) ?? []) : value);
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
      if (nowChains.has(chain) && !chainMatches(chain, value, nowRules.get(chain) ?? []))
        differences.push(`rules of ${chain} changed (${ruleCountOf(chain, value)} written, ${nowRules.get(chain)?.length ?? 0} now)`);
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
 * ownedAfterWrite: the proxy's part of each table in the chains a partial write declared, as the
 * renderer told it (rules as iptables-save prints them). A full write's per-service chains are
 * known by their rule count alone: it throws for those (see recordAfterFullWrite).
 */
export function ownedAfterWrite(written: Record<'filter' | 'nat', WrittenTable>): Map<IptablesTable, OwnedRules> {
  const owned = new Map<IptablesTable, OwnedRules>();
  for (const table of proxyTables) {
    const {declared, deleted, rules: byChain} = written[table as 'filter' | 'nat'];
    const gone = new Set(deleted);
    const chains = declared.filter((chain) => isOwnedChain(table, chain) && !gone.has(chain));
    const rules: string[] = [];
    for (const chain of chains) {
      const list = byChain.get(chain) ?? [];
      if (typeof list === 'number') throw new Error(`${table} chain ${chain} is known by its rule count alone`);
      rules.push(...list);
    }
    owned.set(table, {table, chains, rules, jumpRules: []});
  }
  return owned;
}

/**
 * recordAfterFullWrite: the proxy's part of each table after a full write, without reading the
 * kernel back (slow on a large ruleset: docs/agent.md, Drift repair) and without spelling all of
 * it (parsing every rule costs about as much): the renderer spelled the fixed chains and the
 * jump rules it inserted, and counted the rules of each per-service chain, which the record keeps
 * by count until the next reading settles them (settleRecord). Owned chains the write left alone
 * and the jump rules already in place are as `before`, read just before the write, shows them.
 */
export function recordAfterFullWrite(
  written: Record<'filter' | 'nat', WrittenTable>,
  before: ReadonlyMap<IptablesTable, OwnedRules>,
): Map<IptablesTable, OwnedRecord> {
  const records = new Map<IptablesTable, OwnedRecord>();
  for (const table of proxyTables) {
    const {declared, deleted, rules: byChain, jumps: inserted} = written[table as 'filter' | 'nat'];
    const previous = before.get(table);
    const previousRules = previous ? rulesByChain(previous) : new Map<string, string[]>();
    const replaced = new Set(declared);
    const gone = new Set(deleted);
    const chains = new Map<string, string>();
    let countedChains = 0;
    let ruleCount = 0;
    for (const chain of previous?.chains ?? []) {
      if (replaced.has(chain)) continue;
      const rules = previousRules.get(chain) ?? [];
      chains.set(freshString(chain), chainValue(chain, rules));
      ruleCount += rules.length;
    }
    for (const chain of declared) {
      if (gone.has(chain) || !isOwnedChain(table, chain)) continue;
      const rules = byChain.get(chain) ?? [];
      if (typeof rules === 'number') {
        chains.set(freshString(chain), countedValue(rules));
        countedChains++;
        ruleCount += rules;
      } else {
        chains.set(freshString(chain), chainValue(chain, rules));
        ruleCount += rules.length;
      }
    }
    // -I puts each rule first in its chain, so the last one inserted ends up first.
    const jumpRules = new Map<string, string[]>();
    for (const [chain, rules] of previousRules) if (!isOwnedChain(table, chain)) jumpRules.set(chain, rules);
    for (const {chain, rule, prepend} of inserted) {
      // Jumps into chains that are not the proxy's (kubelet's KUBE-FIREWALL) are not part of its view.
      const target = /\s-[jg]\s+(\S+)/.exec(rule)?.[1];
      if (target === undefined || !isOwnedChain(table, target)) continue;
      const rules = jumpRules.get(chain) ?? [];
      jumpRules.set(chain, prepend ? [rule, ...rules] : [...rules, rule]);
    }
    const jumps = new Map<string, string>();
    for (const [chain, rules] of jumpRules) {
      jumps.set(freshString(chain), chainValue(chain, rules));
      ruleCount += rules.length;
    }
    records.set(table, {table, chains, jumps, ruleCount, countedChains});
  }
  return records;
}
