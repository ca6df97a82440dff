// diffIptables: the proxy's rules as desired against the rules in the kernel, grouped by the
// service port they belong to. Counters, chain declaration order and other people's chains do not
// count; rule order inside a chain does (iptables evaluates it), except in the chains where each rule
// matches its own service (orderFreeChains).
import {filterChains, isServiceChainName, natChains} from './chains.ts';
import {parseIptablesSave} from './parse.ts';
import {
  chainKind,
  isBuiltinChain,
  isProxyChain,
  servicePortOfComment,
  type IptablesRule,
  type IptablesRuleset,
  type RulesetTable,
} from './ruleset.ts';

/** IptablesDiffGroup: the differences of one service port ("" for rules of no service). */
export interface IptablesDiffGroup {
  servicePort: string;
  /** Desired but missing from the kernel. */
  added: string[];
  /** In the kernel but not desired. */
  removed: string[];
}

export interface IptablesDiff {
  equal: boolean;
  groups: IptablesDiffGroup[];
  /** Unified-diff style, "--- desired" / "+++ applied", one "@@ service @@" section per group; empty when equal. */
  text: string;
}

export interface DiffIptablesOptions {
  /** "namespace/name" (every port of the service) or "namespace/name:port". */
  service?: string;
  /**
   * The chains of `table` that may differ, when the caller can tell that every other chain holds
   * the same rules on both sides without reading them (comparing their texts): only these are
   * read. Undefined: every chain is compared.
   */
  chainsToCompare?(table: string): Iterable<string> | undefined;
  /**
   * A chain that jumps or goes to `chain`, found without reading every chain (a caller that can
   * search the rules' text); undefined: every chain is looked through. It names the service port
   * of a hashed chain whose rules carry no comment.
   */
  callerOf?(table: string, chain: string): string | undefined;
}

/**
 * The rules of `chain` the diff compares: all of a proxy chain's, only the jumps into the proxy's
 * chains of another (a built-in chain, someone else's); undefined for a chain the table does not
 * have, or one with nothing to compare. A chain's rules are taken when the diff comes to it, so
 * that a ruleset read chain by chain is never held whole (at 10,000 services each side has
 * 430,000 rules).
 */
function comparedRules(table: RulesetTable | undefined, chain: string): IptablesRule[] | undefined {
  // The canary chain only tells whether someone flushed the table; it holds no rules.
  if (table === undefined || chain === 'KUBE-PROXY-CANARY') return undefined;
  const rules = table.chains.get(chain)?.rules;
  if (rules === undefined || chainKind(table.name, chain) === 'proxy') return rules;
  const jumps = rules.filter((rule) => rule.target && isProxyChain(rule.target.name) && !isBuiltinChain(table.name, rule.target.name));
  return jumps.length > 0 ? jumps : undefined;
}

interface DiffLine {
  sign: '-' | '+';
  text: string;
  servicePort: string;
}

const noService = '';

/** targetInText reads the target of a rule in iptables-save order (matches first, then -j / -g) without parsing it. */
function targetInText(text: string): string | undefined {
  const at = Math.max(text.lastIndexOf(' -j '), text.lastIndexOf(' -g '));
  if (at < 0) return undefined;
  const end = text.indexOf(' ', at + 4);
  return text.slice(at + 4, end < 0 ? undefined : end);
}

function sameTexts(a: IptablesRule[], b: IptablesRule[]): boolean {
  if (a.length !== b.length) return false;
  for (let index = 0; index < a.length; index++) if (a[index].text !== b[index].text) return false;
  return true;
}

/**
 * ChainServices finds the service port of a hashed chain when a line of it differs: from its
 * rules' comments, else (large clusters leave comments out of endpoint rules) from the chain that
 * jumps to it.
 */
class ChainServices {
  private rulesets: IptablesRuleset[];
  private known = new Map<string, string | undefined>();
  private callers = new Map<string, Map<string, IptablesRule>>();
  private findCaller: DiffIptablesOptions['callerOf'];

  constructor(rulesets: IptablesRuleset[], findCaller?: DiffIptablesOptions['callerOf']) {
    this.rulesets = rulesets;
    this.findCaller = findCaller;
  }

  of(table: string, chain: string, depth = 0): string | undefined {
    if (!isServiceChainName(chain) || depth > 4) return undefined;
    const key = `${table} ${chain}`;
    if (this.known.has(key)) return this.known.get(key);
    let found: string | undefined;
    for (const ruleset of this.rulesets) {
      for (const rule of ruleset.tables.get(table)?.chains.get(chain)?.rules ?? []) {
        found = servicePortOfComment(rule.comment);
        if (found) break;
      }
      if (found) break;
    }
    if (!found) {
      const caller = this.callerOf(table, chain);
      if (caller) found = servicePortOfComment(caller.comment) ?? this.of(table, caller.chain, depth + 1);
    }
    this.known.set(key, found);
    return found;
  }

  /** The rule that jumps or goes to `chain`: in the chain findCaller names, else from every chain's rules. */
  private callerOf(table: string, chain: string): IptablesRule | undefined {
    const callingChain = this.findCaller?.(table, chain);
    if (callingChain === undefined) return this.callersOf(table).get(chain);
    for (const ruleset of this.rulesets)
      for (const rule of ruleset.tables.get(table)?.chains.get(callingChain)?.rules ?? [])
        if (targetInText(rule.text) === chain) return rule;
    return this.callersOf(table).get(chain);
  }

  private callersOf(table: string): Map<string, IptablesRule> {
    let callers = this.callers.get(table);
    if (callers) return callers;
    callers = new Map();
    for (const ruleset of this.rulesets) {
      for (const chain of ruleset.tables.get(table)?.chains.values() ?? []) {
        if (chain.kind !== 'proxy') continue;
        for (const rule of chain.rules) {
          const target = targetInText(rule.text);
          if (target && isServiceChainName(target) && !callers.has(target)) callers.set(target, rule);
        }
      }
    }
    this.callers.set(table, callers);
    return callers;
  }
}

/**
 * sequenceDiff lists what turns `applied` into `desired`: lines only desired ('+' in the groups'
 * sense: added) and lines only applied (removed), in chain order.
 */
function sequenceDiff(desired: string[], applied: string[]): Array<{kind: 'desired' | 'applied'; text: string}> {
  let start = 0;
  while (start < desired.length && start < applied.length && desired[start] === applied[start]) start++;
  let endDesired = desired.length;
  let endApplied = applied.length;
  while (endDesired > start && endApplied > start && desired[endDesired - 1] === applied[endApplied - 1]) {
    endDesired--;
    endApplied--;
  }
  const a = desired.slice(start, endDesired);
  const b = applied.slice(start, endApplied);
  const out: Array<{kind: 'desired' | 'applied'; text: string}> = [];
  if (a.length * b.length <= 4_000_000) {
    // Longest common subsequence over what differs.
    const width = b.length + 1;
    const lengths = new Uint32Array((a.length + 1) * width);
    for (let i = a.length - 1; i >= 0; i--) {
      for (let j = b.length - 1; j >= 0; j--) {
        lengths[i * width + j] =
          a[i] === b[j] ? lengths[(i + 1) * width + j + 1] + 1 : Math.max(lengths[(i + 1) * width + j], lengths[i * width + j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < a.length || j < b.length) {
      if (i < a.length && j < b.length && a[i] === b[j]) {
        i++;
        j++;
      } else if (i < a.length && (j === b.length || lengths[(i + 1) * width + j] >= lengths[i * width + j + 1])) {
        out.push({kind: 'desired', text: a[i++]});
      } else {
        out.push({kind: 'applied', text: b[j++]});
      }
    }
    return out;
  }
  // Too large to align: compare as multisets; a pure reordering shows every moved rule.
  const counts = new Map<string, number>();
  for (const line of b) counts.set(line, (counts.get(line) ?? 0) + 1);
  const onlyDesired: string[] = [];
  for (const line of a) {
    const count = counts.get(line) ?? 0;
    if (count > 0) counts.set(line, count - 1);
    else onlyDesired.push(line);
  }
  const onlyApplied = [...counts.entries()].flatMap(([line, count]) => Array<string>(count).fill(line));
  if (onlyDesired.length === 0 && onlyApplied.length === 0) {
    return [...a.map((text) => ({kind: 'desired' as const, text})), ...b.map((text) => ({kind: 'applied' as const, text}))];
  }
  return [
    ...onlyDesired.map((text) => ({kind: 'desired' as const, text})),
    ...onlyApplied.map((text) => ({kind: 'applied' as const, text})),
  ];
}

/**
 * Chains whose rules each match their own service address or port and end in the same kind of
 * verdict, so that their order decides nothing: kube-proxy writes them in Go map order, which
 * changes from sync to sync. nat KUBE-SERVICES keeps its jump to KUBE-NODEPORTS last.
 */
const orderFreeChains: Record<string, ReadonlySet<string>> = {
  nat: new Set([natChains.services, natChains.nodePorts]),
  filter: new Set([filterChains.services, filterChains.externalServices, filterChains.nodePorts, filterChains.proxyFirewall]),
};

/**
 * comparableOrder: the rule texts of an order-free chain sorted between its jumps to KUBE-NODEPORTS
 * (which keep their place), other chains' as they are.
 */
function comparableOrder(table: string, chain: string, texts: string[]): string[] {
  if (!orderFreeChains[table]?.has(chain)) return texts;
  const out: string[] = [];
  let run: string[] = [];
  for (const text of texts) {
    if (targetInText(text) !== natChains.nodePorts) {
      run.push(text);
      continue;
    }
    out.push(...run.sort(), text);
    run = [];
  }
  return [...out, ...run.sort()];
}

function sameOrderFree(table: string, chain: string, a: IptablesRule[], b: IptablesRule[]): boolean {
  if (!orderFreeChains[table]?.has(chain) || a.length !== b.length) return false;
  const sortedA = comparableOrder(
    table,
    chain,
    a.map((rule) => rule.text),
  );
  const sortedB = comparableOrder(
    table,
    chain,
    b.map((rule) => rule.text),
  );
  return sortedA.every((text, index) => text === sortedB[index]);
}

function matchesService(servicePort: string, filter: string | undefined): boolean {
  if (filter === undefined) return true;
  return filter.includes(':') ? servicePort === filter : servicePort === filter || servicePort.startsWith(`${filter}:`);
}

/**
 * diffIptables compares the proxy's rules: its chains (KUBE-SERVICES, KUBE-SVC-*, ...) and its jump
 * rules in built-in chains, table by table. Lines carry their table ("-t nat -A ..."); a chain that
 * exists on one side only also shows as "-t nat -N CHAIN". Hashed chains are grouped under the
 * service port their comments name.
 */
export function diffIptables(
  desired: string | IptablesRuleset,
  applied: string | IptablesRuleset,
  options: DiffIptablesOptions = {},
): IptablesDiff {
  const desiredRules = typeof desired === 'string' ? parseIptablesSave(desired) : desired;
  const appliedRules = typeof applied === 'string' ? parseIptablesSave(applied, {family: desiredRules.family}) : applied;
  const services = new ChainServices([desiredRules, appliedRules], options.callerOf);
  const lines: DiffLine[] = [];

  const tables = [...new Set([...desiredRules.tables.keys(), ...appliedRules.tables.keys()])].sort();
  for (const table of tables) {
    const want = desiredRules.tables.get(table);
    const have = appliedRules.tables.get(table);
    let chains = options.chainsToCompare?.(table);
    if (chains === undefined) {
      const every = [...(want?.chains.keys() ?? [])];
      for (const chain of have?.chains.keys() ?? []) if (!want?.chains.has(chain)) every.push(chain);
      chains = every;
    }
    for (const chain of [...chains].sort()) {
      const wantRules = comparedRules(want, chain);
      const haveRules = comparedRules(have, chain);
      if (!wantRules && !haveRules) continue;
      if (wantRules && haveRules && sameTexts(wantRules, haveRules)) continue;
      if (wantRules && haveRules && sameOrderFree(table, chain, wantRules, haveRules)) continue;
      const chainService = services.of(table, chain);
      // A rule's comment is read (its parts parsed) only for the lines that differ: in a chain of
      // 10,000 rules where one differs, reading every comment costs more than the rest of the diff.
      const ruleOf = new Map<string, IptablesRule>();
      for (const rules of [wantRules, haveRules]) for (const rule of rules ?? []) ruleOf.set(rule.text, rule);
      const serviceOf = (text: string) => chainService ?? servicePortOfComment(ruleOf.get(text)?.comment) ?? noService;
      if (isProxyChain(chain) && (wantRules === undefined) !== (haveRules === undefined)) {
        lines.push({sign: wantRules ? '-' : '+', text: `-t ${table} -N ${chain}`, servicePort: chainService ?? noService});
      }
      const texts = (rules: IptablesRule[] | undefined) =>
        comparableOrder(
          table,
          chain,
          (rules ?? []).map((rule) => rule.text),
        );
      for (const entry of sequenceDiff(texts(wantRules), texts(haveRules))) {
        lines.push({sign: entry.kind === 'desired' ? '-' : '+', text: `-t ${table} ${entry.text}`, servicePort: serviceOf(entry.text)});
      }
    }
  }

  const byService = new Map<string, IptablesDiffGroup>();
  const textLines = new Map<string, string[]>();
  for (const line of lines) {
    if (!matchesService(line.servicePort, options.service)) continue;
    let group = byService.get(line.servicePort);
    if (!group) {
      group = {servicePort: line.servicePort, added: [], removed: []};
      byService.set(line.servicePort, group);
      textLines.set(line.servicePort, []);
    }
    // '-' lines are desired and missing from the kernel: a sync adds them.
    (line.sign === '-' ? group.added : group.removed).push(line.text);
    textLines.get(line.servicePort)!.push(`${line.sign}${line.text}`);
  }
  const order = [...byService.keys()].sort((a, b) => (a === noService ? 1 : b === noService ? -1 : a < b ? -1 : a > b ? 1 : 0));
  const groups = order.map((key) => byService.get(key)!);
  if (groups.length === 0) return {equal: true, groups: [], text: ''};
  const text = [
    '--- desired',
    '+++ applied',
    ...order.flatMap((key) => [`@@ ${key === noService ? '(rules of no service)' : key} @@`, ...textLines.get(key)!]),
  ].join('\n');
  return {equal: false, groups, text: `${text}\n`};
}
