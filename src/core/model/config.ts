// The proxy's own settings: kube-proxy's defaults, and the checked per-family ProxyConfig built
// from what the operator gave plus what the Node says (pod CIDRs for detect-local NodeCIDR).
import {parseCIDR} from './ip.ts';
import type {NodeDefinition} from './node.ts';
import {describe, ObjectProblems} from './object-reader.ts';
import type {IPFamily, IptablesFeatures, LocalDetector, NftablesLayout, Problem, ProxyConfig} from './types.ts';

/** The nftables layouts render knows (ProxyConfig.nftablesLayout). */
export const nftablesLayouts: readonly NftablesLayout[] = ['proxyctl', 'kube-proxy', 'kube-proxy-1.33'];

/** defaultProxyConfig is KubeProxyConfiguration's defaults for the fields ProxyConfig holds. */
export function defaultProxyConfig(): ProxyConfig {
  return {
    masqueradeAll: false,
    masqueradeBit: 14,
    localDetector: {mode: 'None'},
    nodePortAddresses: [],
    localhostNodePorts: true,
    iptablesFeatures: {nfacctCounters: [], randomFully: true, conntrackTCPLiberal: false},
    nftablesLayout: 'proxyctl',
  };
}

export interface ProxyConfigInput {
  family: IPFamily;
  config?: Partial<ProxyConfig>;
  clusterCIDRs?: string[];
  detectLocalMode?: 'ClusterCIDR' | 'NodeCIDR' | 'None';
}

/**
 * resolveProxyConfig fills defaults, checks every value (a bad one falls back to the default with
 * a 'Config' Problem) and narrows CIDRs to the family. A ClusterCIDR or NodeCIDR detector left
 * without a CIDR of the family turns into None, as kube-proxy falls back to its no-op detector.
 */
export function resolveProxyConfig(input: ProxyConfigInput, node: NodeDefinition | undefined, sink: Problem[]): ProxyConfig {
  const problems = new ObjectProblems(sink, 'Config', 'proxy');
  const defaults = defaultProxyConfig();
  const given = input.config ?? {};
  const config = defaultProxyConfig();

  for (const field of ['masqueradeAll', 'localhostNodePorts'] as const) {
    const value = given[field];
    if (value === undefined) continue;
    if (typeof value === 'boolean') config[field] = value;
    else problems.add(field, `${describe(value)} is not true or false`, `default ${defaults[field]} used`);
  }
  if (given.masqueradeBit !== undefined) {
    const bit = given.masqueradeBit;
    if (Number.isInteger(bit) && bit >= 0 && bit <= 31) config.masqueradeBit = bit;
    else problems.add('masqueradeBit', `${describe(bit)} is not in 0-31`, `default ${defaults.masqueradeBit} used`);
  }
  if (given.nodePortAddresses !== undefined) {
    if (!Array.isArray(given.nodePortAddresses)) {
      problems.add('nodePortAddresses', 'not a list', 'every local address used');
    } else {
      for (const [index, entry] of given.nodePortAddresses.entries()) {
        if (entry === 'primary') {
          if (!config.nodePortAddresses.includes(entry)) config.nodePortAddresses.push(entry);
          continue;
        }
        const cidr = typeof entry === 'string' ? parseCIDR(entry.trim()) : undefined;
        if (!cidr) {
          problems.add(`nodePortAddresses[${index}]`, `${describe(entry)} is neither a CIDR nor "primary"`, 'entry ignored');
          continue;
        }
        if (!config.nodePortAddresses.includes(cidr.text)) config.nodePortAddresses.push(cidr.text);
      }
    }
  }
  if (given.nftablesLayout !== undefined) {
    if (nftablesLayouts.includes(given.nftablesLayout)) config.nftablesLayout = given.nftablesLayout;
    else
      problems.add(
        'nftablesLayout',
        `${describe(given.nftablesLayout)} is not one of ${nftablesLayouts.join(', ')}`,
        'default "proxyctl" used',
      );
  }
  if (given.iptablesFeatures !== undefined) config.iptablesFeatures = resolveIptablesFeatures(given.iptablesFeatures, problems);
  config.localDetector = resolveLocalDetector(input, node, problems, sink);
  return config;
}

function resolveIptablesFeatures(given: Partial<IptablesFeatures>, problems: ObjectProblems): IptablesFeatures {
  const features = defaultProxyConfig().iptablesFeatures;
  for (const field of ['randomFully', 'conntrackTCPLiberal'] as const) {
    const value = given[field];
    if (value === undefined) continue;
    if (typeof value === 'boolean') features[field] = value;
    else problems.add(`iptablesFeatures.${field}`, `${describe(value)} is not true or false`, `default ${features[field]} used`);
  }
  if (given.nfacctCounters !== undefined) {
    if (
      Array.isArray(given.nfacctCounters) &&
      given.nfacctCounters.every((name) => typeof name === 'string' && /^[\w.-]{1,31}$/.test(name))
    ) {
      features.nfacctCounters = [...given.nfacctCounters];
    } else {
      problems.add(
        'iptablesFeatures.nfacctCounters',
        `${describe(given.nfacctCounters)} is not a list of nfacct object names`,
        'no counters used',
      );
    }
  }
  return features;
}

function resolveLocalDetector(
  input: ProxyConfigInput,
  node: NodeDefinition | undefined,
  problems: ObjectProblems,
  sink: Problem[],
): LocalDetector {
  const given = input.config?.localDetector;
  let requested: LocalDetector;
  if (given !== undefined) requested = given;
  else if (input.detectLocalMode === 'NodeCIDR') requested = {mode: 'NodeCIDR', cidrs: []};
  else if (input.detectLocalMode === 'None') requested = {mode: 'None'};
  else if (input.clusterCIDRs && input.clusterCIDRs.length > 0) requested = {mode: 'ClusterCIDR', cidrs: input.clusterCIDRs};
  else requested = {mode: 'None'};

  switch (requested.mode) {
    case 'None':
      return {mode: 'None'};
    case 'BridgeInterface':
    case 'InterfaceNamePrefix': {
      const field = requested.mode === 'BridgeInterface' ? 'interfaceName' : 'interfacePrefix';
      const name = requested.mode === 'BridgeInterface' ? requested.interfaceName : requested.interfacePrefix;
      if (typeof name === 'string' && /^[^\s/]{1,15}$/.test(name)) return {...requested};
      problems.add(`localDetector.${field}`, `${describe(name)} is not an interface name`, 'local traffic detection off');
      return {mode: 'None'};
    }
    case 'ClusterCIDR':
    case 'NodeCIDR': {
      const cidrs: string[] = [];
      const given = Array.isArray(requested.cidrs) ? requested.cidrs : [];
      for (const [index, text] of given.entries()) {
        const cidr = typeof text === 'string' ? parseCIDR(text.trim()) : undefined;
        if (!cidr) {
          problems.add(`localDetector.cidrs[${index}]`, `${describe(text)} is not a CIDR`, 'entry ignored');
          continue;
        }
        if (cidr.family === input.family && !cidrs.includes(cidr.text)) cidrs.push(cidr.text);
      }
      if (requested.mode === 'NodeCIDR' && given.length === 0) {
        if (node === undefined) {
          problems.add('localDetector', 'NodeCIDR needs the Node object for its pod CIDRs', 'local traffic detection off');
          return {mode: 'None'};
        }
        cidrs.push(...node.podCIDRs);
        if (cidrs.length === 0) {
          new ObjectProblems(sink, 'Node', node.name).add(
            'spec.podCIDRs',
            `no ${input.family} pod CIDR for detect-local-mode NodeCIDR`,
            'local traffic detection off',
          );
        }
      }
      return cidrs.length > 0 ? {mode: requested.mode, cidrs} : {mode: 'None'};
    }
    default: {
      const unknownMode: unknown = (requested as {mode: unknown}).mode;
      problems.add('localDetector.mode', `unknown mode ${describe(unknownMode)}`, 'local traffic detection off');
      return {mode: 'None'};
    }
  }
}
