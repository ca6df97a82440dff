// traceIpvs: a packet through the state ipvs mode holds in the kernel. The iptables layer decides
// source-range filtering and the masquerade mark from set membership; IPVS, on the input path of a
// node that holds the address (kube-ipvs0 or a NodePort address), picks a real server by scheduler
// and weight; POSTROUTING masquerades marked and hairpin packets. A packet to a node address on a
// port no virtual server takes meets KUBE-IPVS-FILTER, where the node has it.
import {cidrContains, joinHostPort, parseCIDR, parseIP} from '../model/ip.ts';
import type {Packet, TraceBranch, TraceContext, TraceHop, TraceResult} from '../trace/types.ts';
import {accessFilterVerdict} from './access-filter.ts';
import {formatIpvsadmRestore, sortedIncludes, type IpvsState} from './state.ts';

/**
 * A set's entries, and whether it holds one, found by halving their sorted order (IpvsState keeps
 * it): a trace copies no set, which on a large node holds a hundred thousand entries.
 */
function setNamed(state: IpvsState, base: string): {entries: readonly string[]; has(entry: string): boolean} {
  const name = state.family === 'IPv6' ? base.replace(/^KUBE-/, 'KUBE-6-') : base;
  const entries = state.sets.find((set) => set.name === name)?.entries ?? [];
  return {entries, has: (entry) => sortedIncludes(entries, entry)};
}

function contains(cidrText: string, ipText: string): boolean {
  const cidr = parseCIDR(cidrText.includes('/') ? cidrText : `${cidrText}/${cidrText.includes(':') ? 128 : 32}`);
  const ip = parseIP(ipText);
  return cidr !== undefined && ip !== undefined && cidrContains(cidr, ip);
}

/**
 * clusterMasquerade reads the KUBE-CLUSTER-IP masquerade rule of the applied iptables layer and
 * says whether it marks the packet: always (masqueradeAll), for non-local sources (a local
 * detector), or for sources that are service addresses (no detector).
 */
function clusterMasquerade(state: IpvsState, packet: Packet): {marks: boolean; why: string; rule: string} | undefined {
  const rule = state.iptables
    .split('\n')
    .find((line) => /^-A KUBE-SERVICES .*--match-set KUBE-(6-)?CLUSTER-IP \S+ .*-j KUBE-MARK-MASQ/.test(line));
  if (!rule) return undefined;
  const notSource = /! -s (\S+)/.exec(rule);
  if (notSource) {
    const marks = !contains(notSource[1], packet.srcIP);
    return {
      rule,
      marks,
      why: marks
        ? `source ${packet.srcIP} is outside the cluster range ${notSource[1]}`
        : `source ${packet.srcIP} is inside the cluster range ${notSource[1]}`,
    };
  }
  const notInterface = /! -i (\S+)/.exec(rule);
  if (notInterface) {
    const name = notInterface[1];
    const fromPod =
      packet.inInterface !== undefined &&
      (name.endsWith('+') ? packet.inInterface.startsWith(name.slice(0, -1)) : packet.inInterface === name);
    return {
      rule,
      marks: !fromPod,
      why: fromPod ? `it arrives on pod interface ${packet.inInterface}` : `it does not arrive on pod interface ${name}`,
    };
  }
  if (/src,dst/.test(rule)) {
    const marks = state.boundAddresses.includes(packet.srcIP);
    return {rule, marks, why: marks ? `source ${packet.srcIP} is a service address` : `source ${packet.srcIP} is not a service address`};
  }
  return {rule, marks: true, why: 'every packet to a service is masqueraded (masqueradeAll)'};
}

/** traceIpvs walks `packet` through the ipvs-mode state read from the node. */
export function traceIpvs(state: IpvsState, packet: Packet, context: TraceContext): TraceResult {
  const proto = packet.protocol.toLowerCase();
  const ipPort = `${packet.dstIP},${proto}:${packet.dstPort}`;
  const hops: TraceHop[] = [];
  const warnings: string[] = [];
  const result = (verdict: TraceResult['verdict'], branches: TraceBranch[] = [], servicePort?: string): TraceResult => ({
    packet,
    verdict,
    hops,
    branches,
    ...(servicePort ? {servicePort} : {}),
    warnings,
  });
  const server = state.virtualServers.find(
    (vs) => vs.address === packet.dstIP && vs.port === packet.dstPort && vs.protocol === packet.protocol,
  );
  if (!server) {
    // An address of the node, on a port no virtual server takes: filter INPUT decides (KUBE-IPVS-FILTER).
    const filtered = context.localAddresses.includes(packet.dstIP)
      ? accessFilterVerdict(state, packet.dstIP, packet.dstPort, packet.protocol)
      : undefined;
    if (filtered?.refused && filtered.rule) {
      const target = / -j (REJECT|DROP)/.exec(filtered.rule)?.[1] as 'REJECT' | 'DROP';
      hops.push({
        hook: 'INPUT',
        table: 'filter',
        chain: 'KUBE-IPVS-FILTER',
        rule: filtered.rule,
        target,
        explanation:
          `${packet.dstIP} is a service address on kube-ipvs0 and no service uses port ${packet.dstPort}/${packet.protocol} there: ` +
          'new connections are refused',
      });
      return result(target);
    }
    warnings.push(`no virtual server for ${packet.protocol} ${joinHostPort(packet.dstIP, packet.dstPort)}`);
    return result('ACCEPT');
  }
  const servicePort = server.servicePort || undefined;
  const natHook: TraceHop['hook'] = packet.origin === 'local' ? 'OUTPUT' : 'PREROUTING';
  const local = context.localAddresses.includes(packet.dstIP);

  // Load balancer source ranges (filter INPUT, KUBE-PROXY-FIREWALL). The node's own connections
  // never reach INPUT: ipvs takes them as they leave (LOCAL_OUT) and sends them to the real server,
  // and kube-proxy's firewall chain is not jumped to from OUTPUT in ipvs mode.
  if (packet.origin !== 'local' && setNamed(state, 'KUBE-LOAD-BALANCER-FW').has(ipPort)) {
    const allowed = setNamed(state, 'KUBE-LOAD-BALANCER-SOURCE-CIDR')
      .entries.filter((entry) => entry.startsWith(`${ipPort},`))
      .map((entry) => entry.slice(ipPort.length + 1));
    if (!allowed.some((range) => contains(range, packet.srcIP))) {
      hops.push({
        hook: 'INPUT',
        table: 'filter',
        chain: 'KUBE-SOURCE-RANGES-FIREWALL',
        rule: '-A KUBE-SOURCE-RANGES-FIREWALL -j DROP',
        target: 'DROP',
        explanation: `source ${packet.srcIP} is not in the load balancer's source ranges (${allowed.join(', ') || 'none'})`,
      });
      return result('DROP', [], servicePort);
    }
  }

  // The masquerade mark (nat KUBE-SERVICES and its sub-chains).
  let mark: string | undefined;
  const clusterEntry = setNamed(state, 'KUBE-CLUSTER-IP').has(ipPort);
  if (clusterEntry) {
    const decision = clusterMasquerade(state, packet);
    if (decision?.marks) {
      mark = decision.why;
      hops.push({
        hook: natHook,
        table: 'nat',
        chain: 'KUBE-SERVICES',
        rule: decision.rule,
        target: 'KUBE-MARK-MASQ',
        explanation: `${packet.dstIP}:${packet.dstPort} is a cluster IP and ${decision.why}: marked for masquerade`,
      });
    }
  } else if (setNamed(state, 'KUBE-EXTERNAL-IP').has(ipPort)) {
    mark = `${packet.dstIP} is an external IP`;
  } else if (setNamed(state, 'KUBE-LOAD-BALANCER').has(ipPort)) {
    if (!setNamed(state, 'KUBE-LOAD-BALANCER-LOCAL').has(ipPort))
      mark = `${packet.dstIP} is a load balancer IP with externalTrafficPolicy Cluster`;
  } else if (local) {
    const port = String(packet.dstPort);
    if (
      setNamed(state, `KUBE-NODE-PORT-${packet.protocol}`).has(port) &&
      !setNamed(state, `KUBE-NODE-PORT-LOCAL-${packet.protocol}`).has(port)
    ) {
      mark = `${packet.dstPort} is a NodePort with externalTrafficPolicy Cluster`;
    }
  }
  if (mark && !clusterEntry) {
    hops.push({
      hook: natHook,
      table: 'nat',
      chain: 'KUBE-SERVICES',
      rule: '',
      target: 'KUBE-MARK-MASQ',
      explanation: `${mark}: marked for masquerade`,
    });
  }

  const [serverLine] = formatIpvsadmRestore([{...server, realServers: []}])
    .trim()
    .split('\n');
  const active = server.realServers.filter((real) => real.weight > 0);
  const total = active.reduce((sum, real) => sum + real.weight, 0);
  const affinity =
    server.persistenceTimeout !== undefined ? `; the client stays with its choice for ${server.persistenceTimeout} s (persistence)` : '';
  hops.push({
    hook: 'INPUT',
    table: 'ipvs',
    chain: `${server.protocol} ${joinHostPort(server.address, server.port)}`,
    rule: serverLine,
    target: server.scheduler,
    explanation: active.length
      ? `virtual server ${joinHostPort(server.address, server.port)} picks one of ${active.length} real servers (scheduler ${server.scheduler})${affinity}`
      : `virtual server ${joinHostPort(server.address, server.port)} has no real server with weight above 0`,
  });
  if (active.length === 0) {
    warnings.push(`${servicePort ?? joinHostPort(server.address, server.port)} has no endpoints: the connection is refused`);
    return result('REJECT', [], servicePort);
  }
  const branches: TraceBranch[] = active.map((real) => {
    const hairpin = real.address === packet.srcIP;
    const masquerade = mark !== undefined || hairpin;
    return {
      endpoint: joinHostPort(real.address, real.port),
      probability: real.weight / total,
      hops: [
        {
          hook: 'INPUT',
          table: 'ipvs',
          chain: `${server.protocol} ${joinHostPort(server.address, server.port)}`,
          rule: `-a ${serverLine.slice(3).replace(/ -s .*$/, '')} -r ${joinHostPort(real.address, real.port)} -m -w ${real.weight}`,
          target: 'MASQ',
          explanation: `forwarded to real server ${joinHostPort(real.address, real.port)} (weight ${real.weight} of ${total})`,
        },
      ],
      masquerade,
      masqueradeReason: hairpin
        ? `the pod reaches itself through the service (KUBE-LOOP-BACK): source rewritten to the node`
        : mark
          ? `${mark}: KUBE-POSTROUTING masquerades marked packets`
          : 'no masquerade mark: the endpoint sees the client address',
    };
  });
  return result('DNAT', branches, servicePort);
}
