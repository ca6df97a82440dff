// Chain names of the iptables backend: kube-proxy's fixed chains and its hashed per-service and
// per-endpoint chain names, computed exactly as kube-proxy computes them so that rules written by
// kube-proxy and by proxyctl name the same chains.
import {endpointKey} from '../model/endpoint.ts';
import type {Endpoint, Protocol, ServicePort} from '../model/types.ts';
import {sha256Base32} from '../name-hash.ts';

/** IptablesTable: a table of iptables, by the name iptables-save prints after its "*". */
export type IptablesTable = 'filter' | 'nat' | 'mangle' | 'raw';

/** ProxyTable: a table kube-proxy's rules live in, and so one that render writes. */
export type ProxyTable = Extract<IptablesTable, 'filter' | 'nat'>;

/** Fixed chains kube-proxy fills in the filter table, in the order it declares them. */
export const filterChains = {
  services: 'KUBE-SERVICES',
  externalServices: 'KUBE-EXTERNAL-SERVICES',
  forward: 'KUBE-FORWARD',
  nodePorts: 'KUBE-NODEPORTS',
  proxyFirewall: 'KUBE-PROXY-FIREWALL',
} as const;

/** Fixed chains kube-proxy fills in the nat table, in the order it declares them. */
export const natChains = {
  services: 'KUBE-SERVICES',
  nodePorts: 'KUBE-NODEPORTS',
  postrouting: 'KUBE-POSTROUTING',
  markMasq: 'KUBE-MARK-MASQ',
} as const;

/**
 * kubeletFirewallChain is kubelet's chain holding the rule that blocks martian packets to
 * 127.0.0.0/8; kube-proxy writes an identical copy when it opens NodePorts on localhost.
 */
export const kubeletFirewallChain = 'KUBE-FIREWALL';

/** kube-proxy's nfacct objects (pkg/proxy/metrics): packets its rules count, read back for /metrics. */
export const nfacctCounters = {
  /** INVALID-conntrack packets dropped in KUBE-FORWARD. */
  ctStateInvalidDropped: 'ct_state_invalid_dropped_pkts',
  /** NodePort packets to 127.0.0.0/8 accepted in KUBE-NODEPORTS. */
  localhostNodePortsAccepted: 'localhost_nps_accepted_pkts',
} as const;

export const serviceChainPrefixes = {
  cluster: 'KUBE-SVC-',
  local: 'KUBE-SVL-',
  external: 'KUBE-EXT-',
  firewall: 'KUBE-FW-',
  endpoint: 'KUBE-SEP-',
} as const;

/**
 * Prefixes of chains that belong to one service port or endpoint. KUBE-XLB- is the local-policy
 * chain of kube-proxy before 1.24; it is never written, only removed when found.
 */
export const perServiceChainPrefixes: readonly string[] = [...Object.values(serviceChainPrefixes), 'KUBE-XLB-'];

/** isServiceChainName: the chain belongs to one service port or endpoint (hashed name). */
export function isServiceChainName(chain: string): boolean {
  return perServiceChainPrefixes.some((prefix) => chain.startsWith(prefix));
}

/**
 * chainHash is kube-proxy's name hash: SHA-256 of the text, standard base32, first 16
 * characters (80 bits, so the first 10 bytes of the digest decide it).
 */
export function chainHash(text: string): string {
  return sha256Base32(text, 16);
}

/** The part of a service port that names its chains. */
export type ServicePortName = Pick<ServicePort, 'key' | 'protocol'>;

/** portProtoHash hashes kube-proxy's ServicePortName string with the lower-case protocol. */
export function portProtoHash(servicePortName: string, protocol: Protocol | string): string {
  return chainHash(servicePortName + protocol.toLowerCase());
}

/** servicePortChainName: KUBE-SVC-*, the chain spreading traffic over the cluster-wide endpoints. */
export function servicePortChainName(port: ServicePortName): string {
  return serviceChainPrefixes.cluster + portProtoHash(port.key, port.protocol);
}

/** serviceLocalChainName: KUBE-SVL-*, the chain spreading traffic over this node's endpoints. */
export function serviceLocalChainName(port: ServicePortName): string {
  return serviceChainPrefixes.local + portProtoHash(port.key, port.protocol);
}

/** serviceExternalChainName: KUBE-EXT-*, where NodePort, external IP and load-balancer traffic enters. */
export function serviceExternalChainName(port: ServicePortName): string {
  return serviceChainPrefixes.external + portProtoHash(port.key, port.protocol);
}

/** serviceFirewallChainName: KUBE-FW-*, the loadBalancerSourceRanges check. */
export function serviceFirewallChainName(port: ServicePortName): string {
  return serviceChainPrefixes.firewall + portProtoHash(port.key, port.protocol);
}

/**
 * endpointChainName: KUBE-SEP-*, one endpoint of one service port. The hash covers the service
 * port name, the lower-case protocol and the endpoint's "ip:port" ("[ip]:port" for IPv6).
 */
export function endpointChainName(port: ServicePortName, endpoint: Pick<Endpoint, 'ip' | 'port'> | string): string {
  const key = typeof endpoint === 'string' ? endpoint : endpointKey(endpoint);
  return serviceChainPrefixes.endpoint + chainHash(port.key + port.protocol.toLowerCase() + key);
}
