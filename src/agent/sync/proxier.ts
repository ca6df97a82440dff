// IptablesProxier: keeps the node's iptables rules equal to what the cluster's Services and
// EndpointSlices ask for. Each sync builds the ProxyModel per IP family, writes the rules with one
// `iptables-restore --noflush` per family (chains it declares are replaced atomically; everything
// else in the tables stays), keeps the jump rules from the built-in chains, and cleans conntrack.
// A sync is full at start, after any failure, after drift, and at least hourly (kube-proxy's
// FullSyncPeriod); otherwise partial, rewriting only the chains of service ports that changed.
// What a write left is known from its input (kube-proxy never reads its rules back); the kernel is
// read at least once per syncPeriod to check for drift, and if someone changed the rules, a full
// sync rewrites them all.
import {changedServicePorts, type IPFamily, type ModelOptions, type ProxyModel, ProxyModelBuilder, portsWithIdentities} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import {type Host, type IptablesFrontEnd, type RestoreInput, restoreInputText, savedTables} from '../host/host.ts';
import type {Clock} from './clock.ts';
import {planConntrackCleanup} from './conntrack-cleanup.ts';
import type {IptablesRuleSource, JumpRule} from './iptables-rules.ts';
import {applyPartialWrite, declaredChains, describeDrift, type FullWriteReader, InputSpelling, isOwnedChain, matchesRecord, type OwnedRecord, type OwnedRules, proxyTables, readOwnedRules, recordOwned, settleRecord} from './owned-rules.ts';
import type {RunReason} from './runner.ts';
import {deleteConntrackEntries, type FamilySyncState, ProxierBase, type ProxierBaseOptions, releaseGarbage} from './sync-bookkeeping.ts';
import {errorText} from '../../core/error-text.ts';

/** kube-proxy's FullSyncPeriod: the longest run of partial syncs. */
export const fullSyncPeriod = 3_600_000;

export {lastChangeTriggerTimeAnnotation} from './sync-bookkeeping.ts';

/** ClusterObjects: the current Services, EndpointSlices and this node's Node, as the watches hold them. */
export interface ClusterObjects {
  services(): unknown[];
  endpointSlices(): unknown[];
  node(): unknown;
}

export type ObjectKind = 'Service' | 'EndpointSlice' | 'Node';

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
  /** Knows what a write leaves without reading the kernel, when the rule source can spell rules. */
  spelling?: InputSpelling;
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
 * rules or so (docs/agent.md, Figures behind the code).
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

/** FamilySyncResult: what one sync of one IP family did (not protocol/'s SyncResult, the answer to the plugin's sync call). */
export interface FamilySyncResult {
  family: IPFamily;
  kind: 'full' | 'partial' | 'unchanged';
  changedServicePorts: number;
  drift: boolean;
}

/** ChainsWritten: the chains of one table a partial write declared (so replaced or deleted), and what they hold now. */
export interface ChainsWritten {
  table: IptablesTable;
  declared: string[];
  /** The declared chains that exist after the write. */
  chains: string[];
  /** Their rules, as iptables-save prints them. */
  rules: string[];
}

/** WrittenRules: what one write left in the kernel, as the proxier knows it without a new reading. */
export type WrittenRules =
  /** The tables read back after the write (filter, then nat, as iptables-save -t prints them); reading started at `readStartedAt`. */
  | {kind: 'read'; text: string; readStartedAt: number}
  /** The chains a partial write replaced; every other rule is as before the write. */
  | {kind: 'chains'; tables: ChainsWritten[]; writtenAt: number};

/**
 * Told before each iptables-restore and after it (`written` undefined when what it left is not
 * known), and of each reading of the tables taken with no write in flight (the drift check's),
 * with when it started.
 */
export interface RulesWriteListener {
  started(family: IPFamily): void;
  ended(family: IPFamily, written: WrittenRules | undefined): void;
  reading?(family: IPFamily, text: string, startedAt: number): void;
}

/** SyncOutcome: one sync of every family, as told to onSync listeners (the agent API streams it). */
export interface SyncOutcome {
  /** Clock time (ms) the sync started and how long it took. */
  startedAt: number;
  durationMs: number;
  ok: boolean;
  /** Per family; empty when the sync failed. */
  results: FamilySyncResult[];
  /** The proxy's rules in the kernel after the sync, per table, all families together. */
  rules: {filter: number; nat: number};
  error?: string;
}

export class IptablesProxier extends ProxierBase<FamilyState> {
  readonly #options: ProxierOptions;
  readonly #writeListeners = new Set<RulesWriteListener>();

  constructor(options: ProxierOptions) {
    super(options, (family) => {
      const spell = options.rules.spellRules;
      const spelling = spell ? new InputSpelling((input) => spell(family, input)) : undefined;
      return {builder: new ProxyModelBuilder({...options.model, family}), spelling, needFullSync: true, rulesPerTable: new Map(), writesStarted: 0, writesEnded: 0};
    });
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
    const {host, rules, metrics, log} = this.#options;
    const state = this.families.get(family)!;
    const start = this.clock.now();
    let full = state.needFullSync || state.lastFullSync === undefined || start - state.lastFullSync >= fullSyncPeriod;

    // Drift found by a background check is repaired by this sync (full), and reported with it.
    let drift = state.driftFoundInBackground === true;
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
    const checkInBackground = driftCheckDue && slowReading && !state.backgroundInconclusive;
    const readInSync = driftCheckDue && (!slowReading || state.backgroundInconclusive === true);
    let changed = changedServicePorts(state.applied, model);
    if (!full && state.applied && rules.rewritesUnchanged?.(state.applied, model)) {
      // Rules of ports that did not change would keep their old spelling, and read as drift forever.
      log.info('endpoints crossed the large-cluster threshold, which changes the rules of every service port: full sync', {family});
      full = true;
    }
    /** The proxy's rules read at `start`, when the drift check read them. */
    let current: Map<IptablesTable, OwnedRules> | undefined;
    if (!full && checkInBackground && state.written && changed.size === 0) this.#checkDriftInBackground(family, state);
    if (!full && readInSync && state.written && changed.size === 0) {
      this.#checkedAt(state, start);
      this.wholeTablesTouched = true;
      current = await this.#readOwned(family);
      if (this.#driftFrom(family, state.written, current)) {
        drift = true;
        metrics.driftRepairs.inc({ip_family: family});
        full = true;
        changed = changedServicePorts(undefined, model);
      }
    }

    if (!full && changed.size === 0) {
      log.detail(3, 'rules up to date', {family});
      return {family, kind: 'unchanged', changedServicePorts: 0, drift};
    }

    /** The restore's input; a full sync's is streamed as it is rendered. */
    let input: RestoreInput;
    /** A partial sync's input; a full sync's once all of it is written. */
    let text: string | undefined;
    let existing: Map<IptablesTable, OwnedRules> | undefined;
    const existingReadAt = current ? start : this.clock.now();
    /** A full sync's input as it went out, kept only for the input log (--v 5). */
    const pieces: Uint8Array[] = [];
    /** What a full write leaves, read from its input as it goes out. */
    let reader: FullWriteReader | undefined;
    if (full || !state.written) {
      this.wholeTablesTouched = true;
      // A drift check has just read them: a repair need not read them again.
      existing = current ?? (await this.#readOwned(family));
      const existingChains = new Map([...existing].map(([table, owned]) => [table, new Set(owned.chains)]));
      const jumps = missingJumpRules(rules.jumpRules(model), existing);
      for (const jump of jumps) log.info('jump rule added', {family, table: jump.table, chain: jump.chain, rule: jump.rule.join(' ')});
      const extraLines = {
        // In the same atomic write as the chains they lead to, at the end of their table, once those are filled.
        filter: {end: jumpRuleLines(jumps, 'filter')},
        nat: {start: state.frontEnd === 'nf_tables' ? [wholeTableCache] : [], end: jumpRuleLines(jumps, 'nat')},
      };
      reader = state.spelling?.fullWriteReader();
      const decoder = new TextDecoder();
      input = passing(rules.render(model, {existingChains, extraLines}), (piece) => {
        if (log.verbosity >= 5) pieces.push(piece);
        if (!reader) return;
        try {
          // Read in strings small enough for V8's young generation, where they die at the next
          // scavenge: a whole piece's string would be a large object, kept until a full
          // collection, and the whole input with it.
          for (let at = 0; at < piece.length; at += decodedPieceBytes) reader.add(decoder.decode(piece.subarray(at, at + decodedPieceBytes), {stream: true}));
        } catch (error) {
          // Never the write's failure: the kernel is read back instead.
          log.error('cannot follow what the write left; reading it back', {family, reason: errorText(error)});
          reader = undefined;
        }
      });
    } else if (rules.serviceChains) {
      // Only the changed ports' chains can have become stale: name those alone, not every chain of the model.
      // Chain names hash the service port's name, so no other port can be using them.
      const stale = new Set<string>();
      const previous = state.applied!;
      for (const port of portsWithIdentities(previous, changed)) for (const chain of rules.serviceChains(previous, port)) stale.add(chain);
      for (const port of portsWithIdentities(model, changed)) for (const chain of rules.serviceChains(model, port)) stale.delete(chain);
      input = text = withDeletedChains(restoreInputText(rules.render(model, {changedServicePorts: changed, previous})), 'nat', [...stale].sort());
    } else {
      const existingChains = new Map([...state.written].map(([table, owned]) => [table, new Set(owned.chains.keys())]));
      input = text = restoreInputText(rules.render(model, {changedServicePorts: changed, existingChains, previous: state.applied}));
    }
    // A partial sync after a burst of changes (thousands of services created at once) names as
    // many chains as a full one, and pays the same quadratic chain list.
    if (text !== undefined && !full && state.frontEnd === 'nf_tables' && declaredChainCount(text) > wholeTableCacheAbove) input = text = withWholeTableCache(text);
    const partial = !full && state.written !== undefined;
    let now: Map<IptablesTable, OwnedRules> | undefined;
    let written: Map<IptablesTable, OwnedRules> | undefined;
    let fullyWritten: Map<IptablesTable, OwnedRecord> | undefined;
    let readAt = start;
    let readBack: string | undefined;
    // What a full write leaves is worked out from its input and the reading just before it, while
    // iptables-restore commits (seconds at 10,000 services) rather than after.
    let recorded = partial;
    const recordFullWrite = (): void => {
      if (recorded) return;
      recorded = true;
      try {
        fullyWritten = reader?.finish(existing!);
      } catch (error) {
        log.error('cannot follow what the write left; reading it back', {family, reason: errorText(error)});
      }
      reader = undefined;
      // The agent waits for the commit now: the sync's garbage (the input, the initial lists at
      // start) is collected while it does, instead of being held to the end of the sync.
      releaseGarbage();
    };
    this.#tellWrite(family, 'started');
    state.writesStarted++;
    try {
      await host.iptablesRestore(family, input, {noflush: true, inputTaken: partial ? undefined : recordFullWrite});
      state.writesEnded = state.writesStarted;
      const writtenAt = this.clock.now();
      // The kernel is read back after a partial write when a drift check is due, and when the
      // input cannot be followed.
      recordFullWrite();
      if (partial) written = state.spelling?.ownedAfter(text!);
      if (partial ? readInSync || !written : !fullyWritten) {
        this.wholeTablesTouched = true;
        readAt = this.clock.now();
        const tables = await this.#readTables(family);
        now = tables.owned;
        readBack = tables.text;
      }
      this.#tellWrite(family, 'ended', () => {
        if (readBack !== undefined) return {kind: 'read', text: readBack, readStartedAt: readAt};
        return written && chainsWritten(text!, written, writtenAt);
      });
    } catch (error) {
      state.writesEnded = state.writesStarted;
      this.#tellWrite(family, 'ended', undefined);
      metrics.restoreFailures.inc();
      if (!full) metrics.partialRestoreFailures.inc();
      state.needFullSync = true;
      throw new Error(`${family} ${full ? 'full' : 'partial'} sync: ${errorText(error)}`, {cause: error});
    } finally {
      // A failed full write's input as far as it went out.
      if (log.verbosity >= 5) log.detail(5, 'iptables-restore input', {family, rules: text ?? restoreInputText(pieces)});
    }

    if (!partial) {
      state.written = fullyWritten ?? new Map([...now!].map(([table, owned]) => [table, recordOwned(owned)]));
      // The reading before the write checked every chain the write did not replace.
      if (fullyWritten) this.#checkedAt(state, existingReadAt);
    } else {
      // The chains the write did not replace must be as they were after the previous write; reading
      // the kernel back checks them, and the replaced ones, free of charge.
      const declared = declaredChains(text!);
      const expected = state.written!;
      for (const table of proxyTables) applyPartialWrite(expected.get(table)!, (written ?? now!).get(table)!, declared.get(table) ?? new Set());
      if (now && this.#driftFrom(family, expected, now)) {
        drift = true;
        metrics.driftRepairs.inc({ip_family: family});
        state.needFullSync = true;
        this.runner.run();
      }
    }
    // A full sync at 10,000 services takes longer than syncPeriod: count from the reading, not the start.
    if (now) this.#checkedAt(state, readAt);
    else if (partial && checkInBackground) this.#checkDriftInBackground(family, state);

    await this.#cleanConntrack(family, state.applied, model, changed);
    state.applied = model;
    if (full) {
      state.needFullSync = false;
      state.lastFullSync = start;
    }
    for (const [table, owned] of state.written!) state.rulesPerTable.set(table, owned.ruleCount);

    const seconds = (this.clock.now() - start) / 1000;
    metrics.syncDuration.observe({ip_family: family}, seconds);
    (full ? metrics.syncFullDuration : metrics.syncPartialDuration).observe({ip_family: family}, seconds);
    log.detail(2, 'synced rules', {family, kind: full ? 'full' : 'partial', changedServicePorts: changed.size, servicePorts: model.servicePorts.length, seconds});
    return {family, kind: full ? 'full' : 'partial', changedServicePorts: changed.size, drift};
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

/** declaredChainCount: the chains a restore input declares (":CHAIN" lines). */
function declaredChainCount(input: string): number {
  let count = input.startsWith(':') ? 1 : 0;
  for (let at = input.indexOf('\n:'); at >= 0; at = input.indexOf('\n:', at + 2)) count++;
  return count;
}

const wholeTableCache = '-Z';

/** The size of the strings a full sync's input is read back in (see FullWriteReader). */
const decodedPieceBytes = 32 * 1024;

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
 * chainsWritten: what a partial write left in the chains its input declares, from what InputSpelling
 * made of it; undefined when the input also replaced chains that are not the proxy's (their rules
 * are not followed).
 */
function chainsWritten(input: string, written: Map<IptablesTable, OwnedRules>, writtenAt: number): WrittenRules | undefined {
  const tables: ChainsWritten[] = [];
  for (const [table, declared] of declaredChains(input)) {
    const owned = written.get(table);
    if (!owned || [...declared].some((chain) => !isOwnedChain(table, chain))) return undefined;
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
  for (const owned of existing.values()) for (const rule of owned.kubeJumps ?? owned.jumpRules) present.add(`${owned.table} ${ruleWords(rule).join(' ')}`);
  return jumps.filter((jump) => !present.has(`${jump.table} ${['-A', jump.chain, ...jump.rule].join(' ')}`));
}

/**
 * withJumpRules adds the missing jump rules to the restore input, at the end of their table's
 * part: in the same atomic write as the chains they lead to, once those are filled, and without a
 * separate iptables command per rule (each one reads the whole table on iptables-nft).
 */
export function withJumpRules(input: string, jumps: JumpRule[]): string {
  let text = input;
  for (const table of new Set(jumps.map((jump) => jump.table))) text = beforeCommit(text, table, jumpRuleLines(jumps, table));
  return text;
}

/** jumpRuleLines: the jump rules of `table` as iptables-restore commands. */
function jumpRuleLines(jumps: JumpRule[], table: IptablesTable): string[] {
  return jumps.filter((jump) => jump.table === table).map((jump) => `${jump.position === 'prepend' ? '-I' : '-A'} ${jump.chain} ${jump.rule.map(restoreWord).join(' ')}`);
}

/** withDeletedChains flushes and deletes `chains` of `table` at the end of that table's part of the input. */
export function withDeletedChains(input: string, table: IptablesTable, chains: string[]): string {
  if (chains.length === 0) return input;
  return beforeCommit(input, table, [...chains.map((chain) => `:${chain} - [0:0]`), ...chains.map((chain) => `-X ${chain}`)]);
}

function beforeCommit(input: string, table: IptablesTable, lines: string[]): string {
  const start = input.indexOf(`*${table}\n`);
  if (start < 0) return `${input}*${table}\n${lines.join('\n')}\nCOMMIT\n`;
  const commit = input.indexOf('\nCOMMIT\n', start);
  return `${input.slice(0, commit + 1)}${lines.join('\n')}\n${input.slice(commit + 1)}`;
}

function restoreWord(word: string): string {
  return /[\s"]/.test(word) || word === '' ? `"${word.replace(/"/g, '\\"')}"` : word;
}
