// renderIpvs: the ProxyModel as ipvs mode writes it, in kube-proxy's layout (pkg/proxy/ipvs): one
// virtual server per service address and port, one real server per endpoint, the ipsets that
// classify service traffic, the addresses bound to kube-ipvs0 and the iptables rules that match
// those sets.
import {cidrContains, parseCIDR, parseIP} from '../model/ip.ts';
import type {Endpoint, LocalDetector, ProxyModel, ServicePort} from '../model/types.ts';
import {masqueradeMark} from '../iptables/render.ts';
import {compare, sortServers, virtualServer, type Ipset, type IpvsState, type IpvsVirtualServer} from './state.ts';

/** kube-proxy's ipset names (IPv6 sets carry a "6-" after "KUBE-"). */
export const ipsetNames = {
  loopBack: 'KUBE-LOOP-BACK',
  clusterIP: 'KUBE-CLUSTER-IP',
  externalIP: 'KUBE-EXTERNAL-IP',
  externalIPLocal: 'KUBE-EXTERNAL-IP-LOCAL',
  loadBalancer: 'KUBE-LOAD-BALANCER',
  loadBalancerLocal: 'KUBE-LOAD-BALANCER-LOCAL',
  loadBalancerFW: 'KUBE-LOAD-BALANCER-FW',
  loadBalancerSourceCIDR: 'KUBE-LOAD-BALANCER-SOURCE-CIDR',
  nodePortTCP: 'KUBE-NODE-PORT-TCP',
  nodePortLocalTCP: 'KUBE-NODE-PORT-LOCAL-TCP',
  nodePortUDP: 'KUBE-NODE-PORT-UDP',
  nodePortLocalUDP: 'KUBE-NODE-PORT-LOCAL-UDP',
  healthCheckNodePort: 'KUBE-HEALTH-CHECK-NODE-PORT',
  ipvsIPs: 'KUBE-IPVS-IPS',
} as const;

type SetRole = keyof typeof ipsetNames;

const setTypes: Record<SetRole, string> = {
  loopBack: 'hash:ip,port,ip',
  clusterIP: 'hash:ip,port',
  externalIP: 'hash:ip,port',
  externalIPLocal: 'hash:ip,port',
  loadBalancer: 'hash:ip,port',
  loadBalancerLocal: 'hash:ip,port',
  loadBalancerFW: 'hash:ip,port',
  loadBalancerSourceCIDR: 'hash:ip,port,net',
  nodePortTCP: 'bitmap:port',
  nodePortLocalTCP: 'bitmap:port',
  nodePortUDP: 'bitmap:port',
  nodePortLocalUDP: 'bitmap:port',
  healthCheckNodePort: 'bitmap:port',
  ipvsIPs: 'hash:ip',
};

/** ipsetName is the set's name for the family: KUBE-6-CLUSTER-IP for IPv6. */
export function ipsetName(role: SetRole, family: ProxyModel['family']): string {
  const name = ipsetNames[role];
  return family === 'IPv6' ? name.replace(/^KUBE-/, 'KUBE-6-') : name;
}

export interface RenderIpvsOptions {
  /** ipvs.scheduler; kube-proxy's default is rr. */
  scheduler?: string;
}

function ipPort(ip: string, protocol: string, port: number): string {
  return `${ip},${protocol.toLowerCase()}:${port}`;
}

/** hostNetwork strips /32 and /128, as `ipset save` prints single-address networks. */
function hostNetwork(cidr: string): string {
  return cidr.replace(/\/(32|128)$/, '');
}

/** nodePortAddresses resolves the model's nodePortAddresses to the node addresses NodePorts listen on. */
export function nodePortAddresses(model: ProxyModel): string[] {
  const wanted = model.config.nodePortAddresses;
  if (wanted.length === 0) return [...model.nodeIPs];
  if (wanted.length === 1 && wanted[0] === 'primary') return model.nodeIPs.slice(0, 1);
  const cidrs = wanted.map(parseCIDR).filter((cidr) => cidr !== undefined);
  return model.nodeIPs.filter((ip) => {
    const parsed = parseIP(ip);
    return parsed !== undefined && cidrs.some((cidr) => cidrContains(cidr, parsed));
  });
}

function notLocalMatch(detector: LocalDetector): string | undefined {
  switch (detector.mode) {
    case 'ClusterCIDR':
    case 'NodeCIDR':
      return detector.cidrs[0] === undefined ? undefined : `! -s ${detector.cidrs[0]}`;
    case 'BridgeInterface':
      return `! -i ${detector.interfaceName}`;
    case 'InterfaceNamePrefix':
      return `! -i ${detector.interfacePrefix}+`;
    default:
      return undefined;
  }
}

/** renderIpvs computes the whole desired ipvs-mode state of the node. */
export function renderIpvs(model: ProxyModel, options: RenderIpvsOptions = {}): IpvsState {
  const scheduler = options.scheduler || 'rr';
  const family = model.family;
  const entries = new Map<SetRole, Set<string>>(Object.keys(ipsetNames).map((role) => [role as SetRole, new Set<string>()]));
  const add = (role: SetRole, entry: string) => entries.get(role)!.add(entry);
  const servers = new Map<string, IpvsVirtualServer>();
  const bound = new Set<string>();
  const nodeAddresses = nodePortAddresses(model);

  const addServer = (port: ServicePort, address: string, portNumber: number, endpoints: Endpoint[]) => {
    const server = virtualServer(
      address,
      portNumber,
      port.protocol,
      scheduler,
      port.sessionAffinity?.timeoutSeconds,
      port.key,
      endpoints.map((endpoint) => ({address: endpoint.ip, port: endpoint.port, weight: 1})),
    );
    servers.set(`${port.protocol} ${address} ${portNumber}`, server);
  };

  for (const port of model.servicePorts) {
    const proto = port.protocol;
    const internal = port.internalPolicyLocal ? port.localEndpoints : port.clusterEndpoints;
    const external = port.externalPolicyLocal ? port.localEndpoints : port.clusterEndpoints;
    // Only a pod on this node can reach itself through this node's virtual server (kube-proxy skips the others).
    for (const endpoint of port.allReachableEndpoints)
      if (endpoint.isLocal) add('loopBack', `${endpoint.ip},${proto.toLowerCase()}:${endpoint.port},${endpoint.ip}`);

    if (port.clusterIP) {
      add('clusterIP', ipPort(port.clusterIP, proto, port.port));
      bound.add(port.clusterIP);
      addServer(port, port.clusterIP, port.port, internal);
    }
    for (const ip of port.externalIPs) {
      add(port.externalPolicyLocal ? 'externalIPLocal' : 'externalIP', ipPort(ip, proto, port.port));
      bound.add(ip);
      addServer(port, ip, port.port, external);
    }
    for (const ip of port.loadBalancerIPs) {
      add('loadBalancer', ipPort(ip, proto, port.port));
      if (port.externalPolicyLocal) add('loadBalancerLocal', ipPort(ip, proto, port.port));
      if (port.loadBalancerSourceRanges.length > 0 || port.loadBalancerSourceRangesInvalid) {
        add('loadBalancerFW', ipPort(ip, proto, port.port));
        for (const range of port.loadBalancerSourceRanges)
          add('loadBalancerSourceCIDR', `${ipPort(ip, proto, port.port)},${hostNetwork(range)}`);
      }
      bound.add(ip);
      addServer(port, ip, port.port, external);
    }
    if (port.nodePort > 0 && proto !== 'SCTP') {
      add(proto === 'TCP' ? 'nodePortTCP' : 'nodePortUDP', String(port.nodePort));
      if (port.externalPolicyLocal) add(proto === 'TCP' ? 'nodePortLocalTCP' : 'nodePortLocalUDP', String(port.nodePort));
      for (const ip of nodeAddresses) addServer(port, ip, port.nodePort, external);
    }
    if (port.healthCheckNodePort > 0) add('healthCheckNodePort', String(port.healthCheckNodePort));
  }
  for (const ip of bound) add('ipvsIPs', ip);

  const sets: Ipset[] = [...entries].map(([role, set]) => ({
    name: ipsetName(role, family),
    type: setTypes[role],
    entries: [...set].sort(compare),
  }));
  sets.sort((a, b) => compare(a.name, b.name));
  const nonEmpty = new Set(sets.filter((set) => set.entries.length > 0).map((set) => set.name));
  return {
    family,
    virtualServers: sortServers([...servers.values()]),
    sets,
    boundAddresses: [...bound].sort(compare),
    iptables: renderIpvsIptables(model, (role) => (nonEmpty.has(ipsetName(role, family)) ? ipsetName(role, family) : undefined)),
  };
}

/** The chains ipvs mode writes, by table. */
export const ipvsIptablesChains = {
  nat: ['KUBE-SERVICES', 'KUBE-POSTROUTING', 'KUBE-NODE-PORT', 'KUBE-LOAD-BALANCER', 'KUBE-MARK-MASQ'],
  filter: ['KUBE-FORWARD', 'KUBE-NODE-PORT', 'KUBE-PROXY-FIREWALL', 'KUBE-SOURCE-RANGES-FIREWALL', 'KUBE-IPVS-FILTER'],
} as const;

/** The rules from built-in chains into the chains above, as `-A CHAIN ...` lines of each table. */
export const ipvsJumpRules = {
  nat: [
    '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
  ],
  filter: [
    '-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT',
    '-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL',
    '-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER',
    '-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD',
  ],
} as const;

/**
 * The rules that send what one set matches on to a chain, each written only when its set has entries
 * (kube-proxy keeps the same facts in one table, ipsetWithIptablesChain).
 */
const setJumpRules: ReadonlyArray<{
  role: SetRole;
  table: 'nat' | 'filter';
  chain: string;
  protocol?: 'tcp' | 'udp';
  dirs: string;
  target: string;
}> = [
  {role: 'loopBack', table: 'nat', chain: 'KUBE-POSTROUTING', dirs: 'dst,dst,src', target: 'MASQUERADE'},
  {role: 'loadBalancer', table: 'nat', chain: 'KUBE-SERVICES', dirs: 'dst,dst', target: 'KUBE-LOAD-BALANCER'},
  {role: 'loadBalancerLocal', table: 'nat', chain: 'KUBE-LOAD-BALANCER', dirs: 'dst,dst', target: 'RETURN'},
  {role: 'nodePortLocalTCP', table: 'nat', chain: 'KUBE-NODE-PORT', protocol: 'tcp', dirs: 'dst', target: 'RETURN'},
  {role: 'nodePortTCP', table: 'nat', chain: 'KUBE-NODE-PORT', protocol: 'tcp', dirs: 'dst', target: 'KUBE-MARK-MASQ'},
  {role: 'nodePortLocalUDP', table: 'nat', chain: 'KUBE-NODE-PORT', protocol: 'udp', dirs: 'dst', target: 'RETURN'},
  {role: 'nodePortUDP', table: 'nat', chain: 'KUBE-NODE-PORT', protocol: 'udp', dirs: 'dst', target: 'KUBE-MARK-MASQ'},
  {role: 'loadBalancerFW', table: 'filter', chain: 'KUBE-PROXY-FIREWALL', dirs: 'dst,dst', target: 'KUBE-SOURCE-RANGES-FIREWALL'},
  {role: 'loadBalancerSourceCIDR', table: 'filter', chain: 'KUBE-SOURCE-RANGES-FIREWALL', dirs: 'dst,dst,src', target: 'RETURN'},
];

/**
 * renderIpvsIptables writes the iptables layer: `set(role)` names a set that has entries (rules
 * matching empty sets are left out, as kube-proxy does).
 */
function renderIpvsIptables(model: ProxyModel, set: (role: SetRole) => string | undefined): string {
  const mark = masqueradeMark(model.config.masqueradeBit);
  const nat: string[] = [];
  const filter: string[] = [];
  const match = (role: SetRole, dirs: string) => `-m set --match-set ${set(role)} ${dirs}`;
  const when = (role: SetRole, rule: () => string) => {
    if (set(role)) return rule();
    return undefined;
  };
  const push = (lines: string[], line: string | undefined) => line && lines.push(line);

  nat.push(`-A KUBE-SERVICES -s ${model.family === 'IPv6' ? '::1/128' : '127.0.0.0/8'} -j RETURN`);
  for (const rule of setJumpRules) {
    if (!set(rule.role)) continue;
    const protocol = rule.protocol ? ` -p ${rule.protocol}` : '';
    (rule.table === 'nat' ? nat : filter).push(`-A ${rule.chain}${protocol} ${match(rule.role, rule.dirs)} -j ${rule.target}`);
  }

  if (set('clusterIP')) {
    const notLocal = notLocalMatch(model.config.localDetector);
    if (model.config.masqueradeAll) nat.push(`-A KUBE-SERVICES ${match('clusterIP', 'dst,dst')} -j KUBE-MARK-MASQ`);
    else if (notLocal) nat.push(`-A KUBE-SERVICES ${match('clusterIP', 'dst,dst')} ${notLocal} -j KUBE-MARK-MASQ`);
    // Without a local detector the node's own connections carry a VIP source (kube-ipvs0 holds every VIP).
    else nat.push(`-A KUBE-SERVICES ${match('clusterIP', 'src,dst')} -j KUBE-MARK-MASQ`);
  }
  for (const role of ['externalIP', 'externalIPLocal'] as const) {
    if (!set(role)) continue;
    if (role === 'externalIP') nat.push(`-A KUBE-SERVICES ${match(role, 'dst,dst')} -j KUBE-MARK-MASQ`);
    nat.push(`-A KUBE-SERVICES ${match(role, 'dst,dst')} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT`);
    nat.push(`-A KUBE-SERVICES ${match(role, 'dst,dst')} -m addrtype --dst-type LOCAL -j ACCEPT`);
  }
  nat.push('-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT');
  nat.push('-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ');
  filter.push('-A KUBE-SOURCE-RANGES-FIREWALL -j DROP');
  for (const role of ['clusterIP', 'loadBalancer'] as const) {
    push(
      nat,
      when(role, () => `-A KUBE-SERVICES ${match(role, 'dst,dst')} -j ACCEPT`),
    );
  }
  filter.push(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`);
  filter.push(
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
  );
  push(
    filter,
    when('healthCheckNodePort', () => `-A KUBE-NODE-PORT ${match('healthCheckNodePort', 'dst')} -j ACCEPT`),
  );
  for (const role of ['loadBalancer', 'clusterIP', 'externalIP', 'externalIPLocal'] as const) {
    push(
      filter,
      when(role, () => `-A KUBE-IPVS-FILTER ${match(role, 'dst,dst')} -j RETURN`),
    );
  }
  push(
    filter,
    when('healthCheckNodePort', () => `-A KUBE-IPVS-FILTER ${match('healthCheckNodePort', 'dst')} -j RETURN`),
  );
  push(
    filter,
    when('ipvsIPs', () => `-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW ${match('ipvsIPs', 'dst')} -j REJECT`),
  );
  nat.push(`-A KUBE-POSTROUTING -m mark ! --mark ${mark}/${mark} -j RETURN`);
  nat.push(`-A KUBE-POSTROUTING -j MARK --xor-mark ${mark}`);
  nat.push('-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully');
  nat.push(`-A KUBE-MARK-MASQ -j MARK --or-mark ${mark}`);

  const table = (name: 'nat' | 'filter', rules: string[]) =>
    [`*${name}`, ...ipvsIptablesChains[name].map((chain) => `:${chain} - [0:0]`), ...rules, 'COMMIT'].join('\n');
  return `${table('nat', nat)}\n${table('filter', filter)}\n`;
}
