// Command-line flags of proxyctl-agent: kube-proxy's names (pflag syntax: --name=value, --name value,
// --bool, --bool=false) plus --netns and --api-bind-address.
import {parseIP} from '../../core/model/index.ts';
import type {NftablesLayout} from '../../core/model/index.ts';
import {type AgentConfig, ConfigError, type DetectLocalMode, type ProxyMode} from './agent-config.ts';
import {parseGoDuration} from './duration.ts';
import {splitList} from './kube-proxy-configuration.ts';

type FlagKind = 'string' | 'boolean' | 'integer' | 'duration';

interface FlagSpec {
  kind: FlagKind;
  help: string;
  /** Config paths this flag sets, so that a later check can name the flag. */
  paths: string[];
  store: (config: AgentConfig, value: never) => void;
}

const flag = <T>(kind: FlagKind, help: string, paths: string[], store: (config: AgentConfig, value: T) => void): FlagSpec => ({
  kind,
  help,
  paths,
  store: store as FlagSpec['store'],
});

/** Adds the default port when the flag gives only an address, as kube-proxy does. */
export function withPort(address: string, port: number): string {
  const ip = parseIP(address);
  if (ip === undefined) return address;
  return ip.family === 'IPv6' ? `[${ip.text}]:${port}` : `${ip.text}:${port}`;
}

export const flagSpecs: Record<string, FlagSpec> = {
  config: flag<string>(
    'string',
    'KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1)',
    ['configFile'],
    (c, v) => (c.configFile = v),
  ),
  kubeconfig: flag<string>(
    'string',
    'kubeconfig file (default: the files $KUBECONFIG lists, merged as kubectl does, else ~/.kube/config, else the in-cluster service account)',
    ['clientConnection.kubeconfig'],
    (c, v) => (c.kubeconfig = v || undefined),
  ),
  'hostname-override': flag<string>(
    'string',
    'node name to use instead of the hostname',
    ['hostnameOverride'],
    (c, v) => (c.hostnameOverride = v || undefined),
  ),
  'proxy-mode': flag<string>('string', 'iptables, ipvs or nftables', ['mode'], (c, v) => (c.mode = (v || 'iptables') as ProxyMode)),
  'cluster-cidr': flag<string>(
    'string',
    'pod CIDRs, comma separated (one per family)',
    ['clusterCIDR'],
    (c, v) => (c.clusterCIDRs = splitList(v)),
  ),
  'service-cluster-ip-range': flag<string>(
    'string',
    'service CIDRs, comma separated (one per family), for clusters without ServiceCIDR objects (nftables mode)',
    ['serviceCIDRs'],
    (c, v) => (c.serviceCIDRs = splitList(v)),
  ),
  'masquerade-all': flag<boolean>(
    'boolean',
    'SNAT all traffic sent to service cluster IPs',
    ['iptables.masqueradeAll', 'nftables.masqueradeAll'],
    (c, v) => {
      c.iptables.masqueradeAll = v;
      c.nftables.masqueradeAll = v;
    },
  ),
  'nftables-layout': flag<string>(
    'string',
    "nftables mode's table layout: proxyctl (default; endpoints picked from shared maps), kube-proxy " +
      "(kube-proxy 1.34+'s own layout, a chain per endpoint) or kube-proxy-1.33 (as kube-proxy 1.33 and " +
      'before write it)',
    ['nftables.layout'],
    (c, v) => (c.nftables.layout = (v || 'proxyctl') as NftablesLayout),
  ),
  'iptables-masquerade-bit': flag<number>(
    'integer',
    'fwmark bit for SNAT (0-31)',
    ['iptables.masqueradeBit'],
    (c, v) => (c.iptables.masqueradeBit = v),
  ),
  'iptables-sync-period': flag<number>(
    'duration',
    'longest time between syncs, e.g. 30s',
    ['iptables.syncPeriod'],
    (c, v) => (c.iptables.syncPeriod = v),
  ),
  'iptables-min-sync-period': flag<number>(
    'duration',
    'shortest time between syncs, e.g. 1s',
    ['iptables.minSyncPeriod'],
    (c, v) => (c.iptables.minSyncPeriod = v),
  ),
  'iptables-localhost-nodeports': flag<boolean>(
    'boolean',
    'accept NodePort connections on 127.0.0.0/8',
    ['iptables.localhostNodePorts'],
    (c, v) => (c.iptables.localhostNodePorts = v),
  ),
  'ipvs-scheduler': flag<string>(
    'string',
    'ipvs scheduler (rr, wrr, lc, ...; default rr)',
    ['ipvs.scheduler'],
    (c, v) => (c.ipvs.scheduler = v),
  ),
  'ipvs-sync-period': flag<number>(
    'duration',
    'ipvs mode: longest time between syncs, e.g. 30s',
    ['ipvs.syncPeriod'],
    (c, v) => (c.ipvs.syncPeriod = v),
  ),
  'ipvs-min-sync-period': flag<number>(
    'duration',
    'ipvs mode: shortest time between syncs, e.g. 1s',
    ['ipvs.minSyncPeriod'],
    (c, v) => (c.ipvs.minSyncPeriod = v),
  ),
  'ipvs-exclude-cidrs': flag<string>(
    'string',
    'CIDRs whose virtual servers ipvs mode leaves alone, comma separated',
    ['ipvs.excludeCIDRs'],
    (c, v) => (c.ipvs.excludeCIDRs = splitList(v)),
  ),
  'ipvs-strict-arp': flag<boolean>(
    'boolean',
    'set arp_ignore and arp_announce for ipvs',
    ['ipvs.strictARP'],
    (c, v) => (c.ipvs.strictARP = v),
  ),
  'ipvs-tcp-timeout': flag<number>(
    'duration',
    'ipvs idle TCP session timeout (0: leave as is)',
    ['ipvs.tcpTimeout'],
    (c, v) => (c.ipvs.tcpTimeout = v),
  ),
  'ipvs-tcpfin-timeout': flag<number>(
    'duration',
    'ipvs TCP session timeout after FIN (0: leave as is)',
    ['ipvs.tcpFinTimeout'],
    (c, v) => (c.ipvs.tcpFinTimeout = v),
  ),
  'ipvs-udp-timeout': flag<number>(
    'duration',
    'ipvs UDP session timeout (0: leave as is)',
    ['ipvs.udpTimeout'],
    (c, v) => (c.ipvs.udpTimeout = v),
  ),
  'nodeport-addresses': flag<string>(
    'string',
    'CIDRs or primary/localhost/all, comma separated',
    ['nodePortAddresses'],
    (c, v) => (c.nodePortAddresses = splitList(v)),
  ),
  'detect-local-mode': flag<string>(
    'string',
    'ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix',
    ['detectLocalMode'],
    (c, v) => (c.detectLocalMode = v as DetectLocalMode),
  ),
  'bind-address': flag<string>('string', "the node's primary IP", ['bindAddress'], (c, v) => (c.bindAddress = v)),
  'metrics-bind-address': flag<string>(
    'string',
    'host:port of /metrics (default 127.0.0.1:10249, observing 127.0.0.1:10272; empty: off)',
    ['metricsBindAddress'],
    (c, v) => (c.metricsBindAddress = withPort(v, 10249)),
  ),
  'healthz-bind-address': flag<string>(
    'string',
    'host:port of /healthz and /livez (default 0.0.0.0:10256, observing 0.0.0.0:10271; empty: off)',
    ['healthzBindAddress'],
    (c, v) => (c.healthzBindAddress = withPort(v, 10256)),
  ),
  'api-bind-address': flag<string>(
    'string',
    'host:port of the WebSocket API (default 127.0.0.1:10260, observing 127.0.0.1:10270; empty: off)',
    ['apiBindAddress'],
    (c, v) => (c.apiBindAddress = withPort(v, 10260)),
  ),
  netns: flag<string>('string', 'run every rule command inside this network namespace', ['netns'], (c, v) => (c.netns = v || undefined)),
  observe: flag<boolean>(
    'boolean',
    "observe kube-proxy's rules beside it, changing nothing on the node (own ports 10270-10272)",
    ['observe'],
    (c, v) => (c.observe = v),
  ),
  'observe-mode': flag<string>(
    'string',
    "with --observe: kube-proxy's mode, iptables, nftables or ipvs (default: found from the kernel)",
    ['observeMode'],
    (c, v) => (c.observeMode = (v || undefined) as ProxyMode | undefined),
  ),
  cleanup: flag<boolean>('boolean', "remove the agent's rules and exit", ['cleanup'], (c, v) => (c.cleanup = v)),
  v: flag<number>('integer', 'log detail (0-5)', ['logging.verbosity'], (c, v) => (c.verbosity = v)),
};

export interface ParsedFlags {
  /** Flag name (without dashes) -> checked value, in command-line order. */
  values: Array<{name: string; value: string | number | boolean}>;
  help: boolean;
}

/** parseFlags checks the command line; a flag not known, without its value, or of the wrong type is refused. */
export function parseFlags(argv: string[]): ParsedFlags {
  const values: ParsedFlags['values'] = [];
  let help = false;
  for (let index = 0; index < argv.length; index++) {
    const argument = argv[index];
    if (argument === '--help' || argument === '-h') {
      help = true;
      continue;
    }
    const match = /^--?([a-z][a-z0-9-]*)(?:=(.*))?$/s.exec(argument);
    if (!match) throw new ConfigError(`argument ${JSON.stringify(argument)}: proxyctl-agent takes only flags (see --help)`);
    const name = match[1];
    const spec = flagSpecs[name];
    if (spec === undefined) throw new ConfigError(`flag --${name}: unknown flag (see --help)`);
    let text = match[2];
    if (text === undefined) {
      if (spec.kind === 'boolean') {
        values.push({name, value: true});
        continue;
      }
      if (index + 1 >= argv.length) throw new ConfigError(`flag --${name}: needs a value`);
      text = argv[++index];
    }
    values.push({name, value: readFlagValue(name, spec.kind, text)});
  }
  return {values, help};
}

function readFlagValue(name: string, kind: FlagKind, text: string): string | number | boolean {
  switch (kind) {
    case 'string':
      return text;
    case 'boolean':
      if (text === 'true' || text === '1') return true;
      if (text === 'false' || text === '0') return false;
      throw new ConfigError(`flag --${name}: ${JSON.stringify(text)} is not true or false`);
    case 'integer':
      if (/^-?\d+$/.test(text)) return Number(text);
      throw new ConfigError(`flag --${name}: ${JSON.stringify(text)} is not an integer`);
    case 'duration': {
      const milliseconds = parseGoDuration(text);
      if (milliseconds === undefined) throw new ConfigError(`flag --${name}: ${JSON.stringify(text)} is not a duration (like 30s or 1m0s)`);
      return milliseconds;
    }
  }
}

/** applyFlags stores the flags into config and returns config path -> the flag that set it. */
export function applyFlags(flags: ParsedFlags, config: AgentConfig): Map<string, string> {
  const sources = new Map<string, string>();
  for (const {name, value} of flags.values) {
    const spec = flagSpecs[name];
    spec.store(config, value as never);
    for (const path of spec.paths) sources.set(path, `--${name}`);
  }
  return sources;
}

export function flagsHelp(): string {
  const lines = ['Usage: proxyctl-agent [flags]', '', 'A kube-proxy replacement for one node. Flags override --config.', ''];
  for (const [name, spec] of Object.entries(flagSpecs)) {
    const value = spec.kind === 'boolean' ? '' : ` ${spec.kind === 'duration' ? 'DURATION' : spec.kind === 'integer' ? 'N' : 'VALUE'}`;
    lines.push(`  --${name}${value}`.padEnd(40) + spec.help);
  }
  lines.push('  -h, --help'.padEnd(40) + 'this text');
  return lines.join('\n');
}
