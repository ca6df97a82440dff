// Reads a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON, as kube-proxy's
// ConfigMap holds it) into AgentConfig. Every field kube-proxy knows is accepted; fields that only
// matter on Windows or for Go's runtime are read and left unused. Unknown fields and values of the
// wrong type are refused with the field's path. As kube-proxy's defaulting does, null, "" and a zero
// sync period or bind address in the file leave the default in place.
import {parse as parseYaml} from 'yaml';
import type {NftablesLayout} from '../../core/model/index.ts';
import {type AgentConfig, ConfigError, type DetectLocalMode, type ProxyMode} from './agent-config.ts';
import {parseGoDuration} from './duration.ts';

export const kubeProxyConfigurationAPIVersion = 'kubeproxy.config.k8s.io/v1alpha1';
export const kubeProxyConfigurationKind = 'KubeProxyConfiguration';

type LeafKind = 'string' | 'boolean' | 'integer' | 'number' | 'duration' | 'stringList' | 'boolMap' | 'anything';
interface Leaf {
  kind: LeafKind;
  /** Stores the checked value; absent for fields the agent reads but does not use. */
  store?: (config: AgentConfig, value: never) => void;
}
interface Branch {
  fields: Record<string, Leaf | Branch>;
}

const leaf = <T>(kind: LeafKind, store?: (config: AgentConfig, value: T) => void): Leaf => ({kind, store: store as Leaf['store']});
const unused = (kind: LeafKind): Leaf => ({kind});

/** The fields kube-proxy's iptables and nftables sections share, stored into that section. */
function masqueradeAndSyncFields(section: 'iptables' | 'nftables'): Record<string, Leaf> {
  return {
    masqueradeBit: leaf<number>('integer', (c, v) => (c[section].masqueradeBit = v)),
    masqueradeAll: leaf<boolean>('boolean', (c, v) => (c[section].masqueradeAll = v)),
    syncPeriod: leaf<number>('duration', (c, v) => (c[section].syncPeriod = v || c[section].syncPeriod)),
    minSyncPeriod: leaf<number>('duration', (c, v) => (c[section].minSyncPeriod = v || c[section].minSyncPeriod)),
  };
}

const schema: Branch = {
  fields: {
    apiVersion: unused('string'),
    kind: unused('string'),
    featureGates: leaf<Record<string, boolean>>('boolMap', (c, v) => (c.featureGates = v)),
    clientConnection: {
      fields: {
        kubeconfig: leaf<string>('string', (c, v) => (c.kubeconfig = v === '' ? undefined : v)),
        acceptContentTypes: unused('string'),
        contentType: unused('string'),
        qps: unused('number'),
        burst: unused('integer'),
      },
    },
    logging: {
      fields: {
        format: unused('string'),
        flushFrequency: unused('anything'),
        verbosity: leaf<number>('integer', (c, v) => (c.verbosity = v)),
        vmodule: unused('anything'),
        options: unused('anything'),
      },
    },
    hostnameOverride: leaf<string>('string', (c, v) => (c.hostnameOverride = v === '' ? undefined : v)),
    bindAddress: leaf<string>('string', (c, v) => (c.bindAddress = v === '' ? '0.0.0.0' : v)),
    healthzBindAddress: leaf<string>('string', (c, v) => (c.healthzBindAddress = v || c.healthzBindAddress)),
    metricsBindAddress: leaf<string>('string', (c, v) => (c.metricsBindAddress = v || c.metricsBindAddress)),
    bindAddressHardFail: unused('boolean'),
    enableProfiling: unused('boolean'),
    showHiddenMetricsForVersion: unused('string'),
    mode: leaf<string>('string', (c, v) => (c.mode = (v === '' ? 'iptables' : v) as ProxyMode)),
    iptables: {
      fields: {
        ...masqueradeAndSyncFields('iptables'),
        localhostNodePorts: leaf<boolean>('boolean', (c, v) => (c.iptables.localhostNodePorts = v)),
        snatNodeInternalIP: unused('boolean'),
      },
    },
    ipvs: {
      fields: {
        syncPeriod: leaf<number>('duration', (c, v) => (c.ipvs.syncPeriod = v || c.ipvs.syncPeriod)),
        minSyncPeriod: leaf<number>('duration', (c, v) => (c.ipvs.minSyncPeriod = v)),
        scheduler: leaf<string>('string', (c, v) => (c.ipvs.scheduler = v)),
        excludeCIDRs: leaf<string[]>('stringList', (c, v) => (c.ipvs.excludeCIDRs = v)),
        strictARP: leaf<boolean>('boolean', (c, v) => (c.ipvs.strictARP = v)),
        tcpTimeout: leaf<number>('duration', (c, v) => (c.ipvs.tcpTimeout = v)),
        tcpFinTimeout: leaf<number>('duration', (c, v) => (c.ipvs.tcpFinTimeout = v)),
        udpTimeout: leaf<number>('duration', (c, v) => (c.ipvs.udpTimeout = v)),
      },
    },
    nftables: {
      fields: {
        ...masqueradeAndSyncFields('nftables'),
        // proxyctl's own field: kube-proxy has one layout.
        layout: leaf<string>('string', (c, v) => (c.nftables.layout = (v === '' ? 'proxyctl' : v) as NftablesLayout)),
      },
    },
    winkernel: {
      fields: {
        networkName: unused('string'),
        sourceVip: unused('string'),
        enableDSR: unused('boolean'),
        rootHnsEndpointName: unused('string'),
        forwardHealthCheckVip: unused('boolean'),
      },
    },
    detectLocalMode: leaf<string>('string', (c, v) => (c.detectLocalMode = (v === '' ? 'ClusterCIDR' : v) as DetectLocalMode)),
    detectLocal: {
      fields: {
        bridgeInterface: leaf<string>('string', (c, v) => (c.detectLocal.bridgeInterface = v)),
        interfaceNamePrefix: leaf<string>('string', (c, v) => (c.detectLocal.interfaceNamePrefix = v)),
      },
    },
    clusterCIDR: leaf<string>('string', (c, v) => (c.clusterCIDRs = splitList(v))),
    nodePortAddresses: leaf<string[]>('stringList', (c, v) => (c.nodePortAddresses = v)),
    oomScoreAdj: unused('integer'),
    conntrack: {
      fields: {
        maxPerCore: leaf<number>('integer', (c, v) => (c.conntrack.maxPerCore = v)),
        min: leaf<number>('integer', (c, v) => (c.conntrack.min = v)),
        tcpEstablishedTimeout: leaf<number>('duration', (c, v) => (c.conntrack.tcpEstablishedTimeout = v)),
        tcpCloseWaitTimeout: leaf<number>('duration', (c, v) => (c.conntrack.tcpCloseWaitTimeout = v)),
        tcpBeLiberal: leaf<boolean>('boolean', (c, v) => (c.conntrack.tcpBeLiberal = v)),
        udpTimeout: leaf<number>('duration', (c, v) => (c.conntrack.udpTimeout = v)),
        udpStreamTimeout: leaf<number>('duration', (c, v) => (c.conntrack.udpStreamTimeout = v)),
      },
    },
    configSyncPeriod: leaf<number>('duration', (c, v) => (c.configSyncPeriod = v || c.configSyncPeriod)),
    portRange: unused('string'),
    // The agent's own fields (kube-proxy has no such field): observe kube-proxy instead of proxying.
    observe: leaf<boolean>('boolean', (c, v) => (c.observe = v)),
    observeMode: leaf<string>('string', (c, v) => (c.observeMode = (v || undefined) as ProxyMode | undefined)),
    windowsRunAsService: unused('boolean'),
  },
};

/** splitList reads "a, b,c" as ["a","b","c"], as kube-proxy splits clusterCIDR. */
export function splitList(text: string): string[] {
  return text
    .split(',')
    .map((part) => part.trim())
    .filter((part) => part !== '');
}

/**
 * A field that cannot be read, told instead of thrown (an observing agent reads kube-proxy's own
 * ConfigMap, and keeps observing with what it can read).
 */
export type FieldProblem = (path: string, reason: string) => void;

/**
 * applyKubeProxyConfiguration parses the file text and stores every field it sets into config.
 * Returns the dotted paths of the fields that were set (null counts as unset, as Go decodes it).
 * With `onFieldProblem`, an unknown field or a value of the wrong type is told to it and skipped
 * rather than refused; a document that is no KubeProxyConfiguration is refused either way.
 */
export function applyKubeProxyConfiguration(
  text: string,
  fileName: string,
  config: AgentConfig,
  onFieldProblem?: FieldProblem,
): Set<string> {
  let document: unknown;
  try {
    document = parseYaml(text);
  } catch (error) {
    const reason = error instanceof Error ? error.message.split('\n')[0] : String(error);
    throw new ConfigError(`config file ${fileName}: not YAML: ${reason}`);
  }
  if (document === null || typeof document !== 'object' || Array.isArray(document)) {
    throw new ConfigError(`config file ${fileName}: not a KubeProxyConfiguration object`);
  }
  const object = document as Record<string, unknown>;
  if (object.apiVersion !== kubeProxyConfigurationAPIVersion) {
    throw new ConfigError(
      `config file ${fileName}: apiVersion: ${JSON.stringify(object.apiVersion)} is not ${kubeProxyConfigurationAPIVersion}`,
    );
  }
  if (object.kind !== kubeProxyConfigurationKind) {
    throw new ConfigError(`config file ${fileName}: kind: ${JSON.stringify(object.kind)} is not ${kubeProxyConfigurationKind}`);
  }
  const set = new Set<string>();
  const problem: FieldProblem =
    onFieldProblem ??
    ((path, reason) => {
      throw new ConfigError(`config file ${fileName}: ${path}: ${reason}`);
    });
  readBranch(schema, object, '', config, set, problem);
  return set;
}

function readBranch(
  branch: Branch,
  value: Record<string, unknown>,
  prefix: string,
  config: AgentConfig,
  set: Set<string>,
  problem: FieldProblem,
): void {
  for (const [name, fieldValue] of Object.entries(value)) {
    const path = prefix + name;
    const spec = branch.fields[name];
    if (spec === undefined) {
      problem(path, 'unknown field');
      continue;
    }
    if (fieldValue === null || fieldValue === undefined) continue;
    if ('fields' in spec) {
      if (typeof fieldValue !== 'object' || Array.isArray(fieldValue)) {
        problem(path, `${describe(fieldValue)} is not an object`);
        continue;
      }
      readBranch(spec, fieldValue as Record<string, unknown>, `${path}.`, config, set, problem);
      continue;
    }
    const checked = readLeaf(spec.kind, fieldValue);
    if (typeof checked === 'string' && checked.startsWith('\0')) {
      problem(path, checked.slice(1));
      continue;
    }
    spec.store?.(config, checked as never);
    set.add(path);
  }
}

/** readLeaf returns the checked value, or a string starting with NUL that says why it is refused. */
function readLeaf(kind: LeafKind, value: unknown): unknown {
  const refuse = (why: string) => `\0${describe(value)} ${why}`;
  switch (kind) {
    case 'string':
      return typeof value === 'string' ? value : refuse('is not a string');
    case 'boolean':
      return typeof value === 'boolean' ? value : refuse('is not true or false');
    case 'integer':
      return Number.isSafeInteger(value) ? value : refuse('is not an integer');
    case 'number':
      return typeof value === 'number' && Number.isFinite(value) ? value : refuse('is not a number');
    case 'duration': {
      // metav1.Duration decodes only from text, so a bare number is refused as kube-proxy refuses it.
      const milliseconds = typeof value === 'string' ? parseGoDuration(value) : undefined;
      return milliseconds === undefined ? refuse('is not a duration (like "30s" or "1m0s")') : milliseconds;
    }
    case 'stringList':
      return Array.isArray(value) && value.every((item) => typeof item === 'string') ? value : refuse('is not a list of strings');
    case 'boolMap':
      return typeof value === 'object' &&
        value !== null &&
        !Array.isArray(value) &&
        Object.values(value).every((item) => typeof item === 'boolean')
        ? value
        : refuse('is not a map of names to true or false');
    case 'anything':
      return value;
  }
}

export function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object' && value !== null) return 'an object';
  return String(value);
}
