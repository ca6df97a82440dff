// ProxierBase: the part of a proxier that is the same in every mode (iptables, nftables, ipvs): the
// bounded-frequency runner, the per-family model builders, one sync of every family, the
// bookkeeping around it (sync-bookkeeping.ts), and what the agent and its API ask of a proxier.
import type {IPFamily, ProxyModel, ProxyModelBuilder} from '../../core/model/index.ts';
import type {AgentMetrics} from '../health/metrics.ts';
import type {ProxierHealth} from '../health/proxier-health.ts';
import type {ServiceHealthTarget} from '../health/service-health.ts';
import type {Logger} from '../log.ts';
import {type Clock, systemClock} from '../clock.ts';
import type {BoundedFrequencyRunner, RunReason} from './runner.ts';
import {createSyncRunner, serviceHealthTargets, SyncBookkeeping} from './sync-bookkeeping.ts';
import {releaseGarbage} from '../garbage.ts';
import type {ClusterObjects, ObjectKind} from '../watch/cluster-objects.ts';
import type {SyncOutcome, FamilySyncResult} from './types.ts';

/** What every proxier keeps per IP family. */
export interface FamilySyncState {
  /** Rebuilds only the service ports whose objects changed since the last build. */
  builder: ProxyModelBuilder;
  /** The model whose rules are in the kernel. */
  applied?: ProxyModel;
  needFullSync: boolean;
}

export interface ProxierBaseOptions {
  objects: ClusterObjects;
  families: IPFamily[];
  syncPeriod: number;
  minSyncPeriod: number;
  metrics: AgentMetrics;
  health: ProxierHealth;
  log: Logger;
  clock?: Clock;
  serviceHealth?: {sync(targets: ServiceHealthTarget[]): Promise<void>};
}

/**
 * ProxierBase: what the iptables, nftables and ipvs proxiers do alike: the bounded-frequency
 * runner, the bookkeeping above, and the answers the agent and its API ask of a proxier. A
 * subclass writes its backend's rules in syncAll and counts them in ruleTotals.
 */
export abstract class ProxierBase<State extends FamilySyncState> {
  protected readonly clock: Clock;
  protected readonly runner: BoundedFrequencyRunner;
  protected readonly book: SyncBookkeeping;
  protected readonly families = new Map<IPFamily, State>();
  protected lastResults: FamilySyncResult[] = [];
  protected lastError: string | undefined;
  /** A family's sync wrote or read whole tables: the garbage it left is collected once the sync is done. */
  protected wholeTablesTouched = false;
  readonly #objects: ClusterObjects;
  readonly #metrics: AgentMetrics;
  readonly #log: Logger;

  constructor(options: ProxierBaseOptions, initialState: (family: IPFamily) => State) {
    this.#objects = options.objects;
    this.#metrics = options.metrics;
    this.#log = options.log;
    this.clock = options.clock ?? systemClock;
    for (const family of options.families) this.families.set(family, initialState(family));
    this.runner = createSyncRunner((reason) => this.syncRules(reason), {
      minSyncPeriod: options.minSyncPeriod,
      syncPeriod: options.syncPeriod,
      clock: this.clock,
      log: options.log,
      onError: (reason) => (this.lastError = reason),
    });
    this.book = new SyncBookkeeping({
      metrics: options.metrics,
      health: options.health,
      log: options.log,
      clock: this.clock,
      run: () => this.runner.run(),
      serviceHealth: options.serviceHealth,
    });
  }

  /**
   * familySynced: a family's sync that started at `start` (clock ms) is timed in the metrics and
   * logged, in every mode alike; its result is returned for syncFamily to hand on.
   */
  protected familySynced(
    sync: {family: IPFamily; start: number; full: boolean; changedServicePorts: number; model: ProxyModel; drift: boolean},
    logged: {message: string; detail?: Record<string, unknown>} = {message: 'synced rules'},
  ): FamilySyncResult {
    const {family, full} = sync;
    const seconds = (this.clock.now() - sync.start) / 1000;
    this.#metrics.syncDuration.observe({ip_family: family}, seconds);
    (full ? this.#metrics.syncFullDuration : this.#metrics.syncPartialDuration).observe({ip_family: family}, seconds);
    const kind = full ? 'full' : 'partial';
    this.#log.detail(2, logged.message, {
      family,
      kind,
      ...logged.detail,
      changedServicePorts: sync.changedServicePorts,
      servicePorts: sync.model.servicePorts.length,
      seconds,
    });
    return {family, kind, changedServicePorts: sync.changedServicePorts, drift: sync.drift};
  }

  async stop(): Promise<void> {
    await this.runner.stop();
  }

  /** markSynced: the initial list of that kind is in; syncing starts when all three are. */
  markSynced(kind: ObjectKind): void {
    this.book.markSynced(kind);
  }

  /** onChange: an object was added, updated or deleted. */
  onChange(kind: ObjectKind, object: unknown): void {
    this.book.onChange(kind, object);
  }

  /** requestSync asks for a sync as soon as minSyncPeriod allows; `full` makes it a full one. */
  requestSync(options: {full?: boolean} = {}): void {
    if (options.full) for (const state of this.families.values()) state.needFullSync = true;
    this.book.queue();
  }

  /** onSync calls `listener` after every sync that ran (not the ones skipped before the initial lists). */
  onSync(listener: (outcome: SyncOutcome) => void): () => void {
    return this.book.onSync(listener);
  }

  /** The models whose rules are in the kernel now, per family. */
  appliedModels(): Map<IPFamily, ProxyModel> {
    const models = new Map<IPFamily, ProxyModel>();
    for (const [family, state] of this.families) if (state.applied) models.set(family, state.applied);
    return models;
  }

  status(): {initialized: boolean; lastResults: FamilySyncResult[]; lastError: string | undefined; syncPending: boolean} {
    return {
      initialized: this.book.initialized(),
      lastResults: this.lastResults,
      lastError: this.lastError,
      syncPending: this.runner.pending,
    };
  }

  /** syncRules is one sync of every family (the runner's function; tests call it directly). */
  async syncRules(reason: RunReason = {requested: true, periodic: false, retry: false}): Promise<FamilySyncResult[]> {
    return this.book.runSync(
      () => this.syncAll(reason),
      () => this.ruleTotals(),
    );
  }

  /** Starts the runner once the node is prepared; the first sync waits for the initial lists. */
  protected startRunner(): void {
    this.runner.start();
    if (this.book.initialized()) this.runner.run();
  }

  /**
   * One sync of every family: each family's model built from the watched objects and written by
   * syncFamily; a family that fails does not keep the others from being written, and the sync
   * then fails as a whole.
   */
  protected async syncAll(reason: RunReason): Promise<FamilySyncResult[]> {
    const triggers = this.book.beginSync();
    const objects = {services: this.#objects.services(), endpointSlices: this.#objects.endpointSlices(), node: this.#objects.node()};
    await this.prepareSync();
    const results: FamilySyncResult[] = [];
    const models: ProxyModel[] = [];
    let failure: unknown;
    for (const [family, state] of this.families) {
      const model = state.builder.build(objects);
      models.push(model);
      try {
        results.push(await this.syncFamily(family, model, reason));
      } catch (error) {
        failure ??= error;
      }
    }
    this.book.reportProblems(models);
    // After health and metrics are told: a last-resort collection takes a few hundred ms at 10,000 services.
    const release = this.wholeTablesTouched;
    this.wholeTablesTouched = false;
    try {
      if (failure !== undefined) {
        // Changes seen by this sync are not in the kernel yet: keep the health clock running on them.
        this.book.syncFailed(triggers);
        throw failure;
      }
      this.syncSucceeded();
      this.lastResults = results;
      this.lastError = undefined;
      await this.book.syncSucceeded(triggers, this.appliedModels().values());
      return results;
    } finally {
      if (release) releaseGarbage();
    }
  }

  /** Reads what every family's sync needs from the node, once per sync. */
  protected async prepareSync(): Promise<void> {}

  /** Writes one family's model to the kernel. */
  protected abstract syncFamily(family: IPFamily, model: ProxyModel, reason: RunReason): Promise<FamilySyncResult>;

  /** After every family was written: the mode's own gauges. */
  protected syncSucceeded(): void {}

  /** The proxy's rules in the kernel per table, all families together. */
  protected abstract ruleTotals(): {filter: number; nat: number};
}
