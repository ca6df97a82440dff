// IptablesProxier: keeps the node's iptables rules equal to what the cluster's Services and
// EndpointSlices ask for. Each sync builds the ProxyModel per IP family, writes the rules with one
// `iptables-restore --noflush` per family (chains it declares are replaced atomically; everything
// else in the tables stays), keeps the jump rules from the built-in chains, and cleans conntrack.
// A sync is full at start, after any failure, after drift, and at least hourly (kube-proxy's
// FullSyncPeriod); otherwise partial, rewriting only the chains of service ports that changed.
// Every periodic sync first reads the rules back and, if someone changed them, rewrites them all.
import {buildProxyModel, changedServicePorts, type IPFamily, type ModelOptions, type ProxyModel} from '../../core/model/index.ts';
import type {AgentMetrics} from '../health/metrics.ts';
import type {ProxierHealth} from '../health/proxier-health.ts';
import type {ServiceHealthTarget} from '../health/service-health.ts';
import type {Host, IptablesFrontEnd, IptablesTable} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {type Clock, systemClock} from './clock.ts';
import {planConntrackCleanup} from './conntrack-cleanup.ts';
import type {IptablesRuleSource} from './iptables-rules.ts';
import {afterPartialWrite, declaredChains, describeDrift, type OwnedRules, proxyTables, readOwnedRules, sameOwnedRules} from './owned-rules.ts';
import {BoundedFrequencyRunner, type RunReason} from './runner.ts';

/** kube-proxy's FullSyncPeriod: the longest run of partial syncs. */
export const fullSyncPeriod = 3_600_000;

/** Annotation the EndpointSlice controller sets to when the change behind the slice happened. */
export const lastChangeTriggerTimeAnnotation = 'endpoints.kubernetes.io/last-change-trigger-time';

/** ClusterObjects: the current Services, EndpointSlices and this node's Node, as the watches hold them. */
export interface ClusterObjects {
  services(): unknown[];
  endpointSlices(): unknown[];
  node(): unknown;
}

export type ObjectKind = 'Service' | 'EndpointSlice' | 'Node';

export interface ProxierOptions {
  host: Host;
  rules: IptablesRuleSource;
  objects: ClusterObjects;
  families: IPFamily[];
  /** Everything buildProxyModel needs except the family. */
  model: Omit<ModelOptions, 'family'>;
  syncPeriod: number;
  minSyncPeriod: number;
  metrics: AgentMetrics;
  health: ProxierHealth;
  log: Logger;
  clock?: Clock;
  /** Opens and closes healthCheckNodePort listeners after each sync. */
  serviceHealth?: {sync(targets: ServiceHealthTarget[]): Promise<void>};
}

interface FamilyState {
  /** iptables' kernel interface, once known: decides how a full sync's input is prepared. */
  frontEnd?: IptablesFrontEnd;
  /** The model whose rules are in the kernel. */
  applied?: ProxyModel;
  /** The proxy's rules as read back right after the last write, per table. */
  written?: Map<IptablesTable, OwnedRules>;
  needFullSync: boolean;
  lastFullSync?: number;
  /** When the rules were last compared with what was written (or freshly written in full). */
  lastDriftCheck?: number;
  rulesPerTable: Map<IptablesTable, number>;
}

export interface SyncResult {
  family: IPFamily;
  kind: 'full' | 'partial' | 'unchanged';
  changedServicePorts: number;
  drift: boolean;
}

/** SyncOutcome: one sync of every family, as told to onSync listeners (the agent API streams it). */
export interface SyncOutcome {
  /** Clock time (ms) the sync started and how long it took. */
  startedAt: number;
  durationMs: number;
  ok: boolean;
  /** Per family; empty when the sync failed. */
  results: SyncResult[];
  /** The proxy's rules in the kernel after the sync, per table, all families together. */
  rules: {filter: number; nat: number};
  error?: string;
}

export class IptablesProxier {
  readonly #options: ProxierOptions;
  readonly #clock: Clock;
  readonly #runner: BoundedFrequencyRunner;
  readonly #families = new Map<IPFamily, FamilyState>();
  readonly #synced = new Set<ObjectKind>();
  readonly #pendingTriggers = new Map<string, {time: number; family: IPFamily | undefined}>();
  #pendingServiceChanges = 0;
  #pendingEndpointChanges = 0;
  #loggedProblems = new Set<string>();
  #lastResults: SyncResult[] = [];
  #lastError: string | undefined;
  readonly #syncListeners = new Set<(outcome: SyncOutcome) => void>();

  constructor(options: ProxierOptions) {
    this.#options = options;
    this.#clock = options.clock ?? systemClock;
    for (const family of options.families) this.#families.set(family, {needFullSync: true, rulesPerTable: new Map()});
    this.#runner = new BoundedFrequencyRunner((reason) => this.syncRules(reason).then(() => undefined), {
      minInterval: options.minSyncPeriod,
      maxInterval: Math.max(options.syncPeriod, options.minSyncPeriod),
      retryInterval: Math.max(options.syncPeriod, options.minSyncPeriod),
      clock: this.#clock,
      onError: (error, retryIn) => {
        this.#lastError = error instanceof Error ? error.message : String(error);
        options.log.error('sync failed; full sync next', {reason: this.#lastError, retryInSeconds: retryIn / 1000});
      },
    });
  }

  /** start prepares the node (route_localnet) and starts the runner; the first sync waits for the initial lists. */
  async start(): Promise<void> {
    await this.#enableLocalhostNodePorts();
    for (const family of this.#families.keys()) {
      try {
        const frontEnd = await this.#options.host.iptablesFrontEnd(family);
        this.#families.get(family)!.frontEnd = frontEnd;
        this.#options.log.info('iptables front end', {family, frontEnd});
      } catch (error) {
        this.#options.log.warn('cannot tell the iptables front end', {family, reason: errorText(error)});
      }
    }
    this.#runner.start();
    if (this.#initialized()) this.#runner.run();
  }

  async stop(): Promise<void> {
    await this.#runner.stop();
  }

  /** markSynced: the initial list of that kind is in; syncing starts when all three are. */
  markSynced(kind: ObjectKind): void {
    this.#synced.add(kind);
    if (this.#initialized()) this.#queue();
  }

  /** onChange: an object was added, updated or deleted. */
  onChange(kind: ObjectKind, object: unknown): void {
    const metrics = this.#options.metrics;
    if (kind === 'Service') {
      this.#pendingServiceChanges++;
      metrics.serviceChangesTotal.inc();
      metrics.serviceChangesPending.set(this.#pendingServiceChanges);
    } else if (kind === 'EndpointSlice') {
      this.#pendingEndpointChanges++;
      metrics.endpointChangesTotal.inc();
      metrics.endpointChangesPending.set(this.#pendingEndpointChanges);
      this.#noteTriggerTime(object);
    } else {
      this.#options.health.syncNode(object);
    }
    if (this.#initialized()) this.#queue();
  }

  /** requestSync asks for a sync as soon as minSyncPeriod allows; `full` rewrites every chain. */
  requestSync(options: {full?: boolean} = {}): void {
    if (options.full) for (const state of this.#families.values()) state.needFullSync = true;
    this.#queue();
  }

  /** onSync calls `listener` after every sync that ran (not the ones skipped before the initial lists). */
  onSync(listener: (outcome: SyncOutcome) => void): () => void {
    this.#syncListeners.add(listener);
    return () => this.#syncListeners.delete(listener);
  }

  /** The models whose rules are in the kernel now, per family. */
  appliedModels(): Map<IPFamily, ProxyModel> {
    const models = new Map<IPFamily, ProxyModel>();
    for (const [family, state] of this.#families) if (state.applied) models.set(family, state.applied);
    return models;
  }

  status(): {initialized: boolean; lastResults: SyncResult[]; lastError: string | undefined; syncPending: boolean} {
    return {initialized: this.#initialized(), lastResults: this.#lastResults, lastError: this.#lastError, syncPending: this.#runner.pending};
  }

  /** syncRules is one sync of every family (the runner's function; tests call it directly). */
  async syncRules(reason: RunReason = {requested: true, periodic: false, retry: false}): Promise<SyncResult[]> {
    if (!this.#initialized()) {
      this.#options.log.detail(2, 'not syncing until services, endpoint slices and the node have been listed');
      return [];
    }
    const startedAt = this.#clock.now();
    try {
      const results = await this.#syncAll(reason);
      this.#tellListeners({startedAt, durationMs: this.#clock.now() - startedAt, ok: true, results, rules: this.#ruleTotals()});
      return results;
    } catch (error) {
      this.#tellListeners({startedAt, durationMs: this.#clock.now() - startedAt, ok: false, results: [], rules: this.#ruleTotals(), error: errorText(error)});
      throw error;
    }
  }

  #tellListeners(outcome: SyncOutcome): void {
    for (const listener of this.#syncListeners) {
      try {
        listener(outcome);
      } catch (error) {
        this.#options.log.error('sync listener failed', {reason: errorText(error)});
      }
    }
  }

  #ruleTotals(): {filter: number; nat: number} {
    const totals = {filter: 0, nat: 0};
    for (const state of this.#families.values()) {
      totals.filter += state.rulesPerTable.get('filter') ?? 0;
      totals.nat += state.rulesPerTable.get('nat') ?? 0;
    }
    return totals;
  }

  async #syncAll(reason: RunReason): Promise<SyncResult[]> {
    const {metrics, health} = this.#options;
    metrics.serviceChangesPending.set((this.#pendingServiceChanges = 0));
    metrics.endpointChangesPending.set((this.#pendingEndpointChanges = 0));
    const triggers = new Map(this.#pendingTriggers);
    this.#pendingTriggers.clear();
    const objects = {
      services: this.#options.objects.services(),
      endpointSlices: this.#options.objects.endpointSlices(),
      node: this.#options.objects.node(),
    };

    const results: SyncResult[] = [];
    const problems = new Map<string, string>();
    let failure: unknown;
    for (const family of this.#families.keys()) {
      const model = buildProxyModel(objects, {...this.#options.model, family});
      for (const problem of model.problems) problems.set(problem.message, `${problem.kind} ${problem.namespace ? `${problem.namespace}/` : ''}${problem.name}`);
      try {
        results.push(await this.#syncFamily(family, model, reason));
      } catch (error) {
        failure ??= error;
      }
    }
    this.#reportProblems(problems);
    if (failure !== undefined) {
      // Changes seen by this sync are not in the kernel yet: keep the health clock running on them.
      for (const [key, value] of triggers) if (!this.#pendingTriggers.has(key)) this.#pendingTriggers.set(key, value);
      health.queuedUpdate();
      throw failure;
    }

    const now = this.#clock.now();
    health.updated();
    metrics.lastSyncTimestamp.set(now / 1000);
    for (const {time, family} of triggers.values()) {
      if (now >= time) metrics.networkProgrammingDuration.observe({ip_family: family ?? 'IPv4'}, (now - time) / 1000);
    }
    this.#updateRuleCounts();
    this.#updateNoLocalEndpoints();
    this.#lastResults = results;
    this.#lastError = undefined;
    await this.#syncServiceHealth();
    return results;
  }

  async #syncFamily(family: IPFamily, model: ProxyModel, reason: RunReason): Promise<SyncResult> {
    const {host, rules, metrics, log} = this.#options;
    const state = this.#families.get(family)!;
    const start = this.#clock.now();
    let full = state.needFullSync || state.lastFullSync === undefined || start - state.lastFullSync >= fullSyncPeriod;

    // Checked at least once per syncPeriod, also when changes keep every sync from being periodic.
    let drift = false;
    const driftCheckDue = reason.periodic || state.lastDriftCheck === undefined || start - state.lastDriftCheck >= this.#options.syncPeriod;
    if (!full && driftCheckDue && state.written) {
      state.lastDriftCheck = start;
      const current = await this.#readOwned(family);
      for (const table of proxyTables) {
        const written = state.written.get(table)!;
        const now = current.get(table)!;
        if (!sameOwnedRules(written, now)) {
          drift = true;
          log.warn('rules changed behind our back; rewriting them', {family, drift: describeDrift(written, now)});
        }
      }
      if (drift) {
        metrics.driftRepairs.inc({ip_family: family});
        full = true;
      }
    }

    const changed = changedServicePorts(state.applied, model);
    if (!full && changed.size === 0) {
      log.detail(3, 'rules up to date', {family});
      return {family, kind: 'unchanged', changedServicePorts: 0, drift};
    }

    const existing = full || !state.written ? await this.#readOwned(family) : state.written;
    const existingChains = new Map([...existing].map(([table, owned]) => [table, new Set(owned.chains)]));
    const rendered = rules.render(model, {changedServicePorts: full ? undefined : changed, existingChains});
    const text = full && state.frontEnd === 'nf_tables' ? withWholeTableCache(rendered) : rendered;
    log.detail(5, 'iptables-restore input', {family, rules: text});
    let now: Map<IptablesTable, OwnedRules>;
    try {
      await host.iptablesRestore(family, text, {noflush: true});
      if (full) await this.#ensureJumpRules(family, model);
      now = await this.#readOwned(family);
    } catch (error) {
      metrics.restoreFailures.inc();
      if (!full) metrics.partialRestoreFailures.inc();
      state.needFullSync = true;
      throw new Error(`${family} ${full ? 'full' : 'partial'} sync: ${errorText(error)}`, {cause: error});
    }

    if (full || !state.written) {
      state.written = now;
    } else {
      // The read-back after a partial write is also a drift check, free of charge: the chains the
      // write did not replace must be as they were after the previous write.
      const declared = declaredChains(text);
      const previous = state.written;
      const expected = new Map(proxyTables.map((table) => [table, afterPartialWrite(previous.get(table)!, now.get(table)!, declared.get(table) ?? new Set())]));
      let changedBehindUs = false;
      for (const table of proxyTables) {
        if (sameOwnedRules(expected.get(table)!, now.get(table)!)) continue;
        changedBehindUs = true;
        log.warn('rules changed behind our back; rewriting them', {family, drift: describeDrift(expected.get(table)!, now.get(table)!)});
      }
      state.written = expected;
      if (changedBehindUs) {
        drift = true;
        metrics.driftRepairs.inc({ip_family: family});
        state.needFullSync = true;
        this.#runner.run();
      }
    }
    state.lastDriftCheck = start;

    await this.#cleanConntrack(family, state.applied, model);
    state.applied = model;
    if (full) {
      state.needFullSync = false;
      state.lastFullSync = start;
    }
    for (const [table, owned] of state.written) state.rulesPerTable.set(table, owned.rules.length);

    const seconds = (this.#clock.now() - start) / 1000;
    metrics.syncDuration.observe({ip_family: family}, seconds);
    (full ? metrics.syncFullDuration : metrics.syncPartialDuration).observe({ip_family: family}, seconds);
    log.detail(2, 'synced rules', {family, kind: full ? 'full' : 'partial', changedServicePorts: changed.size, servicePorts: model.servicePorts.length, seconds});
    return {family, kind: full ? 'full' : 'partial', changedServicePorts: changed.size, drift};
  }

  async #readOwned(family: IPFamily): Promise<Map<IptablesTable, OwnedRules>> {
    const owned = new Map<IptablesTable, OwnedRules>();
    for (const table of proxyTables) owned.set(table, readOwnedRules(table, await this.#options.host.iptablesSave(family, table)));
    return owned;
  }

  async #ensureJumpRules(family: IPFamily, model: ProxyModel): Promise<void> {
    const {host, rules, log} = this.#options;
    for (const jump of rules.jumpRules(model)) {
      if (await host.iptablesHasRule(family, jump.table, jump.chain, jump.rule)) continue;
      await host.iptablesAddRule(family, jump.table, jump.chain, jump.rule, jump.position);
      log.info('jump rule added', {family, table: jump.table, chain: jump.chain, rule: jump.rule.join(' ')});
    }
  }

  async #cleanConntrack(family: IPFamily, previous: ProxyModel | undefined, next: ProxyModel): Promise<void> {
    const {host, metrics, log} = this.#options;
    for (const filter of planConntrackCleanup(previous, next)) {
      try {
        const deleted = await host.conntrackDelete(filter);
        metrics.conntrackDeletedEntries.inc({ip_family: family}, deleted);
        log.detail(deleted > 0 ? 1 : 4, 'conntrack entries deleted', {...filter, deleted});
      } catch (error) {
        log.error('conntrack cleanup failed', {family, reason: errorText(error)});
      }
    }
  }

  #reportProblems(problems: Map<string, string>): void {
    const {log, metrics} = this.#options;
    for (const [message, object] of problems) {
      if (!this.#loggedProblems.has(message)) log.warn('object skipped', {object, reason: message});
    }
    this.#loggedProblems = new Set(problems.keys());
    metrics.modelProblems.set(problems.size);
  }

  #updateRuleCounts(): void {
    for (const table of proxyTables) {
      let total = 0;
      for (const state of this.#families.values()) total += state.rulesPerTable.get(table) ?? 0;
      this.#options.metrics.iptablesRules.set({table}, total);
    }
  }

  #updateNoLocalEndpoints(): void {
    let internal = 0;
    let external = 0;
    for (const model of this.appliedModels().values()) {
      for (const port of model.servicePorts) {
        if (port.localEndpoints.length > 0) continue;
        if (port.internalPolicyLocal) internal++;
        if (port.externalPolicyLocal) external++;
      }
    }
    this.#options.metrics.noLocalEndpoints.set({traffic_policy: 'internal'}, internal);
    this.#options.metrics.noLocalEndpoints.set({traffic_policy: 'external'}, external);
  }

  async #syncServiceHealth(): Promise<void> {
    if (!this.#options.serviceHealth) return;
    const targets = new Map<string, ServiceHealthTarget & {ips: Set<string>}>();
    for (const model of this.appliedModels().values()) {
      for (const port of model.servicePorts) {
        if (port.healthCheckNodePort === 0) continue;
        const key = `${port.namespace}/${port.serviceName}`;
        const target = targets.get(key) ?? {namespace: port.namespace, name: port.serviceName, healthCheckNodePort: port.healthCheckNodePort, localEndpoints: 0, ips: new Set<string>()};
        for (const endpoint of port.endpoints) if (endpoint.isLocal && endpoint.ready) target.ips.add(endpoint.ip);
        targets.set(key, target);
      }
    }
    await this.#options.serviceHealth.sync(
      [...targets.values()].map(({ips, ...target}) => ({...target, localEndpoints: ips.size})),
    );
  }

  async #enableLocalhostNodePorts(): Promise<void> {
    const {host, log, model} = this.#options;
    const config = model.config ?? {};
    if (!this.#families.has('IPv4') || config.localhostNodePorts === false) return;
    const addresses = config.nodePortAddresses ?? [];
    const coversLoopback = addresses.length === 0 || addresses.some((cidr) => cidr === '0.0.0.0/0' || cidr.startsWith('127.'));
    if (!coversLoopback) return;
    const name = 'net.ipv4.conf.all.route_localnet';
    try {
      if ((await host.sysctlRead(name)) !== '1') {
        await host.sysctlWrite(name, '1');
        log.info('set sysctl for localhost NodePorts', {sysctl: name, value: 1});
      }
    } catch (error) {
      log.error('cannot set sysctl; NodePorts on 127.0.0.1 will not answer', {sysctl: name, reason: errorText(error)});
    }
  }

  #noteTriggerTime(object: unknown): void {
    const slice = object as {metadata?: {namespace?: string; name?: string; annotations?: Record<string, unknown>}; addressType?: unknown};
    const text = slice?.metadata?.annotations?.[lastChangeTriggerTimeAnnotation];
    const time = typeof text === 'string' ? Date.parse(text) : NaN;
    if (Number.isNaN(time)) return;
    const key = `${slice.metadata?.namespace}/${slice.metadata?.name}`;
    const family = slice.addressType === 'IPv4' || slice.addressType === 'IPv6' ? slice.addressType : undefined;
    const known = this.#pendingTriggers.get(key);
    if (!known || time < known.time) this.#pendingTriggers.set(key, {time, family});
  }

  #queue(): void {
    this.#options.health.queuedUpdate();
    this.#options.metrics.lastQueuedTimestamp.set(this.#clock.now() / 1000);
    this.#runner.run();
  }

  #initialized(): boolean {
    return this.#synced.has('Service') && this.#synced.has('EndpointSlice') && this.#synced.has('Node');
  }
}

/**
 * iptables-nft's restore with --noflush first notes every chain its input names, one linear
 * insertion into a sorted list per command, to read just those from the kernel. A full sync names
 * every chain (about 11 per service): at 1,000 services that list costs seconds, at 10,000 it would
 * take most of an hour. A command that names no chain makes it read the whole table instead and
 * skip the list. `-Z` (zero the table's counters) is the one such command that changes no rule; its
 * price is that the nat counters restart from zero at each full sync, which those of our own rules
 * do anyway since a full sync rewrites all of them. Partial syncs name few chains and go without it.
 */
export function withWholeTableCache(rules: string): string {
  return rules.replace(/^\*nat\n/m, '*nat\n-Z\n');
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
