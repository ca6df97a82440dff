// SyncBookkeeping: what every proxier does around its syncs, whatever it writes to the kernel:
// waiting for the initial lists, counting Service and EndpointSlice changes and their trigger times
// for the metrics, telling sync listeners, logging skipped objects once, and after a successful sync
// updating health, the sync metrics and the healthCheckNodePort listeners. Also the conntrack
// cleanup every mode runs after a write. ProxierBase (proxier-base.ts) holds one.
import type {IPFamily, ProxyModel} from '../../core/model/index.ts';
import type {AgentMetrics} from '../health/metrics.ts';
import type {ProxierHealth} from '../health/proxier-health.ts';
import type {ServiceHealthTarget} from '../health/service-health.ts';
import type {ConntrackFilter, Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import type {Clock} from '../clock.ts';
import {lastChangeTriggerTimeAnnotation, type ObjectKind} from '../watch/cluster-objects.ts';
import type {SyncOutcome, FamilySyncResult} from './types.ts';
import {errorText} from '../../core/error-text.ts';
import {BoundedFrequencyRunner, type RunReason} from './runner.ts';

/** When the changes a sync covers happened, per EndpointSlice (for the network programming latency). */
export type TriggerTimes = Map<string, {time: number; family: IPFamily | undefined}>;

export interface SyncBookkeepingOptions {
  metrics: AgentMetrics;
  health: ProxierHealth;
  log: Logger;
  clock: Clock;
  /** Asks the proxier's runner for a sync. */
  run: () => void;
  serviceHealth?: {sync(targets: ServiceHealthTarget[]): Promise<void>};
}

export class SyncBookkeeping {
  readonly #options: SyncBookkeepingOptions;
  readonly #synced = new Set<ObjectKind>();
  readonly #pendingTriggers: TriggerTimes = new Map();
  #pendingServiceChanges = 0;
  #pendingEndpointChanges = 0;
  #loggedProblems = new Set<string>();
  readonly #listeners = new Set<(outcome: SyncOutcome) => void>();

  constructor(options: SyncBookkeepingOptions) {
    this.#options = options;
  }

  /** initialized: Services, EndpointSlices and the Node have all been listed. */
  initialized(): boolean {
    return this.#synced.has('Service') && this.#synced.has('EndpointSlice') && this.#synced.has('Node');
  }

  markSynced(kind: ObjectKind): void {
    this.#synced.add(kind);
    if (this.initialized()) this.queue();
  }

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
    if (this.initialized()) this.queue();
  }

  /** queue marks an update as waiting (health, metric) and asks for a sync. */
  queue(): void {
    this.#options.health.queuedUpdate();
    this.#options.metrics.lastQueuedTimestamp.set(this.#options.clock.now() / 1000);
    this.#options.run();
  }

  onSync(listener: (outcome: SyncOutcome) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  tellListeners(outcome: SyncOutcome): void {
    for (const listener of this.#listeners) {
      try {
        listener(outcome);
      } catch (error) {
        this.#options.log.error('sync listener failed', {reason: errorText(error)});
      }
    }
  }

  /**
   * runSync runs one sync of every family as each proxier does: not before the initial lists
   * are in, and with the listeners told of its outcome, success or failure.
   */
  async runSync(sync: () => Promise<FamilySyncResult[]>, rules: () => SyncOutcome['rules']): Promise<FamilySyncResult[]> {
    if (!this.initialized()) {
      this.#options.log.detail(2, 'not syncing until services, endpoint slices and the node have been listed');
      return [];
    }
    const {clock} = this.#options;
    const startedAt = clock.now();
    try {
      const results = await sync();
      this.tellListeners({startedAt, durationMs: clock.now() - startedAt, ok: true, results, rules: rules()});
      return results;
    } catch (error) {
      this.tellListeners({startedAt, durationMs: clock.now() - startedAt, ok: false, results: [], rules: rules(), error: errorText(error)});
      throw error;
    }
  }

  /** beginSync: the pending changes are now being synced; returns the trigger times they carry. */
  beginSync(): TriggerTimes {
    const {metrics} = this.#options;
    metrics.serviceChangesPending.set((this.#pendingServiceChanges = 0));
    metrics.endpointChangesPending.set((this.#pendingEndpointChanges = 0));
    const triggers = new Map(this.#pendingTriggers);
    this.#pendingTriggers.clear();
    return triggers;
  }

  /** syncFailed: the changes are not in the kernel yet, so the health clock keeps running on them. */
  syncFailed(triggers: TriggerTimes): void {
    for (const [key, value] of triggers) if (!this.#pendingTriggers.has(key)) this.#pendingTriggers.set(key, value);
    this.#options.health.queuedUpdate();
  }

  /** syncSucceeded updates health and metrics from the models now in the kernel, and the health check ports. */
  async syncSucceeded(triggers: TriggerTimes, models: Iterable<ProxyModel>): Promise<void> {
    const {metrics, health, clock} = this.#options;
    const now = clock.now();
    health.updated();
    metrics.lastSyncTimestamp.set(now / 1000);
    for (const {time, family} of triggers.values()) {
      if (now >= time) metrics.networkProgrammingDuration.observe({ip_family: family ?? 'IPv4'}, (now - time) / 1000);
    }
    const list = [...models];
    let internal = 0;
    let external = 0;
    for (const model of list) {
      // Every port on every sync: picked by filter, which allocates nothing per port.
      for (const port of model.servicePorts.filter(
        (candidate) => candidate.localEndpoints.length === 0 && (candidate.internalPolicyLocal || candidate.externalPolicyLocal),
      )) {
        if (port.internalPolicyLocal) internal++;
        if (port.externalPolicyLocal) external++;
      }
    }
    metrics.noLocalEndpoints.set({traffic_policy: 'internal'}, internal);
    metrics.noLocalEndpoints.set({traffic_policy: 'external'}, external);
    if (this.#options.serviceHealth) await this.#options.serviceHealth.sync(serviceHealthTargets(list));
  }

  /** reportProblems logs each malformed object once, until it changes, and sets the metric. */
  reportProblems(models: Iterable<ProxyModel>): void {
    const {log, metrics} = this.#options;
    const problems = new Map<string, string>();
    for (const model of models) {
      for (const problem of model.problems)
        problems.set(problem.message, `${problem.kind} ${problem.namespace ? `${problem.namespace}/` : ''}${problem.name}`);
    }
    for (const [message, object] of problems) {
      if (!this.#loggedProblems.has(message)) log.warn('object skipped', {object, reason: message});
    }
    this.#loggedProblems = new Set(problems.keys());
    metrics.modelProblems.set(problems.size);
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
}

/**
 * createSyncRunner: the bounded-frequency runner every proxier syncs with: at most one sync per
 * minSyncPeriod, at least one per syncPeriod, a failed one retried with backoff up to syncPeriod.
 */
export function createSyncRunner(
  sync: (reason: RunReason) => Promise<unknown>,
  options: {minSyncPeriod: number; syncPeriod: number; clock: Clock; log: Logger; onError: (reason: string) => void},
): BoundedFrequencyRunner {
  const longest = Math.max(options.syncPeriod, options.minSyncPeriod);
  return new BoundedFrequencyRunner((reason) => sync(reason).then(() => undefined), {
    minInterval: options.minSyncPeriod,
    maxInterval: longest,
    retryInterval: longest,
    clock: options.clock,
    onError: (error, retryIn) => {
      const reason = errorText(error);
      options.onError(reason);
      options.log.error('sync failed; full sync next', {reason, retryInSeconds: retryIn / 1000});
    },
  });
}

/** serviceHealthTargets: one health check port per eTP=Local service, with its ready local endpoints. */
export function serviceHealthTargets(models: Iterable<ProxyModel>): ServiceHealthTarget[] {
  const targets = new Map<string, ServiceHealthTarget & {ips: Set<string>}>();
  for (const model of models) {
    for (const port of model.servicePorts.filter((candidate) => candidate.healthCheckNodePort !== 0)) {
      const key = `${port.namespace}/${port.serviceName}`;
      const target = targets.get(key) ?? {
        namespace: port.namespace,
        name: port.serviceName,
        healthCheckNodePort: port.healthCheckNodePort,
        localEndpoints: 0,
        ips: new Set<string>(),
      };
      for (const endpoint of port.endpoints) if (endpoint.isLocal && endpoint.ready) target.ips.add(endpoint.ip);
      targets.set(key, target);
    }
  }
  return [...targets.values()].map(({ips, ...target}) => ({...target, localEndpoints: ips.size}));
}

/** deleteConntrackEntries runs the planned deletions; failures are logged and never fail the sync. */
export async function deleteConntrackEntries(
  parts: {host: Host; metrics: AgentMetrics; log: Logger},
  family: IPFamily,
  filters: ConntrackFilter[],
): Promise<void> {
  const {host, metrics, log} = parts;
  for (const filter of filters) {
    try {
      const deleted = await host.conntrackDelete(filter);
      metrics.conntrackDeletedEntries.inc({ip_family: family}, deleted);
      log.detail(deleted > 0 ? 1 : 4, 'conntrack entries deleted', {...filter, deleted});
    } catch (error) {
      log.error('conntrack cleanup failed', {family, reason: errorText(error)});
    }
  }
}
