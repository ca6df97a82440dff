// diffIpvs: the desired ipvs-mode state against the one read from the kernel, as lines a person
// can read (ipvsadm-restore, ipset restore and iptables-save spelling), grouped by service port.
import {diffIptables} from '../iptables/diff.ts';
import {joinHostPort} from '../model/ip.ts';
import {
  compare,
  dummyDevice,
  type Ipset,
  type IpvsState,
  type IpvsVirtualServer,
  sameVirtualServer,
  sortedIndex,
  virtualServerKey,
  virtualServerLines,
} from './state.ts';
import {ipvsJumpRules} from './render.ts';

export interface IpvsDiffGroup {
  /** "ns/name:port", or "" for state that belongs to no single service port. */
  servicePort: string;
  /** Desired but missing from the kernel. */
  added: string[];
  /** In the kernel but not desired. */
  removed: string[];
}

export interface IpvsDiff {
  equal: boolean;
  groups: IpvsDiffGroup[];
  /** Unified-diff style: "@@ service @@" sections of "+" (missing) and "-" (unwanted) lines; empty when equal. */
  text: string;
  /** The virtual servers, by virtualServerKey, whose lines differ (of those compared). */
  differingServers: Set<string>;
}

/** withJumpRules adds the rules from built-in chains to the layer's text, so both sides of a diff carry them. */
export function withJumpRules(iptables: string): string {
  return iptables.replace(/^\*(nat|filter)\n((?::[^\n]*\n)*)/gm, (_all, table: 'nat' | 'filter', declarations: string) => {
    const builtins = table === 'nat' ? ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'] : ['INPUT', 'FORWARD', 'OUTPUT'];
    return `*${table}\n${builtins.map((chain) => `:${chain} ACCEPT [0:0]`).join('\n')}\n${declarations}${ipvsJumpRules[table].join('\n')}\n`;
  });
}

/**
 * SetEntryOwners finds the service port a set entry belongs to from the desired virtual servers:
 * "IP,proto:PORT[,...]" entries by their virtual server, KUBE-LOOP-BACK's by the real server,
 * NodePort entries ("PORT" in a set of one protocol) by the servers on that port, KUBE-IPVS-IPS'
 * addresses and kube-ipvs0's by the servers on that address: each when one service port alone
 * claims it.
 */
class SetEntryOwners {
  private byServer: Map<string, string>;
  private servers: IpvsState['virtualServers'];
  private nodePorts: Map<string, string>;
  /**
   * Each claimed key's one owner, or "" where several claim it. Made when an entry first needs
   * an owner: a diff of sets that agree asks for none, and at 10,000 services x 10 endpoints the
   * claims are over 110,000 keys, kept as long as the desired state.
   */
  private claims: Map<string, string> | undefined;

  constructor(owners: Map<string, string>, servers: IpvsState['virtualServers'], nodePorts: Map<string, string>) {
    this.byServer = owners;
    this.servers = servers;
    this.nodePorts = nodePorts;
  }

  private claimed(): Map<string, string> {
    if (this.claims) return this.claims;
    const claims = (this.claims = new Map<string, string>());
    const claim = (key: string, owner: string) => {
      const known = claims.get(key);
      // "" is no owner, and also more than one: either way no entry is given to a service port.
      claims.set(key, known === undefined || known === owner ? owner : '');
    };
    // A node without addresses for NodePorts has no virtual server on them; the caller's model still knows whose they are.
    for (const [port, owner] of this.nodePorts) claim(`port ${port}`, owner);
    for (const server of this.servers) {
      const owner = server.servicePort || this.byServer.get(virtualServerKey(server)) || '';
      const protocol = server.protocol.toLowerCase();
      claim(`port ${protocol}:${server.port}`, owner);
      claim(`address ${server.address}`, owner);
      for (const real of server.realServers) claim(`endpoint ${real.address},${protocol}:${real.port}`, owner);
    }
    return claims;
  }

  private sole(key: string): string {
    return this.claimed().get(key) ?? '';
  }

  of(set: string, entry: string): string {
    const address = /^\[?([0-9a-fA-F.:]+?)\]?,(tcp|udp|sctp):(\d+)/.exec(entry);
    if (address && /LOOP-BACK$/.test(set)) return this.sole(`endpoint ${address[1]},${address[2]}:${address[3]}`);
    if (address) {
      const protocol = address[2].toUpperCase() as 'TCP' | 'UDP' | 'SCTP';
      return this.byServer.get(virtualServerKey({protocol, address: address[1], port: Number(address[3])})) ?? '';
    }
    const nodePort = /NODE-PORT(?:-LOCAL)?-(TCP|UDP|SCTP)$/.exec(set);
    if (nodePort && /^\d+$/.test(entry)) return this.sole(`port ${nodePort[1].toLowerCase()}:${entry}`);
    if (/IPVS-IPS$/.test(set)) return this.sole(`address ${entry}`);
    return '';
  }

  /** The service port whose virtual servers alone are on an address of kube-ipvs0. */
  ofAddress(address: string): string {
    return this.sole(`address ${address}`);
  }
}

/** What a diff reads of the desired state, made once per desired state (and NodePort owners). */
interface DesiredIndex {
  nodePorts: Map<string, string> | undefined;
  /** virtualServerKey -> service port. */
  owners: Map<string, string>;
  entryOwners: SetEntryOwners;
  servers: Map<string, IpvsVirtualServer>;
  sets: Map<string, Ipset>;
}

const desiredIndexes = new WeakMap<IpvsState, DesiredIndex>();
const serverOwnersOf = new WeakMap<IpvsState, Map<string, string>>();

/**
 * desiredServerOwners: the service port of each of a desired state's virtual servers, by
 * virtualServerKey, made once while the state lives. The kernel does not know whose a virtual
 * server is: the diff names its groups by this, and the agent's reader names the servers it reads.
 */
export function desiredServerOwners(desired: IpvsState): Map<string, string> {
  let owners = serverOwnersOf.get(desired);
  if (!owners) serverOwnersOf.set(desired, (owners = new Map(desired.virtualServers.map((server) => [keyOf(server), server.servicePort]))));
  return owners;
}

function desiredIndex(desired: IpvsState, nodePorts: Map<string, string> | undefined): DesiredIndex {
  const known = desiredIndexes.get(desired);
  if (known && known.nodePorts === nodePorts) return known;
  const owners = desiredServerOwners(desired);
  const index = {
    nodePorts,
    owners,
    entryOwners: new SetEntryOwners(owners, desired.virtualServers, nodePorts ?? new Map()),
    servers: new Map(desired.virtualServers.map((server) => [keyOf(server), server])),
    sets: new Map(desired.sets.map((set) => [set.name, set])),
  };
  desiredIndexes.set(desired, index);
  return index;
}

// An observer checks for drift after every change it sees, and a followed reading keeps the
// objects of every server and set that did not change (parseIpvsadmSaveSince, followIpvsChanges),
// as the desired state keeps its own for its model's life. What a check found of such an object
// is remembered with it: its key, and the other side's object it was found the same as. At
// 10,000 services a check then spells no key and compares no line of what did not change.
const keys = new WeakMap<IpvsVirtualServer, string>();
const foundSame = new WeakMap<object, object>();

function keyOf(server: IpvsVirtualServer): string {
  let key = keys.get(server);
  if (key === undefined) keys.set(server, (key = virtualServerKey(server)));
  return key;
}

/** `same` of the two, remembered when true (for the same two objects, `same` always answers alike). */
function sameRemembered<T extends object>(a: T, b: T, same: (a: T, b: T) => boolean): boolean {
  if (a === b || foundSame.get(a) === b) return true;
  if (!same(a, b)) return false;
  foundSame.set(a, b);
  return true;
}

function sameLines(a: readonly string[], b: readonly string[]): boolean {
  return sameRemembered(a, b, (a, b) => a.length === b.length && a.every((line, index) => line === b[index]));
}

/** Each line of `lines` that `other` lacks, to `into`. */
function missingFrom(lines: readonly string[], other: readonly string[], into: (line: string) => void): void {
  const present = new Set(other);
  for (const line of lines) if (!present.has(line)) into(line);
}

export interface DiffIpvsOptions {
  /** "tcp:30080" -> the service port with that NodePort, for NodePort set entries. */
  nodePorts?: Map<string, string>;
  /**
   * The virtual servers, by virtualServerKey, that may differ: the caller knows every other one
   * to be the same on both sides (an earlier diff found it so, and nothing touched it since), and
   * they are not compared. At 10,000 services a diff after a change to one server then looks at
   * that one, not at 20,000. Undefined: every server is compared. Both states' servers are then
   * found by halving: in key order, as readings and renderings keep them (sortServers).
   */
  comparedServers?: ReadonlySet<string>;
}

/** The servers of `state` with the given keys, in key order (the state's own), found by halving. */
function serversWithKeys(state: IpvsState, keys: readonly string[]): IpvsVirtualServer[] {
  const servers = state.virtualServers;
  return keys.flatMap((key) => {
    const at = sortedIndex(servers, key, keyOf);
    return at < servers.length && keyOf(servers[at]) === key ? [servers[at]] : [];
  });
}

/**
 * diffIpvs compares virtual and real servers, set entries, bound addresses and the iptables layer,
 * each as lines (ipvsadm-restore, ipset restore and `address X dev kube-ipvs0`), part by part: a
 * server or set the same on both sides costs one comparison, not a line each.
 * `applied.iptables` is the node's iptables-save text; only the proxy's chains and jumps count.
 */
export function diffIpvs(desired: IpvsState, applied: IpvsState, options: DiffIpvsOptions = {}): IpvsDiff {
  const index = desiredIndex(desired, options.nodePorts);
  const {owners, entryOwners} = index;
  const groups = new Map<string, IpvsDiffGroup>();
  const group = (servicePort: string) => {
    let found = groups.get(servicePort);
    if (!found) groups.set(servicePort, (found = {servicePort, added: [], removed: []}));
    return found;
  };
  // Desired lines missing from the kernel, in the desired state's order; then the kernel's extra lines, in its order.
  const added = (owner: string) => (line: string) => group(owner).added.push(line);
  const removed = (owner: string) => (line: string) => group(owner).removed.push(line);
  const ownerOf = (server: IpvsVirtualServer) => server.servicePort || owners.get(keyOf(server)) || '';

  const compared = options.comparedServers && [...options.comparedServers].sort(compare);
  const appliedCompared = compared ? serversWithKeys(applied, compared) : applied.virtualServers;
  const desiredCompared = compared ? serversWithKeys(desired, compared) : desired.virtualServers;
  const appliedServers = new Map(appliedCompared.map((server) => [keyOf(server), server]));
  const desiredServers = index.servers;
  const differingServers = new Set<string>();
  const appliedSets = new Map(applied.sets.map((set) => [set.name, set]));
  const desiredSets = index.sets;
  // An empty set matches nothing: whether it exists changes no packet (kube-proxy creates sets it
  // never fills), and a set one side lacks shows as its entries. Types count where both hold entries.
  const typed = (name: string) => (desiredSets.get(name)?.entries.length ?? 0) > 0 && (appliedSets.get(name)?.entries.length ?? 0) > 0;
  const addressLine = (address: string) => `address ${address} dev ${dummyDevice}`;

  const compareSide = (
    mine: IpvsState,
    myServers: readonly IpvsVirtualServer[],
    others: {servers: Map<string, IpvsVirtualServer>; sets: Map<string, Ipset>; addresses: string[]},
    to: typeof added,
  ) => {
    for (const server of myServers) {
      const other = others.servers.get(keyOf(server));
      if (other && sameRemembered(server, other, sameVirtualServer)) continue;
      differingServers.add(keyOf(server));
      if (!other) virtualServerLines(server).forEach(to(ownerOf(server)));
      else missingFrom(virtualServerLines(server), virtualServerLines(other), to(ownerOf(server)));
    }
    for (const set of mine.sets) {
      const other = others.sets.get(set.name);
      if (typed(set.name) && set.type !== other!.type) to('')(`create ${set.name} ${set.type}`);
      if (other && sameLines(set.entries, other.entries)) continue;
      const present = new Set(other?.entries ?? []);
      for (const entry of set.entries) if (!present.has(entry)) to(entryOwners.of(set.name, entry))(`add ${set.name} ${entry}`);
    }
    if (!sameLines(mine.boundAddresses, others.addresses)) {
      const present = new Set(others.addresses);
      for (const address of mine.boundAddresses) if (!present.has(address)) to(entryOwners.ofAddress(address))(addressLine(address));
    }
  };
  compareSide(desired, desiredCompared, {servers: appliedServers, sets: appliedSets, addresses: applied.boundAddresses}, added);
  compareSide(applied, appliedCompared, {servers: desiredServers, sets: desiredSets, addresses: desired.boundAddresses}, removed);
  const rules = diffIptables(withJumpRules(desired.iptables), applied.iptables);
  for (const rulesGroup of rules.groups) {
    group(rulesGroup.servicePort).added.push(...rulesGroup.added);
    group(rulesGroup.servicePort).removed.push(...rulesGroup.removed);
  }
  const sorted = [...groups.values()]
    .filter((g) => g.added.length + g.removed.length > 0)
    .sort((a, b) => (a.servicePort < b.servicePort ? -1 : 1));
  return {equal: sorted.length === 0, groups: sorted, text: ipvsDiffText(sorted), differingServers};
}

/**
 * ipvsDiffText spells diff groups as every mode's diff does: "-" desired and missing from the
 * kernel, "+" in the kernel and not desired.
 */
export function ipvsDiffText(groups: readonly IpvsDiffGroup[]): string {
  if (groups.length === 0) return '';
  const body = groups.flatMap((g) => [
    `@@ ${g.servicePort || '(no service)'} @@`,
    ...g.added.map((line) => `-${line}`),
    ...g.removed.map((line) => `+${line}`),
  ]);
  return `--- desired\n+++ applied\n${body.join('\n')}\n`;
}

/** realServerText is "ip:port" of a real server (brackets for IPv6). */
export function realServerText(server: {address: string; port: number}): string {
  return joinHostPort(server.address, server.port);
}
