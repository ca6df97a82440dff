// ipvs mode's state in a node namespace of the kernel tests: loaded as ipvs mode's first sync loads
// it, and read back with the tools an operator would use.
import {
  formatIpsetRestore,
  formatIpvsadmRestore,
  parseBoundAddresses,
  parseIpsetSave,
  parseIpvsadmSave,
  withJumpRules,
  type IpvsState,
} from '../../src/core/ipvs/index.ts';
import {execInNamespace, type NodeDescription} from '../../src/lab/netns/index.ts';
import {restoreIptables, saveIptables} from './namespace-lab.ts';

/** applyIpvsState loads the state into the node's namespace the way ipvs mode's first sync does. */
export async function applyIpvsState(entry: NodeDescription, state: IpvsState): Promise<void> {
  const inNode = (command: string[], input?: string) => execInNamespace(entry.namespace, command, input === undefined ? {} : {input});
  // kube-proxy's ipvs sysctls: conntrack for the iptables layer's masquerade, quick expiry of dead real servers.
  await inNode([
    'sysctl',
    '-qw',
    'net.ipv4.ip_forward=1',
    'net.ipv4.vs.conntrack=1',
    'net.ipv4.vs.expire_nodest_conn=1',
    'net.ipv4.vs.expire_quiescent_template=1',
  ]);
  await inNode(['ip', 'link', 'add', 'kube-ipvs0', 'type', 'dummy']);
  for (const address of state.boundAddresses) await inNode(['ip', 'addr', 'add', `${address}/32`, 'dev', 'kube-ipvs0']);
  await inNode(['ipset', 'restore'], formatIpsetRestore(state.sets, state.family));
  await inNode(['ipvsadm-restore'], formatIpvsadmRestore(state.virtualServers));
  await restoreIptables(entry, withJumpRules(state.iptables));
}

/** readIpvsState reads the node's state back with the tools an operator would use. */
export async function readIpvsState(entry: NodeDescription): Promise<IpvsState> {
  const inNode = async (command: string[]) => (await execInNamespace(entry.namespace, command)).stdout;
  return {
    family: 'IPv4',
    virtualServers: parseIpvsadmSave(await inNode(['ipvsadm', '-Sn'])),
    sets: parseIpsetSave(await inNode(['ipset', 'save'])),
    boundAddresses: parseBoundAddresses(await inNode(['ip', '-j', 'addr', 'show', 'dev', 'kube-ipvs0'])),
    iptables: await saveIptables(entry),
  };
}
