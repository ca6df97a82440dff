// ipvs mode's RulesBackend for the agent API: the desired and applied state as one text in four
// sections (virtual and real servers in ipvsadm spelling, KUBE- sets in ipset spelling, the
// addresses on kube-ipvs0, the iptables layer), read back into an IpvsState for diffIpvs and
// traceIpvs. The applied text is what `ipvsadm -Sn`, `ipset save`, `ip -j addr show kube-ipvs0` and
// iptables-save report in the node's namespace.
import {
  compareIpvsNames,
  desiredServerOwners,
  diffIpvs,
  ipvsDiffText,
  dummyDevice,
  type IpvsDiffGroup,
  type IpvsState,
  type IpvsVirtualServer,
  parseIpsetSave,
  parseIpvsadmSave,
  flagProtocol,
  renderIpvs,
  serverNamed,
  sortedIndex,
  traceIpvs,
  virtualServerKey,
  virtualServerText,
} from '../../../core/ipvs/index.ts';
import type {IPFamily, ProxyModel} from '../../../core/model/index.ts';
import type {Host} from '../../host/host.ts';
import {readBoundAddresses, readIptablesLayer, readIpvsKernelState, readSet, readSets, readVirtualServers} from '../../sync/ipvs-host.ts';
import {ipvsStateParts, type LatestIpvsLook} from '../../applied/ipvs-changes.ts';
import type {TouchedObjects} from '../../applied/ruleset-changes.ts';
import type {ParsedRules, RulesBackend} from './backend.ts';

const sections = {
  ipvsadm: '#### virtual and real servers (ipvsadm)',
  ipset: '#### sets (ipset)',
  addresses: `#### addresses on ${dummyDevice}`,
  iptables: '#### iptables layer (iptables-save)',
} as const;

/**
 * The state's text as runs of lines, each line a run's `prefix` and one of its items: a set's
 * entries are one run ("add NAME " and each entry), so a search need not spell every entry's line.
 * A virtual server is one item of several lines (virtualServerText), with no prefix.
 */
function* stateRuns(state: IpvsState): Iterable<{prefix: string; items: readonly string[]}> {
  yield {prefix: '', items: [`#### ipvs mode, ${state.family}`, sections.ipvsadm]};
  for (const server of state.virtualServers) {
    if (server.servicePort) yield {prefix: '# service ', items: [server.servicePort]};
    yield {prefix: '', items: [virtualServerText(server)]};
  }
  yield {prefix: '', items: [sections.ipset]};
  for (const set of state.sets) {
    yield {prefix: '', items: [`create ${set.name} ${set.type}`]};
    yield {prefix: `add ${set.name} `, items: set.entries};
  }
  yield {prefix: '', items: [sections.addresses, ...state.boundAddresses, sections.iptables]};
  yield {prefix: '', items: state.iptables.split('\n')};
}

/** formatIpvsState writes the state as the API shows it; parseIpvsStateText reads it back. */
export function formatIpvsState(state: IpvsState): string {
  const lines: string[] = [];
  for (const {prefix, items} of stateRuns(state)) for (const item of items) lines.push(prefix + item);
  return lines.join('\n');
}

/** The lines of formatIpvsState's text that hold `needle`, found without putting the text together. */
export function* ipvsLinesWith(state: IpvsState, needle: string): Iterable<string> {
  // A needle across a prefix and its item holds the prefix's last character, a space.
  const spaced = needle.includes(' ');
  for (const {prefix, items} of stateRuns(state)) {
    const inPrefix = prefix !== '' && prefix.includes(needle);
    for (const item of items) {
      if (!(inPrefix || item.includes(needle) || (spaced && prefix !== '' && (prefix + item).includes(needle)))) continue;
      if (prefix === '' && item.includes('\n')) {
        for (const line of item.split('\n')) if (line.includes(needle)) yield line;
      } else yield prefix + item;
    }
  }
}

/**
 * The lines of formatIpvsState's text that hold `needle` in the pieces the lines `near` name
 * (AppliedText.linesNear): the virtual servers they name ("-A -t 10.96.0.10:80 ..."), and the set
 * entries and kube-ipvs0 addresses that begin with an address they name, a virtual or a real
 * server's, a set entry's or a bound one. Each is found by halving a sorted list, where a search
 * of the whole state reads every server and entry: a drifted service's other state is mostly
 * there, such as the KUBE-LOOP-BACK entry of a real server that is missing.
 */
export function* ipvsLinesNear(state: IpvsState, needle: string, near: readonly string[]): Iterable<string> {
  const serverKeys = new Set<string>();
  const addresses = new Set<string>();
  for (const line of near) {
    for (const [, flag, host, port] of line.matchAll(/(?:^| )(-[tur]|--sctp-service) \[?([^\]\s]*?)\]?:(\d+)(?= |$)/g)) {
      addresses.add(host);
      const protocol = flagProtocol(flag);
      if (protocol) serverKeys.add(virtualServerKey({protocol, address: host, port: Number(port)}));
    }
    const entry = /^add \S+ \[?([0-9a-fA-F.:]+?)\]?(?:,|$)/.exec(line);
    if (entry) addresses.add(entry[1]);
    const bound = /^address (\S+) dev /.exec(line);
    if (bound) addresses.add(bound[1]);
  }
  for (const key of serverKeys) {
    const server = state.virtualServers[sortedIndex(state.virtualServers, key, virtualServerKey)];
    if (server && virtualServerKey(server) === key)
      for (const line of virtualServerText(server).split('\n')) if (line.includes(needle)) yield line;
  }
  for (const address of addresses) {
    for (const set of state.sets)
      for (const prefix of [address, `[${address}]`])
        for (let at = sortedIndex(set.entries, prefix); set.entries[at]?.startsWith(prefix); at++) {
          const after = set.entries[at][prefix.length];
          const line = `add ${set.name} ${set.entries[at]}`;
          if ((after === undefined || after === ',') && line.includes(needle)) yield line;
        }
    const bound = state.boundAddresses[sortedIndex(state.boundAddresses, address)];
    if (bound === address && bound.includes(needle)) yield bound;
  }
}

export function parseIpvsStateText(text: string): IpvsState {
  const family: IPFamily = /^#### ipvs mode, IPv6/.test(text) ? 'IPv6' : 'IPv4';
  const parts = new Map<string, string[]>();
  let current: string[] | undefined;
  for (const line of text.split('\n')) {
    const section = Object.entries(sections).find(([, header]) => line === header)?.[0];
    if (section) parts.set(section, (current = []));
    else if (current && !line.startsWith('#### ')) current.push(line);
  }
  const part = (name: keyof typeof sections) => (parts.get(name) ?? []).join('\n');
  // "# service ns/name:port" names the service port of the virtual server after it.
  const owners = new Map<string, string>();
  let owner: string | undefined;
  for (const line of part('ipvsadm').split('\n')) {
    const comment = /^# service (\S+)/.exec(line);
    if (comment) owner = comment[1];
    else if (line.startsWith('-A ') && owner !== undefined) {
      const [server] = parseIpvsadmSave(line);
      owners.set(virtualServerKey(server), owner);
      owner = undefined;
    }
  }
  const virtualServers = parseIpvsadmSave(part('ipvsadm')).map((server) => ({
    ...server,
    servicePort: owners.get(virtualServerKey(server)) ?? '',
  }));
  return {
    family,
    virtualServers,
    sets: parseIpsetSave(part('ipset')),
    boundAddresses: part('addresses')
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => line !== ''),
    iptables: part('iptables'),
  };
}

function inService(group: IpvsDiffGroup, service: string): boolean {
  return group.servicePort === service || group.servicePort.startsWith(`${service}:`);
}

/**
 * Per applied state: the virtual servers (by virtualServerKey) that may differ from a desired
 * state (held weakly: a new model's lets the old one go), every other server known to be the
 * same. A diff leaves the servers it found differing; a foreign change followed by the servers
 * it named adds those. The next diff against the same desired state compares them alone.
 */
const serversMayDiffer = new WeakMap<IpvsState, {desired: WeakRef<IpvsState>; servers: ReadonlySet<string>}>();

/** What may differ of the followed state: what did of the state it followed, and the servers the change named. */
function carryServersMayDiffer(before: IpvsState, followed: IpvsState, touched: Map<string, TouchedObjects>): void {
  const known = serversMayDiffer.get(before);
  if (!known) return;
  if (followed.virtualServers === before.virtualServers) {
    serversMayDiffer.set(followed, known);
    return;
  }
  const servers = touched.get(ipvsStateParts.servers);
  if (!servers || servers.whole) return;
  const keys = new Set(known.servers);
  for (const words of servers.servers) {
    const named = serverNamed(words);
    // Words that name no server: what changed is not known, and every server is compared.
    if (!named) return;
    keys.add(virtualServerKey(named));
  }
  serversMayDiffer.set(followed, {desired: known.desired, servers: keys});
}

/**
 * ipvsRulesBackend renders with the agent's scheduler, so the desired state is the one it writes.
 * `latestLook`: the servers as watchIpvsState's latest look printed them, which a followed change
 * reads instead of running `ipvsadm -Sn` again.
 */
export function ipvsRulesBackend(options: {scheduler?: string; latestLook?: LatestIpvsLook} = {}): RulesBackend {
  // The kernel does not know which service a virtual server belongs to; the desired state last
  // asked for, per family, does. Only its owners map is kept (desiredServerOwners, the one the
  // diff's index reads): the state itself goes with its model.
  const lastOwners = new Map<IPFamily, Map<string, string>>();
  const ownerOf = (family: IPFamily, server: IpvsVirtualServer) => lastOwners.get(family)?.get(virtualServerKey(server)) ?? '';
  // The state readApplied read, per family, until its text comes back to parse: reading the text
  // again would parse the whole state a second time (at 10,000 services as long as the reading's own parse).
  const justRead = new Map<IPFamily, {text: string; state: IpvsState}>();
  // Each model's desired state, made once while the model lives: every drift check, trace and
  // rules.desired asks for it.
  const desiredOf = new WeakMap<ProxyModel, IpvsState>();
  const desiredState = (model: ProxyModel): IpvsState => {
    let state = desiredOf.get(model);
    if (!state) desiredOf.set(model, (state = renderIpvs(model, {scheduler: options.scheduler})));
    lastOwners.set(state.family, desiredServerOwners(state));
    return state;
  };
  const backend: RulesBackend = {
    mode: 'ipvs',
    render: (model) => formatIpvsState(desiredState(model)),
    parse: (text) => {
      const family: IPFamily = text.startsWith('#### ipvs mode, IPv6') ? 'IPv6' : 'IPv4';
      const read = justRead.get(family);
      justRead.delete(family);
      const state = read?.text === text ? read.state : parseIpvsStateText(text);
      for (const server of state.virtualServers) server.servicePort ||= ownerOf(state.family, server);
      return state as ParsedRules;
    },
    // The rendered state itself, which its text would read back to: parsed from that text, each
    // address and entry would be a slice holding the whole text (megabytes at 10,000 services).
    desired: (model) => desiredState(model) as ParsedRules,
    diff: (desired, applied, service) => {
      const [mine, theirs] = [desired as IpvsState, applied as IpvsState];
      const known = serversMayDiffer.get(theirs);
      const result = diffIpvs(mine, theirs, {comparedServers: known?.desired.deref() === mine ? known.servers : undefined});
      // Filtered to a service or not, the diff compared the whole state.
      serversMayDiffer.set(theirs, {desired: new WeakRef(mine), servers: result.differingServers});
      if (!service) return {equal: result.equal, groups: result.groups, text: result.text};
      const groups = result.groups.filter((group) => inService(group, service));
      return {equal: groups.length === 0, groups, text: ipvsDiffText(groups)};
    },
    trace: (rules, packet, context) => traceIpvs(rules as IpvsState, packet, context),
    readApplied: async (host: Host, family: IPFamily) => {
      const state = await readIpvsKernelState(host, family, options.latestLook?.servers);
      const text = formatIpvsState(state);
      justRead.set(family, {text, state});
      return text;
    },
    format: (rules) => formatIpvsState(rules as IpvsState),
    // The state holds all its text says: printed again when asked for, not kept deflated beside it.
    textOf: (rules) => () => formatIpvsState(rules as IpvsState),
    rulesWith: (rules, needle) => ipvsLinesWith(rules as IpvsState, needle),
    rulesNear: (rules, needle, near) => ipvsLinesNear(rules as IpvsState, needle, near),
    follow: async (host, family, rules, touched) => {
      const followed = await followIpvsChanges(host, family, rules as IpvsState, touched, options.latestLook?.servers);
      carryServersMayDiffer(rules as IpvsState, followed, touched);
      for (const server of followed.virtualServers) server.servicePort ||= ownerOf(family, server);
      return followed as ParsedRules;
    },
  };
  return backend;
}

/**
 * The state brought up to date by reading again only the parts foreign changes touched
 * (watchIpvsState's report, the iptables layer's tables from nft monitor): `state` itself when
 * none was. `serversText`: `ipvsadm -Sn` as the latest look printed it, read in place of
 * running it again.
 */
export async function followIpvsChanges(
  host: Host,
  family: IPFamily,
  state: IpvsState,
  touched: Map<string, TouchedObjects>,
  serversText?: string,
): Promise<IpvsState> {
  const servers = touched.get(ipvsStateParts.servers);
  const sets = touched.get(ipvsStateParts.sets);
  const addresses = touched.get(ipvsStateParts.addresses);
  const iptablesLayer = touched.has('nat') || touched.has('filter');
  if (!servers && !sets && !addresses && !iptablesLayer) return state;
  const followed = {...state};
  if (servers)
    followed.virtualServers = await readVirtualServers(host, family, {
      since: state.virtualServers,
      printed: serversText,
      changed: servers.whole ? undefined : servers.servers,
    });
  if (sets?.whole) followed.sets = await readSets(host, family);
  else if (sets) {
    const byName = new Map(state.sets.map((set) => [set.name, set]));
    for (const name of sets.sets) {
      const read = await readSet(host, name);
      if (read) byName.set(name, read);
      else byName.delete(name);
    }
    followed.sets = [...byName.values()].sort((a, b) => compareIpvsNames(a.name, b.name));
  }
  if (addresses) followed.boundAddresses = await readBoundAddresses(host, family);
  if (iptablesLayer) followed.iptables = await readIptablesLayer(host, family);
  return followed;
}
