// The behaviour method: the applied rules against another mode's rules for the same node (what a
// switch would change), or against the desired rules (what the drift does), compared by what they
// do to each class of packet; with what the node shows that bears on the changes.
import {
  behaviourSide,
  diffBehaviour,
  hostSocketSentences,
  packetClasses,
  parseListeningSockets,
  renderedSide,
  socketsOnServiceAddresses,
  type ListeningSocket,
  type BehaviourDiff,
  type BehaviourSide,
  type ModeRules,
  type ProxyMode,
} from '../../../core/behaviour/index.ts';
import {errorText} from '../../../core/error-text.ts';
import type {IpvsState} from '../../../core/ipvs/index.ts';
import type {Host} from '../../host/host.ts';
import {parseIP, type IPFamily} from '../../../core/model/index.ts';
import type {BehaviourAnswer, BehaviourParams} from '../../../protocol/methods.ts';
import type {RuntimeState} from '../runtime-state.ts';
import {readNfacctPackets} from '../../sync/iptables-features.ts';

export async function answerBehaviour(state: RuntimeState, params: BehaviourParams, serviceCIDRs: string[]): Promise<BehaviourAnswer> {
  if (params.to) await checkKernelRuns(state, params.to);
  const addresses = await state.localAddresses();
  const diffs: BehaviourDiff[] = [];
  const appliedRules: ModeRules[] = [];
  let readAt = Infinity;
  for (const [family, model] of state.models()) {
    const current = await state.readApplied(family);
    readAt = Math.min(readAt, current.readAt);
    const rules = {mode: state.backend.mode, rules: current.rules} as ModeRules;
    appliedRules.push(rules);
    // kube-ipvs0's addresses are the services', not the node's: no NodePort answers on them, and no other mode holds them.
    const serviceAddresses = new Set(rules.mode === 'ipvs' ? rules.rules.boundAddresses : []);
    const nodeAddresses = [
      ...new Set([
        ...model.nodeIPs,
        ...addresses.filter((address) => parseIP(address)?.family === family && !serviceAddresses.has(address)),
      ]),
    ];
    const applied = behaviourSide(rules, nodeAddresses, `${state.backend.mode} mode (applied)`);
    const familyCIDRs = serviceCIDRs.filter((cidr) => (cidr.includes(':') ? 'IPv6' : 'IPv4') === family);
    const classes = packetClasses(model, {nodeAddresses, serviceCIDRs: familyCIDRs, ...(params.service ? {service: params.service} : {})});
    if (params.to) {
      const target = renderedSide(model, params.to, {nodeAddresses, serviceCIDRs: familyCIDRs, label: `${params.to} mode`});
      diffs.push(diffBehaviour(classes, applied, target));
    } else {
      const desired: BehaviourSide = behaviourSide(
        {mode: state.backend.mode, rules: state.desiredFor(model)} as ModeRules,
        nodeAddresses,
        `${state.backend.mode} mode (desired)`,
      );
      diffs.push(diffBehaviour(classes, desired, applied));
    }
  }
  const diff = mergeFamilies(diffs);
  const evidence = params.to ? await switchEvidence(state, params.to, diff, appliedRules) : [];
  return {node: state.nodeName, diff, evidence, readAt: new Date(readAt).toISOString()};
}

/** A mode the node's kernel cannot run is an error, not a prediction. */
async function checkKernelRuns(state: RuntimeState, mode: ProxyMode): Promise<void> {
  const {host, nodeName} = state;
  try {
    if (mode === 'ipvs') await host.ipvsadm(['-Ln']);
    else if (mode === 'nftables') await checkNftablesRuns(host);
    else await host.iptablesVersion(state.families[0] as IPFamily);
  } catch (error) {
    throw new Error(`node ${nodeName} cannot run ${mode} mode: ${errorText(error).split('\n')[0]}`);
  }
}

/** kube-proxy refuses nftables mode on kernels older than this (utilkernel.NFTablesKubeProxyKernelVersion). */
const nftablesModeKernel = [5, 13];

/**
 * checkNftablesRuns: nft answers and the kernel is one kube-proxy runs nftables mode on. `nft -t
 * list sets` is the question (terse: without the sets' elements), not `nft list tables`: nft reads
 * every rule of every table for that, minutes on a large iptables-nft node.
 */
export async function checkNftablesRuns(host: Host): Promise<void> {
  await host.nft(['-t', 'list', 'sets']);
  const release = (await host.sysctlRead('kernel.osrelease')).trim();
  const [major, minor] = (/^(\d+)\.(\d+)/.exec(release) ?? []).slice(1).map(Number);
  if (major < nftablesModeKernel[0] || (major === nftablesModeKernel[0] && minor < nftablesModeKernel[1]))
    throw new Error(`kube-proxy in nftables mode requires kernel ${nftablesModeKernel.join('.')} or later; this node runs ${release}`);
}

function mergeFamilies(diffs: BehaviourDiff[]): BehaviourDiff {
  if (diffs.length === 1) return diffs[0];
  const [first, ...rest] = diffs;
  const merged: BehaviourDiff = {...first, groups: [...first.groups], summary: {...first.summary, byEntry: {...first.summary.byEntry}}};
  for (const diff of rest) {
    merged.equal &&= diff.equal;
    merged.groups.push(...diff.groups);
    for (const key of ['classes', 'servicePorts', 'changedClasses', 'changedServicePorts', 'stopAnswering', 'startAnswering'] as const)
      merged.summary[key] += diff.summary[key];
    for (const [entry, count] of Object.entries(diff.summary.byEntry))
      merged.summary.byEntry[entry as keyof typeof merged.summary.byEntry] =
        (merged.summary.byEntry[entry as keyof typeof merged.summary.byEntry] ?? 0) + count;
  }
  return merged;
}

async function switchEvidence(state: RuntimeState, to: ProxyMode, diff: BehaviourDiff, applied: ModeRules[]): Promise<string[]> {
  const {host, backend} = state;
  const entries = new Set(diff.groups.flatMap((group) => group.changes.map((change) => change.class.entry)));
  const evidence: string[] = [];
  const counter = (name: string): Promise<number | undefined> => readNfacctPackets(host, name).catch(() => undefined);
  if (backend.mode === 'iptables' && to !== 'iptables') {
    const localhost = await counter('localhost_nps_accepted_pkts');
    if (localhost !== undefined)
      evidence.push(
        `${localhost} packets reached NodePorts on 127.0.0.1 so far (nfacct ` +
          `localhost_nps_accepted_pkts)${
            localhost > 0 && entries.has('node-port-loopback')
              ? ': something on the node uses them, and they stop ' + 'answering after the switch'
              : ''
          }`,
      );
    const invalid = await counter('ct_state_invalid_dropped_pkts');
    if (invalid !== undefined)
      evidence.push(
        `${invalid} packets conntrack marked INVALID were dropped so far (nfacct ct_state_invalid_dropped_pkts)${
          invalid > 0 ? `: after the ` + `switch ${to} mode lets them through, and the endpoints may answer them with resets` : ''
        }`,
      );
  }
  if (backend.mode === 'ipvs' && to !== 'ipvs') {
    const states = applied.flatMap((rules) => (rules.mode === 'ipvs' ? [rules.rules] : []));
    evidence.push(...(await hostSocketEvidence(host, states, to)));
    const lbIPs = state.models().flatMap(([, model]) => model.servicePorts.flatMap((port) => port.loadBalancerIPs));
    if (lbIPs.length > 0) {
      try {
        const ignore = (await host.sysctlRead('net/ipv4/conf/all/arp_ignore')).trim();
        const announce = (await host.sysctlRead('net/ipv4/conf/all/arp_announce')).trim();
        const strict = ignore === '1' && announce === '2';
        evidence.push(
          strict
            ? `arp_ignore=1 and arp_announce=2 (strictARP): the node does not answer ARP for the ${lbIPs.length} load-balancer IPs on kube-ipvs0, as ` +
                `after the switch`
            : `arp_ignore=${ignore} and arp_announce=${announce} (no strictARP): the node answers ARP for the ${lbIPs.length} load-balancer IPs bound ` +
                `to kube-ipvs0 today, and would not after the switch`,
        );
      } catch (error) {
        evidence.push(`the ARP settings could not be read: ${errorText(error).split('\n')[0]}`);
      }
    }
  }
  return evidence;
}

/**
 * hostSocketEvidence: the host sockets that answer on service addresses today only because ipvs
 * mode binds them to kube-ipvs0, read from the node's listening sockets and its applied ipvs state
 * (virtual servers, kube-ipvs0 addresses, KUBE-IPVS-FILTER).
 */
export async function hostSocketEvidence(host: Host, states: IpvsState[], to: ProxyMode): Promise<string[]> {
  const bound = states.reduce((count, ipvs) => count + ipvs.boundAddresses.length, 0);
  if (bound === 0) return [];
  let sockets: ListeningSocket[];
  try {
    sockets = parseListeningSockets(await host.listeningSockets());
  } catch (error) {
    return [`the host sockets could not be read (ss -l): ${errorText(error).split('\n')[0]}`];
  }
  return hostSocketSentences(socketsOnServiceAddresses(states, sockets), bound, to);
}
