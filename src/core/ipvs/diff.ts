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
 * "IP,proto:PORT[,...]" entries by their virtual server, NodePort entries ("PORT" in a set of
 * one protocol) by the service port with that NodePort. Entries no service port claims alone
 * (KUBE-LOOP-BACK's endpoints, health-check ports) stay with no service.
 */
class SetEntryOwners {
  private byServer: Map<string, string>;
  private byNodePort = new Map<string, string>();

  constructor(owners: Map<string, string>, servers: IpvsState['virtualServers']) {
    this.byServer = owners;
    const clusterKeys = new Map<string, Set<string>>();
    for (const server of servers) {
      const key = `${server.protocol.toLowerCase()}:${server.port}`;
      if (!clusterKeys.has(key)) clusterKeys.set(key, new Set());
      clusterKeys.get(key)!.add(server.servicePort || owners.get(virtualServerKey(server)) || '');
    }
    for (const [key, ports] of clusterKeys) if (ports.size === 1) this.byNodePort.set(key, [...ports][0]);
  }

  of(set: string, entry: string): string {
    const address = /^(\[?[0-9a-fA-F.:]+?\]?),(tcp|udp|sctp):(\d+)/.exec(entry);
    if (address && !/LOOP-BACK$/.test(set)) {
      const protocol = address[2].toUpperCase() as 'TCP' | 'UDP' | 'SCTP';
      return this.byServer.get(virtualServerKey({protocol, address: address[1].replace(/^\[|\]$/g, ''), port: Number(address[3])})) ?? '';
    }
    const nodePort = /NODE-PORT(?:-LOCAL)?-(TCP|UDP|SCTP)$/.exec(set);
    if (nodePort && /^\d+$/.test(entry)) return this.byNodePort.get(`${nodePort[1].toLowerCase()}:${entry}`) ?? '';
    return '';
  }
}

/** stateLines lists the state as one line per fact, keyed by the service port it belongs to. */
function stateLines(state: IpvsState, owners: Map<string, string>, entryOwners: SetEntryOwners): Map<string, string> {
  const lines = new Map<string, string>();
  for (const server of state.virtualServers) {
    const owner = server.servicePort || owners.get(virtualServerKey(server)) || '';
    for (const line of formatIpvsadmRestore([server]).trim().split('\n')) lines.set(line, owner);
  }
  for (const set of state.sets) {
    lines.set(`create ${set.name} ${set.type}`, '');
    for (const entry of set.entries) lines.set(`add ${set.name} ${entry}`, entryOwners.of(set.name, entry));
  }
  for (const address of state.boundAddresses) lines.set(`address ${address} dev ${dummyDevice}`, '');
  return lines;
}

/**
 * diffIpvs compares virtual and real servers, set entries, bound addresses and the iptables layer.
 * `applied.iptables` is the node's iptables-save text; only the proxy's chains and jumps count.
 */
export function diffIpvs(desired: IpvsState, applied: IpvsState): IpvsDiff {
  const owners = new Map(desired.virtualServers.map((server) => [virtualServerKey(server), server.servicePort]));
  const entryOwners = new SetEntryOwners(owners, desired.virtualServers);
  const want = stateLines(desired, owners, entryOwners);
  const have = stateLines(applied, owners, entryOwners);
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
  const text = sorted
    .map((g) =>
      [`@@ ${g.servicePort || '(no service)'} @@`, ...g.added.map((line) => `+${line}`), ...g.removed.map((line) => `-${line}`)].join('\n'),
    )
    .join('\n');
  return {equal: sorted.length === 0, groups: sorted, text: text ? `--- applied\n+++ desired\n${text}\n` : ''};
}

/** realServerText is "ip:port" of a real server (brackets for IPv6). */
export function realServerText(server: {address: string; port: number}): string {
  return joinHostPort(server.address, server.port);
}
