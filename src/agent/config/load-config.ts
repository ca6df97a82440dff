// loadAgentConfig: defaults, then the --config file, then the flags on top (flags win, as in
// kube-proxy), then every value checked, and the addresses parsed once for the agent to use as
// they are. A refused setting throws ConfigError naming it.
import {existsSync, readFileSync} from 'node:fs';
import {join} from 'node:path';
import {parseCIDR, parseIP, type ParsedCIDR, type ParsedIP} from '../../core/model/index.ts';
import {
  type AgentConfig,
  ConfigError,
  defaultAgentConfig,
  detectLocalModes,
  ipvsSchedulers,
  nftablesLayouts,
  observeBindAddresses,
  proxyModes,
} from './agent-config.ts';
import {formatGoDuration} from './duration.ts';
import {applyFlags, flagSpecs, parseFlags, withPort} from './flags.ts';
import {applyKubeProxyConfiguration, describe} from './kube-proxy-configuration.ts';
import {errorText} from '../../core/error-text.ts';

/** BindAddress: a server's "IP:port" setting, as written and parsed. */
export interface BindAddress {
  text: string;
  host: string;
  port: number;
}

/** AgentAddresses: the addresses of an AgentConfig, parsed when it was checked. */
export interface AgentAddresses {
  bindAddress: ParsedIP;
  clusterCIDRs: ParsedCIDR[];
  /** Each server's address; undefined when its setting is empty (the server is off). */
  healthz: BindAddress | undefined;
  metrics: BindAddress | undefined;
  api: BindAddress | undefined;
}

/** CheckedConfig: an AgentConfig validateAgentConfig accepted, with the addresses it parsed. */
export interface CheckedConfig {
  config: AgentConfig;
  addresses: AgentAddresses;
  /** Config path -> what set it ("flag --cluster-cidr", "config file F"); paths not in it have their default. */
  setBy?: ReadonlyMap<string, string>;
}

export interface LoadedConfig extends CheckedConfig {
  /** --help was given. */
  help: boolean;
}

export function loadAgentConfig(argv: string[], readFile: (path: string) => string = (path) => readFileSync(path, 'utf8')): LoadedConfig {
  const flags = parseFlags(argv);
  const config = defaultAgentConfig();
  const configFlag = flags.values.findLast((entry) => entry.name === 'config');
  const fileFields = new Set<string>();
  if (configFlag !== undefined && configFlag.value !== '') {
    const fileName = String(configFlag.value);
    let text: string;
    try {
      text = readFile(fileName);
    } catch (error) {
      const reason = (error as NodeJS.ErrnoException).code ?? errorText(error);
      throw new ConfigError(`config file ${fileName}: cannot read it: ${reason}`);
    }
    for (const path of applyKubeProxyConfiguration(text, fileName, config)) fileFields.add(path);
  }
  const flagSources = applyFlags(flags, config);
  if (config.observe) {
    // Beside kube-proxy, its ports are taken: the observer has its own unless told otherwise.
    // A flag that gives only an address gets the observer's port, not kube-proxy's.
    for (const [field, address] of Object.entries(observeBindAddresses) as [keyof typeof observeBindAddresses, string][]) {
      const flag = flags.values.findLast((entry) => flagSpecs[entry.name]?.paths.includes(field));
      const port = Number(address.slice(address.lastIndexOf(':') + 1));
      if (flag !== undefined && flag.value !== '' && parseIP(String(flag.value)) !== undefined)
        config[field] = withPort(String(flag.value), port);
      else if (!flagSources.has(field) && !fileFields.has(field)) config[field] = address;
    }
  }
  const source = (path: string): string => {
    const flag = flagSources.get(path);
    if (flag !== undefined) return `flag ${flag}`;
    if (fileFields.has(path)) return `config file ${config.configFile}: ${path}`;
    return path;
  };
  const setBy = new Map<string, string>();
  for (const path of fileFields) setBy.set(path, `config file ${config.configFile}`);
  for (const [path, flag] of flagSources) setBy.set(path, `flag ${flag}`);
  return {...validateAgentConfig(config, source), setBy, help: flags.help};
}

/**
 * validateAgentConfig checks what the type alone does not, as kube-proxy's validation does; `source`
 * names where a setting came from (a flag, or a field of the file). Also normalises a few values,
 * and hands on the addresses it parsed.
 */
export function validateAgentConfig(config: AgentConfig, source: (path: string) => string = (path) => path): CheckedConfig {
  const refuse = (path: string, value: unknown, why: string): never => {
    throw new ConfigError(`${source(path)}: ${describe(value)} ${why}`);
  };
  if (!proxyModes.includes(config.mode)) refuse('mode', config.mode, `is not one of ${proxyModes.join(', ')}`);
  if (config.observeMode !== undefined && !proxyModes.includes(config.observeMode))
    refuse('observeMode', config.observeMode, `is not one of ${proxyModes.join(', ')}`);
  if (config.observeMode !== undefined && !config.observe) refuse('observeMode', config.observeMode, 'is set without observe (--observe)');
  // --cleanup removes kube-proxy's rules too: never from an agent told to observe them.
  if (config.observe && config.cleanup)
    refuse('cleanup', true, 'is refused with observe (--observe): an observing agent never changes the node');

  checkSection('iptables', config.iptables);
  if (config.mode === 'nftables') checkSection('nftables', config.nftables);
  if (!nftablesLayouts.includes(config.nftables.layout)) {
    refuse('nftables.layout', config.nftables.layout, `is not one of ${nftablesLayouts.join(', ')}`);
  }
  if (config.mode === 'ipvs') {
    checkPeriods('ipvs', config.ipvs);
    if (config.ipvs.scheduler !== '' && !ipvsSchedulers.includes(config.ipvs.scheduler)) {
      refuse('ipvs.scheduler', config.ipvs.scheduler, `is not one of ${ipvsSchedulers.join(', ')}`);
    }
    config.ipvs.excludeCIDRs.forEach((cidr, index) => {
      if (!parseCIDR(cidr)) refuse('ipvs.excludeCIDRs', cidr, `(entry ${index}) is not a CIDR`);
    });
    for (const field of ['tcpTimeout', 'tcpFinTimeout', 'udpTimeout'] as const) {
      if (config.ipvs[field] < 0) refuse(`ipvs.${field}`, formatGoDuration(config.ipvs[field]), 'is negative');
    }
  }

  for (const field of ['maxPerCore', 'min'] as const) {
    if (config.conntrack[field] < 0) refuse(`conntrack.${field}`, config.conntrack[field], 'is negative');
  }
  for (const field of ['tcpEstablishedTimeout', 'tcpCloseWaitTimeout', 'udpTimeout', 'udpStreamTimeout'] as const) {
    if (config.conntrack[field] < 0) refuse(`conntrack.${field}`, formatGoDuration(config.conntrack[field]), 'is negative');
  }
  if (config.configSyncPeriod <= 0) refuse('configSyncPeriod', formatGoDuration(config.configSyncPeriod), 'is not greater than 0');

  const bindAddress = parseIP(config.bindAddress) ?? refuse('bindAddress', config.bindAddress, 'is not an IP address');
  const server = (field: 'healthzBindAddress' | 'metricsBindAddress' | 'apiBindAddress'): BindAddress | undefined => {
    const text = config[field];
    if (text === '') return undefined;
    const parsed = parseHostPort(text) ?? refuse(field, text, 'is not IP:port (like 0.0.0.0:10256 or [::1]:10249)');
    return {text, ...parsed};
  };
  const servers = {healthz: server('healthzBindAddress'), metrics: server('metricsBindAddress'), api: server('apiBindAddress')};

  const parsedCIDRs = {clusterCIDR: [] as ParsedCIDR[], serviceCIDRs: [] as ParsedCIDR[]};
  for (const [field, cidrs] of [
    ['clusterCIDR', config.clusterCIDRs],
    ['serviceCIDRs', config.serviceCIDRs],
  ] as const) {
    for (const text of cidrs) {
      const cidr = parseCIDR(text) ?? refuse(field, text, 'is not a CIDR');
      if (parsedCIDRs[field].some((other) => other.family === cidr.family))
        refuse(field, cidrs.join(','), `has two ${cidr.family} CIDRs (at most one per family)`);
      parsedCIDRs[field].push(cidr);
    }
  }

  const expanded: string[] = [];
  for (const entry of config.nodePortAddresses) {
    if (entry === 'primary') expanded.push(entry);
    else if (entry === 'localhost') expanded.push('127.0.0.0/8', '::1/128');
    else if (entry === 'all') expanded.push('0.0.0.0/0', '::/0');
    else if (parseCIDR(entry)) expanded.push(entry);
    else refuse('nodePortAddresses', entry, 'is neither a CIDR nor one of primary, localhost, all');
  }
  config.nodePortAddresses = [...new Set(expanded)];

  if (!detectLocalModes.includes(config.detectLocalMode)) {
    refuse('detectLocalMode', config.detectLocalMode, `is not one of ${detectLocalModes.join(', ')}`);
  }
  if (config.detectLocalMode === 'BridgeInterface' && !isInterfaceName(config.detectLocal.bridgeInterface)) {
    refuse(
      'detectLocal.bridgeInterface',
      config.detectLocal.bridgeInterface,
      'is not an interface name (detectLocalMode BridgeInterface needs one)',
    );
  }
  if (config.detectLocalMode === 'InterfaceNamePrefix' && !isInterfaceName(config.detectLocal.interfaceNamePrefix)) {
    refuse(
      'detectLocal.interfaceNamePrefix',
      config.detectLocal.interfaceNamePrefix,
      'is not an interface name prefix (detectLocalMode InterfaceNamePrefix needs one)',
    );
  }

  if (config.hostnameOverride !== undefined) {
    config.hostnameOverride = config.hostnameOverride.trim().toLowerCase();
    if (
      !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(config.hostnameOverride) ||
      config.hostnameOverride.length > 253
    ) {
      refuse('hostnameOverride', config.hostnameOverride, 'is not a node name (lower-case DNS subdomain)');
    }
  }
  if (config.netns !== undefined && (!/^[A-Za-z0-9_.-]{1,64}$/.test(config.netns) || config.netns === '.' || config.netns === '..')) {
    refuse('netns', config.netns, 'is not a network namespace name');
  }
  if (!Number.isInteger(config.verbosity) || config.verbosity < 0) refuse('logging.verbosity', config.verbosity, 'is not 0 or more');
  return {config, addresses: {bindAddress, clusterCIDRs: parsedCIDRs.clusterCIDR, ...servers}};

  function checkSection(name: 'iptables' | 'nftables', section: {masqueradeBit: number; syncPeriod: number; minSyncPeriod: number}): void {
    if (section.masqueradeBit < 0 || section.masqueradeBit > 31) refuse(`${name}.masqueradeBit`, section.masqueradeBit, 'is not in 0-31');
    checkPeriods(name, section);
  }
  function checkPeriods(name: string, section: {syncPeriod: number; minSyncPeriod: number}): void {
    if (section.syncPeriod <= 0) refuse(`${name}.syncPeriod`, formatGoDuration(section.syncPeriod), 'is not greater than 0');
    if (section.minSyncPeriod < 0) refuse(`${name}.minSyncPeriod`, formatGoDuration(section.minSyncPeriod), 'is negative');
    if (section.syncPeriod < section.minSyncPeriod) {
      refuse(
        `${name}.syncPeriod`,
        formatGoDuration(section.syncPeriod),
        `is shorter than ${name}.minSyncPeriod ${formatGoDuration(section.minSyncPeriod)}`,
      );
    }
  }
}

/** Where `ip netns add` leaves the namespaces `ip netns exec` enters (iproute2's NETNS_RUN_DIR). */
export const netnsRunDirectory = '/run/netns';

/**
 * checkNetnsExists refuses --netns naming a network namespace that does not exist: the agent
 * would start, answer /healthz, and fail every sync. A start-up check, apart from
 * loadAgentConfig, which reads settings without looking at the node.
 */
export function checkNetnsExists(netns: string | undefined, directory = netnsRunDirectory): void {
  if (netns === undefined) return;
  if (!existsSync(join(directory, netns))) {
    throw new ConfigError(
      `flag --netns: network namespace "${netns}" does not exist (no ${join(directory, netns)}; create it with ip netns add ${netns})`,
    );
  }
}

/** parseHostPort reads "IP:port" or "[IPv6]:port". */
export function parseHostPort(text: string): {host: string; port: number} | undefined {
  const match = /^\[([^\]]+)\]:(\d{1,5})$/.exec(text) ?? /^([^:[\]]+):(\d{1,5})$/.exec(text);
  if (!match) return undefined;
  const ip = parseIP(match[1]);
  const port = Number(match[2]);
  if (!ip || port > 65535) return undefined;
  return {host: ip.text, port};
}

function isInterfaceName(name: string): boolean {
  return /^[^\s/]{1,15}$/.test(name);
}
