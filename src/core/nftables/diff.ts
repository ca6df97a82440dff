// diffNftables: desired table (render output) against applied table (the kernel's listing), line
// by line, grouped by service port. Endpoint-choice keys (numgen offsets) differ between a full
// render and a history of partial syncs, so rules that pick from an endpoint map are compared by
// the endpoints they can reach, not by their keys; elements clients add to affinity sets at run
// time, emptied chains waiting for deletion, counter values, and the order of chains, sets and
// elements are not differences (rules keep their order inside a chain: it decides).
import {type NftChain, type NftRuleset, type NftSet, ruleComment, ruleText} from './parse.ts';

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
  /**
   * The parts whose lines differ: with the parts changed since, the only ones a diff of the same
   * desired table against the applied one changed part by part need compare (comparedParts).
   */
  differingParts: PartNames;
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
  /**
   * The only parts that may differ: every other part the caller knows holds the same lines on
   * both sides (an applied table changed part by part since a diff against the same desired one
   * named its differing parts). At 10,000 services that is 120,000 chains not walked for a
   * changed map. Undefined compares every part.
   */
  comparedParts?: PartNames;
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
}

/**
 * Whether desired `part` is known to hold the same lines as `counterpart`, the applied side's part of its name.
 * One object on both sides is: only shareSameParts puts a part on both, and never one that picks
 * from an endpoint map.
 */
function knownSame(part: NftChain | NftSet, counterpart: NftChain | NftSet | undefined, same?: SameParts): boolean {
  return same !== undefined && counterpart !== undefined && (counterpart === part || same.get(part) === counterpart);
}

/** A chain's lines: its declaration and its rules, in order; none for an emptied per-service chain `other` lacks. */
function chainLines(ruleset: NftRuleset, chain: NftChain, other: NftRuleset): Line[] {
  const servicePort = servicePortOfChain(chain.name);
  // An emptied per-service chain the other side lacks is stale, waiting for its deletion.
  if (servicePort !== undefined && chain.rules.length === 0 && !other.chains.has(chain.name)) return [];
  const base =
    chain.hook !== undefined
      ? ` { type ${chain.type} hook ${chain.hook} priority ${chain.priority} ; policy ${chain.policy ?? 'accept'} ; }`
      : '';
  const lines: Line[] = [{servicePort: servicePort ?? '', text: `chain ${chain.name}${base}`}];
  chain.rules.forEach((rule, index) => {
    // A counter's values change with traffic; whether the rule counts is what is compared.
    const counted = ruleText(rule).replace(/\bcounter packets \d+ bytes \d+/g, 'counter');
    const comment = ruleComment(rule);
    const text = resolveEndpointChoice(ruleset, comment !== undefined ? `${counted} comment "${comment}"` : counted);
    lines.push({servicePort: servicePort ?? '', text: `rule ${chain.name} #${index + 1}: ${text}`});
  });
  return lines;
}

/** A set's lines: its declaration and its elements (an affinity set's elements are clients', added at run time). */
function setLines(set: NftSet): Line[] {
  const affinity = set.name.startsWith('affinity-');
  const owner = affinity ? (servicePortOfChain(`endpoint${set.name.slice('affinity'.length)}`) ?? '') : '';
  // nft -j leaves out "dynamic", which the kernel adds to any set a rule updates.
  const flags = set.flags.filter((flag) => flag !== 'dynamic');
  const lines: Line[] = [
    {
      servicePort: owner,
      text:
        `${set.kind} ${set.name}` +
        (flags.length > 0 ? ` flags ${flags.join(',')}` : '') +
        (set.timeoutSeconds !== undefined ? ` timeout ${set.timeoutSeconds}s` : ''),
    },
  ];
  if (affinity) return lines;
  for (const element of set.elements) {
    const target = /^(?:goto|jump) (\S+)$/.exec(element.value ?? '')?.[1];
    const servicePort =
      (target !== undefined ? servicePortOfChain(target) : undefined) ??
      (element.comment && /^[^/\s]+\/\S+$/.test(element.comment) ? element.comment : '');
    const comment = element.comment !== undefined ? ` comment "${element.comment}"` : '';
    lines.push({
      servicePort,
      text: `element ${set.name} { ${element.key}${comment}${element.value !== undefined ? ` : ${element.value}` : ''} }`,
    });
  }
  return lines;
}

/** Whether two parts' lines are the same: in order for a chain (its rules' order decides), in any order for a set. */
function sameLines(mine: Line[], theirs: Line[], ordered: boolean): boolean {
  if (mine.length !== theirs.length) return false;
  if (ordered) return mine.every((line, index) => line.text === theirs[index].text);
  const texts = new Set(mine.map((line) => line.text));
  return texts.size === mine.length && theirs.every((line) => texts.has(line.text));
}

/** The parts of a table by name, chains and sets apart (a chain and a set may share a name). */
export interface PartNames {
  chains: ReadonlySet<string>;
  sets: ReadonlySet<string>;
}

/** A part whose lines differ, or that one side alone has: its lines on each side. */
interface DifferingPart {
  kind: 'chain' | 'set';
  name: string;
  want: Line[];
  have: Line[];
}

/**
 * The parts whose lines differ (or that one side alone has), chains then sets, each by name.
 * Each part the two sides hold the same of adds nothing; with `same`, a whole diff remembers it
 * (a chain that picks from an endpoint map reads that map's elements too,
 * resolveEndpointChoice, and is not remembered). `compared`: the only parts that may differ;
 * undefined compares every part.
 */
function differingParts(
  desired: NftRuleset,
  applied: NftRuleset,
  same: SameParts | undefined,
  remember: boolean,
  compared: PartNames | undefined,
): DifferingPart[] {
  const found: DifferingPart[] = [];
  const compare = <Part extends NftChain | NftSet>(
    kind: DifferingPart['kind'],
    mine: Part | undefined,
    theirs: Part | undefined,
    lines: (part: Part, ruleset: NftRuleset) => Line[],
  ) => {
    if (mine && knownSame(mine, theirs, same)) return;
    const want = mine ? lines(mine, desired) : [];
    const have = theirs ? lines(theirs, applied) : [];
    if (mine && theirs && sameLines(want, have, kind === 'chain')) {
      if (same && remember && !pickedFromMap(mine) && !pickedFromMap(theirs)) same.set(mine, theirs);
      return;
    }
    if (want.length > 0 || have.length > 0) found.push({kind, name: (mine ?? theirs)!.name, want, have});
  };
  const chainLinesOf = (chain: NftChain, ruleset: NftRuleset) => chainLines(ruleset, chain, ruleset === desired ? applied : desired);
  const compareChain = (name: string) => compare('chain', desired.chains.get(name), applied.chains.get(name), chainLinesOf);
  const compareSet = (name: string) => {
    if (!name.startsWith('endpoint-targets-')) compare('set', desired.sets.get(name), applied.sets.get(name), setLines);
  };
  if (compared) {
    for (const name of compared.chains) compareChain(name);
    for (const name of compared.sets) compareSet(name);
  } else {
    for (const name of desired.chains.keys()) compareChain(name);
    for (const name of applied.chains.keys()) if (!desired.chains.has(name)) compareChain(name);
    for (const name of desired.sets.keys()) compareSet(name);
    for (const name of applied.sets.keys()) if (!desired.sets.has(name)) compareSet(name);
  }
  // Whichever parts were compared, and in whatever order, the lines come in one order.
  return found.sort((a, b) => (a.kind !== b.kind ? (a.kind === 'chain' ? -1 : 1) : a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

function pickedFromMap(part: NftChain | NftSet): boolean {
  return 'rules' in part && part.rules.some((rule) => endpointMapRule.test(ruleText(rule)));
}

/**
 * shareSameParts puts in `applied` the desired chain or set in place of each of its own that a
 * diff found the same (in `same`), so that a caller who keeps both tables keeps one copy of what
 * they share (an observer: at 10,000 services each table is about 100 MiB parsed). What `applied`
 * says does not change: a chain is taken only when its rules read exactly the same (a counter's
 * values included), a set when its flags and elements do (elements in any order). `compared`:
 * the only parts the diff compared (DiffNftablesOptions.comparedParts).
 */
export function shareSameParts(desired: NftRuleset, applied: NftRuleset, same: SameParts, compared?: PartNames): void {
  for (const name of compared?.chains ?? applied.chains.keys()) {
    const chain = applied.chains.get(name);
    const mine = desired.chains.get(name);
    if (!chain || !mine || mine === chain || same.get(mine) !== chain) continue;
    const identical = (rule: NftChain['rules'][number], index: number) =>
      ruleText(rule) === ruleText(mine.rules[index]) && ruleComment(rule) === ruleComment(mine.rules[index]);
    if (chain.rules.length !== mine.rules.length || !chain.rules.every(identical)) continue;
    applied.chains.set(name, mine);
    // knownSame finds a shared part by identity: its entry would only hold memory (a table of
    // 110,000 pairs at 10,000 services).
    same.delete(mine);
  }
  for (const name of compared?.sets ?? applied.sets.keys()) {
    const set = applied.sets.get(name);
    const mine = desired.sets.get(name);
    if (!set || !mine || mine === set || same.get(mine) !== set || !identicalSets(mine, set)) continue;
    applied.sets.set(name, mine);
    same.delete(mine);
  }
}

/**
 * Whether two sets say exactly the same, flags and every element included (the diff passes over
 * the "dynamic" flag and an affinity set's elements, which a trace reads).
 */
function identicalSets(mine: NftSet, theirs: NftSet): boolean {
  if (mine.kind !== theirs.kind || mine.timeoutSeconds !== theirs.timeoutSeconds) return false;
  if (mine.flags.join() !== theirs.flags.join() || mine.elements.length !== theirs.elements.length) return false;
  const text = (element: NftSet['elements'][number]) => `${element.key}\0${element.value ?? ''}\0${element.comment ?? ''}`;
  const elements = new Set(mine.elements.map(text));
  return elements.size === mine.elements.length && theirs.elements.every((element) => elements.has(text(element)));
}

function matchesService(servicePort: string, filter: string | undefined): boolean {
  if (filter === undefined) return true;
  return servicePort === filter || servicePort.startsWith(`${filter}:`);
}

/** diffNftables compares two tables; `service` ("ns/name[:port]") keeps only that service's lines. */
export function diffNftables(desired: NftRuleset, applied: NftRuleset, options: DiffNftablesOptions = {}): NftablesDiff {
  // Only a whole diff remembers what it found the same: a diff of one service filters lines.
  const parts = differingParts(desired, applied, options.sameParts, options.service === undefined, options.comparedParts);
  const want = parts.flatMap((part) => part.want);
  const have = parts.flatMap((part) => part.have);
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
  for (const [key, {line, count: n}] of wanted) {
    const missing = n - (held.get(key)?.count ?? 0);
    for (let index = 0; index < missing; index++)
      if (matchesService(line.servicePort, options.service)) group(line.servicePort).added.push(line.text);
  }
  for (const [key, {line, count: n}] of held) {
    const extra = n - (wanted.get(key)?.count ?? 0);
    for (let index = 0; index < extra; index++)
      if (matchesService(line.servicePort, options.service)) group(line.servicePort).removed.push(line.text);
  }
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
  const named = (kind: DifferingPart['kind']) => new Set(parts.filter((part) => part.kind === kind).map((part) => part.name));
  return {
    equal: sorted.length === 0,
    groups: sorted,
    text: text === '' ? '' : `${text}\n`,
    differingParts: {chains: named('chain'), sets: named('set')},
  };
}
