// explainDrift: an observing agent's diff groups, each explained by Service for a person on call:
// "not programmed on this node", "endpoint 10.244.1.7 still programmed, removed from the
// EndpointSlice 4m ago", "rule not written by kube-proxy", "no kube-proxy rules at all on this
// node". It reads the rule lines the backends' diff gives (any mode: the addresses in them) and
// searches the applied rules' text, so it needs nothing of a backend beyond what diff already
// answers and the text, searched as the rules allow.
import {joinHostPort, type ProxyModel, type ServicePort} from '../../core/model/index.ts';
import type {DiffGroup, DriftExplanation} from '../../protocol/methods.ts';
import type {EndpointHistory} from './observing-proxier.ts';

export interface DriftContext {
  /** The desired models, every family. */
  models: ProxyModel[];
  /** The applied rules' text, every family (what kube-proxy programmed). */
  applied: AppliedText;
  history: EndpointHistory;
  now: number;
}

/**
 * The applied rules' text, searched for a name or read whole. Rules that keep their text in pieces
 * (iptables' patched readings, nftables' parsed table) find the lines holding a name without
 * putting the whole text together.
 */
export interface AppliedText {
  /** The lines that hold `needle`. */
  linesWith(needle: string): Iterable<string>;
  /**
   * The lines that hold `needle` in the pieces (chains, sets) that `near` names: rule lines the
   * question is about, a drifted group's. Most of what a question asks of a drifted service is in
   * the pieces its drifted lines name, and those are read alone where the whole text is tens of MB
   * at 10,000 services. None where the text is not kept in pieces.
   */
  linesNear(needle: string, near: readonly string[]): Iterable<string>;
  whole(): string;
}

/** AppliedText of a text in one string, read once when first asked for. */
export function wholeText(read: () => string): AppliedText {
  let text: string | undefined;
  const whole = () => (text ??= read());
  return {
    *linesWith(needle) {
      const all = whole();
      for (let at = all.indexOf(needle); at >= 0; at = all.indexOf(needle, at + 1)) {
        const start = all.lastIndexOf('\n', at) + 1;
        const end = all.indexOf('\n', at);
        yield all.slice(start, end < 0 ? undefined : end);
        if (end < 0) return;
        at = end;
      }
    },
    linesNear: () => [],
    whole,
  };
}

/** How many unexplained rules an explanation lists before it says how many more there are. */
const rulesListed = 3;

export function explainDrift(groups: DiffGroup[], context: DriftContext): DiffGroup[] {
  const ports = new Map<string, ServicePort[]>();
  for (const model of context.models) for (const port of model.servicePorts) ports.set(port.key, [...(ports.get(port.key) ?? []), port]);
  const drifted = groups.filter((group) => group.added.length > 0 || group.removed.length > 0);
  if (drifted.length === 0) return groups;
  const parts: GroupContext = {...context, isProgrammed: programmedCheck(context.applied), isApplied: appliedAddressCheck(context.applied)};
  // Whether kube-proxy's rules name any service port: mostly answered by a drifted port, near
  // its group's lines, without a search through the whole text.
  const anyProgrammed =
    drifted.some((group) =>
      (ports.get(group.servicePort) ?? []).some((port) => programmedNear(port, context.applied, [...group.added, ...group.removed])),
    ) || [...ports.values()].some((list) => list.some((port) => parts.isProgrammed(port)));
  return groups.map((group) => {
    if (group.added.length === 0 && group.removed.length === 0) return group;
    const list = ports.get(group.servicePort) ?? [];
    return {...group, explanations: explainGroup(group, list, parts, ports.size > 0 && !anyProgrammed)};
  });
}

/**
 * An endpoint that is programmed but left the EndpointSlice (stale), or joined it and is not
 * programmed (missing); `at` is when the observer saw that happen, if it did.
 */
function endpointExplanation(
  kind: 'stale-endpoint' | 'missing-endpoint',
  ip: string,
  at: number | undefined,
  now: number,
): DriftExplanation {
  const [state, event] = kind === 'stale-endpoint' ? ['still programmed', 'removed from'] : ['not programmed', 'added to'];
  if (at === undefined)
    return {
      kind,
      endpoint: ip,
      text: kind === 'stale-endpoint' ? `endpoint ${ip} ${state}, not in the EndpointSlices` : `endpoint ${ip} ${state}`,
    };
  return {
    kind,
    endpoint: ip,
    text: `endpoint ${ip} ${state}, ${event} the EndpointSlice ${age(now - at)} ago`,
    since: new Date(at).toISOString(),
  };
}

function explainGroup(group: DiffGroup, ports: ServicePort[], context: GroupContext, nothingProgrammed: boolean): DriftExplanation[] {
  if (nothingProgrammed) return [{kind: 'no-kube-proxy-rules', text: 'no kube-proxy rules at all on this node'}];
  // Asked last: whether the rules name the port is a search through them.
  if (ports.length > 0 && group.removed.length === 0 && !ports.some((port) => context.isProgrammed(port, group.added)))
    return [{kind: 'not-programmed', text: 'not programmed on this node'}];
  // A service port the cluster no longer has, still programmed.
  if (ports.length === 0 && group.servicePort !== '' && group.added.length === 0)
    return [{kind: 'stale-service', text: 'still programmed on this node, no longer a port of any Service'}];
  // Rules of no service port name no endpoint: whatever differs there is a rule.
  if (ports.length === 0) return ruleExplanations(group);
  const current = new Set(ports.flatMap((port) => port.endpoints.map((endpoint) => endpoint.ip)));
  const serviceIPs = new Set(ports.flatMap((port) => [port.clusterIP, ...port.externalIPs, ...port.loadBalancerIPs]));
  const explanations: DriftExplanation[] = [];
  const stale = new Set<string>();
  for (const line of group.removed) for (const ip of addressesIn(line)) if (!current.has(ip) && !serviceIPs.has(ip)) stale.add(ip);
  for (const ip of stale)
    explanations.push(endpointExplanation('stale-endpoint', ip, context.history.leftAt(group.servicePort, ip), context.now));
  const missing = new Set<string>();
  for (const line of group.added)
    for (const ip of addressesIn(line)) if (current.has(ip) && !missing.has(ip) && !context.isApplied(ip, group.added)) missing.add(ip);
  for (const ip of missing)
    explanations.push(endpointExplanation('missing-endpoint', ip, context.history.joinedAt(group.servicePort, ip), context.now));
  return explanations.length > 0 ? explanations : ruleExplanations(group);
}

/** A rule in kube-proxy's chains it would not write, and one it should have written that is missing. */
function ruleExplanations(group: DiffGroup): DriftExplanation[] {
  const explanations: DriftExplanation[] = [];
  if (group.removed.length > 0) explanations.push({kind: 'foreign-rule', text: `rule not written by kube-proxy: ${listed(group.removed)}`});
  if (group.added.length > 0)
    explanations.push({kind: 'missing-rule', text: `rule kube-proxy should have written is missing: ${listed(group.added)}`});
  return explanations;
}

/** What explaining one group needs beyond DriftContext: questions about the applied rules, answered from indexes made once. */
interface GroupContext extends DriftContext {
  /** `near`: the lines of the group asking, whose pieces are searched first (AppliedText.linesNear). */
  isProgrammed: (port: ServicePort, near?: readonly string[]) => boolean;
  /** Whether kube-proxy's rules name the address anywhere; `near` as for isProgrammed. */
  isApplied: (ip: string, near: readonly string[]) => boolean;
}

/** How many addresses are looked for one by one before every address the rules hold is read in one pass. */
const addressesSearched = 16;

/**
 * appliedAddressCheck: whether kube-proxy's rules name an address, found for the first few
 * addresses asked by searching for that address alone (the lines holding it, near the group's
 * lines first), as programmedCheck does for service ports: a change leaves one or two endpoints
 * missing, and reading every address out of a large node's rules costs more than the rest of
 * the check.
 */
function appliedAddressCheck(applied: AppliedText): GroupContext['isApplied'] {
  let addresses: Set<string> | undefined;
  let searched = 0;
  return (ip, near) => {
    if (addresses === undefined && searched++ < addressesSearched)
      return holdsAddress(applied.linesNear(ip, near), ip) || holdsAddress(applied.linesWith(ip), ip);
    return (addresses ??= new Set(addressesIn(applied.whole()))).has(ip);
  };
}

/** Whether one of `lines` names `ip` as addressesIn reads it (10.0.0.1 is not in 10.0.0.12). */
function holdsAddress(lines: Iterable<string>, ip: string): boolean {
  for (const line of lines) if (addressesIn(line).includes(ip)) return true;
  return false;
}

/**
 * programmedNames: what kube-proxy's rules name, read in one pass: service ports in iptables'
 * comments ("ns/name:port ..."), in nftables' chain names ("service-HASH-ns/name/tcp/port"), and
 * the ip:port of ipvs virtual servers.
 */
function programmedNames(appliedText: string): Set<string> {
  const names = new Set<string>();
  const word = '[a-z0-9][-a-z0-9.]*';
  // A comment's "ns/name" or "ns/name:port", not part of a longer word.
  for (const match of appliedText.matchAll(new RegExp(`(?<![-A-Za-z0-9./])(${word}/${word})(?::(${word}))?`, 'g'))) {
    names.add(match[1]);
    if (match[2] !== undefined) names.add(`${match[1]}:${match[2]}`);
  }
  // nftables chain names: "service-HASH-ns/name/tcp/port" (the hash is 8 characters of base32).
  for (const match of appliedText.matchAll(new RegExp(`-[A-Z2-7]{8}-(${word}/${word}/(?:tcp|udp|sctp)/[-a-z0-9]*)`, 'g')))
    names.add(match[1]);
  for (const match of appliedText.matchAll(/(\d{1,3}(?:\.\d{1,3}){3}:\d+)|(\[[0-9a-fA-F:]+\]:\d+)/g)) names.add(match[1] ?? match[2]);
  return names;
}

/** How many service ports are looked for one by one before every name the rules hold is read in one pass. */
const portsSearched = 16;

/**
 * programmedCheck: whether kube-proxy's rules name a service port (as programmed() tells from
 * programmedNames), found for the first few ports asked by searching the text for that port's
 * names alone: a check that finds one service port drifted asks about two or three, and reading
 * every name out of a large node's rules (tens of MB) costs more than the rest of the check.
 */
function programmedCheck(applied: AppliedText): GroupContext['isProgrammed'] {
  let names: Set<string> | undefined;
  let searched = 0;
  return (port, near) => {
    if (names === undefined && searched++ < portsSearched) return programmedSearch(port, applied, near);
    return programmed(port, (names ??= programmedNames(applied.whole())));
  };
}

/**
 * programmed() for one port, by searching the text for each of its names where programmedNames
 * would read them: every name in the pieces `near` names first, then in the whole text.
 */
function programmedSearch(port: ServicePort, text: AppliedText, near?: readonly string[]): boolean {
  if (near !== undefined && programmedNear(port, text, near)) return true;
  return namesOf(port).some(({needle, fits}) => occurs(text.linesWith(needle), needle, fits));
}

/** Whether the pieces of the applied rules that the lines `near` name say the port is programmed. */
function programmedNear(port: ServicePort, text: AppliedText, near: readonly string[]): boolean {
  return near.length > 0 && namesOf(port).some(({needle, fits}) => occurs(text.linesNear(needle, near), needle, fits));
}

/**
 * A name kube-proxy's rules give a service port: as programmedNames reads it (`name`), and as one
 * search finds it: the text searched for, and whether the characters around it (and its position
 * in its line) make it that name.
 */
interface PortName {
  name: string;
  needle: string;
  fits: (before: string, after: string, at: number, line: string) => boolean;
}

/** The names programmedNames reads for a port. */
function namesOf(port: ServicePort): PortName[] {
  const word = /[-a-z0-9.]/;
  const nftName = `${port.namespace}/${port.serviceName}/${port.protocol.toLowerCase()}/${port.portName}`;
  const hashed = (line: string, at: number) => /^-[A-Z2-7]{8}$/.test(line.slice(at - 9, at));
  const names: PortName[] = [
    // A comment's "ns/name:port" (or "ns/name"), not part of a longer word.
    {name: port.key, needle: port.key, fits: (before, after) => !/[-A-Za-z0-9./]/.test(before) && !word.test(after)},
    // An nftables chain "service-HASH-ns/name/tcp/port", the hash 8 characters of base32.
    {name: nftName, needle: `-${nftName}`, fits: (_, after, at, line) => !/[-a-z0-9]/.test(after) && hashed(line, at)},
  ];
  // An ipvs virtual server, "ip:port".
  if (port.clusterIP !== '' && port.clusterIP !== 'None') {
    const address = joinHostPort(port.clusterIP, port.port);
    names.push({name: address, needle: address, fits: (before, after) => !/[\d.]/.test(before) && !/\d/.test(after)});
  }
  return names;
}

/** Whether `needle` occurs in `lines` with the characters around it as `fits` wants them. */
function occurs(lines: Iterable<string>, needle: string, fits: PortName['fits']): boolean {
  for (const line of lines)
    for (let at = line.indexOf(needle); at >= 0; at = line.indexOf(needle, at + 1))
      if (fits(line.charAt(at - 1) || '\n', line.charAt(at + needle.length) || '\n', at, line)) return true;
  return false;
}

/** A service port is programmed when kube-proxy's rules name it, or (ipvs) hold its ClusterIP and port. */
function programmed(port: ServicePort, names: Set<string>): boolean {
  return namesOf(port).some(({name}) => names.has(name));
}

/**
 * The single addresses a rule line names: endpoint addresses in DNAT targets, `-s IP/32`, comments
 * ("ns/name:port -> IP:PORT"), nft elements and ipvs real servers. Networks (a /N other than a
 * single address) are left out: they are CIDRs of the configuration, not endpoints.
 */
export function addressesIn(line: string): string[] {
  const found = new Set<string>();
  for (const match of line.matchAll(/(?<![\w.:])(\d{1,3}(?:\.\d{1,3}){3})(?:\/(\d{1,2}))?/g)) {
    if (match[2] === undefined || match[2] === '32') found.add(match[1]);
  }
  for (const match of line.matchAll(
    /\[([0-9a-fA-F:]+)\]|(?<![\w:])([0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7})(?:\/(\d{1,3}))?(?![\w:])/g,
  )) {
    const ip = match[1] ?? match[2];
    if (ip.includes('::') || ip.split(':').length === 8) if (match[3] === undefined || match[3] === '128') found.add(ip);
  }
  return [...found];
}

function listed(rules: string[]): string {
  const shown = rules.slice(0, rulesListed).join(' | ');
  return rules.length > rulesListed ? `${shown} (and ${rules.length - rulesListed} more)` : shown;
}

/** "45s", "4m", "2h", "3d": how long ago, as people say it. */
export function age(ms: number): string {
  const seconds = Math.max(0, Math.round(ms / 1000));
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 172_800) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86_400)}d`;
}
