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

/** stateLines lists the state as one line per fact, keyed by the service port it belongs to. */
function stateLines(state: IpvsState, owners: Map<string, string>): Map<string, string> {
  const lines = new Map<string, string>();
  for (const server of state.virtualServers) {
    const owner = server.servicePort || owners.get(virtualServerKey(server)) || '';
    for (const line of formatIpvsadmRestore([server]).trim().split('\n')) lines.set(line, owner);
  }
  for (const set of state.sets) {
    lines.set(`create ${set.name} ${set.type}`, '');
    for (const entry of set.entries) lines.set(`add ${set.name} ${entry}`, '');
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
  const want = stateLines(desired, owners);
  const have = stateLines(applied, owners);
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
