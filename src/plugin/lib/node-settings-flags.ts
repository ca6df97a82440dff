// The node settings `render` takes as flags (family, node, addresses, CIDRs, masquerading, local
// detection, NodePort addresses), shared with `migrate-check --rules`, which renders the same way.
import {Flags} from '@oclif/core';
import type {OfflineSettings} from './model-input.ts';

export const nodeSettingsFlags = {
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
};

type NodeSettingsValues = {
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
};

/** offlineSettings: the parsed flags as readOfflineModel takes them. */
export function offlineSettings(flags: NodeSettingsValues): OfflineSettings {
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
    localhostNodePorts: flags['localhost-nodeports'] === undefined ? undefined : flags['localhost-nodeports'] === 'true',
  };
}

/** The same flags under a help heading (migrate-check shows them with its other offline flags). */
export function nodeSettingsFlagsIn(helpGroup: string): typeof nodeSettingsFlags {
  return Object.fromEntries(
    Object.entries(nodeSettingsFlags).map(([name, flag]) => [name, {...flag, helpGroup}]),
  ) as unknown as typeof nodeSettingsFlags;
}
