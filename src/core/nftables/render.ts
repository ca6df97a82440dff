// renderNftables: ProxyModel -> an `nft -f` script for table `ip kube-proxy` / `ip6 kube-proxy`,
// with kube-proxy's nftables layout (verdict maps for service lookup, per-service chains,
// no-endpoint and firewall maps, masquerade marking), either whole or as one transaction that
// touches only the changed service ports.
//
// One difference in layout, for speed: kube-proxy picks an endpoint with `numgen random mod N vmap
// { i : goto endpoint-chain }`, a chain and an anonymous set per endpoint, and nft slows down with
// every kernel object (10,000 services x 10 endpoints take minutes to load). Here a service port
// without session affinity picks its endpoint from a shared map, `endpoint-targets-tcp-S` (one per
// protocol, as nft types a map's port by protocol, and per shard S of service ports), keyed by
// `numgen random mod N offset K` (each service port owns the keys K..K+N-1), and hairpin traffic
// (a pod reaching itself) is recognised after DNAT in `masquerading` by the set
// `hairpin-endpoints`. Services with session affinity keep kube-proxy's endpoint chains and
// per-endpoint affinity sets. The packets see the same behaviour either way.
import {servicePortIdentity} from '../model/changes.ts';
import {cidrContains, parseCIDR, parseIP} from '../model/ip.ts';
import {endpointKey} from '../model/endpoint.ts';
import type {Endpoint, ProxyModel, ServicePort} from '../model/types.ts';
import {jumpRule, kubeProxyBaseChainsBefore134, kubeProxyJumpsBefore134, kubeProxySet, renderKubeProxySetup} from './kube-proxy-layout.ts';
import {endpointMapShard, endpointNameBase, namePrefixes, servicePortChains, tableName} from './names.ts';

export interface NftablesRenderOptions {
  /**
   * Service ports (servicePortIdentity) changed since `existing` was applied. With `existing`,
   * the script is one transaction for these only; without, a full sync.
   */
  changedServicePorts?: Set<string>;
  /**
   * What the last successful sync left in the kernel (from renderNftablesSync). A partial render
   * updates it in place and returns it: after a failed apply, sync fully with recreateTable.
   */
  existing?: NftablesState;
  /**
   * The cluster's service CIDRs (ServiceCIDR objects / --service-cluster-ip-range). Traffic to an
   * address inside them that is no service's ClusterIP is dropped; without them it is left alone,
   * as kube-proxy does before it has seen a ServiceCIDR.
   */
  serviceCIDRs?: string[];
  /**
   * The node's local addresses, to match nodePortAddresses CIDRs against. Default: the model's
   * node IPs.
   */
  nodeAddresses?: string[];
  /**
   * Full sync only: delete and recreate the table in the same transaction, dropping whatever it
   * held (another proxy's objects, a failed sync's leftovers). Session-affinity memory is lost.
   */
  recreateTable?: boolean;
  /** Clock for stale-chain bookkeeping, in ms. Default Date.now(). */
  now?: number;
}

/** One element of a set or map: key (and value) as nft writes them, "a . b . c". */
export interface NftElement {
  container: string;
  key: string;
  value?: string;
  comment?: string;
}

interface EndpointBlock {
  chain: string;
  /** The endpoint-targets map holding the block. */
  map: string;
  offset: number;
  /** "ip . port" per key, in key order. */
  targets: string[];
}

/** Footprint: every kernel object and element one service port needs. */
interface Footprint {
  /**
   * Each chain's rules one per line, in one string: what a partial sync compares, and smaller than
   * an array of the concatenated strings the rules were built as (30,000 chains at 10,000 services).
   */
  chains: Array<{name: string; rules: string}>;
  affinitySets: Array<{name: string; timeoutSeconds: number}>;
  /** Elements of the shared sets and maps; the endpoint-targets elements are the blocks'. */
  elements: NftElement[];
  /** The service port's own keys of the endpoint-targets maps: no other holds them, so they need no bookkeeping. */
  blocks: EndpointBlock[];
}

/** NftablesState is what one sync left in the kernel; the next incremental sync starts from it. */
export interface NftablesState {
  family: ProxyModel['family'];
  /** Node-wide settings the fixed part of the table was written for; a change needs a full sync. */
  setupKey: string;
  footprints: Map<string, Footprint>;
  /**
   * container -> key -> the element as the first service port holding it wrote it (its value and
   * comment are the kernel's), and how many service ports hold it (see heldElement).
   */
  elements: Map<string, Map<string, HeldElement>>;
  /** First free key of the endpoint-targets maps (one key space for all of them). */
  nextOffset: number;
  /** endpoint-targets maps created so far. */
  targetMaps: Set<string>;
  /** Chains flushed and no longer referenced, with the time they went stale (ms). */
  staleChains: Map<string, number>;
}

/**
 * HeldElement: the element itself while one service port holds it, which most are (no object of
 * its own for each of the 200,000 elements at 10,000 services x 10 endpoints), else the first
 * holder's element and the count.
 */
type HeldElement = NftElement | {count: number; element: NftElement};

function heldElement(state: NftablesState, element: Pick<NftElement, 'container' | 'key'>): {count: number; first: NftElement} | undefined {
  const held = state.elements.get(element.container)?.get(element.key);
  if (held === undefined) return undefined;
  return 'count' in held ? {count: held.count, first: held.element} : {count: 1, first: held};
}

/** holdElement records that `count` service ports hold `first`'s element; none deletes it. */
function holdElement(state: NftablesState, first: NftElement, count: number): void {
  let container = state.elements.get(first.container);
  if (!container) state.elements.set(first.container, (container = new Map()));
  if (count <= 0) container.delete(first.key);
  else container.set(first.key, count === 1 ? first : {count, element: first});
}

export interface NftablesSync {
  script: string;
  kind: 'full' | 'partial';
  /** The state after the script is applied successfully. */
  state: NftablesState;
}

/** Fixed chains and maps of the table (kube-proxy's names, plus the two of our endpoint choice). */
export const nftNames = {
  services: 'services',
  serviceIPs: 'service-ips',
  serviceNodePorts: 'service-nodeports',
  nodePortIPs: 'nodeport-ips',
  clusterIPs: 'cluster-ips',
  serviceEndpointsCheck: 'service-endpoints-check',
  nodePortEndpointsCheck: 'nodeport-endpoints-check',
  noEndpointServices: 'no-endpoint-services',
  noEndpointNodePorts: 'no-endpoint-nodeports',
  reject: 'reject-chain',
  clusterIPsCheck: 'cluster-ips-check',
  firewallIPs: 'firewall-ips',
  firewallCheck: 'firewall-check',
  markMasq: 'mark-for-masquerade',
  masquerading: 'masquerading',
  hairpinEndpoints: 'hairpin-endpoints',
  localCIDRs: 'local-cidrs',
} as const;

/** Maps and sets emptied and refilled by every full sync. */
const refilledContainers = [
  nftNames.clusterIPs,
  nftNames.serviceIPs,
  nftNames.firewallIPs,
  nftNames.noEndpointServices,
  nftNames.noEndpointNodePorts,
  nftNames.serviceNodePorts,
  nftNames.hairpinEndpoints,
];

/** endpointTargetsMap: the endpoint-choice map of a protocol ("tcp", "udp", "sctp") and shard. */
export function endpointTargetsMap(protocol: string, shard: number): string {
  return `endpoint-targets-${protocol}-${shard}`;
}

function endpointTargetsMapDefinition(words: FamilyWords, map: string): string {
  const protocol = /^endpoint-targets-(\w+)-/.exec(map)![1];
  return `add map ${words.ipX} ${tableName} ${map} { typeof numgen random mod 1 : ${words.ipX} daddr . ${protocol} dport ; }`;
}

/** masqueradeMark: the mark bit as nft lists it, e.g. 0x00004000 for bit 14. */
export function masqueradeMark(bit: number): string {
  return `0x${(2 ** bit).toString(16).padStart(8, '0')}`;
}

interface FamilyWords {
  /** "ip" or "ip6": table family and payload protocol. */
  ipX: 'ip' | 'ip6';
  addrType: 'ipv4_addr' | 'ipv6_addr';
  loopback: string;
  /** nftablesLayout 'kube-proxy' or 'kube-proxy-1.33': a chain per endpoint, no shared maps, kube-proxy's spelling. */
  kubeProxyLayout: boolean;
  /** 'kube-proxy-1.33': kube-proxy's base chains before 1.34, and the port in the ClusterIP masquerade rule. */
  kubeProxyBefore134: boolean;
}

function familyWords(model: ProxyModel): FamilyWords {
  const kubeProxyBefore134 = model.config.nftablesLayout === 'kube-proxy-1.33';
  const kubeProxyLayout = kubeProxyBefore134 || model.config.nftablesLayout === 'kube-proxy';
  const layout = {kubeProxyLayout, kubeProxyBefore134};
  return model.family === 'IPv6'
    ? {ipX: 'ip6', addrType: 'ipv6_addr', loopback: '::1', ...layout}
    : {ipX: 'ip', addrType: 'ipv4_addr', loopback: '127.0.0.0/8', ...layout};
}

/**
 * valueList writes addresses and CIDRs as nft lists them: a host prefix as the bare address, one
 * value without braces, several as an anonymous set.
 */
function valueList(items: string[]): string {
  const shown = items.map((item) => {
    const cidr = parseCIDR(item);
    return cidr && cidr.prefixLength === (cidr.family === 'IPv4' ? 32 : 128) ? cidr.network.text : (cidr?.text ?? item);
  });
  return shown.length === 1 ? shown[0] : `{ ${shown.join(', ')} }`;
}

/** outermostCIDRs drops CIDRs inside another of the list (an interval set refuses overlaps). */
function outermostCIDRs(texts: string[]): string[] {
  const cidrs = texts.map((text) => parseCIDR(text)).filter((cidr) => cidr !== undefined);
  const kept = cidrs.filter(
    (cidr, index) =>
      !cidrs.some(
        (other, otherIndex) =>
          otherIndex !== index &&
          other.prefixLength <= cidr.prefixLength &&
          cidrContains(other, cidr.network) &&
          (other.prefixLength < cidr.prefixLength || otherIndex < index),
      ),
  );
  return [...new Set(kept.map((cidr) => cidr.text))];
}

/** localTrafficMatch: kube-proxy's IfLocalNFT / IfNotLocalNFT for the model's detector. */
function localTrafficMatch(model: ProxyModel, words: FamilyWords, local: boolean): string | undefined {
  const detector = model.config.localDetector;
  const op = local ? '' : '!= ';
  switch (detector.mode) {
    case 'ClusterCIDR':
    case 'NodeCIDR':
      if (detector.cidrs.length === 0) return undefined;
      // Several CIDRs go in one named set: an anonymous set in every service chain is a kernel
      // object each, and nft slows down with every one.
      const cidrs = outermostCIDRs(detector.cidrs);
      if (cidrs.length > 1 && words.kubeProxyLayout) return `${words.ipX} saddr ${op}${kubeProxySet(cidrs)}`;
      if (cidrs.length > 1) return `${words.ipX} saddr ${op}@${nftNames.localCIDRs}`;
      return `${words.ipX} saddr ${op}${valueList(cidrs)}`;
    case 'BridgeInterface':
      return `iifname ${op}"${detector.interfaceName}"`;
    case 'InterfaceNamePrefix':
      return `iifname ${op}"${detector.interfacePrefix}*"`;
    case 'None':
      return undefined;
  }
}

/** familyCIDRs: the CIDRs of the model's family, as parseCIDR writes them. */
function familyCIDRs(model: ProxyModel, texts: string[] | undefined): string[] {
  return (texts ?? [])
    .map((text) => parseCIDR(text))
    .filter((cidr) => cidr !== undefined && cidr.family === model.family)
    .map((cidr) => cidr!.text);
}

interface NodePortPlan {
  /** Every local address accepts NodePorts (a CIDR covering the whole family was given). */
  matchAll: boolean;
  addresses: string[];
}

/**
 * nodePortPlan: nftables mode takes an empty nodePortAddresses as "primary" (the node's primary
 * IP only); CIDRs select the node addresses inside them; loopback never accepts NodePorts.
 */
export function nodePortPlan(model: ProxyModel, nodeAddresses?: string[]): NodePortPlan {
  const given = model.config.nodePortAddresses.length === 0 ? ['primary'] : model.config.nodePortAddresses;
  const cidrs = given
    .filter((entry) => entry !== 'primary')
    .map((entry) => parseCIDR(entry))
    .filter((cidr) => cidr !== undefined && cidr.family === model.family);
  if (cidrs.some((cidr) => cidr!.prefixLength === 0)) return {matchAll: true, addresses: []};
  const addresses: string[] = [];
  const add = (address: string) => {
    const ip = parseIP(address);
    if (!ip || ip.family !== model.family) return;
    const loopback = ip.family === 'IPv4' ? ip.bytes[0] === 127 : ip.text === '::1';
    if (!loopback && !addresses.includes(ip.text)) addresses.push(ip.text);
  };
  if (given.includes('primary') && model.nodeIPs.length > 0) add(model.nodeIPs[0]);
  for (const address of nodeAddresses ?? model.nodeIPs) {
    const ip = parseIP(address);
    if (ip && cidrs.some((cidr) => cidrContains(cidr!, ip))) add(address);
  }
  return {matchAll: false, addresses};
}

function setupKey(model: ProxyModel, options: NftablesRenderOptions): string {
  return JSON.stringify([model.family, model.nodeIPs, model.config, options.serviceCIDRs ?? [], options.nodeAddresses ?? []]);
}

/** renderSetup writes the fixed part of the table and empties every refilled map and set. */
function renderSetup(model: ProxyModel, options: NftablesRenderOptions, words: FamilyWords, out: string[]): void {
  if (words.kubeProxyLayout) {
    const serviceCIDRs = familyCIDRs(model, options.serviceCIDRs);
    const release = words.kubeProxyBefore134 ? 'before-1.34' : 'current';
    renderKubeProxySetup(model, {...words, release, serviceCIDRs, nodePorts: nodePortPlan(model, options.nodeAddresses)}, out);
    return;
  }
  const t = `${words.ipX} ${tableName}`;
  const mark = masqueradeMark(model.config.masqueradeBit);
  out.push(`add table ${t} { comment "rules for kube-proxy" ; }`);
  for (const chain of kubeProxyBaseChainsBefore134) {
    out.push(`add chain ${t} ${chain.name} { type ${chain.type} hook ${chain.hook} priority ${chain.priority} ; }`);
    out.push(`flush chain ${t} ${chain.name}`);
  }
  const created = new Set<string>();
  const ensure = (name: string) => {
    if (created.has(name)) return;
    created.add(name);
    out.push(`add chain ${t} ${name}`, `flush chain ${t} ${name}`);
  };
  // Reject is only allowed in input, forward and output hooks on older kernels.
  for (const jump of kubeProxyJumpsBefore134) {
    ensure(jump.to);
    out.push(`add rule ${t} ${jump.from} ${jumpRule(jump)}`);
  }
  for (const name of [
    nftNames.services,
    nftNames.clusterIPsCheck,
    nftNames.masquerading,
    nftNames.markMasq,
    nftNames.reject,
    nftNames.firewallCheck,
  ])
    ensure(name);

  out.push(`add rule ${t} ${nftNames.markMasq} meta mark set meta mark | ${mark}`);
  const detector = model.config.localDetector;
  if ((detector.mode === 'ClusterCIDR' || detector.mode === 'NodeCIDR') && outermostCIDRs(detector.cidrs).length > 1) {
    out.push(
      `add set ${t} ${nftNames.localCIDRs} { type ${words.addrType} ; flags interval ; comment "sources of pod traffic (local traffic detection)" ; }`,
    );
    out.push(`flush set ${t} ${nftNames.localCIDRs}`);
    out.push(`add element ${t} ${nftNames.localCIDRs} { ${outermostCIDRs(detector.cidrs).join(', ')} }`);
  }
  out.push(
    `add set ${t} ${nftNames.hairpinEndpoints} { type ${words.addrType} . ${words.addrType} ` +
      `; comment "endpoints masqueraded when they reach themselves through a service" ; }`,
  );
  out.push(
    `add rule ${t} ${nftNames.masquerading} ct status dnat ${words.ipX} saddr . ${words.ipX} daddr @${nftNames.hairpinEndpoints} jump ${nftNames.markMasq}`,
  );
  out.push(`add rule ${t} ${nftNames.masquerading} meta mark & ${mark} == 0x00000000 return`);
  out.push(`add rule ${t} ${nftNames.masquerading} meta mark set meta mark ^ ${mark}`);
  out.push(`add rule ${t} ${nftNames.masquerading} masquerade fully-random`);

  out.push(`add set ${t} ${nftNames.clusterIPs} { type ${words.addrType} ; comment "Active ClusterIPs" ; }`);
  out.push(
    `add rule ${t} ${nftNames.clusterIPsCheck} ${words.ipX} daddr @${nftNames.clusterIPs} reject comment "Reject traffic to invalid ports of ClusterIPs"`,
  );
  const serviceCIDRs = familyCIDRs(model, options.serviceCIDRs);
  if (serviceCIDRs.length > 0) {
    out.push(
      `add rule ${t} ${nftNames.clusterIPsCheck} ${words.ipX} daddr ${valueList(serviceCIDRs)} drop comment "Drop traffic to unallocated ClusterIPs"`,
    );
  }

  const nodePorts = nodePortPlan(model, options.nodeAddresses);
  out.push(`add set ${t} ${nftNames.nodePortIPs} { type ${words.addrType} ; comment "IPs that accept NodePort traffic" ; }`);
  if (nodePorts.matchAll) {
    out.push(`delete set ${t} ${nftNames.nodePortIPs}`);
  } else {
    out.push(`flush set ${t} ${nftNames.nodePortIPs}`);
    if (nodePorts.addresses.length > 0) out.push(`add element ${t} ${nftNames.nodePortIPs} { ${nodePorts.addresses.join(', ')} }`);
  }

  out.push(
    `add map ${t} ${nftNames.noEndpointServices} { type ${words.addrType} . inet_proto . inet_service : verdict ` +
      `; comment "vmap to drop or reject packets to services with no endpoints" ; }`,
  );
  out.push(
    `add map ${t} ${nftNames.noEndpointNodePorts} { type inet_proto . inet_service : verdict ` +
      `; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`,
  );
  out.push(`add rule ${t} ${nftNames.reject} reject`);
  out.push(
    `add rule ${t} ${nftNames.serviceEndpointsCheck} ${words.ipX} daddr . meta l4proto . th dport vmap @${nftNames.noEndpointServices}`,
  );
  out.push(
    nodePorts.matchAll
      ? `add rule ${t} ${nftNames.nodePortEndpointsCheck} ${words.ipX} daddr != ${words.loopback} meta l4proto . th dport vmap @${nftNames.noEndpointNodePorts}`
      : `add rule ${t} ${nftNames.nodePortEndpointsCheck} ${words.ipX} daddr @${nftNames.nodePortIPs} ` +
          `meta l4proto . th dport vmap @${nftNames.noEndpointNodePorts}`,
  );

  out.push(
    `add map ${t} ${nftNames.firewallIPs} { type ${words.addrType} . inet_proto . inet_service : verdict ` +
      `; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`,
  );
  out.push(`add rule ${t} ${nftNames.firewallCheck} ${words.ipX} daddr . meta l4proto . th dport vmap @${nftNames.firewallIPs}`);

  out.push(
    `add map ${t} ${nftNames.serviceIPs} { type ${words.addrType} . inet_proto . inet_service : verdict ` +
      `; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`,
  );
  out.push(`add map ${t} ${nftNames.serviceNodePorts} { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`);
  out.push(`add rule ${t} ${nftNames.services} ${words.ipX} daddr . meta l4proto . th dport vmap @${nftNames.serviceIPs}`);
  out.push(
    nodePorts.matchAll
      ? `add rule ${t} ${nftNames.services} fib daddr type local ${words.ipX} daddr != ${words.loopback} ` +
          `meta l4proto . th dport vmap @${nftNames.serviceNodePorts}`
      : `add rule ${t} ${nftNames.services} ${words.ipX} daddr @${nftNames.nodePortIPs} meta l4proto . th dport vmap @${nftNames.serviceNodePorts}`,
  );

  for (const name of refilledContainers)
    out.push(`flush ${name === nftNames.clusterIPs || name === nftNames.hairpinEndpoints ? 'set' : 'map'} ${t} ${name}`);
}

/**
 * Allocates endpoint-target keys. A partial sync keeps a chain's block when it has as many
 * endpoints as before: the chain's rule (`mod N offset K`) stays the same, and only the keys whose
 * endpoint changed get new values, so an endpoint change is a few element updates, no chain rewrite.
 */
interface BlockAllocator {
  allocate(chain: string, map: string, targets: string[]): EndpointBlock;
}

/**
 * footprintOf computes what one service port needs, following kube-proxy's syncProxyRules: which
 * chains exist, which map elements send its addresses where, and the rules of each chain.
 */
function footprintOf(model: ProxyModel, port: ServicePort, words: FamilyWords, blocks: BlockAllocator): Footprint {
  const footprint: Footprint = {chains: [], affinitySets: [], elements: [], blocks: []};
  const protocol = port.protocol.toLowerCase();
  const names = servicePortChains(port);
  const chainRules = new Map<string, string[]>();
  const chain = (name: string): string[] => {
    let rules = chainRules.get(name);
    if (!rules) chainRules.set(name, (rules = []));
    return rules;
  };
  const element = (container: string, key: string, value?: string, comment?: string) => {
    // Plain literals, not spreads: an object spread makes each of the 200,000 elements bigger.
    footprint.elements.push(
      value === undefined
        ? comment === undefined
          ? {container, key}
          : {container, key, comment}
        : comment === undefined
          ? {container, key, value}
          : {container, key, value, comment},
    );
  };
  const mark = nftNames.markMasq;
  const affinity = port.sessionAffinity !== undefined;
  // kube-proxy's layout, and session affinity in either, pick an endpoint chain per endpoint.
  const endpointChains = affinity || words.kubeProxyLayout;
  const hasEndpoints = port.hasAnyEndpoints;
  const endpointChain = (endpoint: Endpoint) => namePrefixes.endpoint + endpointNameBase(port, endpoint);
  const affinitySet = (endpoint: Endpoint) => namePrefixes.affinity + endpointNameBase(port, endpoint);

  const usesClusterChain = port.clusterEndpoints.length > 0 && port.usesClusterEndpoints;
  const usesLocalChain = port.localEndpoints.length > 0 && port.usesLocalEndpoints;
  // Chain order as kube-proxy creates them: endpoint chains, then the policy chains.
  if (endpointChains) for (const endpoint of port.allReachableEndpoints) chain(endpointChain(endpoint));
  if (usesClusterChain) chain(names.cluster);
  if (usesLocalChain) chain(names.local);

  const internalChain = port.internalPolicyLocal ? names.local : names.cluster;
  const hasInternalEndpoints = hasEndpoints && (!port.internalPolicyLocal || port.localEndpoints.length > 0);
  const externalPolicyChain = port.externalPolicyLocal ? names.local : names.cluster;
  const hasExternalEndpoints = hasEndpoints && (!port.externalPolicyLocal || port.localEndpoints.length > 0);
  const usesExternalChain = hasEndpoints && port.externallyAccessible;
  if (usesExternalChain) chain(names.external);
  const internalFilterVerdict = !hasEndpoints ? `goto ${nftNames.reject}` : 'drop';
  const externalFilterVerdict = internalFilterVerdict;
  const comment = port.key;

  element(nftNames.clusterIPs, port.clusterIP);
  const vip = (ip: string) => `${ip} . ${protocol} . ${port.port}`;
  if (hasInternalEndpoints) element(nftNames.serviceIPs, vip(port.clusterIP), `goto ${internalChain}`);
  else element(nftNames.noEndpointServices, vip(port.clusterIP), internalFilterVerdict, comment);

  for (const ip of port.externalIPs) {
    if (hasEndpoints) element(nftNames.serviceIPs, vip(ip), `goto ${names.external}`);
    if (!hasExternalEndpoints) element(nftNames.noEndpointServices, vip(ip), externalFilterVerdict, comment);
  }
  const usesFirewall =
    port.loadBalancerIPs.length > 0 && (port.loadBalancerSourceRanges.length > 0 || port.loadBalancerSourceRangesInvalid);
  if (usesFirewall) chain(names.firewall);
  for (const ip of port.loadBalancerIPs) {
    if (hasEndpoints) element(nftNames.serviceIPs, vip(ip), `goto ${names.external}`);
    if (usesFirewall) element(nftNames.firewallIPs, vip(ip), `goto ${names.firewall}`);
  }
  if (!hasExternalEndpoints)
    for (const ip of port.loadBalancerIPs) element(nftNames.noEndpointServices, vip(ip), externalFilterVerdict, comment);
  if (port.nodePort !== 0) {
    if (hasEndpoints) element(nftNames.serviceNodePorts, `${protocol} . ${port.nodePort}`, `goto ${names.external}`);
    if (!hasExternalEndpoints) element(nftNames.noEndpointNodePorts, `${protocol} . ${port.nodePort}`, externalFilterVerdict, comment);
  }

  if (hasInternalEndpoints) {
    // kube-proxy's own layout (1.34 on) matches the address alone: the chain is reached for this port only.
    const match =
      words.kubeProxyLayout && !words.kubeProxyBefore134
        ? `${words.ipX} daddr ${port.clusterIP}`
        : `${words.ipX} daddr ${port.clusterIP} ${protocol} dport ${port.port}`;
    if (model.config.masqueradeAll) chain(internalChain).push(`${match} jump ${mark}`);
    else {
      const notLocal = localTrafficMatch(model, words, false);
      if (notLocal) chain(internalChain).push(`${match} ${notLocal} jump ${mark}`);
    }
  }

  if (usesExternalChain) {
    const rules = chain(names.external);
    if (!port.externalPolicyLocal) {
      rules.push(`jump ${mark}`);
    } else {
      const local = localTrafficMatch(model, words, true);
      if (local) rules.push(`${local} goto ${names.cluster} comment "short-circuit pod traffic"`);
      rules.push(`fib saddr type local jump ${mark} comment "masquerade local traffic"`);
      rules.push(`fib saddr type local goto ${names.cluster} comment "short-circuit local traffic"`);
    }
    if (hasExternalEndpoints) rules.push(`goto ${externalPolicyChain}`);
  }

  if (usesFirewall) {
    const sources = [...port.loadBalancerSourceRanges];
    const nodeIP = model.nodeIPs[0] !== undefined ? parseIP(model.nodeIPs[0]) : undefined;
    const allowFromNode = nodeIP !== undefined && port.loadBalancerSourceRanges.some((text) => cidrContains(parseCIDR(text)!, nodeIP));
    if (allowFromNode) sources.push(...port.loadBalancerIPs);
    // Unreadable ranges admit nobody.
    const allowed = words.kubeProxyLayout ? kubeProxySet(sources.map((text) => parseCIDR(text)?.text ?? text)) : valueList(sources);
    chain(names.firewall).push(sources.length === 0 ? 'drop' : `${words.ipX} saddr != ${allowed} drop`);
  }

  if (affinity) {
    for (const endpoint of port.allReachableEndpoints)
      footprint.affinitySets.push({name: affinitySet(endpoint), timeoutSeconds: port.sessionAffinity!.timeoutSeconds});
  }

  const writeEndpointChoice = (policyChain: string, endpoints: Endpoint[]) => {
    const rules = chain(policyChain);
    if (endpointChains) {
      if (affinity)
        for (const endpoint of endpoints) rules.push(`${words.ipX} saddr @${affinitySet(endpoint)} goto ${endpointChain(endpoint)}`);
      const separator = words.kubeProxyLayout ? ' , ' : ', ';
      rules.push(
        `numgen random mod ${endpoints.length} vmap { ${endpoints.map((endpoint, index) => `${index} : goto ${endpointChain(endpoint)}`).join(separator)} }`,
      );
      return;
    }
    const map = endpointTargetsMap(protocol, endpointMapShard(policyChain));
    const block = blocks.allocate(
      policyChain,
      map,
      endpoints.map((endpoint) => `${endpoint.ip} . ${endpoint.port}`),
    );
    footprint.blocks.push(block);
    const offset = block.offset === 0 ? '' : ` offset ${block.offset}`;
    rules.push(`meta l4proto ${protocol} dnat ${words.ipX} to numgen random mod ${endpoints.length}${offset} map @${map}`);
  };
  if (usesClusterChain) writeEndpointChoice(names.cluster, port.clusterEndpoints);
  if (usesLocalChain) writeEndpointChoice(names.local, port.localEndpoints);

  for (const endpoint of port.allReachableEndpoints) {
    if (!words.kubeProxyLayout) element(nftNames.hairpinEndpoints, `${endpoint.ip} . ${endpoint.ip}`);
    if (!endpointChains) continue;
    const rules = chain(endpointChain(endpoint));
    rules.push(`${words.ipX} saddr ${endpoint.ip} jump ${mark}`);
    if (affinity) rules.push(`update @${affinitySet(endpoint)} { ${words.ipX} saddr }`);
    rules.push(`meta l4proto ${protocol} dnat to ${endpointKey(endpoint)}`);
  }
  for (const [name, rules] of chainRules) footprint.chains.push({name, rules: rules.join('\n')});
  return footprint;
}

/** The endpoint-targets elements of blocks: key offset+index, value the target. */
function blockElements(blocks: EndpointBlock[]): NftElement[] {
  return blocks.flatMap((block) => block.targets.map((value, index) => ({container: block.map, key: String(block.offset + index), value})));
}

/**
 * The endpoint-targets elements that change from `before` to `after` (the blocks of the changed
 * service ports): a kept block's changed keys, a dropped block's keys and a new block's keys.
 */
function blockChanges(before: EndpointBlock[], after: EndpointBlock[]): {deletions: NftElement[]; additions: NftElement[]} {
  const byId = (blocks: EndpointBlock[]) => new Map(blockElements(blocks).map((element) => [elementId(element), element]));
  const old = byId(before);
  const fresh = byId(after);
  const deletions = [...old]
    .filter(([id, element]) => fresh.get(id)?.value !== element.value)
    .map(([, {container, key}]) => ({container, key}));
  const additions = [...fresh].filter(([id, element]) => old.get(id)?.value !== element.value).map(([, element]) => element);
  return {deletions, additions};
}

/** nftablesRuleCount: the rules of the service ports' chains in `state`. */
export function nftablesRuleCount(state: NftablesState): number {
  let count = 0;
  for (const footprint of state.footprints.values())
    for (const {rules} of footprint.chains) if (rules !== '') count += rules.split('\n').length;
  return count;
}

function elementId(element: Pick<NftElement, 'container' | 'key'>): string {
  return `${element.container}\0${element.key}`;
}

function elementText(element: NftElement): string {
  const comment = element.comment !== undefined ? ` comment "${element.comment}"` : '';
  return element.value !== undefined ? `${element.key}${comment} : ${element.value}` : `${element.key}${comment}`;
}

/** Elements per command: keeps lines readable and nft's parser fast. */
const elementsPerCommand = 500;

function pushElements(out: string[], verb: 'add' | 'delete', words: FamilyWords, elements: NftElement[]): void {
  const byContainer = new Map<string, NftElement[]>();
  for (const element of elements) {
    let list = byContainer.get(element.container);
    if (!list) byContainer.set(element.container, (list = []));
    list.push(element);
  }
  for (const [container, list] of byContainer) {
    for (let start = 0; start < list.length; start += elementsPerCommand) {
      const chunk = list.slice(start, start + elementsPerCommand);
      const texts = verb === 'add' ? chunk.map(elementText) : chunk.map((element) => element.key);
      out.push(`${verb} element ${words.ipX} ${tableName} ${container} { ${texts.join(', ')} }`);
    }
  }
}

function pushFootprintObjects(out: string[], words: FamilyWords, footprint: Footprint): void {
  const t = `${words.ipX} ${tableName}`;
  for (const set of footprint.affinitySets) {
    out.push(`add set ${t} ${set.name} { type ${words.addrType} ; flags dynamic,timeout ; timeout ${set.timeoutSeconds}s ; }`);
  }
  for (const {name} of footprint.chains) out.push(`add chain ${t} ${name}`, `flush chain ${t} ${name}`);
}

/** pushTargetMaps creates the endpoint-targets maps a footprint uses that do not exist yet. */
function pushTargetMaps(out: string[], words: FamilyWords, footprint: Footprint, created: Set<string>): void {
  for (const block of footprint.blocks) {
    if (created.has(block.map)) continue;
    created.add(block.map);
    out.push(endpointTargetsMapDefinition(words, block.map));
  }
}

function pushFootprintRules(out: string[], words: FamilyWords, footprint: Footprint): void {
  const t = `${words.ipX} ${tableName}`;
  for (const {name, rules} of footprint.chains)
    if (rules !== '') for (const rule of rules.split('\n')) out.push(`add rule ${t} ${name} ${rule}`);
}

/**
 * renderNftablesSync renders a sync and the state it leaves. A full sync (no usable `existing`,
 * or no changedServicePorts, or node-wide settings changed) rewrites the whole table in one
 * transaction; a partial one rewrites only the chains and elements of changed service ports.
 * Chains no longer used are flushed and recorded as stale: deleteStaleChains removes them later,
 * because older kernels notice only after a moment that a deleted map element no longer
 * references them.
 */
export function renderNftablesSync(model: ProxyModel, options: NftablesRenderOptions = {}): NftablesSync {
  const words = familyWords(model);
  const now = options.now ?? Date.now();
  const key = setupKey(model, options);
  const previous = options.existing;
  const partial =
    previous !== undefined && options.changedServicePorts !== undefined && previous.family === model.family && previous.setupKey === key;
  return partial ? renderPartialSync(model, options, words, previous, now) : renderFullSync(model, options, words, key, now);
}

/** The whole table in one transaction; chains of `options.existing` no longer used are flushed and recorded as stale. */
function renderFullSync(model: ProxyModel, options: NftablesRenderOptions, words: FamilyWords, key: string, now: number): NftablesSync {
  const previous = options.existing;
  const out: string[] = [];
  const t = `${words.ipX} ${tableName}`;

  const state: NftablesState = {
    family: model.family,
    setupKey: key,
    footprints: new Map(),
    elements: new Map(),
    nextOffset: 0,
    staleChains: new Map(),
    targetMaps: new Set(),
  };
  if (options.recreateTable) out.push(`add table ${t}`, `delete table ${t}`);
  renderSetup(model, options, words, out);
  if (previous && !options.recreateTable && previous.family === model.family) {
    for (const map of previous.targetMaps) {
      out.push(`flush map ${t} ${map}`);
      state.targetMaps.add(map);
    }
  }
  const allocator: BlockAllocator = {
    allocate(chain, map, targets) {
      const block = {chain, map, offset: state.nextOffset, targets};
      state.nextOffset += Math.max(targets.length, 1);
      return block;
    },
  };
  const elements: NftElement[] = [];
  for (const port of model.servicePorts) {
    const footprint = footprintOf(model, port, words, allocator);
    state.footprints.set(servicePortIdentity(port), footprint);
    for (const element of footprint.elements) {
      const held = heldElement(state, element);
      if (held) holdElement(state, held.first, held.count + 1);
      else {
        holdElement(state, element, 1);
        elements.push(element);
      }
    }
    elements.push(...blockElements(footprint.blocks));
    pushTargetMaps(out, words, footprint, state.targetMaps);
    pushFootprintObjects(out, words, footprint);
  }
  const activeChains = new Set([...state.footprints.values()].flatMap((footprint) => footprint.chains.map((chain) => chain.name)));
  const activeSets = new Set([...state.footprints.values()].flatMap((footprint) => footprint.affinitySets.map((set) => set.name)));
  if (previous && !options.recreateTable) {
    for (const footprint of previous.footprints.values()) {
      for (const {name} of footprint.chains)
        if (!activeChains.has(name) && !previous.staleChains.has(name)) {
          out.push(`flush chain ${t} ${name}`);
          state.staleChains.set(name, now);
        }
      for (const set of footprint.affinitySets) if (!activeSets.has(set.name)) out.push(`delete set ${t} ${set.name}`);
    }
    for (const [name, since] of previous.staleChains) if (!activeChains.has(name)) state.staleChains.set(name, since);
  }
  for (const footprint of state.footprints.values()) pushFootprintRules(out, words, footprint);
  pushElements(out, 'add', words, elements);
  return {script: out.join('\n') + '\n', kind: 'full', state};
}

/** The chains and elements of the changed service ports only, on top of `state` (updated in place). */
function renderPartialSync(
  model: ProxyModel,
  options: NftablesRenderOptions,
  words: FamilyWords,
  previous: NftablesState,
  now: number,
): NftablesSync {
  const out: string[] = [];
  const t = `${words.ipX} ${tableName}`;

  // Partial: replace the footprints of changed service ports. The state is updated in place, so
  // that the cost follows the change, not the cluster.
  const state = previous;
  const ports = new Map<string, ServicePort>();
  for (const port of model.servicePorts) {
    const identity = servicePortIdentity(port);
    if (options.changedServicePorts!.has(identity)) ports.set(identity, port);
  }
  const touched = new Map<string, {before?: {count: number; value?: string}; element: NftElement}>();
  const touch = (element: NftElement) => {
    const id = elementId(element);
    if (!touched.has(id)) {
      const held = heldElement(state, element);
      touched.set(id, {before: held ? {count: held.count, value: held.first.value} : undefined, element});
    }
    return id;
  };
  const oldChains = new Set<string>();
  /** Chain name -> its rules as the kernel holds them, for the chains of changed service ports. */
  const oldChainRules = new Map<string, string>();
  const newChains = new Set<string>();
  const oldSets = new Set<string>();
  const newSets = new Set<string>();
  const written: Footprint[] = [];
  const blocksBefore: EndpointBlock[] = [];
  const blocksAfter: EndpointBlock[] = [];
  for (const identity of [...options.changedServicePorts!].sort()) {
    const old = state.footprints.get(identity);
    const port = ports.get(identity);
    const oldBlocks = new Map((old?.blocks ?? []).map((block) => [block.chain, block]));
    const allocator: BlockAllocator = {
      allocate(chain, map, targets) {
        const kept = oldBlocks.get(chain);
        if (kept && kept.map === map && kept.targets.length === targets.length) return {...kept, targets};
        const block = {chain, map, offset: state.nextOffset, targets};
        state.nextOffset += Math.max(targets.length, 1);
        return block;
      },
    };
    if (old) {
      for (const element of old.elements) {
        touch(element);
        const held = heldElement(state, element)!;
        holdElement(state, held.first, held.count - 1);
      }
      for (const {name, rules} of old.chains) {
        oldChains.add(name);
        oldChainRules.set(name, rules);
      }
      blocksBefore.push(...old.blocks);
      for (const set of old.affinitySets) oldSets.add(set.name);
      state.footprints.delete(identity);
    }
    if (!port) continue;
    const footprint = footprintOf(model, port, words, allocator);
    state.footprints.set(identity, footprint);
    for (const element of footprint.elements) {
      const id = touch(element);
      const held = heldElement(state, element);
      if (held) holdElement(state, held.first, held.count + 1);
      else {
        holdElement(state, element, 1);
        touched.get(id)!.element = element;
      }
    }
    for (const {name} of footprint.chains) newChains.add(name);
    for (const set of footprint.affinitySets) newSets.add(set.name);
    blocksAfter.push(...footprint.blocks);
    written.push(footprint);
  }

  // Only what differs is written: a chain whose rules stay as they are is not flushed and
  // refilled, and an affinity set that exists is not declared again. An endpoint change without a
  // change of endpoint count then writes elements only, which nft applies without loading every
  // chain of the table first.
  const toWrite = written.map((footprint) => ({
    ...footprint,
    chains: footprint.chains.filter(({name, rules}) => oldChainRules.get(name) !== rules),
    affinitySets: footprint.affinitySets.filter((set) => !oldSets.has(set.name)),
  }));
  for (const footprint of toWrite) {
    pushTargetMaps(out, words, footprint, state.targetMaps);
    pushFootprintObjects(out, words, footprint);
  }
  for (const name of oldChains) {
    if (newChains.has(name)) continue;
    out.push(`flush chain ${t} ${name}`);
    state.staleChains.set(name, now);
  }
  for (const name of newChains) state.staleChains.delete(name);
  const {deletions, additions} = blockChanges(blocksBefore, blocksAfter);
  for (const {before, element} of touched.values()) {
    const held = heldElement(state, element);
    const after = held && {value: held.first.value, comment: held.first.comment};
    if (before && (!after || after.value !== before.value)) deletions.push(element);
    if (after && (!before || after.value !== before.value)) additions.push({...element, value: after.value, comment: after.comment});
  }
  pushElements(out, 'delete', words, deletions);
  pushElements(out, 'add', words, additions);
  for (const footprint of toWrite) pushFootprintRules(out, words, footprint);
  for (const name of oldSets) if (!newSets.has(name)) out.push(`delete set ${t} ${name}`);
  return {script: out.length > 0 ? out.join('\n') + '\n' : '', kind: 'partial', state};
}

/**
 * renderNftables is the `nft -f` script of a sync: the whole table, or with `existing` and
 * `changedServicePorts` one transaction for the changed service ports only.
 */
export function renderNftables(model: ProxyModel, options: NftablesRenderOptions = {}): string {
  return renderNftablesSync(model, options).script;
}

/**
 * deleteStaleChains: the script deleting chains that went stale at least `minAgeMs` ago, and the
 * state without them; undefined when none is due. Run it as its own transaction: a failure only
 * delays the deletion.
 */
export function deleteStaleChains(state: NftablesState, now: number, minAgeMs = 1000): {script: string; state: NftablesState} | undefined {
  const due = [...state.staleChains].filter(([, since]) => now - since >= minAgeMs).map(([name]) => name);
  if (due.length === 0) return undefined;
  const ipX = state.family === 'IPv6' ? 'ip6' : 'ip';
  const staleChains = new Map(state.staleChains);
  for (const name of due) staleChains.delete(name);
  return {script: due.map((name) => `delete chain ${ipX} ${tableName} ${name}`).join('\n') + '\n', state: {...state, staleChains}};
}

/** nftablesCleanupScript deletes the table of the family (as kube-proxy's CleanupLeftovers). */
export function nftablesCleanupScript(family: ProxyModel['family']): string {
  const ipX = family === 'IPv6' ? 'ip6' : 'ip';
  return `add table ${ipX} ${tableName}\ndelete table ${ipX} ${tableName}\n`;
}
