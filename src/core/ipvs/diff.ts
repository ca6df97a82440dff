// diffIpvs: the desired ipvs-mode state against the one read from the kernel, as lines a person
// can read (ipvsadm-restore, ipset restore and iptables-save spelling), grouped by service port.
import {diffIptables} from '../iptables/diff.ts';
import {joinHostPort} from '../model/ip.ts';
import {dummyDevice, formatIpvsadmRestore, virtualServerKey, type IpvsState} from './state.ts';
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
  private claims = new Map<string, Set<string>>();

  constructor(owners: Map<string, string>, servers: IpvsState['virtualServers'], nodePorts: Map<string, string>) {
    this.byServer = owners;
    // A node without addresses for NodePorts has no virtual server on them; the caller's model still knows whose they are.
    for (const [port, owner] of nodePorts) this.claim(`port ${port}`, owner);
    for (const server of servers) {
      const owner = server.servicePort || owners.get(virtualServerKey(server)) || '';
      const protocol = server.protocol.toLowerCase();
      this.claim(`port ${protocol}:${server.port}`, owner);
      this.claim(`address ${server.address}`, owner);
      for (const real of server.realServers) this.claim(`endpoint ${real.address},${protocol}:${real.port}`, owner);
    }
  }

  private claim(key: string, owner: string): void {
    if (!this.claims.has(key)) this.claims.set(key, new Set());
    this.claims.get(key)!.add(owner);
  }

  private sole(key: string): string {
    const owners = this.claims.get(key);
    return owners?.size === 1 ? [...owners][0] : '';
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

/** stateLines lists the state as one line per fact, keyed by the service port it belongs to. */
function stateLines(state: IpvsState, owners: Map<string, string>, entryOwners: SetEntryOwners, typed: Set<string>): Map<string, string> {
  const lines = new Map<string, string>();
  for (const server of state.virtualServers) {
    const owner = server.servicePort || owners.get(virtualServerKey(server)) || '';
    for (const line of formatIpvsadmRestore([server]).trim().split('\n')) lines.set(line, owner);
  }
  for (const set of state.sets) {
    // An empty set matches nothing: whether it exists changes no packet (kube-proxy creates sets it
    // never fills), and a set one side lacks shows as its entries. Types count where both hold entries.
    if (typed.has(set.name)) lines.set(`create ${set.name} ${set.type}`, '');
    for (const entry of set.entries) lines.set(`add ${set.name} ${entry}`, entryOwners.of(set.name, entry));
  }
  for (const address of state.boundAddresses) lines.set(`address ${address} dev ${dummyDevice}`, entryOwners.ofAddress(address));
  return lines;
}

export interface DiffIpvsOptions {
  /** "tcp:30080" -> the service port with that NodePort, for NodePort set entries. */
  nodePorts?: Map<string, string>;
}

/**
 * diffIpvs compares virtual and real servers, set entries, bound addresses and the iptables layer.
 * `applied.iptables` is the node's iptables-save text; only the proxy's chains and jumps count.
 */
export function diffIpvs(desired: IpvsState, applied: IpvsState, options: DiffIpvsOptions = {}): IpvsDiff {
  const owners = new Map(desired.virtualServers.map((server) => [virtualServerKey(server), server.servicePort]));
  const entryOwners = new SetEntryOwners(owners, desired.virtualServers, options.nodePorts ?? new Map());
  const filled = (state: IpvsState) => new Set(state.sets.filter((set) => set.entries.length > 0).map((set) => set.name));
  const appliedFilled = filled(applied);
  const typed = new Set([...filled(desired)].filter((name) => appliedFilled.has(name)));
  const want = stateLines(desired, owners, entryOwners, typed);
  const have = stateLines(applied, owners, entryOwners, typed);
  const groups = new Map<string, IpvsDiffGroup>();
  const group = (servicePort: string) => {
    let found = groups.get(servicePort);
    if (!found) groups.set(servicePort, (found = {servicePort, added: [], removed: []}));
    return found;
  };
  for (const [line, owner] of want) if (!have.has(line)) group(owner).added.push(line);
  for (const [line, owner] of have) if (!want.has(line)) group(owner).removed.push(line);
  const rules = diffIptables(withJumpRules(desired.iptables), applied.iptables);
  for (const rulesGroup of rules.groups) {
    group(rulesGroup.servicePort).added.push(...rulesGroup.added);
    group(rulesGroup.servicePort).removed.push(...rulesGroup.removed);
  }
  const sorted = [...groups.values()]
    .filter((g) => g.added.length + g.removed.length > 0)
    .sort((a, b) => (a.servicePort < b.servicePort ? -1 : 1));
  return {equal: sorted.length === 0, groups: sorted, text: ipvsDiffText(sorted)};
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
