// IptablesProxier: keeps the node's iptables rules equal to what the cluster's Services and
// EndpointSlices ask for. Each sync builds the ProxyModel per IP family, writes the rules with one
// `iptables-restore --noflush` per family (chains it declares are replaced atomically; everything
// else in the tables stays), keeps the jump rules from the built-in chains, and cleans conntrack.
// A sync is full at start, after any failure, after drift, and at least hourly (kube-proxy's
// FullSyncPeriod); otherwise partial, rewriting only the chains of service ports that changed.
// What a write left is known from its input (kube-proxy never reads its rules back); the kernel is
// read at least once per syncPeriod to check for drift, and if someone changed the rules, a full
// sync rewrites them all.
import {
  changedServicePorts,
  type IPFamily,
  type ModelOptions,
  type ProxyModel,
  ProxyModelBuilder,
  portsWithIdentities,
} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import {type Host, type IptablesFrontEnd, type RestoreInput, restoreInputText, savedTables} from '../host/host.ts';
import {errorText} from '../../core/error-text.ts';
import {planConntrackCleanup} from './conntrack-cleanup.ts';
import type {IptablesRuleSource, JumpRule, RenderedWrite, WrittenTable} from './iptables-rules.ts';
import {
  applyPartialWrite,
  describeDrift,
  isOwnedChain,
  matchesRecord,
  type OwnedRecord,
  type OwnedRules,
  ownedAfterWrite,
  proxyTables,
  readOwnedRules,
  recordAfterFullWrite,
  recordOwned,
  settleRecord,
} from './owned-rules.ts';
import type {RunReason} from './runner.ts';
import type {ClusterObjects} from '../watch/cluster-objects.ts';
import {type FamilySyncState, ProxierBase, type ProxierBaseOptions} from './proxier-base.ts';
import {deleteConntrackEntries} from './sync-bookkeeping.ts';
import {releaseGarbage} from '../garbage.ts';
import type {ChainsWritten, RulesWriteListener, FamilySyncResult, WrittenRules} from './types.ts';

/** kube-proxy's FullSyncPeriod: the longest run of partial syncs. */
export const fullSyncPeriod = 3_600_000;

export interface ProxierOptions extends ProxierBaseOptions {
  host: Host;
  rules: IptablesRuleSource;
  objects: ClusterObjects;
  /** Everything buildProxyModel needs except the family. */
  model: Omit<ModelOptions, 'family'>;
}

interface FamilyState extends FamilySyncState {
  /** iptables' kernel interface, once known: decides how a full sync's input is prepared. */
  frontEnd?: IptablesFrontEnd;
  /** The proxy's rules as the last write left them, per table (known from the write's input, or read back when it cannot be followed), recorded compactly. */
  written?: Map<IptablesTable, OwnedRecord>;
  lastFullSync?: number;
  /** When the rules were last compared with what was written (or freshly written in full). */
  lastDriftCheck?: number;
  rulesPerTable: Map<IptablesTable, number>;
  /** How long the last reading of the tables took (clock ms), and how many of the proxy's rules it read: see expectedReadingMs. */
  lastReadingMs?: number;
  lastReadingRules?: number;
  /** Restores started and ended: a background reading that overlapped one proves nothing. */
  writesStarted: number;
  writesEnded: number;
  /** The drift check reading the kernel outside the syncs, while one runs. */
  backgroundCheck?: Promise<void>;
  /** The last background check overlapped a write, and so proved nothing. */
  backgroundInconclusive?: boolean;
  /** Drift a background check found, for the result of the full sync that repairs it. */
  driftFoundInBackground?: boolean;
}

/**
 * A reading of the tables this slow or slower (a large cluster's: see docs/agent.md, Drift
 * repair) is taken for the drift check outside the syncs, so that changes need not wait for it;
 * faster ones, within the sync that found the check due.
 */
export const backgroundReadingMs = 1000;

/**
 * A reading of fewer of the proxy's rules than this takes about as long as one of this many:
 * iptables-save starting and reading the ruleset's skeleton costs as much as reading a thousand
 * rules or so (docs/development.md, Figures behind the code).
 */
const readingFixedCostRules = 1000;

/**
 * expectedReadingMs: how long the next reading of the tables will take, from the last one, scaled
 * by how many rules the tables hold now against how many it read. The first sync's reading finds
 * the tables empty and takes milliseconds; at 10,000 services the next one takes seconds, and is
 * taken in the background because of this scaling, not inside a sync that changes would wait for.
 */
function expectedReadingMs(state: FamilyState): number | undefined {
  if (state.lastReadingMs === undefined) return undefined;
  let rules = 0;
  for (const count of state.rulesPerTable.values()) rules += count;
  const growth = Math.max(rules, readingFixedCostRules) / Math.max(state.lastReadingRules ?? 0, readingFixedCostRules);
  return state.lastReadingMs * Math.max(1, growth);
}

export class IptablesProxier extends ProxierBase<FamilyState> {
  readonly #options: ProxierOptions;
  readonly #writeListeners = new Set<RulesWriteListener>();

  constructor(options: ProxierOptions) {
    super(options, (family) => ({
      builder: new ProxyModelBuilder({...options.model, family}),
      needFullSync: true,
      rulesPerTable: new Map(),
      writesStarted: 0,
      writesEnded: 0,
    }));
    this.#options = options;
  }

  /** start prepares the node (route_localnet) and starts the runner; the first sync waits for the initial lists. */
  async start(): Promise<void> {
    await this.#enableLocalhostNodePorts();
    for (const family of this.families.keys()) {
      try {
        const frontEnd = await this.#options.host.iptablesFrontEnd(family);
        this.families.get(family)!.frontEnd = frontEnd;
        this.#options.log.info('iptables front end', {family, frontEnd});
      } catch (error) {
        this.#options.log.warn('cannot tell the iptables front end', {family, reason: errorText(error)});
      }
    }
    this.startRunner();
  }

  /** onWrite tells `listener` of every write of rules (the agent API keeps its copy of the kernel's rules current with it). */
  onWrite(listener: RulesWriteListener): () => void {
    this.#writeListeners.add(listener);
    return () => this.#writeListeners.delete(listener);
  }

  /**
   * readApplied reads the proxy's tables as iptables-save prints them (filter, then nat), for
   * whoever must know what the kernel holds now (the plugin's API). The reading is the caller's:
   * listeners are not told of it, and the proxy's rules are not picked out of it.
   */
  async readApplied(family: IPFamily): Promise<string> {
    return savedTables(await this.#options.host.iptablesSave(family), proxyTables);
  }

  /** `written` is worked out only when someone listens. */
  #tellWrite(family: IPFamily, phase: 'started' | 'ended', written?: () => WrittenRules | undefined): void {
    if (this.#writeListeners.size === 0) return;
    let rules: WrittenRules | undefined;
    try {
      rules = written?.();
    } catch (error) {
      this.#options.log.error('cannot tell what the write left', {family, reason: errorText(error)});
    }
    for (const listener of this.#writeListeners) {
      try {
        if (phase === 'started') listener.started(family);
        else listener.ended(family, rules);
      } catch (error) {
        this.#options.log.error('rules write listener failed', {reason: errorText(error)});
      }
    }
  }

  #tellReading(family: IPFamily, text: string, startedAt: number): void {
    for (const listener of this.#writeListeners) {
      try {
        listener.reading?.(family, text, startedAt);
      } catch (error) {
        this.#options.log.error('rules write listener failed', {reason: errorText(error)});
      }
    }
  }

  protected ruleTotals(): {filter: number; nat: number} {
    const totals = {filter: 0, nat: 0};
    for (const state of this.families.values()) {
      totals.filter += state.rulesPerTable.get('filter') ?? 0;
      totals.nat += state.rulesPerTable.get('nat') ?? 0;
    }
    return totals;
  }

  protected async syncFamily(family: IPFamily, model: ProxyModel, reason: RunReason): Promise<FamilySyncResult> {
    const {metrics, log} = this.#options;
    const state = this.families.get(family)!;
    const start = this.clock.now();
    const plan = this.#planSync(family, state, model, reason, start);
    let {full, changed} = plan;

    /** The proxy's rules read at `start`, when the drift check read them. */
    let current: Map<IptablesTable, OwnedRules> | undefined;
    if (!full && plan.checkInBackground && state.written && changed.size === 0) this.#checkDriftInBackground(family, state);
    if (!full && plan.readInSync && state.written && changed.size === 0) {
      this.#checkedAt(state, start);
      this.wholeTablesTouched = true;
      current = await this.#readOwned(family);
      if (this.#driftFrom(family, state.written, current)) {
        plan.drift = true;
        metrics.driftRepairs.inc({ip_family: family});
        full = true;
        changed = changedServicePorts(undefined, model);
      }
    }

    if (!full && changed.size === 0) {
      log.detail(3, 'rules up to date', {family});
      return {family, kind: 'unchanged', changedServicePorts: 0, drift: plan.drift};
    }

    const partial = !full && state.written !== undefined;
    const write = partial ? this.#partialWrite(state, model, changed) : await this.#fullWrite(family, state, model, current, start);
    const previous = state.applied;
    const outcome = await this.#restore(family, state, write, {
      full,
      readInSync: plan.readInSync,
      start,
      committed: () => (state.applied = model),
    });
    if (this.#recordWrite(family, state, write, outcome)) plan.drift = true;
    // A full sync at 10,000 services takes longer than syncPeriod: count from the reading, not the start.
    if (outcome.now) this.#checkedAt(state, outcome.readAt);
    else if (partial && plan.checkInBackground) this.#checkDriftInBackground(family, state);

    await this.#cleanConntrack(family, previous, model, changed);
    if (full) {
      state.needFullSync = false;
      state.lastFullSync = start;
    }
    for (const [table, owned] of state.written!) state.rulesPerTable.set(table, owned.ruleCount);

    return this.familySynced({family, start, full, changedServicePorts: changed.size, model, drift: plan.drift});
  }

  /**
   * #planSync decides what a sync does: full or partial, which service ports changed, and whether
   * the drift check is due, read in the sync or in the background.
   */
  #planSync(family: IPFamily, state: FamilyState, model: ProxyModel, reason: RunReason, start: number): SyncPlan {
    let full = state.needFullSync || state.lastFullSync === undefined || start - state.lastFullSync >= fullSyncPeriod;
    // Drift found by a background check is repaired by this sync (full), and reported with it.
    const drift = state.driftFoundInBackground === true;
    state.driftFoundInBackground = false;
    // Checked at least once per syncPeriod, also when changes keep every sync from being periodic:
    // before deciding when nothing is to be written, else with the read-back after the write.
    // A slow reading is taken in the background instead, started early enough to conclude within
    // syncPeriod. When one overlapped a write, and so proved nothing, the next sync takes the
    // reading itself, as changes that never pause would otherwise leave drift unseen.
    const {syncPeriod} = this.#options;
    const sinceCheck = state.lastDriftCheck === undefined ? Infinity : start - state.lastDriftCheck;
    const readingMs = expectedReadingMs(state) ?? 0;
    const slowReading = readingMs >= backgroundReadingMs;
    const driftCheckDue = reason.periodic || sinceCheck >= (slowReading ? Math.max(syncPeriod / 2, syncPeriod - readingMs) : syncPeriod);
    const changed = changedServicePorts(state.applied, model);
    if (!full && state.applied && this.#options.rules.rewritesUnchanged?.(state.applied, model)) {
      // Rules of ports that did not change would keep their old spelling, and read as drift forever.
      this.#options.log.info('endpoints crossed the large-cluster threshold, which changes the rules of every service port: full sync', {
        family,
      });
      full = true;
    }
    return {
      full,
      changed,
      drift,
      checkInBackground: driftCheckDue && slowReading && !state.backgroundInconclusive,
      readInSync: driftCheckDue && (!slowReading || state.backgroundInconclusive === true),
    };
  }

  /**
   * #fullWrite prepares a full sync's write from a reading of the tables (`current`, when the drift
   * check has just taken one): stale chains deleted, missing jump rules inserted. Its input is
   * streamed as it is rendered.
   */
  async #fullWrite(
    family: IPFamily,
    state: FamilyState,
    model: ProxyModel,
    current: Map<IptablesTable, OwnedRules> | undefined,
    start: number,
  ): Promise<PreparedWrite> {
    const {rules, log} = this.#options;
    this.wholeTablesTouched = true;
    // A drift check has just read them: a repair need not read them again.
    const existingReadAt = current ? start : this.clock.now();
    const existing = current ?? (await this.#readOwned(family));
    const existingChains = new Map([...existing].map(([table, owned]) => [table, new Set(owned.chains)]));
    const jumps = missingJumpRules(rules.jumpRules(model), existing);
    for (const jump of jumps) log.info('jump rule added', {family, table: jump.table, chain: jump.chain, rule: jump.rule.join(' ')});
    let rendered: RenderedWrite | undefined = rules.render(model, {
      existingChains,
      // In the same atomic write as the chains they lead to, at the end of their table, once those are filled.
      insertJumps: jumps,
      extraLines: {nat: {start: state.frontEnd === 'nf_tables' ? [wholeTableCache] : []}},
    });
    /** The input as it went out, kept only for the input log (--v 5). */
    const pieces: Uint8Array[] = [];
    const input = passing(rendered.input, (piece) => {
      if (log.verbosity >= 5) pieces.push(piece);
    });
    // The renderer's record of a full write (every chain of the tables) is let go once the
    // drift record is made from it, not held while iptables-restore commits.
    const takeWritten = (): ReturnType<RenderedWrite['written']> => {
      const written = rendered?.written();
      rendered = undefined;
      return written;
    };
    return {kind: 'full', takeWritten, input, logText: () => restoreInputText(pieces), existing, existingReadAt};
  }

  /** #partialWrite prepares a partial sync's write: the changed ports' chains, and the fixed chains when they change. */
  #partialWrite(state: FamilyState, model: ProxyModel, changed: Set<string>): PreparedWrite {
    const rendered = this.#options.rules.render(model, {changedServicePorts: changed, previous: state.applied});
    let text = restoreInputText(rendered.input);
    // A partial sync after a burst of changes (thousands of services created at once) names as
    // many chains as a full one, and pays the same quadratic chain list.
    const declared = rendered.declaredChains();
    if (state.frontEnd === 'nf_tables' && declared.filter.length + declared.nat.length > wholeTableCacheAbove)
      text = withWholeTableCache(text);
    return {kind: 'partial', rendered, input: text, logText: () => text};
  }

  /**
   * #restore writes the input with iptables-restore --noflush, and tells what it left: from the
   * renderer's record (a full write's while iptables-restore commits, once it has taken all its
   * input), or by reading the tables back when a drift check is due after a partial write or the
   * record cannot be had.
   */
  async #restore(
    family: IPFamily,
    state: FamilyState,
    write: PreparedWrite,
    /** `committed` runs once iptables-restore has committed, before the listeners are told (the model is then the applied one). */
    sync: {full: boolean; readInSync: boolean; start: number; committed: () => void},
  ): Promise<WriteOutcome> {
    const {host, metrics, log} = this.#options;
    const partial = write.kind === 'partial';
    const outcome: WriteOutcome = {readAt: sync.start};
    // What a full write leaves is worked out from the renderer's record and the reading just
    // before it, while iptables-restore commits (seconds at 10,000 services) rather than after.
    let recorded = partial;
    const recordFullWrite = (): void => {
      if (recorded || write.kind !== 'full') return;
      recorded = true;
      outcome.fullyWritten = this.#followed(family, () => {
        const written = write.takeWritten();
        return written && recordAfterFullWrite(written, write.existing);
      });
      // The agent waits for the commit now: the sync's garbage (the input, the initial lists at
      // start) is collected while it does, instead of being held to the end of the sync.
      releaseGarbage();
    };
    this.#tellWrite(family, 'started');
    state.writesStarted++;
    try {
      await host.iptablesRestore(family, write.input, {noflush: true, inputTaken: partial ? undefined : recordFullWrite});
      state.writesEnded = state.writesStarted;
      sync.committed();
      const writtenAt = this.clock.now();
      recordFullWrite();
      const spelled = partial ? this.#followed(family, () => write.rendered.written()) : undefined;
      if (spelled) outcome.written = this.#followed(family, () => ownedAfterWrite(spelled));
      // The kernel is read back after a partial write when a drift check is due, and when what the
      // write left cannot be followed.
      let readBack: string | undefined;
      if (partial ? sync.readInSync || !outcome.written : !outcome.fullyWritten) {
        this.wholeTablesTouched = true;
        outcome.readAt = this.clock.now();
        const tables = await this.#readTables(family);
        outcome.now = tables.owned;
        readBack = tables.text;
      }
      this.#tellWrite(family, 'ended', () => {
        if (readBack !== undefined) return {kind: 'read', text: readBack, readStartedAt: outcome.readAt};
        return spelled && outcome.written && chainsWritten(spelled, outcome.written, writtenAt);
      });
    } catch (error) {
      state.writesEnded = state.writesStarted;
      this.#tellWrite(family, 'ended', undefined);
      metrics.restoreFailures.inc();
      if (!sync.full) metrics.partialRestoreFailures.inc();
      state.needFullSync = true;
      throw new Error(`${family} ${sync.full ? 'full' : 'partial'} sync: ${errorText(error)}`, {cause: error});
    } finally {
      // A failed full write's input as far as it went out.
      if (log.verbosity >= 5) log.detail(5, 'iptables-restore input', {family, rules: write.logText()});
    }
    return outcome;
  }

  /** #followed: what the write left, or undefined (logged) when it cannot be told without reading the kernel back. */
  #followed<T>(family: IPFamily, follow: () => T | undefined): T | undefined {
    try {
      return follow();
    } catch (error) {
      this.#options.log.error('cannot follow what the write left; reading it back', {family, reason: errorText(error)});
      return undefined;
    }
  }

  /**
   * #recordWrite keeps what the write left as the record the next drift check compares with.
   * True when a partial write's read-back showed drift (a full sync is then asked for).
   */
  #recordWrite(family: IPFamily, state: FamilyState, write: PreparedWrite, outcome: WriteOutcome): boolean {
    if (write.kind === 'full') {
      state.written = outcome.fullyWritten ?? new Map([...outcome.now!].map(([table, owned]) => [table, recordOwned(owned)]));
      // The reading before the write checked every chain the write did not replace.
      if (outcome.fullyWritten) this.#checkedAt(state, write.existingReadAt);
      return false;
    }
    // The chains the write did not replace must be as they were after the previous write; reading
    // the kernel back checks them, and the replaced ones, free of charge.
    const declared = write.rendered.declaredChains();
    const expected = state.written!;
    for (const table of proxyTables) {
      applyPartialWrite(expected.get(table)!, (outcome.written ?? outcome.now!).get(table)!, new Set(declared[table as 'filter' | 'nat']));
    }
    if (!outcome.now || !this.#driftFrom(family, expected, outcome.now)) return false;
    this.#options.metrics.driftRepairs.inc({ip_family: family});
    state.needFullSync = true;
    this.runner.run();
    return true;
  }

  override async stop(): Promise<void> {
    await super.stop();
    await Promise.all([...this.families.values()].map((state) => state.backgroundCheck));
  }

  /**
   * #driftFrom compares a reading with the record of what was written, table by table: a table
   * that matches has its record settled (see settleRecord), one that does not is logged. True
   * when anything drifted.
   */
  #driftFrom(family: IPFamily, record: Map<IptablesTable, OwnedRecord>, reading: Map<IptablesTable, OwnedRules>): boolean {
    let drift = false;
    for (const table of proxyTables) {
      const [written, now] = [record.get(table)!, reading.get(table)!];
      if (matchesRecord(written, now)) {
        record.set(table, settleRecord(written, now));
      } else {
        drift = true;
        this.#options.log.warn('rules changed behind our back; rewriting them', {family, drift: describeDrift(written, now)});
      }
    }
    return drift;
  }

  /** #checkedAt: a drift check compared the kernel's rules, as a reading that started at `time` found them, with the record. */
  #checkedAt(state: FamilyState, time: number): void {
    state.lastDriftCheck = time;
    state.backgroundInconclusive = false;
  }

  /**
   * #checkDriftInBackground reads the tables outside the syncs, so that changes need not wait for
   * a slow reading, and compares them with the record when it is done. A write that overlapped
   * the reading leaves it inconclusive: the next check due is then taken by the sync itself.
   */
  #checkDriftInBackground(family: IPFamily, state: FamilyState): void {
    if (state.backgroundCheck) return;
    const {log, metrics} = this.#options;
    const startedAt = this.clock.now();
    const writes = state.writesStarted;
    const noWriteInFlight = state.writesEnded === writes;
    state.backgroundCheck = (async () => {
      const reading = await this.#readOwned(family);
      if (!noWriteInFlight || state.writesStarted !== writes || !state.written || state.needFullSync) {
        // Unless a sync has checked since, the next sync checks, reading the kernel itself.
        if ((state.lastDriftCheck ?? -Infinity) < startedAt) {
          state.backgroundInconclusive = true;
          this.runner.run();
        }
        return;
      }
      this.#checkedAt(state, startedAt);
      if (!this.#driftFrom(family, state.written, reading)) return;
      metrics.driftRepairs.inc({ip_family: family});
      state.needFullSync = true;
      state.driftFoundInBackground = true;
      this.runner.run();
    })()
      .catch((error: unknown) => {
        // The sync reads next, so that a reading that keeps failing fails syncs, as it did before.
        log.warn('drift check failed', {family, reason: errorText(error)});
        state.backgroundInconclusive = true;
        this.runner.run();
      })
      .finally(() => {
        state.backgroundCheck = undefined;
        releaseGarbage();
      });
  }

  async #readOwned(family: IPFamily): Promise<Map<IptablesTable, OwnedRules>> {
    return (await this.#readTables(family)).owned;
  }

  /** The proxy's part of its tables, and the tables as iptables-save printed them (filter, then nat). */
  async #readTables(family: IPFamily): Promise<{owned: Map<IptablesTable, OwnedRules>; text: string}> {
    // One reading of every table: iptables-nft reads the whole ruleset for either table.
    const startedAt = this.clock.now();
    const state = this.families.get(family)!;
    const writes = state.writesStarted;
    const idle = state.writesEnded === writes;
    const save = await this.#options.host.iptablesSave(family);
    const tables = {owned: new Map(proxyTables.map((table) => [table, readOwnedRules(table, save)])), text: savedTables(save, proxyTables)};
    if (idle && state.writesStarted === writes) this.#tellReading(family, tables.text, startedAt);
    state.lastReadingMs = this.clock.now() - startedAt;
    state.lastReadingRules = 0;
    for (const owned of tables.owned.values()) state.lastReadingRules += owned.rules.length;
    return tables;
  }

  async #cleanConntrack(family: IPFamily, previous: ProxyModel | undefined, next: ProxyModel, changed: Set<string>): Promise<void> {
    // Ports that did not change need no cleanup: plan over the changed ones alone.
    const only = (model: ProxyModel): ProxyModel => ({...model, servicePorts: portsWithIdentities(model, changed)});
    await deleteConntrackEntries(this.#options, family, planConntrackCleanup(previous && only(previous), only(next)));
  }

  /** The rules per table, all families together (kubeproxy_sync_proxy_rules_iptables_total). */
  protected override syncSucceeded(): void {
    for (const table of proxyTables) {
      let total = 0;
      for (const state of this.families.values()) total += state.rulesPerTable.get(table) ?? 0;
      this.#options.metrics.iptablesRules.set({table}, total);
    }
  }

  async #enableLocalhostNodePorts(): Promise<void> {
    const {host, log, model} = this.#options;
    const config = model.config ?? {};
    if (!this.families.has('IPv4') || config.localhostNodePorts === false) return;
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
}

/**
 * iptables-nft's restore with --noflush first notes every chain its input names, one linear
 * insertion into a sorted list per command, to read just those from the kernel. A full sync names
 * every chain (about 11 per service), so the list makes a full sync quadratic in the services (see
 * docs/agent.md, How a sync works). A command that names no chain makes it read the whole table instead and
 * skip the list. `-Z` (zero the table's counters) is the one such command that changes no rule; its
 * price is that the nat counters restart from zero at each full sync, which those of our own rules
 * do anyway since a full sync rewrites all of them. Partial syncs usually name few chains and go
 * without it; one that names more than wholeTableCacheAbove uses it too (its counters restart).
 */
/** Chains a restore input may name before reading the whole table is cheaper than the list (about 90 services). */
const wholeTableCacheAbove = 1000;

const wholeTableCache = '-Z';

/** SyncPlan: what #planSync decided for one sync of a family. */
interface SyncPlan {
  full: boolean;
  changed: Set<string>;
  /** Drift was found (by a background check before the sync, or by this sync's). */
  drift: boolean;
  checkInBackground: boolean;
  readInSync: boolean;
}

/** PreparedWrite: a sync's restore input and what the renderer tells of it. */
type PreparedWrite = {input: RestoreInput; logText: () => string} & (
  | {kind: 'partial'; rendered: RenderedWrite}
  /** What the renderer told of a full write (given once), the proxy's rules read just before it, and when that reading started. */
  | {
      kind: 'full';
      takeWritten: () => ReturnType<RenderedWrite['written']>;
      existing: Map<IptablesTable, OwnedRules>;
      existingReadAt: number;
    }
);

/** WriteOutcome: what a write left, as far as the proxier knows it. */
interface WriteOutcome {
  /** A full write's record, from the renderer's and the reading before it. */
  fullyWritten?: Map<IptablesTable, OwnedRecord>;
  /** A partial write's chains, from the renderer's record. */
  written?: Map<IptablesTable, OwnedRules>;
  /** The tables read back after the write, and when that reading started. */
  now?: Map<IptablesTable, OwnedRules>;
  readAt: number;
}

/** withWholeTableCache puts the -Z command at the start of the nat part of a partial sync's input. */
export function withWholeTableCache(rules: string): string {
  // Sliced and joined rather than replaced by a regular expression: the input holds whole tables,
  // and a replace would copy all of it once more.
  const at = rules.startsWith('*nat\n') ? 0 : rules.indexOf('\n*nat\n') + 1;
  if (at === 0 && !rules.startsWith('*nat\n')) return rules;
  return `${rules.slice(0, at + 5)}${wholeTableCache}\n${rules.slice(at + 5)}`;
}

/** passing passes a restore input on piece by piece, and shows each piece to `see` as it goes out. */
function* passing(input: RestoreInput, see: (piece: Uint8Array) => void): Generator<Uint8Array> {
  for (const piece of typeof input === 'string' ? [Buffer.from(input)] : input) {
    see(piece);
    yield piece;
  }
}

/**
 * chainsWritten: what a partial write left in the chains it declared, as the renderer told it;
 * undefined when the write also replaced chains that are not the proxy's (their rules are not
 * followed).
 */
function chainsWritten(
  spelled: Record<'filter' | 'nat', WrittenTable>,
  written: Map<IptablesTable, OwnedRules>,
  writtenAt: number,
): WrittenRules | undefined {
  const tables: ChainsWritten[] = [];
  for (const table of proxyTables) {
    const {declared} = spelled[table as 'filter' | 'nat'];
    const owned = written.get(table);
    if (!owned || declared.some((chain) => !isOwnedChain(table, chain))) return undefined;
    tables.push({table, declared: [...declared], chains: owned.chains, rules: owned.rules});
  }
  return {kind: 'chains', tables, writtenAt};
}

/** The words of a rule, quotes removed, as iptables-save and iptables-restore both read them. */
function ruleWords(rule: string): string[] {
  return [...rule.matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((match) => match[1] ?? match[2]);
}

/** The jump rules the kernel does not hold yet, judged from the proxy's rules read before a full sync. */
export function missingJumpRules(jumps: JumpRule[], existing: Map<IptablesTable, OwnedRules>): JumpRule[] {
  const present = new Set<string>();
  for (const owned of existing.values())
    for (const rule of owned.kubeJumps ?? owned.jumpRules) present.add(`${owned.table} ${ruleWords(rule).join(' ')}`);
  return jumps.filter((jump) => !present.has(`${jump.table} ${['-A', jump.chain, ...jump.rule].join(' ')}`));
}
