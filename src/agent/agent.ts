// startAgent: wires one node agent together from a checked AgentConfig: watches -> object store ->
// proxier -> host, with the healthz, metrics and service health servers. main.ts runs it as a
// process; the lab can run it in-process with its own host, rules and client.
import {readFileSync} from 'node:fs';
import {hostname} from 'node:os';
import type {IPFamily, LocalDetector, ParsedIP, ProxyConfig} from '../core/model/index.ts';
import {type AccessReviewer, kubernetesAccessReviewer} from './api/access.ts';
import {iptablesBackend, iptablesRulesBackend} from './api/rules/iptables.ts';
import type {RulesBackend} from './api/rules/backend.ts';
import {earlyWatcher, unwatchedRulesetChanges, watchNftRuleset} from './applied/ruleset-changes.ts';
import {type LatestIpvsLook, watchIpvsState} from './applied/ipvs-changes.ts';
import {readNodeAddresses} from './api/node-addresses.ts';
import {createAgentRuntime} from './api/runtime.ts';
import {type AgentApi, isLoopbackHost, startAgentApi} from './api/server.ts';
import {type AgentConfig, syncPeriods} from './config/agent-config.ts';
import type {AgentAddresses, BindAddress, CheckedConfig} from './config/load-config.ts';
import {startHealthServer} from './health/health-server.ts';
import type {HttpEndpoint} from './health/http-listen.ts';
import {type AgentMetrics, createAgentMetrics} from './health/metrics.ts';
import {startMetricsServer} from './health/metrics-server.ts';
import {ProxierHealth} from './health/proxier-health.ts';
import {ServiceHealthServers} from './health/service-health.ts';
import {CommandHost} from './host/command-host.ts';
import type {Host} from './host/host.ts';
import type {Logger} from './log.ts';
import {detectIptablesFeatures, readNfacctCounters} from './sync/iptables-features.ts';
import {type IptablesRuleSource, coreIptablesRules} from './sync/iptables-rules.ts';
import {nftablesRulesBackend} from './api/rules/nftables.ts';
import {NftablesProxier, removeNftablesTables} from './sync/nftables-proxier.ts';
import {IptablesProxier} from './sync/proxier.ts';
import {IpvsProxier} from './sync/ipvs-proxier.ts';
import {ipvsRulesBackend} from './api/rules/ipvs.ts';
import {ClusterWatch} from './watch/cluster-watch.ts';
import {createKubernetesClient, type KubernetesClient, loadKubeConfig} from './watch/kubernetes-client.ts';
import {errorText} from '../core/error-text.ts';
import type {ObserveRuntime} from './api/runtime-state.ts';
import {DriftTracker} from './observe/drift-tracker.ts';
import {kubeProxyNftablesBackend} from './observe/kube-proxy-nftables.ts';
import {followKubeProxyMode, type Observation, type ObserveReport, prepareObservation} from './observe/observation.ts';
import {ObservingProxier} from './observe/observing-proxier.ts';

export interface AgentDependencies {
  log: Logger;
  host?: Host;
  rules?: IptablesRuleSource;
  client?: KubernetesClient;
  /** What the plugin API renders, parses, diffs and traces with; default core/iptables. */
  rulesBackend?: RulesBackend;
  /** Checks the plugin's tokens when the API listens beyond loopback; default: the cluster's TokenReview/SubjectAccessReview. */
  accessReviewer?: AccessReviewer;
}

/** The proxier of the configured mode. */
export type AgentProxier = IptablesProxier | NftablesProxier | IpvsProxier | ObservingProxier;

export interface RunningAgent {
  nodeName: string;
  families: IPFamily[];
  proxier: AgentProxier;
  watch: ClusterWatch;
  metrics: AgentMetrics;
  health: ProxierHealth;
  healthz?: HttpEndpoint;
  metricsServer?: HttpEndpoint;
  /** The WebSocket API for kubectl proxyctl (--api-bind-address). */
  api?: AgentApi;
  /** Stops watching, syncing and serving. The rules stay in the kernel, so traffic keeps flowing. */
  stop(): Promise<void>;
  /**
   * Resolves, saying why, when the agent must start again to go on: an observer whose kube-proxy
   * now runs another mode (as kube-proxy starts again when its configuration file changes).
   */
  restartNeeded?: Promise<string>;
}

export async function startAgent(given: CheckedConfig, dependencies: AgentDependencies): Promise<RunningAgent> {
  const {log} = dependencies;
  const client = dependencies.client ?? createKubernetesClient(loadKubeConfig(given.config.kubeconfig));
  // An observing agent renders with kube-proxy's mode and settings, and reads through a host that refuses writes.
  const observation = given.config.observe
    ? await prepareObservation(given, {log, client, host: dependencies.host, families: proxyFamilies(given.addresses)})
    : undefined;
  const checked = observation ?? given;
  const {addresses} = checked;
  let {config} = checked;
  const host =
    observation?.host ??
    dependencies.host ??
    new CommandHost({netns: config.netns, onCommand: (command) => log.detail(4, 'run', {command: command.join(' ')})});
  if (config.mode === 'ipvs' && !observation && !(await ipvsAvailable(host, log))) config = {...config, mode: 'iptables'};
  const rules = config.mode === 'iptables' && !observation ? (dependencies.rules ?? coreIptablesRules()) : undefined;
  const nodeName = config.hostnameOverride ?? hostname().toLowerCase();
  const families = proxyFamilies(addresses);
  const {syncPeriod, minSyncPeriod} = syncPeriods(config);

  // kube-proxy's iptables proxier checks these at start; core renders from the answer.
  const iptablesMode = config.mode === 'iptables';
  // An observer takes the nfacct counters that are there and creates none.
  const iptablesFeatures = iptablesMode ? await detectIptablesFeatures(host, log, {families, createCounters: !observation}) : undefined;
  const metrics = createAgentMetrics({
    processMetrics: true,
    nfacct: iptablesMode ? () => readNfacctCounters(host) : undefined,
  });
  const health = new ProxierHealth(2 * syncPeriod);
  // kube-proxy serves the healthCheckNodePorts; an observer opens none.
  const serviceHealth = observation ? undefined : healthCheckNodePorts(config, health, log);
  const proxierOptions = {
    host,
    objects: {services: () => watch.store.services(), endpointSlices: () => watch.store.endpointSlices(), node: () => watch.store.node()},
    families,
    model: {
      nodeName,
      nodeIPs: bindAddressNodeIPs(addresses.bindAddress),
      clusterCIDRs: config.clusterCIDRs,
      detectLocalMode:
        config.detectLocalMode === 'NodeCIDR' ? 'NodeCIDR' : config.detectLocalMode === 'ClusterCIDR' ? 'ClusterCIDR' : undefined,
      config: {...proxyConfig(config), ...(iptablesFeatures && {iptablesFeatures})},
    } as const,
    syncPeriod,
    minSyncPeriod,
    metrics,
    health,
    log,
    serviceHealth,
  };
  const proxier =
    observation !== undefined
      ? new ObservingProxier(proxierOptions)
      : rules !== undefined
        ? new IptablesProxier({...proxierOptions, rules})
        : config.mode === 'ipvs'
          ? new IpvsProxier({...proxierOptions, ipvs: config.ipvs})
          : new NftablesProxier({
              ...proxierOptions,
              nodeAddresses: () => readNodeAddresses(host.netns),
              serviceCIDRs: () => serviceCIDRs.current,
            });
  const watch: ClusterWatch = new ClusterWatch({
    client,
    nodeName,
    log,
    watchdogMs: config.configSyncPeriod,
    // Only nftables mode writes a rule for the service CIDRs; kube-proxy's iptables and ipvs modes have none.
    serviceCIDRs: config.mode === 'nftables',
    onSynced: (kind) => {
      log.detail(1, 'initial list received', {kind});
      if (kind !== 'ServiceCIDR') proxier.markSynced(kind);
    },
  });
  const serviceCIDRs = new ServiceCIDRSource(config.serviceCIDRs, () => watch.store.serviceCIDRs());
  watch.store.onChange((kind, type, object) => {
    // Checked first: an initial list calls this once per object, 20,000 times at 10,000 services.
    if (log.verbosity >= 3) {
      const metadata = (object as {metadata?: {namespace?: string; name?: string}}).metadata;
      log.detail(3, 'object changed', {
        kind,
        object: `${metadata?.namespace ? `${metadata.namespace}/` : ''}${metadata?.name}`,
        change: type,
      });
    }
    if (kind !== 'ServiceCIDR') proxier.onChange(kind, type === 'DELETED' && kind === 'Node' ? undefined : object);
    else if (serviceCIDRs.refresh()) {
      log.info('service CIDRs changed', {serviceCIDRs: serviceCIDRs.current.join(',') || '(none)'});
      // The drop rule sits in the table's base chains, which only a full sync rewrites.
      proxier.requestSync({full: true});
    }
  });
  // The initial lists (seconds at 10,000 services) are taken while the node is prepared and the
  // servers start; the proxier writes nothing before its start below.
  watch.start();

  const running: RunningAgent = {nodeName, families, proxier, watch, metrics, health, stop: async () => {}};
  let observe: ObserveRuntime | undefined;
  try {
    // Switching modes: each mode removes the other's rules at start, as kube-proxy does.
    if (rules !== undefined) await removeNftablesTables(host, families, log);
    observe = observation && observeRuntime({report: observation.report, proxier: proxier as ObservingProxier, nodeName, log, metrics});
    running.healthz = await listenOrLog('healthz', addresses.healthz, log, (host, port) =>
      startHealthServer({host, port, health, metrics}),
    );
    running.metricsServer = await listenOrLog('metrics', addresses.metrics, log, (host, port) =>
      startMetricsServer({host, port, registry: metrics.registry, mode: config.mode, configz: () => config}),
    );
    running.api = await startApiOrLog(config, addresses.api, {
      nodeName,
      families,
      proxier,
      host,
      log,
      accessReviewer: dependencies.accessReviewer,
      backend: dependencies.rulesBackend,
      serviceCIDRs: () => serviceCIDRs.current,
      observe,
    });
    await proxier.start();
  } catch (error) {
    await running.api?.stop();
    await watch.stop();
    await running.healthz?.close();
    await running.metricsServer?.close();
    throw error;
  }
  log.info('agent started', {
    node: nodeName,
    mode: observation ? `observe: kube-proxy ${config.mode}` : config.mode,
    families: families.join(','),
    netns: config.netns,
    syncPeriodSeconds: syncPeriod / 1000,
  });

  const stopFollowingMode = followObservedMode(observation, observe, running, {mode: config.mode, syncPeriod, log});
  running.stop = async () => {
    stopFollowingMode();
    await running.api?.stop();
    await watch.stop();
    await proxier.stop();
    host.close?.();
    await serviceHealth?.close();
    await running.healthz?.close();
    await running.metricsServer?.close();
    log.info('agent stopped; rules left in place');
  };
  return running;
}

/**
 * An observer follows kube-proxy's mode (observation.ts): found in another mode, alone, it asks
 * through running.restartNeeded to start again and observe that one. Returns the stop function
 * (nothing to stop for a proxying agent).
 */
function followObservedMode(
  observation: Observation | undefined,
  observe: ObserveRuntime | undefined,
  running: RunningAgent,
  settings: {mode: string; syncPeriod: number; log: Logger},
): () => void {
  if (!observation) return () => {};
  let restartFor: (reason: string) => void = () => {};
  running.restartNeeded = new Promise((resolve) => (restartFor = resolve));
  return followKubeProxyMode(observation, settings.syncPeriod, settings.log, {
    rulesGone: () => observe?.tracker.kubeProxyRulesGone ?? false,
    onModeChanged: (mode) => restartFor(`kube-proxy now runs ${mode} mode; this observer compares as ${settings.mode} mode`),
  });
}

/** What the API adds for an observer: its findings, the endpoints' history, and the drift tracker with its gauges. */
function observeRuntime(parts: {
  report: ObserveReport;
  proxier: ObservingProxier;
  nodeName: string;
  log: Logger;
  metrics: AgentMetrics;
}): ObserveRuntime {
  const {report, proxier, nodeName, log, metrics} = parts;
  return {report, history: proxier.endpointHistory, tracker: new DriftTracker({nodeName, log, registry: metrics.registry, now: Date.now})};
}

/** The healthCheckNodePort servers of Services with externalTrafficPolicy Local, in the node's network. */
function healthCheckNodePorts(config: AgentConfig, health: ProxierHealth, log: Logger): ServiceHealthServers {
  return new ServiceHealthServers({
    hosts: serviceHealthHosts(config.nodePortAddresses),
    netns: config.netns,
    proxyHealthy: () => health.state().healthy,
    onError: (target, error) =>
      log.error('cannot open health check port', {
        service: `${target.namespace}/${target.name}`,
        port: target.healthCheckNodePort,
        reason: errorText(error),
      }),
  });
}

/** As kube-proxy does: without IP_VS in the kernel, ipvs mode falls back to iptables mode (logged). */
async function ipvsAvailable(host: Host, log: Logger): Promise<boolean> {
  const reason = await host.ipvsadm(['-Ln']).then(
    () => undefined,
    (error: unknown) => errorText(error),
  );
  if (reason !== undefined) log.warn("can't use the IPVS proxier, falling back to iptables mode", {reason});
  return reason === undefined;
}

/**
 * The plugin's API on --api-bind-address (off when empty). Beyond loopback every caller needs a
 * bearer token, checked with TokenReview and SubjectAccessReview (nodes/proxy of this node).
 */
async function startApiOrLog(
  config: AgentConfig,
  address: BindAddress | undefined,
  parts: {
    nodeName: string;
    families: IPFamily[];
    proxier: AgentProxier;
    host: Host;
    log: Logger;
    accessReviewer?: AccessReviewer;
    backend?: RulesBackend;
    /** The cluster's service CIDRs now (an observer renders nftables mode's drop rule with them). */
    serviceCIDRs: () => string[];
    observe?: ObserveRuntime;
  },
): Promise<AgentApi | undefined> {
  const {log, host} = parts;
  if (address === undefined) return undefined;
  const {proxier} = parts;
  const appliedServiceCIDRs = () => (proxier instanceof NftablesProxier ? proxier.appliedServiceCIDRs : parts.serviceCIDRs());
  // An observer's looks at the ipvs state hand the servers they printed to the follow of a change.
  const latestLook: LatestIpvsLook = {servers: undefined};
  const backend =
    parts.backend ??
    (config.mode === 'nftables'
      ? parts.observe
        ? kubeProxyNftablesBackend({serviceCIDRs: appliedServiceCIDRs})
        : nftablesRulesBackend({serviceCIDRs: appliedServiceCIDRs})
      : config.mode === 'ipvs'
        ? ipvsRulesBackend({scheduler: config.ipvs.scheduler, latestLook})
        : parts.observe
          ? iptablesRulesBackend({keepDesired: true})
          : iptablesBackend);
  const frontEnd = config.mode === 'nftables' ? 'nf_tables' : await host.iptablesFrontEnd(parts.families[0]).catch(() => undefined);
  // Legacy iptables changes are invisible to nft monitor: read the kernel for every request then.
  // An observer's nft monitor starts once its first reading is in (xtables-monitor stands in until then).
  let firstReadingDone: () => void = () => {};
  const firstReading = new Promise<void>((resolve) => (firstReadingDone = resolve));
  const iptablesChanges =
    frontEnd === 'nf_tables' && (config.mode !== 'ipvs' || parts.observe)
      ? await watchNftRuleset({
          netns: host.netns,
          log,
          ...(parts.observe && {early: earlyWatcher, monitorAfter: firstReading}),
        })
      : unwatchedRulesetChanges();
  // ipvs mode's virtual servers, sets and addresses change unseen by nft monitor: an observer whose
  // iptables layer nft monitor watches looks at them every few seconds (all their changes are
  // foreign to it); a proxying agent, whose own writes would be most of what it sees, reads them
  // for every request, as does an observer on legacy iptables.
  const changes =
    config.mode !== 'ipvs'
      ? iptablesChanges
      : parts.observe && frontEnd === 'nf_tables'
        ? await watchIpvsState({host, log, iptables: iptablesChanges, latest: latestLook})
        : unwatchedRulesetChanges();
  const runtime = createAgentRuntime({
    nodeName: parts.nodeName,
    version: agentVersion(),
    families: parts.families,
    proxier: parts.proxier,
    host,
    backend,
    changes,
    log,
    observe: parts.observe,
    serviceCIDRs: () => (appliedServiceCIDRs().length > 0 ? appliedServiceCIDRs() : config.serviceCIDRs),
  });
  void runtime.firstReading.then(firstReadingDone);
  try {
    const auth = isLoopbackHost(address.host)
      ? undefined
      : (parts.accessReviewer ?? kubernetesAccessReviewer(loadKubeConfig(config.kubeconfig)));
    const api = await startAgentApi({host: address.host, port: address.port, handlers: runtime, auth, nodeName: parts.nodeName, log});
    return {
      ...api,
      stop: async () => {
        await api.stop();
        runtime.close();
      },
    };
  } catch (error) {
    runtime.close();
    log.error('cannot start the plugin API', {address: config.apiBindAddress, reason: errorText(error)});
    return undefined;
  }
}

/**
 * ServiceCIDRSource: the service CIDRs nftables mode drops unused addresses of: the ServiceCIDR
 * objects' when the cluster has any, else those of --service-cluster-ip-range.
 */
export class ServiceCIDRSource {
  readonly #configured: string[];
  readonly #watched: () => string[];
  #current: string[];

  constructor(configured: string[], watched: () => string[]) {
    this.#configured = configured;
    this.#watched = watched;
    this.#current = this.#effective();
  }

  get current(): string[] {
    return this.#current;
  }

  /** refresh reads the watched objects again; true when the effective CIDRs changed. */
  refresh(): boolean {
    const next = this.#effective();
    const changed = next.join(',') !== this.#current.join(',');
    this.#current = next;
    return changed;
  }

  #effective(): string[] {
    const watched = this.#watched();
    return watched.length > 0 ? watched : this.#configured;
  }
}

/** The agent's release: the version in the package.json above this file (source or dist). */
function agentVersion(): string {
  for (const up of ['../../package.json', '../../../package.json']) {
    try {
      const manifest = JSON.parse(readFileSync(new URL(up, import.meta.url), 'utf8')) as {name?: string; version?: string};
      if (manifest.name === 'proxyctl' && manifest.version) return manifest.version;
    } catch {
      // not there: try one level up
    }
  }
  return 'unknown';
}

/** IPv4, plus IPv6 when the cluster CIDRs or the bind address say the cluster has it. */
export function proxyFamilies(addresses: Pick<AgentAddresses, 'clusterCIDRs' | 'bindAddress'>): IPFamily[] {
  const families = new Set<IPFamily>();
  for (const cidr of addresses.clusterCIDRs) families.add(cidr.family);
  const bind = addresses.bindAddress;
  if (!/^(0\.0\.0\.0|::)$/.test(bind.text)) families.add(bind.family);
  if (families.size === 0) families.add('IPv4');
  return [...families].sort();
}

function proxyConfig(config: AgentConfig): Partial<ProxyConfig> {
  const nftables = config.mode === 'nftables';
  const result: Partial<ProxyConfig> = {
    masqueradeAll: nftables ? config.nftables.masqueradeAll : config.iptables.masqueradeAll,
    masqueradeBit: nftables ? config.nftables.masqueradeBit : config.iptables.masqueradeBit,
    nodePortAddresses: config.nodePortAddresses,
    // nftables mode never accepts NodePorts on 127.0.0.1.
    localhostNodePorts: nftables ? false : config.iptables.localhostNodePorts,
    nftablesLayout: config.nftables.layout,
  };
  let detector: LocalDetector | undefined;
  if (config.detectLocalMode === 'BridgeInterface') detector = {mode: 'BridgeInterface', interfaceName: config.detectLocal.bridgeInterface};
  if (config.detectLocalMode === 'InterfaceNamePrefix')
    detector = {mode: 'InterfaceNamePrefix', interfacePrefix: config.detectLocal.interfaceNamePrefix};
  if (detector) result.localDetector = detector;
  return result;
}

function bindAddressNodeIPs(ip: ParsedIP): string[] | undefined {
  return !/^(0\.0\.0\.0|::)$/.test(ip.text) ? [ip.text] : undefined;
}

/** Health check ports listen on every address unless nodePortAddresses limits them (as kube-proxy). */
function serviceHealthHosts(nodePortAddresses: string[]): string[] | undefined {
  const cidrs = nodePortAddresses.filter((entry) => entry !== 'primary');
  if (cidrs.length === 0 || cidrs.some((cidr) => cidr === '0.0.0.0/0' || cidr === '::/0')) return undefined;
  // Binding to a CIDR is not possible; the loopback CIDRs map to their address, others to all.
  return cidrs.every((cidr) => cidr.startsWith('127.') || cidr === '::1/128') ? ['127.0.0.1'] : undefined;
}

async function listenOrLog(
  name: string,
  address: BindAddress | undefined,
  log: Logger,
  start: (host: string, port: number) => Promise<HttpEndpoint>,
): Promise<HttpEndpoint | undefined> {
  if (address === undefined) return undefined;
  try {
    const endpoint = await start(address.host, address.port);
    log.info(`${name} server listening`, {address: `${endpoint.host}:${endpoint.port}`});
    return endpoint;
  } catch (error) {
    // kube-proxy goes on without the server unless bindAddressHardFail; so do we.
    log.error(`cannot start ${name} server`, {address: address.text, reason: errorText(error)});
    return undefined;
  }
}
