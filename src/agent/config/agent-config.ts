// AgentConfig: the agent's settings after the KubeProxyConfiguration file and the flags are read,
// checked and merged. Durations are milliseconds.
import {type NftablesLayout, nftablesLayouts} from '../../core/model/index.ts';

export type ProxyMode = 'iptables' | 'ipvs' | 'nftables';
export const proxyModes: readonly ProxyMode[] = ['iptables', 'ipvs', 'nftables'];

export type DetectLocalMode = 'ClusterCIDR' | 'NodeCIDR' | 'BridgeInterface' | 'InterfaceNamePrefix';
export const detectLocalModes: readonly DetectLocalMode[] = ['ClusterCIDR', 'NodeCIDR', 'BridgeInterface', 'InterfaceNamePrefix'];

export {nftablesLayouts};

/** IPVS schedulers kube-proxy accepts. */
export const ipvsSchedulers: readonly string[] = ['rr', 'wrr', 'lc', 'wlc', 'lblc', 'lblcr', 'sh', 'dh', 'sed', 'nq', 'mh'];

export interface AgentConfig {
  mode: ProxyMode;
  /** The file read with --config, if any. */
  configFile?: string;
  /** Path of the kubeconfig; unset means $KUBECONFIG's files (merged as kubectl does), else ~/.kube/config, else the in-cluster service account. */
  kubeconfig?: string;
  /** Node name used instead of the hostname. */
  hostnameOverride?: string;
  /** Historic name: the node's primary IP when set (kube-proxy binds nothing to it). */
  bindAddress: string;
  /** Pod CIDRs, at most one per IP family. */
  clusterCIDRs: string[];
  /**
   * The cluster's service CIDRs (--service-cluster-ip-range) for clusters without ServiceCIDR
   * objects; nftables mode drops traffic to their addresses that are no ClusterIP. ServiceCIDR
   * objects, once there are any, take their place.
   */
  serviceCIDRs: string[];
  detectLocalMode: DetectLocalMode;
  detectLocal: {bridgeInterface: string; interfaceNamePrefix: string};
  /** CIDRs, or 'primary'; the keywords 'localhost' and 'all' are expanded to CIDRs. Empty: every address. */
  nodePortAddresses: string[];
  iptables: {
    masqueradeAll: boolean;
    masqueradeBit: number;
    localhostNodePorts: boolean;
    syncPeriod: number;
    minSyncPeriod: number;
  };
  ipvs: {
    scheduler: string;
    syncPeriod: number;
    minSyncPeriod: number;
    excludeCIDRs: string[];
    strictARP: boolean;
    tcpTimeout: number;
    tcpFinTimeout: number;
    udpTimeout: number;
  };
  nftables: {
    masqueradeAll: boolean;
    masqueradeBit: number;
    syncPeriod: number;
    minSyncPeriod: number;
    /** Table layout (proxyctl's own field): 'proxyctl' (shared endpoint maps), or kube-proxy's own ('kube-proxy', 'kube-proxy-1.33'). */
    layout: NftablesLayout;
  };
  conntrack: {
    /** 0 leaves nf_conntrack_max as it is. */
    maxPerCore: number;
    min: number;
    /** 0 leaves the kernel's value. */
    tcpEstablishedTimeout: number;
    tcpCloseWaitTimeout: number;
    tcpBeLiberal: boolean;
    udpTimeout: number;
    udpStreamTimeout: number;
  };
  /** "host:port"; empty turns the server off. */
  metricsBindAddress: string;
  healthzBindAddress: string;
  /** Where the WebSocket API for the plugin listens. */
  apiBindAddress: string;
  /** How often the watches relist everything. */
  configSyncPeriod: number;
  /** Run every rule command inside this network namespace (`ip netns exec NAME`). */
  netns?: string;
  /** Remove the agent's rules and exit. */
  cleanup: boolean;
  /**
   * Observe kube-proxy instead of proxying: write nothing, compare what kube-proxy programmed with
   * what it should have (docs/observe.md).
   */
  observe: boolean;
  /** The kube-proxy mode to observe; unset: found from the kernel's rules. */
  observeMode?: ProxyMode;
  /** Log detail, as --v: 0 events and errors, 2 each sync, 4 commands, 5 rule text. */
  verbosity: number;
  featureGates: Record<string, boolean>;
}

/** defaultAgentConfig holds kube-proxy's v1alpha1 defaults. */
export function defaultAgentConfig(): AgentConfig {
  return {
    mode: 'iptables',
    bindAddress: '0.0.0.0',
    clusterCIDRs: [],
    serviceCIDRs: [],
    detectLocalMode: 'ClusterCIDR',
    detectLocal: {bridgeInterface: '', interfaceNamePrefix: ''},
    nodePortAddresses: [],
    iptables: {masqueradeAll: false, masqueradeBit: 14, localhostNodePorts: true, syncPeriod: 30_000, minSyncPeriod: 1_000},
    ipvs: {
      scheduler: '',
      syncPeriod: 30_000,
      minSyncPeriod: 0,
      excludeCIDRs: [],
      strictARP: false,
      tcpTimeout: 0,
      tcpFinTimeout: 0,
      udpTimeout: 0,
    },
    nftables: {masqueradeAll: false, masqueradeBit: 14, syncPeriod: 30_000, minSyncPeriod: 1_000, layout: 'proxyctl'},
    conntrack: {
      maxPerCore: 32768,
      min: 131072,
      tcpEstablishedTimeout: 24 * 3_600_000,
      tcpCloseWaitTimeout: 3_600_000,
      tcpBeLiberal: false,
      udpTimeout: 0,
      udpStreamTimeout: 0,
    },
    metricsBindAddress: '127.0.0.1:10249',
    healthzBindAddress: '0.0.0.0:10256',
    apiBindAddress: '127.0.0.1:10260',
    configSyncPeriod: 15 * 60_000,
    cleanup: false,
    observe: false,
    verbosity: 0,
    featureGates: {},
  };
}

/**
 * The observing agent's own ports, so that it runs beside kube-proxy (10256 healthz, 10249
 * metrics) and beside a proxying agent (10260 API) on the same node: 10270 API, 10271 healthz,
 * 10272 metrics. Used when --observe is on and the address is not set.
 */
export const observeBindAddresses = {
  apiBindAddress: '127.0.0.1:10270',
  healthzBindAddress: '0.0.0.0:10271',
  metricsBindAddress: '127.0.0.1:10272',
} as const;

/** syncPeriods returns the periods of the configured mode. */
export function syncPeriods(config: AgentConfig): {syncPeriod: number; minSyncPeriod: number} {
  const section = config.mode === 'ipvs' ? config.ipvs : config.mode === 'nftables' ? config.nftables : config.iptables;
  return {syncPeriod: section.syncPeriod, minSyncPeriod: section.minSyncPeriod};
}

/** ConfigError is a setting refused at start; the message names the field and the cause. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}
