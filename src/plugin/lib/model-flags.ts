// The flags that describe the objects and the node a ruleset is rendered for: `render` prints
// what the proxy writes from them, `diff --rules` compares a saved dump with that. One definition,
// so that both commands take the same words for the same kube-proxy settings.
import {Flags} from '@oclif/core';
import {type NftablesLayout, nftablesLayouts} from '../../core/model/index.ts';
import type {OfflineSettings} from './model-input.ts';

const objectsFileSummary = 'File with Services, EndpointSlices and the Node; "-" reads stdin. Repeat for several files.';

/** -f FILE: the objects (required by render; diff needs them only with --rules). */
export const objectsFileFlag = {
  required: Flags.string({char: 'f', summary: objectsFileSummary, multiple: true, required: true}),
  optional: Flags.string({char: 'f', summary: objectsFileSummary, multiple: true}),
};

/** The node settings, as kube-proxy's flags and KubeProxyConfiguration name them. */
export const modelFlags = {
  'ip-family': Flags.option({summary: 'IP family of the rules.', options: ['ipv4', 'ipv6'] as const, default: 'ipv4'})(),
  'node-name': Flags.string({summary: 'The node the rules are for (its endpoints are local). Default: the Node in the input.'}),
  'node-ip': Flags.string({summary: "The node's addresses, primary first. Default: the Node's InternalIPs.", multiple: true}),
  'cluster-cidr': Flags.string({
    summary: 'Pod CIDR of the cluster (kube-proxy --cluster-cidr); traffic from outside it is masqueraded.',
    multiple: true,
    delimiter: ',',
  }),
  'service-cidr': Flags.string({
    summary:
      'Service CIDRs of the cluster (kube-apiserver --service-cluster-ip-range); nftables mode drops traffic to their addresses that are no ClusterIP.',
    multiple: true,
    delimiter: ',',
  }),
  'masquerade-all': Flags.boolean({summary: 'Masquerade all traffic sent to service IPs (kube-proxy --masquerade-all).', default: false}),
  'masquerade-bit': Flags.integer({summary: 'Bit of the packet mark that flags packets for masquerading.', min: 0, max: 31}),
  'nodeport-addresses': Flags.string({
    summary: 'Where NodePorts listen: CIDRs, or "primary" (kube-proxy --nodeport-addresses). Default: every local address.',
    multiple: true,
    delimiter: ',',
  }),
  'detect-local': Flags.option({
    summary: 'How pod traffic is told from other traffic. Default: cluster-cidr when --cluster-cidr is given, else none.',
    options: ['cluster-cidr', 'node-cidr', 'bridge-interface', 'interface-name-prefix', 'none'] as const,
  })(),
  'pod-bridge-interface': Flags.string({summary: 'Bridge the pods hang off (with --detect-local bridge-interface).'}),
  'pod-interface-name-prefix': Flags.string({summary: "Prefix of the pods' interfaces (with --detect-local interface-name-prefix)."}),
  'localhost-nodeports': Flags.option({
    summary: 'Accept NodePort connections on 127.0.0.1 (iptables mode, IPv4).',
    options: ['true', 'false'] as const,
  })(),
  'nfacct-counters': Flags.string({
    summary:
      'iptables mode: the nfacct objects the node holds (ct_state_invalid_dropped_pkts, localhost_nps_accepted_pkts), which kube-proxy counts into. ' +
      'Default: none.',
    multiple: true,
    delimiter: ',',
  }),
  'ipvs-scheduler': Flags.string({summary: "ipvs mode: the virtual servers' scheduler (kube-proxy's ipvs.scheduler).", default: 'rr'}),
  'nftables-layout': Flags.option({
    summary:
      "nftables mode's table layout: proxyctl's own (default), or kube-proxy's (a chain per endpoint, as kube-proxy 1.34+ writes it; kube-proxy-1.33 " +
      'as 1.33 and before).',
    options: nftablesLayouts,
  })(),
  'random-fully': Flags.option({
    summary: 'iptables mode: iptables knows MASQUERADE --random-fully (1.6.2 and later). Default: true.',
    options: ['true', 'false'] as const,
  })(),
};

type ModelFlagValues = {
  'ip-family': 'ipv4' | 'ipv6';
  'node-name'?: string;
  'node-ip'?: string[];
  'cluster-cidr'?: string[];
  'service-cidr'?: string[];
  'masquerade-all': boolean;
  'masquerade-bit'?: number;
  'nodeport-addresses'?: string[];
  'detect-local'?: OfflineSettings['detectLocal'];
  'pod-bridge-interface'?: string;
  'pod-interface-name-prefix'?: string;
  'localhost-nodeports'?: 'true' | 'false';
  'nfacct-counters'?: string[];
  'random-fully'?: 'true' | 'false';
  'nftables-layout'?: NftablesLayout;
};

const trueOrFalse = (value: 'true' | 'false' | undefined) => (value === undefined ? undefined : value === 'true');

/** offlineSettings: the model flags as the settings readOfflineModel takes. */
export function offlineSettings(flags: ModelFlagValues): OfflineSettings {
  return {
    family: flags['ip-family'] === 'ipv6' ? 'IPv6' : 'IPv4',
    nodeName: flags['node-name'],
    nodeIPs: flags['node-ip'],
    clusterCIDRs: flags['cluster-cidr'],
    serviceCIDRs: flags['service-cidr'],
    masqueradeAll: flags['masquerade-all'] || undefined,
    masqueradeBit: flags['masquerade-bit'],
    nodePortAddresses: flags['nodeport-addresses'],
    detectLocal: flags['detect-local'],
    podBridgeInterface: flags['pod-bridge-interface'],
    podInterfaceNamePrefix: flags['pod-interface-name-prefix'],
    localhostNodePorts: trueOrFalse(flags['localhost-nodeports']),
    nfacctCounters: flags['nfacct-counters'],
    randomFully: trueOrFalse(flags['random-fully']),
    nftablesLayout: flags['nftables-layout'],
  };
}
