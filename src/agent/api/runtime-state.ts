// RuntimeState: what the agent API's method handlers share, handed to each of them: the proxier's
// models, the applied rules, the last sync and the drift check, and the work they have in common
// (reading the kernel, the full diff, waiting for a sync).
import {getHeapStatistics} from 'node:v8';
import {endpointKey, type IPFamily, type ProxyModel} from '../../core/model/index.ts';
import type {DiffGroup, DiffResult, ProbeParams, ProbeResult, SyncEvent, SyncKind} from '../../protocol/methods.ts';
import type {Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import type {SyncOutcome} from '../sync/types.ts';
import {releaseGarbageSoon} from '../garbage.ts';
import type {AppliedRules, AppliedState} from '../applied/applied-state.ts';
import type {ParsedRules, RulesBackend, RulesDiff} from './rules/backend.ts';
import type {ObserveReport} from '../observe/observation.ts';
import type {EndpointHistory} from '../observe/observing-proxier.ts';
import type {DriftTracker} from '../observe/drift-tracker.ts';
import {explainDrift, wholeText, type AppliedText} from '../observe/drift-explanation.ts';

/** What an observing agent (--observe) adds to the answers: what it found, and drift explained by Service. */
export interface ObserveRuntime {
  report: ObserveReport;
  history: EndpointHistory;
  tracker: DriftTracker;
}

/** What the method handlers need of the proxier: its models and its syncs. */
export interface ProxierSyncs {
  appliedModels(): Map<IPFamily, ProxyModel>;
  status(): {initialized: boolean};
  requestSync(options?: {full?: boolean}): void;
  onSync(listener: (outcome: SyncOutcome) => void): () => void;
}

export interface DriftCheck {
  key: string;
  /** The applied rules the check compared, per family. */
  readings: AppliedRules[];
  services: string[];
  checkedAt: string;
}

export interface RuntimeStateOptions {
  nodeName: string;
  version: string;
  families: IPFamily[];
  proxier: ProxierSyncs;
  host: Host;
  backend: RulesBackend;
  log: Logger;
  applied: AppliedState;
  now: () => number;
  syncTimeoutMs: number;
  nodeAddresses: () => Promise<string[]>;
  probe: (params: ProbeParams, netns: string | undefined) => Promise<ProbeResult>;
  observe?: ObserveRuntime;
}

const addressesTtlMs = 5000;

export function syncKind(outcome: SyncOutcome): SyncKind {
  return outcome.results.some((result) => result.kind === 'full') ? 'full' : 'partial';
}

function toEvent(outcome: SyncOutcome): SyncEvent {
  const event: SyncEvent = {
    at: new Date(outcome.startedAt).toISOString(),
    durationMs: outcome.durationMs,
    kind: syncKind(outcome),
    ok: outcome.ok,
  };
  if (outcome.ok) event.rules = outcome.rules;
  else event.error = outcome.error ?? 'unknown error';
  return event;
}

/** Rules of several families in one text: each under a header line naming the family. */
export function joinFamilies(parts: {family: IPFamily; text: string}[]): string {
  if (parts.length === 1) return parts[0].text;
  return parts.map((part) => `# ${part.family}\n${part.text}`).join('\n');
}

/** A number per model object, so that a drift check can name the models it compared. */
const modelNumbers = new WeakMap<ProxyModel, number>();
let modelsNumbered = 0;

function modelNumber(model: ProxyModel | undefined): number {
  if (model === undefined) return 0;
  let number = modelNumbers.get(model);
  if (number === undefined) modelNumbers.set(model, (number = ++modelsNumbered));
  return number;
}

function driftedServices(groups: DiffGroup[]): string[] {
  return groups
    .filter((group) => group.added.length > 0 || group.removed.length > 0)
    .map((group) => group.servicePort || '(rules of no service)');
}

/** How many times a whole-node diff is taken again when syncs keep changing the models while it reads. */
const modelChangesFollowed = 3;

/**
 * After a drift check failed (the kernel's rules could not be read), status does not start another
 * for this long, doubled per failure in a row up to driftRetryMaxMs: a plugin that polls status on
 * such a node would otherwise keep the agent reading the kernel back to back. A sync, a foreign
 * change or a request that needs the rules still checks at once.
 */
const driftRetryFirstMs = 1000;
const driftRetryMaxMs = 60_000;

/** Heap a whole-node diff may leave (garbage included) before the agent collects it at once (bytes). */
const diffGarbageCollected = 32 * 1024 * 1024;

function sameModels(a: [IPFamily, ProxyModel][], b: [IPFamily, ProxyModel][]): boolean {
  return a.length === b.length && a.every(([family, model], index) => b[index][0] === family && b[index][1] === model);
}

/** RuntimeState holds the options it was made with, as they were given, and what happened since. */
export interface RuntimeState extends Readonly<RuntimeStateOptions> {}
export class RuntimeState {
  readonly listeners = new Set<(event: SyncEvent) => void>();
  lastOutcome: SyncOutcome | undefined;
  everSynced = false;
  failures = 0;
  drift: DriftCheck | undefined;
  closed = false;
  private addresses: {list: string[]; at: number} | undefined;
  private counts: {key: string; services: number; endpoints: number} | undefined;
  private warming: Promise<void> | undefined;
  private warmAgain = false;
  private driftFailures = 0;
  private driftRetryAt = 0;
  // At 10,000 services a diff takes seconds, filtered to one service or not: compute the whole
  // diff once per (reading of the kernel, model) and answer trace's drift question from it.
  private readonly fullDiffs = new WeakMap<AppliedRules, {model: ProxyModel; result: RulesDiff}>();
  /** Readings taken at start (readFirst), for the first whole-node drift check. */
  private readonly firstReadings = new Map<IPFamily, Promise<AppliedRules>>();

  constructor(options: RuntimeStateOptions) {
    Object.assign(this, options);
  }

  recordSync(outcome: SyncOutcome): void {
    this.lastOutcome = outcome;
    if (outcome.ok) this.everSynced = true;
    else this.failures++;
    const event = toEvent(outcome);
    for (const listener of this.listeners) listener(event);
    // A proxier's sync prepares the drift answer only when the kernel's rules are known without
    // reading them (the cache followed the write): nftables' listing at 10,000 services takes
    // seconds and hundreds of MiB, and holds the next transaction back while nft dumps the table.
    // A request reads them when it comes. An observer's sync is its model rebuilt: always checked.
    if (outcome.ok && (this.observe || this.families.every((family) => this.applied.current(family)))) this.warmUp();
  }

  // Prepares what the next trace or diff needs (desired rules, a fresh reading of the kernel, the
  // drift check), so that the plugin does not wait seconds for it on a large node: after a sync
  // (recordSync says which), when status finds the last check out of date, and in an observer
  // when the change monitor reports a foreign change. It reads the rules as the changes reported
  // so far leave them, not waiting for the monitor to settle: in ipvs mode that is a look begun
  // after the call, which would add a whole look to every change's drift; a request settles.
  warmUp(): void {
    if (this.warming) {
      this.warmAgain = true;
      return;
    }
    this.warming = (async () => {
      await new Promise((resolve) => setImmediate(resolve));
      await this.currentDrift({settle: false});
    })()
      .catch((error: Error) => this.log.detail(2, 'agent api: preparing rules after a sync failed', {reason: error.message}))
      .finally(() => {
        this.warming = undefined;
        if (this.warmAgain && !this.closed) {
          this.warmAgain = false;
          this.warmUp();
        }
      });
  }

  models(): [IPFamily, ProxyModel][] {
    const byFamily = this.proxier.appliedModels();
    const present = this.families
      .filter((family) => byFamily.has(family))
      .map((family): [IPFamily, ProxyModel] => [family, byFamily.get(family)!]);
    if (present.length === 0)
      throw new Error(
        `node ${this.nodeName} has no rules yet: the agent has not finished its first sync (it waits for the lists of services, endpoint slices and its node)`,
      );
    return present;
  }

  // Rendered when asked, not kept (unless the backend keeps them per model: an observer's iptables
  // backend): the text alone is as large as a full sync's input, and the answers that need it most
  // (the drift check, and trace's drift question from it) are kept instead.
  desiredFor(model: ProxyModel): ParsedRules {
    return this.backend.desired?.(model) ?? this.backend.parse(this.backend.render(model));
  }

  readApplied(family: IPFamily, options?: {settle?: boolean}): Promise<AppliedRules> {
    return this.applied.get(family, options).catch((error: Error) => {
      throw new Error(`cannot read the rules on node ${this.nodeName}: ${error.message}`);
    });
  }

  fullDiff(model: ProxyModel, current: AppliedRules): RulesDiff {
    const known = this.fullDiffs.get(current);
    if (known && known.model === model) return known.result;
    const heapBefore = getHeapStatistics().used_heap_size;
    const result = this.backend.diff(this.desiredFor(model), current.rules);
    this.fullDiffs.set(current, {model, result});
    // A diff that parsed most rules of both sides (a whole reading, a new model) leaves hundreds of
    // MiB at 10,000 services: given back now, not at V8's leisure, once this request is answered
    // and nothing on the stack holds them. One that compared a few changed chains leaves little,
    // and a collection of the whole heap would cost more than the comparison did.
    if (getHeapStatistics().used_heap_size - heapBefore > diffGarbageCollected) releaseGarbageSoon('regular');
    return result;
  }

  /**
   * readFirst: an observer reads kube-proxy's rules as it starts, while the cluster's objects are
   * still being listed; its first drift check compares that reading (whose readAt says when it
   * was taken) instead of reading the kernel only once the first model is built. Resolves once
   * every family's is in (or failed).
   */
  readFirst(): Promise<void> {
    for (const family of this.families) {
      const reading = this.readApplied(family);
      // Its failure is the first drift check's to see (and log); the next check reads again.
      reading.catch(() => undefined);
      this.firstReadings.set(family, reading);
    }
    return Promise.allSettled(this.firstReadings.values()).then(() => undefined);
  }

  /**
   * A backend that keeps the desired rules (an observer's) makes them while the kernel is read, in
   * another process: a new model's rules are spelled as a reading of a large node comes in (a
   * slice at a time, letting the reading be parsed as it comes, where the backend can: prepareDesired).
   */
  private async desiredWhileReading(model: ProxyModel, reading: Promise<AppliedRules>): Promise<void> {
    // Its failure is the caller's to see, when it waits for the reading.
    reading.catch(() => undefined);
    // The reading starts its command within a few turns (once the change monitor has caught up).
    for (let turn = 0; turn < 3; turn++) await new Promise((resolve) => setImmediate(resolve));
    await this.backend.prepareDesired?.(model);
    this.backend.desired!(model);
  }

  /** Each family's applied rules read and compared with its model's desired ones. */
  private async compareWithKernel(models: [IPFamily, ProxyModel][], service: string | undefined, reading?: {settle?: boolean}) {
    const writes = this.writesStarted();
    const groups: DiffGroup[] = [];
    const texts: {family: IPFamily; text: string}[] = [];
    let equal = true;
    let readAt = Infinity;
    const readings: AppliedRules[] = [];
    for (const [family, model] of models) {
      const first = service ? undefined : this.firstReadings.get(family);
      if (!service) this.firstReadings.delete(family);
      const applied = first ?? this.readApplied(family, reading);
      if (!service && this.backend.desired) await this.desiredWhileReading(model, applied);
      const current = await applied;
      readings.push(current);
      const result = service ? this.backend.diff(this.desiredFor(model), current.rules, service) : this.fullDiff(model, current);
      equal &&= result.equal;
      groups.push(...result.groups);
      texts.push({family, text: result.text});
      readAt = Math.min(readAt, current.readAt);
    }
    // A write that started while the kernel was read, or whose model became the applied one
    // meanwhile, may be in the reading and not in the models, or the other way round.
    const settled = writes === this.writesStarted() && sameModels(models, this.models());
    return {models, settled, equal, groups, texts, readAt, readings};
  }

  /** The readings' text for the drift explanation, searched through the backend where it keeps the text in pieces. */
  private appliedText(readings: AppliedRules[]): AppliedText {
    const texts = readings.map((reading) => wholeText(() => reading.text));
    let whole: string | undefined;
    const {backend} = this;
    return {
      *linesWith(needle) {
        for (const [index, reading] of readings.entries())
          yield* backend.rulesWith?.(reading.rules, needle) ?? texts[index].linesWith(needle);
      },
      *linesNear(needle, near) {
        for (const reading of readings) yield* backend.rulesNear?.(reading.rules, needle, near) ?? [];
      },
      whole: () => (whole ??= texts.map((text) => text.whole()).join('\n')),
    };
  }

  private writesStarted(): string {
    return this.families.map((family) => this.applied.writesStarted(family)).join(':');
  }

  /** `reading.settle: false`: the rules as the changes reported so far leave them (AppliedState.get). */
  async diffAll(service?: string, reading?: {settle?: boolean}): Promise<DiffResult> {
    let compared = await this.compareWithKernel(this.models(), service, reading);
    // A sync that wrote while the kernel was read (a reading waits for a write in progress) can be
    // in the reading and not in the models compared with it: compared again, with the models it left.
    for (let attempt = 1; attempt < modelChangesFollowed && !compared.settled; attempt++)
      compared = await this.compareWithKernel(this.models(), service, reading);
    let {groups} = compared;
    const {equal, texts, readAt, readings} = compared;
    if (this.observe) {
      groups = explainDrift(groups, {
        models: compared.models.map(([, model]) => model),
        applied: this.appliedText(readings),
        history: this.observe.history,
        now: this.now(),
      });
      if (!service) this.observe.tracker.checked(groups, Math.min(readAt, this.now()));
    }
    const answer: DiffResult = {
      equal,
      groups,
      text: equal ? '' : joinFamilies(texts.filter((part) => part.text !== '')),
      readAt: new Date(readAt).toISOString(),
    };
    if (!service) {
      const services = driftedServices(groups);
      // Drift seen while syncs kept writing is not logged: the next check, between writes, tells.
      if (compared.settled && services.length > 0 && (this.drift?.services.join() ?? '') !== services.join())
        this.log.warn('agent api: applied rules differ from the desired ones', {services: services.slice(0, 5).join(',')});
      this.drift = {key: this.driftKey(new Map(compared.models)), readings, services, checkedAt: answer.readAt};
    }
    return answer;
  }

  /**
   * The services and endpoints the models hold, counted once per set of models (by their numbers,
   * so that no old model is kept alive): at 10,000 services counting builds a set of 100,000
   * endpoint keys, and status is asked often (the plugin, alert scripts); models change with syncs.
   */
  modelCounts(models: Map<IPFamily, ProxyModel>): {services: number; endpoints: number} {
    const key = this.driftKey(models);
    if (this.counts?.key === key) return this.counts;
    const services = new Set<string>();
    const endpoints = new Set<string>();
    for (const model of models.values()) {
      for (const port of model.servicePorts) {
        services.add(`${port.namespace}/${port.serviceName}`);
        for (const endpoint of port.endpoints) endpoints.add(endpointKey(endpoint));
      }
    }
    this.counts = {key, services: services.size, endpoints: endpoints.size};
    return this.counts;
  }

  // A drift check stays valid while neither the kernel's rules (the cache's readings) nor the desired
  // ones change: the desired rules are the models', so the key names the models themselves. A sync
  // that left a model as it was (an observer's periodic rebuild with nothing changed) keeps it.
  private driftKey(models = this.proxier.appliedModels()): string {
    return this.families.map((family) => modelNumber(models.get(family))).join(':');
  }

  driftCurrent(check: DriftCheck | undefined): check is DriftCheck {
    return (
      check !== undefined &&
      check.key === this.driftKey() &&
      check.readings.every((reading) => this.applied.current(reading.family) === reading)
    );
  }

  /** `reading.settle: false`: as the changes reported so far leave the rules (AppliedState.get); the check is then not confirmed. */
  async currentDrift(reading: {settle?: boolean} = {}): Promise<DriftCheck | undefined> {
    if (this.driftCurrent(this.drift)) {
      if (reading.settle === false) return this.drift;
      // Confirms the readings (waits for the change monitor) before trusting the check.
      for (const current of this.drift.readings) await this.readApplied(current.family);
      if (this.driftCurrent(this.drift)) return this.drift;
    }
    try {
      await this.diffAll(undefined, reading);
      this.driftFailures = 0;
    } catch (error) {
      this.driftFailures++;
      this.driftRetryAt = this.now() + Math.min(driftRetryMaxMs, driftRetryFirstMs * 2 ** (this.driftFailures - 1));
      this.log.detail(2, 'agent api: drift check failed', {reason: (error as Error).message, failuresInARow: this.driftFailures});
    }
    return this.drift;
  }

  /** Whether status may start a drift check: not while the wait after failed ones lasts (driftRetryFirstMs). */
  driftRetryDue(): boolean {
    return this.driftFailures === 0 || this.now() >= this.driftRetryAt;
  }

  async localAddresses(): Promise<string[]> {
    if (this.addresses && this.now() - this.addresses.at < addressesTtlMs) return this.addresses.list;
    const list = await this.nodeAddresses();
    this.addresses = {list, at: this.now()};
    return list;
  }

  waitForSync(requestedAt: number): Promise<SyncOutcome> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        stop();
        reject(new Error(`no sync finished within ${this.syncTimeoutMs / 1000} s on node ${this.nodeName}; the agent's log says why`));
      }, this.syncTimeoutMs);
      const stop = this.proxier.onSync((outcome) => {
        // A sync that was already running may not include what the caller wants written.
        if (outcome.startedAt < requestedAt) return;
        clearTimeout(timer);
        stop();
        resolve(outcome);
      });
    });
  }
}
