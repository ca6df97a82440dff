// diffNftables: desired table (render output) against applied table (the kernel's listing), line
// by line, grouped by service port. Endpoint-choice keys (numgen offsets) differ between a full
// render and a history of partial syncs, so rules that pick from an endpoint map are compared by
// the endpoints they can reach, not by their keys; elements clients add to affinity sets at run
// time, emptied chains waiting for deletion, counter values, and the order of chains, sets and
// elements are not differences (rules keep their order inside a chain: it decides).
import type {NftChain, NftRuleset, NftSet} from './parse.ts';

/** DiffGroup: the changes of one service port (the protocol's DiffGroup has the same shape). */
export interface DiffGroup {
  /** Service port key ("ns/name:port"), or "" for lines that belong to no service. */
  servicePort: string;
  /** Lines desired but missing from the kernel. */
  added: string[];
  /** Lines in the kernel that are not desired. */
  removed: string[];
}

export interface NftablesDiff {
  equal: boolean;
  groups: DiffGroup[];
  text: string;
}

/**
 * SameParts: chains and sets a diff found to hold the same lines on both sides, as desired part ->
 * applied part (the objects). A later diff between rulesets that share those objects (an applied
 * ruleset patched after a foreign change, the same desired one) skips them unread: at 10,000
 * services that is 120,000 chains not spelled out again for one changed map.
 */
export type SameParts = WeakMap<NftChain | NftSet, NftChain | NftSet>;

export interface DiffNftablesOptions {
  /** "ns/name[:port]": only that service's lines. */
  service?: string;
  /** Parts known to be the same, skipped; a whole diff (no service) adds the parts it finds the same. */
  sameParts?: SameParts;
}

const perServiceName = /^(?:service|local|external|firewall|endpoint)-[A-Z0-9]{8}-([^/]+)\/([^/]+)\/[a-z]+\/([^_]*?)(?:__.*)?$/;

function servicePortOfChain(name: string): string | undefined {
  const match = perServiceName.exec(name);
  return match ? `${match[1]}/${match[2]}${match[3] ? `:${match[3]}` : ''}` : undefined;
}

const endpointMapRule = /numgen random mod (\d+)(?: offset (\d+))? map @(endpoint-targets-[\w-]+)/;

/** resolveEndpointChoice replaces the keys of an endpoint-map rule with the endpoints behind them. */
function resolveEndpointChoice(ruleset: NftRuleset, rule: string): string {
  const match = endpointMapRule.exec(rule);
  if (!match) return rule;
  const [, modulus, offset = '0', map] = match;
  const elements = new Map((ruleset.sets.get(map)?.elements ?? []).map((element) => [element.key, element.value]));
  const targets = Array.from({length: Number(modulus)}, (_, index) => elements.get(String(Number(offset) + index)) ?? '(missing)');
  return rule.replace(endpointMapRule, `numgen random mod ${modulus} map { ${targets.join(', ')} }`);
}

interface Line {
  servicePort: string;
  text: string;
  /** The chain or set the line is of. */
  part: NftChain | NftSet;
}

/**
 * Whether `part` of `ruleset` is known to hold the same lines as the other side's part of its
 * name (`desiredSide`: whether `ruleset` is the desired one). One object on both sides is: only
 * shareSameParts puts a part on both, and never one that picks from an endpoint map.
 */
function knownSame(part: NftChain | NftSet, other: Map<string, NftChain | NftSet>, desiredSide: boolean, same?: SameParts): boolean {
  if (!same) return false;
  const counterpart = other.get(part.name);
  if (counterpart === part) return true;
  if (!counterpart) return false;
  return desiredSide ? same.get(part) === counterpart : same.get(counterpart) === part;
}

/** The lines of `ruleset`'s parts not known to be the same as `other`'s; `compared` gets those parts. */
function linesOf(
  ruleset: NftRuleset,
  other: NftRuleset,
  desiredSide: boolean,
  same?: SameParts,
  compared?: Set<NftChain | NftSet>,
): Line[] {
  const lines: Line[] = [];
  for (const chain of ruleset.chains.values()) {
    if (knownSame(chain, other.chains, desiredSide, same)) continue;
    compared?.add(chain);
    const servicePort = servicePortOfChain(chain.name);
    // An emptied per-service chain the other side lacks is stale, waiting for its deletion.
    if (servicePort !== undefined && chain.rules.length === 0 && !other.chains.has(chain.name)) continue;
    const base =
      chain.hook !== undefined
        ? ` { type ${chain.type} hook ${chain.hook} priority ${chain.priority} ; policy ${chain.policy ?? 'accept'} ; }`
        : '';
    lines.push({servicePort: servicePort ?? '', text: `chain ${chain.name}${base}`, part: chain});
    chain.rules.forEach((rule, index) => {
      // A counter's values change with traffic; whether the rule counts is what is compared.
      const counted = rule.text.replace(/\bcounter packets \d+ bytes \d+/g, 'counter');
      const text = resolveEndpointChoice(ruleset, rule.comment !== undefined ? `${counted} comment "${rule.comment}"` : counted);
      lines.push({servicePort: servicePort ?? '', text: `rule ${chain.name} #${index + 1}: ${text}`, part: chain});
    });
  }
  for (const set of ruleset.sets.values()) {
    if (set.name.startsWith('endpoint-targets-') || knownSame(set, other.sets, desiredSide, same)) continue;
    compared?.add(set);
    const affinity = set.name.startsWith('affinity-');
    const owner = affinity ? (servicePortOfChain(`endpoint${set.name.slice('affinity'.length)}`) ?? '') : '';
    // nft -j leaves out "dynamic", which the kernel adds to any set a rule updates.
    const flags = set.flags.filter((flag) => flag !== 'dynamic');
    lines.push({
      servicePort: owner,
      part: set,
      text:
        `${set.kind} ${set.name}` +
        (flags.length > 0 ? ` flags ${flags.join(',')}` : '') +
        (set.timeoutSeconds !== undefined ? ` timeout ${set.timeoutSeconds}s` : ''),
    });
    if (affinity) continue;
    for (const element of set.elements) {
      const target = /^(?:goto|jump) (\S+)$/.exec(element.value ?? '')?.[1];
      const servicePort =
        (target !== undefined ? servicePortOfChain(target) : undefined) ??
        (element.comment && /^[^/\s]+\/\S+$/.test(element.comment) ? element.comment : '');
      const comment = element.comment !== undefined ? ` comment "${element.comment}"` : '';
      lines.push({
        servicePort,
        part: set,
        text: `element ${set.name} { ${element.key}${comment}${element.value !== undefined ? ` : ${element.value}` : ''} }`,
      });
    }
  }
  return lines;
}

function partKey(part: NftChain | NftSet): string {
  return `${'rules' in part ? 'chain' : 'set'} ${part.name}`;
}

/**
 * Adds to `same` the desired parts compared that the applied side has too and whose lines did not
 * differ. A chain that picks from an endpoint map reads that map's elements too
 * (resolveEndpointChoice), so it is not remembered.
 */
function rememberSameParts(compared: Set<NftChain | NftSet>, applied: NftRuleset, differing: Set<string>, same: SameParts): void {
  const pickedFromMap = (part: NftChain | NftSet) => 'rules' in part && part.rules.some((rule) => endpointMapRule.test(rule.text));
  for (const part of compared) {
    const counterpart = 'rules' in part ? applied.chains.get(part.name) : applied.sets.get(part.name);
    if (!counterpart || differing.has(partKey(part)) || pickedFromMap(part) || pickedFromMap(counterpart)) continue;
    same.set(part, counterpart);
  }
}

/**
 * shareSameParts puts in `applied` the desired chain or set in place of each of its own that a
 * diff found the same (in `same`), so that a caller who keeps both tables keeps one copy of what
 * they share (an observer: at 10,000 services each table is about 100 MiB parsed). What `applied`
 * says does not change: a chain is taken only when its rules read exactly the same (a counter's
 * values included), a set when its elements do, in any order.
 */
export function shareSameParts(desired: NftRuleset, applied: NftRuleset, same: SameParts): void {
  for (const [name, chain] of applied.chains) {
    const mine = desired.chains.get(name);
    if (!mine || mine === chain || same.get(mine) !== chain) continue;
    const identical = (rule: NftChain['rules'][number], index: number) =>
      rule.text === mine.rules[index].text && rule.comment === mine.rules[index].comment;
    if (chain.rules.length !== mine.rules.length || !chain.rules.every(identical)) continue;
    applied.chains.set(name, mine);
    same.set(mine, mine);
  }
  for (const [name, set] of applied.sets) {
    const mine = desired.sets.get(name);
    if (!mine || mine === set || same.get(mine) !== set) continue;
    applied.sets.set(name, mine);
    same.set(mine, mine);
  }
}

function matchesService(servicePort: string, filter: string | undefined): boolean {
  if (filter === undefined) return true;
  return servicePort === filter || servicePort.startsWith(`${filter}:`);
}

/** diffNftables compares two tables; `service` ("ns/name[:port]") keeps only that service's lines. */
export function diffNftables(desired: NftRuleset, applied: NftRuleset, options: DiffNftablesOptions = {}): NftablesDiff {
  const {sameParts} = options;
  // The desired parts compared now (the rest were known to be the same): those found the same are remembered.
  const compared = new Set<NftChain | NftSet>();
  const want = linesOf(desired, applied, true, sameParts, compared);
  const have = linesOf(applied, desired, false, sameParts);
  const count = (lines: Line[]) => {
    const counts = new Map<string, {line: Line; count: number}>();
    for (const line of lines) {
      const key = `${line.servicePort}\0${line.text}`;
      const entry = counts.get(key);
      if (entry) entry.count++;
      else counts.set(key, {line, count: 1});
    }
    return counts;
  };
  const wanted = count(want);
  const held = count(have);
  const groups = new Map<string, DiffGroup>();
  const group = (servicePort: string) => {
    let found = groups.get(servicePort);
    if (!found) groups.set(servicePort, (found = {servicePort, added: [], removed: []}));
    return found;
  };
  // Parts with a line on one side only, by name (`chain X`, `set Y`): the rest hold the same lines.
  const differing = new Set<string>();
  for (const [key, {line, count: n}] of wanted) {
    const missing = n - (held.get(key)?.count ?? 0);
    if (missing > 0) differing.add(partKey(line.part));
    for (let index = 0; index < missing; index++)
      if (matchesService(line.servicePort, options.service)) group(line.servicePort).added.push(line.text);
  }
  for (const [key, {line, count: n}] of held) {
    const extra = n - (wanted.get(key)?.count ?? 0);
    if (extra > 0) differing.add(partKey(line.part));
    for (let index = 0; index < extra; index++)
      if (matchesService(line.servicePort, options.service)) group(line.servicePort).removed.push(line.text);
  }
  if (sameParts && options.service === undefined) rememberSameParts(compared, applied, differing, sameParts);
  const sorted = [...groups.values()].sort((a, b) => (a.servicePort < b.servicePort ? -1 : a.servicePort > b.servicePort ? 1 : 0));
  const text = sorted
    .map((entry) =>
      [
        `# ${entry.servicePort || '(not a service)'}`,
        // As iptables mode's diff and `kubectl proxyctl diff` say: "-" is desired and missing from the
        // kernel, "+" is in the kernel and not desired.
        ...entry.added.map((line) => `- ${line}`),
        ...entry.removed.map((line) => `+ ${line}`),
      ].join('\n'),
    )
    .join('\n');
  return {equal: sorted.length === 0, groups: sorted, text: text === '' ? '' : `${text}\n`};
}
