// The fixed part of kube-proxy's own nftables layout (nftablesLayout 'kube-proxy', and
// 'kube-proxy-1.33' with the base chains of kube-proxy before 1.34): base chains,
// maps, sets and rules as kube-proxy's nftables proxier writes them, in its spelling ("mark set
// mark or 0x4000"), so that its published expected rules and this renderer's output compare line
// by line. The per-service part is render.ts' footprintOf, which switches on the layout.
import type {ProxyModel} from '../model/types.ts';
import {tableName} from './names.ts';

type BaseChain = {name: string; type: 'filter' | 'nat'; hook: string; priority: number};
/** A rule in a base chain jumping to a regular one: `from`, `match`, then `jump to`. */
type Jump = {from: string; match: string; to: string};

/** jumpRule: the jump as nft writes it. */
export function jumpRule(jump: Jump): string {
  return `${jump.match ? `${jump.match} ` : ''}jump ${jump.to}`;
}

/** kube-proxy's base chains (1.34 on): filter before DNAT at dstnat-10, the endpoint checks at filter priority. */
export const kubeProxyBaseChains: readonly BaseChain[] = [
  {name: 'filter-prerouting-pre-dnat', type: 'filter', hook: 'prerouting', priority: -110},
  {name: 'filter-output-pre-dnat', type: 'filter', hook: 'output', priority: -110},
  {name: 'filter-forward', type: 'filter', hook: 'forward', priority: 0},
  {name: 'filter-input', type: 'filter', hook: 'input', priority: 0},
  {name: 'filter-output', type: 'filter', hook: 'output', priority: 0},
  {name: 'nat-output', type: 'nat', hook: 'output', priority: -100},
  {name: 'nat-postrouting', type: 'nat', hook: 'postrouting', priority: 100},
  {name: 'nat-prerouting', type: 'nat', hook: 'prerouting', priority: -100},
];

/**
 * kube-proxy's base chains before 1.34 (kubernetes#132456 changed them): every filter chain at
 * dstnat-10, and the ClusterIP check after DNAT in filter-output-post-dnat. proxyctl's own
 * layout keeps these.
 */
export const kubeProxyBaseChainsBefore134: readonly BaseChain[] = [
  {name: 'filter-prerouting', type: 'filter', hook: 'prerouting', priority: -110},
  {name: 'filter-input', type: 'filter', hook: 'input', priority: -110},
  {name: 'filter-forward', type: 'filter', hook: 'forward', priority: -110},
  {name: 'filter-output', type: 'filter', hook: 'output', priority: -110},
  {name: 'filter-output-post-dnat', type: 'filter', hook: 'output', priority: -90},
  {name: 'nat-prerouting', type: 'nat', hook: 'prerouting', priority: -100},
  {name: 'nat-output', type: 'nat', hook: 'output', priority: -100},
  {name: 'nat-postrouting', type: 'nat', hook: 'postrouting', priority: 100},
];

/** The jumps from base chains before 1.34, in kube-proxy's order. */
export const kubeProxyJumpsBefore134: readonly Jump[] = [
  {from: 'filter-input', match: 'ct state new', to: 'nodeport-endpoints-check'},
  {from: 'filter-input', match: 'ct state new', to: 'service-endpoints-check'},
  {from: 'filter-forward', match: 'ct state new', to: 'service-endpoints-check'},
  {from: 'filter-output', match: 'ct state new', to: 'service-endpoints-check'},
  {from: 'filter-prerouting', match: 'ct state new', to: 'firewall-check'},
  {from: 'filter-output', match: 'ct state new', to: 'firewall-check'},
  {from: 'nat-output', match: '', to: 'services'},
  {from: 'nat-prerouting', match: '', to: 'services'},
  {from: 'nat-postrouting', match: '', to: 'masquerading'},
  {from: 'filter-forward', match: 'ct state new', to: 'cluster-ips-check'},
  {from: 'filter-output-post-dnat', match: 'ct state new', to: 'cluster-ips-check'},
];

/** The jumps from base chains, in kube-proxy's order. */
const kubeProxyJumps: readonly Jump[] = [
  {from: 'filter-prerouting-pre-dnat', match: 'ct state new', to: 'firewall-check'},
  {from: 'filter-forward', match: 'ct state new', to: 'service-endpoints-check'},
  {from: 'filter-forward', match: 'ct state new', to: 'cluster-ips-check'},
  {from: 'filter-input', match: 'ct state new', to: 'nodeport-endpoints-check'},
  {from: 'filter-input', match: 'ct state new', to: 'service-endpoints-check'},
  {from: 'filter-output', match: 'ct state new', to: 'service-endpoints-check'},
  {from: 'filter-output-pre-dnat', match: 'ct state new', to: 'firewall-check'},
  {from: 'filter-output', match: 'ct state new', to: 'cluster-ips-check'},
  {from: 'nat-output', match: '', to: 'services'},
  {from: 'nat-postrouting', match: '', to: 'masquerading'},
  {from: 'nat-prerouting', match: '', to: 'services'},
];

/** Regular chains of the fixed part, and the one with a comment. */
const kubeProxyChains = [
  'cluster-ips-check',
  'firewall-check',
  'mark-for-masquerade',
  'masquerading',
  'nodeport-endpoints-check',
  'reject-chain',
  'services',
  'service-endpoints-check',
];

/** kubeProxyMark: the masquerade mark as kube-proxy writes it ("0x4000" for bit 14). */
export function kubeProxyMark(bit: number): string {
  return `0x${(2 ** bit).toString(16)}`;
}

/**
 * kubeProxySet: addresses or CIDRs as kube-proxy writes an anonymous set: its rule words are
 * joined by spaces, and "," is a word of its own ("{ a , b }"); the service CIDRs come as one
 * word, joined by "," alone.
 */
export function kubeProxySet(items: string[], separator: ' , ' | ',' = ' , '): string {
  return `{ ${items.join(separator)} }`;
}

export interface KubeProxySetupInput {
  ipX: 'ip' | 'ip6';
  addrType: 'ipv4_addr' | 'ipv6_addr';
  loopback: string;
  /** Which kube-proxy releases' base chains: 1.34 on ('current'), or before. */
  release: 'current' | 'before-1.34';
  /** The service CIDRs of the family. */
  serviceCIDRs: string[];
  nodePorts: {matchAll: boolean; addresses: string[]};
}

/**
 * renderKubeProxySetup writes the fixed part of kube-proxy's table, each chain and refilled map
 * flushed after its `add`, as a full sync of kube-proxy does.
 */
export function renderKubeProxySetup(model: ProxyModel, input: KubeProxySetupInput, out: string[]): void {
  const {ipX, addrType} = input;
  const t = `${ipX} ${tableName}`;
  const mark = kubeProxyMark(model.config.masqueradeBit);
  const verdictMap = (name: string, key: string, comment: string) => {
    out.push(`add map ${t} ${name} { type ${key} : verdict ; comment "${comment}" ; }`, `flush map ${t} ${name}`);
  };
  out.push(`add table ${t} { comment "rules for kube-proxy" ; }`);
  out.push(`add set ${t} cluster-ips { type ${addrType} ; comment "Active ClusterIPs" ; }`, `flush set ${t} cluster-ips`);
  out.push(`add set ${t} nodeport-ips { type ${addrType} ; comment "IPs that accept NodePort traffic" ; }`);
  if (input.nodePorts.matchAll) out.push(`delete set ${t} nodeport-ips`);
  else out.push(`flush set ${t} nodeport-ips`);
  const serviceKey = `${addrType} . inet_proto . inet_service`;
  verdictMap('firewall-ips', serviceKey, 'destinations that are subject to LoadBalancerSourceRanges');
  verdictMap('no-endpoint-nodeports', 'inet_proto . inet_service', 'vmap to drop or reject packets to service nodeports with no endpoints');
  verdictMap('no-endpoint-services', serviceKey, 'vmap to drop or reject packets to services with no endpoints');
  verdictMap('service-ips', serviceKey, 'ClusterIP, ExternalIP and LoadBalancer IP traffic');
  verdictMap('service-nodeports', 'inet_proto . inet_service', 'NodePort traffic');

  const before134 = input.release === 'before-1.34';
  for (const chain of before134 ? kubeProxyBaseChainsBefore134 : kubeProxyBaseChains) {
    out.push(
      `add chain ${t} ${chain.name} { type ${chain.type} hook ${chain.hook} priority ${chain.priority} ; }`,
      `flush chain ${t} ${chain.name}`,
    );
  }
  for (const name of kubeProxyChains) {
    const comment = name === 'reject-chain' ? ' { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }' : '';
    out.push(`add chain ${t} ${name}${comment}`, `flush chain ${t} ${name}`);
  }

  out.push(`add rule ${t} cluster-ips-check ${ipX} daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`);
  if (input.serviceCIDRs.length > 0) {
    out.push(
      `add rule ${t} cluster-ips-check ${ipX} daddr ${kubeProxySet(input.serviceCIDRs, ',')} drop comment "Drop traffic to unallocated ClusterIPs"`,
    );
  }
  for (const jump of before134 ? kubeProxyJumpsBefore134 : kubeProxyJumps) out.push(`add rule ${t} ${jump.from} ${jumpRule(jump)}`);
  out.push(`add rule ${t} firewall-check ${ipX} daddr . meta l4proto . th dport vmap @firewall-ips`);
  out.push(`add rule ${t} mark-for-masquerade mark set mark or ${mark}`);
  out.push(`add rule ${t} masquerading mark and ${mark} == 0 return`);
  out.push(`add rule ${t} masquerading mark set mark xor ${mark}`);
  out.push(`add rule ${t} masquerading masquerade fully-random`);
  // Without nodeport-ips (nodePortAddresses covering the family) every local address but loopback
  // takes NodePorts; the input hook sees local destinations only.
  const nodePortIPs = input.nodePorts.matchAll ? `${ipX} daddr != ${input.loopback}` : `${ipX} daddr @nodeport-ips`;
  out.push(`add rule ${t} nodeport-endpoints-check ${nodePortIPs} meta l4proto . th dport vmap @no-endpoint-nodeports`);
  out.push(`add rule ${t} reject-chain reject`);
  out.push(`add rule ${t} services ${ipX} daddr . meta l4proto . th dport vmap @service-ips`);
  const localNodePortIPs = input.nodePorts.matchAll ? `fib daddr type local ${nodePortIPs}` : nodePortIPs;
  out.push(`add rule ${t} services ${localNodePortIPs} meta l4proto . th dport vmap @service-nodeports`);
  if (!input.nodePorts.matchAll && input.nodePorts.addresses.length > 0) {
    out.push(`add element ${t} nodeport-ips { ${input.nodePorts.addresses.join(', ')} }`);
  }
  out.push(`add rule ${t} service-endpoints-check ${ipX} daddr . meta l4proto . th dport vmap @no-endpoint-services`);
}
