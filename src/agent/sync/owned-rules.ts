// Which iptables chains and rules belong to the proxy (kube-proxy's names, so that rules left by
// kube-proxy are ours to replace), and the normalised view of them in iptables-save output that
// drift detection compares and --cleanup removes. Chains of kubelet (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-MARK-DROP) and of anyone else are foreign and never touched.
import type {IptablesTable} from '../host/host.ts';

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

export interface OwnedRules {
  table: IptablesTable;
  /** Owned chains that exist. */
  chains: string[];
  /** Rules inside owned chains, and rules elsewhere that jump or go to an owned chain, as iptables-save prints them, in order. */
  rules: string[];
  /** The subset of rules that sit in foreign (mostly built-in) chains: the jump rules. */
  jumpRules: string[];
}

/** readOwnedRules picks the proxy's part of one table out of `iptables-save -t TABLE` output. */
export function readOwnedRules(table: IptablesTable, saveText: string): OwnedRules {
  const chains: string[] = [];
  const rules: string[] = [];
  const jumpRules: string[] = [];
  let inTable = false;
  for (const raw of saveText.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('*')) {
      inTable = line === `*${table}`;
      continue;
    }
    if (!inTable || line === '' || line.startsWith('#') || line === 'COMMIT') continue;
    if (line.startsWith(':')) {
      const chain = line.slice(1).split(/\s+/)[0];
      if (isOwnedChain(table, chain)) chains.push(chain);
      continue;
    }
    const rule = /^-A\s+(\S+)/.exec(line);
    if (!rule) continue;
    // Packet counters ("[12:3456] -A ...", iptables-save -c) never mean a rule changed.
    const text = line.replace(/^\[\d+:\d+\]\s+/, '');
    if (isOwnedChain(table, rule[1])) {
      rules.push(text);
      continue;
    }
    const target = /\s-[jg]\s+(\S+)/.exec(text);
    if (target && isOwnedChain(table, target[1])) {
      rules.push(text);
      jumpRules.push(text);
    }
  }
  return {table, chains, rules, jumpRules};
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
 * sameOwnedRules: both views have the same chains, and each chain the same rules in the same
 * order. The order of the chains themselves does not matter: iptables-save lists them in the order
 * the kernel keeps them, which a rewrite can change.
 */
export function sameOwnedRules(a: OwnedRules, b: OwnedRules): boolean {
  if (a.chains.length !== b.chains.length || a.rules.length !== b.rules.length) return false;
  const bChains = new Set(b.chains);
  if (!a.chains.every((chain) => bChains.has(chain))) return false;
  const aRules = rulesByChain(a);
  const bRules = rulesByChain(b);
  if (aRules.size !== bRules.size) return false;
  for (const [chain, rules] of aRules) if (rules.join('\n') !== bRules.get(chain)?.join('\n')) return false;
  return true;
}

/**
 * afterPartialWrite is what the proxy's part of a table should be after a write that replaced only
 * the `written` chains: those as the kernel holds them now, every other owned chain and every jump
 * rule as they were after the previous write. Taking the whole table from the kernel instead would
 * adopt whatever someone changed meanwhile in chains the write did not touch, and that drift would
 * never be repaired while partial syncs keep coming.
 */
export function afterPartialWrite(previous: OwnedRules, now: OwnedRules, written: ReadonlySet<string>): OwnedRules {
  const previousRules = rulesByChain(previous);
  const nowRules = rulesByChain(now);
  const nowChains = new Set(now.chains);
  const chains = [...previous.chains.filter((chain) => !written.has(chain)), ...now.chains.filter((chain) => written.has(chain))];
  const rules = [...previous.jumpRules];
  for (const chain of chains) rules.push(...((written.has(chain) ? nowRules : previousRules).get(chain) ?? []));
  // A written chain the kernel no longer has was deleted by the write (a stale chain): gone from both.
  return {table: now.table, chains: chains.filter((chain) => !written.has(chain) || nowChains.has(chain)), rules, jumpRules: [...previous.jumpRules]};
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
export function describeDrift(written: OwnedRules, now: OwnedRules, limit = 3): string {
  const differences: string[] = [];
  const nowChains = new Set(now.chains);
  const writtenChains = new Set(written.chains);
  for (const chain of written.chains) if (!nowChains.has(chain)) differences.push(`chain ${chain} missing`);
  for (const chain of now.chains) if (!writtenChains.has(chain)) differences.push(`chain ${chain} added`);
  const nowRules = new Set(now.rules);
  const writtenRules = new Set(written.rules);
  for (const rule of written.rules) if (!nowRules.has(rule)) differences.push(`rule missing: ${rule}`);
  for (const rule of now.rules) if (!writtenRules.has(rule)) differences.push(`rule added: ${rule}`);
  if (differences.length === 0 && written.rules.join('\n') !== now.rules.join('\n')) differences.push('rules reordered');
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
