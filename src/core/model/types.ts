// The ProxyModel: everything a backend needs to know about one IP family on one node, derived from
// Services, EndpointSlices and the Node. Backends see only this, never raw API objects.

export type IPFamily = 'IPv4' | 'IPv6';
export type Protocol = 'TCP' | 'UDP' | 'SCTP';

/** LocalDetector says how the proxy tells pod (cluster-local) traffic from everything else. */
export type LocalDetector =
  | {mode: 'ClusterCIDR'; cidrs: string[]}
  | {mode: 'NodeCIDR'; cidrs: string[]}
  | {mode: 'BridgeInterface'; interfaceName: string}
  | {mode: 'InterfaceNamePrefix'; interfacePrefix: string}
  | {mode: 'None'};

/** ProxyConfig holds the node-wide settings of KubeProxyConfiguration that change the rules. */
export interface ProxyConfig {
  masqueradeAll: boolean;
  /** Bit of the packet mark used to flag packets for SNAT (kube-proxy default 14). */
  masqueradeBit: number;
  localDetector: LocalDetector;
  /**
   * nodePortAddresses as given: CIDRs, or the single word 'primary'. Empty means every local
   * address (iptables and ipvs default); nftables mode treats empty as 'primary'.
   */
  nodePortAddresses: string[];
  /** Accept NodePort connections on 127.0.0.0/8 (iptables mode, IPv4 only). */
  localhostNodePorts: boolean;
  /** What the node's kernel and iptables offer that changes iptables mode's rules; detected by whoever runs on the node. */
  iptablesFeatures: IptablesFeatures;
  /**
   * nftables mode's table layout: 'proxyctl' picks endpoints from shared maps (fewer kernel
   * objects), 'kube-proxy' writes kube-proxy's own layout (a chain per endpoint, numgen vmaps) as
   * kube-proxy 1.34 and 1.35 write it, 'kube-proxy-1.33' as kube-proxy 1.33 and before (other
   * base chains, the port in the ClusterIP masquerade rule).
   */
  nftablesLayout: NftablesLayout;
}

export type NftablesLayout = 'proxyctl' | 'kube-proxy' | 'kube-proxy-1.33';

/**
 * IptablesFeatures: the node facts kube-proxy's iptables proxier checks before writing rules. The
 * defaults are those of a current node without nfacct objects.
 */
export interface IptablesFeatures {
  /**
   * The nfacct objects that exist on the node (kube-proxy's ct_state_invalid_dropped_pkts and
   * localhost_nps_accepted_pkts); rules count into those alone, since a rule naming a missing one
   * cannot be loaded.
   */
  nfacctCounters: string[];
  /** iptables knows MASQUERADE --random-fully (1.6.2 and later). */
  randomFully: boolean;
  /** net.netfilter.nf_conntrack_tcp_be_liberal is set: conntrack marks no out-of-window packet INVALID, so none is dropped. */
  conntrackTCPLiberal: boolean;
}

/** Endpoint is one address of an EndpointSlice, resolved to the port of one service port. */
export interface Endpoint {
  ip: string;
  port: number;
  /**
   * Conditions with kube-proxy's defaults (endpointslicecache.go): an unset ready or serving
   * counts as true, an unset terminating as false.
   */
  ready: boolean;
  serving: boolean;
  terminating: boolean;
  nodeName?: string;
  zone?: string;
  /** nodeName equals the proxy's node. */
  isLocal: boolean;
  /** hints.forZones[].name and hints.forNodes[].name; undefined when the slice gave no hints. */
  zoneHints?: string[];
  nodeHints?: string[];
  /** The pod behind the endpoint (targetRef), for people reading traces. */
  podName?: string;
  podNamespace?: string;
}

/** ServicePort is kube-proxy's "service port": one (service, port) pair for one IP family. */
export interface ServicePort {
  namespace: string;
  serviceName: string;
  /** Port name; empty when the service has a single unnamed port. */
  portName: string;
  /** kube-proxy's ServicePortName string: "namespace/name:portName" (":portName" omitted if empty). */
  key: string;
  protocol: Protocol;
  clusterIP: string;
  port: number;
  /** 0 when the service has no NodePort. */
  nodePort: number;
  externalIPs: string[];
  /** status.loadBalancer.ingress IPs of this family whose ipMode is VIP (or unset). */
  loadBalancerIPs: string[];
  loadBalancerSourceRanges: string[];
  /**
   * spec.loadBalancerSourceRanges had an entry that is no CIDR: the load-balancer IPs admit no
   * client at all (fail closed), as if the ranges matched nothing. Other addresses are not governed
   * by the ranges and work as usual.
   */
  loadBalancerSourceRangesInvalid: boolean;
  /** externalTrafficPolicy Local on an externally accessible service. */
  externalPolicyLocal: boolean;
  /** internalTrafficPolicy Local. */
  internalPolicyLocal: boolean;
  /** 0 when none. */
  healthCheckNodePort: number;
  /** Set when sessionAffinity is ClientIP. */
  sessionAffinity?: {timeoutSeconds: number};
  /**
   * Every endpoint of this family for this port, deduplicated by key and sorted by key as plain
   * strings (kube-proxy's byEndpoint order, so rule order matches kube-proxy's).
   */
  endpoints: Endpoint[];
  /**
   * kube-proxy's CategorizeEndpoints result. clusterEndpoints: used for Cluster policy (ready ones,
   * topology-filtered; serving+terminating ones if none is ready). localEndpoints: the same choice
   * among endpoints on this node, used for Local policies. allReachableEndpoints: their union.
   * Empty arrays when the policy does not use that set.
   */
  clusterEndpoints: Endpoint[];
  localEndpoints: Endpoint[];
  allReachableEndpoints: Endpoint[];
  /** Topology hints were applied to clusterEndpoints. */
  topologyApplied: boolean;
  /** Which hints were applied: '' (none), 'PreferSameZone' (forZones) or 'PreferSameNode' (forNodes). */
  topologyMode: '' | 'PreferSameZone' | 'PreferSameNode';
  /**
   * Some endpoint anywhere in the cluster is usable (ready, or serving and terminating). kube-proxy
   * REJECTs traffic to a service without any, and DROPs it when only the local set is empty.
   */
  hasAnyEndpoints: boolean;
  /** Reachable other than by clusterIP: nodePort, loadBalancerIPs or externalIPs. */
  externallyAccessible: boolean;
  /** kube-proxy's UsesClusterEndpoints: internal policy Cluster, or externally accessible. */
  usesClusterEndpoints: boolean;
  /** kube-proxy's UsesLocalEndpoints: internal policy Local, or externalPolicyLocal. */
  usesLocalEndpoints: boolean;
}

/** Problem is one object (or part of one) that was skipped, and why. */
export interface Problem {
  /** 'Config' names the proxy's own settings (ModelOptions), not an API object. */
  kind: 'Service' | 'EndpointSlice' | 'Node' | 'Config';
  namespace?: string;
  name: string;
  /** JSON path of the offending field, e.g. "spec.ports[1].nodePort". */
  field: string;
  /** Full sentence naming object and cause, e.g. "service default/web port http: invalid nodePort 70000". */
  message: string;
}

export interface ProxyModel {
  family: IPFamily;
  nodeName: string;
  /** This node's addresses of this family, primary first (Node status InternalIP, then others). */
  nodeIPs: string[];
  nodeZone?: string;
  config: ProxyConfig;
  /** Sorted by key, then protocol. */
  servicePorts: ServicePort[];
  problems: Problem[];
}
