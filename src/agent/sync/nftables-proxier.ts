// NftablesProxier: keeps table `ip kube-proxy` / `ip6 kube-proxy` equal to what the cluster's
// Services and EndpointSlices ask for, as kube-proxy's nftables mode does. Each sync is one
// `nft -f` transaction per family: full at start (recreating the table, which also removes what
// another proxy left in it), after any failure, after drift and at least hourly; otherwise
// partial, touching only the chains and elements of changed service ports. Chains a sync leaves
// unused are flushed at once and deleted by a later sync, in a transaction of their own.
// At start the proxy's iptables chains and jump rules (iptables mode) are removed, as kube-proxy
// cleans up the other modes when it starts.
import {changedServicePorts, type IPFamily, type ModelOptions, type ProxyModel, ProxyModelBuilder} from '../../core/model/index.ts';
import {diffNftables} from '../../core/nftables/diff.ts';
import {type NftRuleset, parseNftablesJson, parseNftablesScript} from '../../core/nftables/parse.ts';
import {
  deleteStaleChains,
  nftablesCleanupScript,
  nftablesRuleCount,
  type NftablesState,
  renderNftables,
  renderNftablesSync,
} from '../../core/nftables/render.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {planConntrackCleanup} from './conntrack-cleanup.ts';
import {cleanupRestoreInput, readOwnedRules} from './owned-rules.ts';
import type {ClusterObjects} from '../watch/cluster-objects.ts';
import {fullSyncPeriod} from './proxier.ts';
import type {RunReason} from './runner.ts';
import {type FamilySyncState, ProxierBase, type ProxierBaseOptions} from './proxier-base.ts';
import {deleteConntrackEntries} from './sync-bookkeeping.ts';
import type {FamilySyncResult, RulesWriteListener} from './types.ts';
import {errorText} from '../../core/error-text.ts';

export interface NftablesProxierOptions extends ProxierBaseOptions {
  host: Host;
  objects: ClusterObjects;
  /** Everything the model builder needs except the family. */
  model: Omit<ModelOptions, 'family'>;
  /** The cluster's service CIDRs now, read at each sync: addresses in them that are no ClusterIP are dropped. */
  serviceCIDRs?: () => string[];
  /** The node's addresses, for nodePortAddresses given as CIDRs (default: the model's node IPs). */
  nodeAddresses?: () => Promise<string[]>;
}

interface FamilyState extends FamilySyncState {
  /** What the last successful sync left in the table; undefined: unknown, recreate it. */
  nft?: NftablesState;
  lastFullSync?: number;
  rules: number;
  /**
   * When the last reading that matched what was written started, or the write that recreated the
   * table: from then on the table changed only by the proxier's writes unless a listener saw
   * otherwise. Undefined after a failed write.
   */
  verifiedAt?: number;
}

/** The drift check reads the table at least this often (ms) even when nothing else seems to have changed it. */
const driftReadAtLeastEvery = 60 * 60 * 1000;

/** nftFamily: the nft table family of an IP family. */
export function nftFamily(family: IPFamily): 'ip' | 'ip6' {
  return family === 'IPv6' ? 'ip6' : 'ip';
}

/**
 * removeNftablesTables deletes nftables mode's tables (iptables mode calls it at start, as
 * kube-proxy removes the other modes' rules). A missing table is not an error.
 */
export async function removeNftablesTables(host: Host, families: IPFamily[], log: Logger): Promise<void> {
  for (const family of families) {
    try {
      await host.nft(['-f', '-'], nftablesCleanupScript(family));
      log.detail(1, 'removed nftables mode table, if any', {table: `${nftFamily(family)} kube-proxy`});
    } catch (error) {
      log.error('cannot remove nftables mode table', {table: `${nftFamily(family)} kube-proxy`, reason: errorText(error)});
    }
  }
}

export class NftablesProxier extends ProxierBase<FamilyState> {
  readonly #options: NftablesProxierOptions;
  /** The node's addresses as read for the sync in progress (nodePortAddresses as CIDRs). */
  #nodeAddressesThisSync: string[] | undefined;
  #appliedServiceCIDRs: string[] = [];
  readonly #writeListeners = new Set<RulesWriteListener>();
  /** Transactions started, and whether one runs: a listing that overlapped one is not told. */
  #writes = 0;
  #writing = false;

  constructor(options: NftablesProxierOptions) {
    super(options, (family) => ({builder: new ProxyModelBuilder({...options.model, family}), needFullSync: true, rules: 0}));
    this.#options = options;
  }

  /** start removes iptables mode's rules and starts the runner; the first sync waits for the initial lists. */
  async start(): Promise<void> {
    await this.#cleanupIptablesMode();
    this.startRunner();
  }

  /** onWrite tells `listener` of every transaction (what it left is not followed: undefined) and of each listing the drift check takes. */
  onWrite(listener: RulesWriteListener): () => void {
    this.#writeListeners.add(listener);
    return () => this.#writeListeners.delete(listener);
  }

  /**
   * readApplied lists the table as `nft -j list table` prints it (an empty listing when there is none
   * yet); the listing is the caller's, listeners are not told of it.
   */
  async readApplied(family: IPFamily): Promise<string> {
    try {
      return await this.#list(family, false);
    } catch {
      // No table yet: nothing applied.
      return '{"nftables": []}';
    }
  }

  /** The table as `nft -j list table` prints it; listeners are told (`tell`) of a listing no transaction overlapped. */
  async #list(family: IPFamily, tell = true): Promise<string> {
    const startedAt = this.clock.now();
    const writes = this.#writes;
    const idle = !this.#writing;
    const listed = await this.#options.host.nft(['-j', 'list', 'table', nftFamily(family), 'kube-proxy']);
    if (tell && idle && writes === this.#writes) this.#tell((listener) => listener.reading?.(family, listed, startedAt));
    return listed;
  }

  #tell(call: (listener: RulesWriteListener) => void): void {
    for (const listener of this.#writeListeners) {
      try {
        call(listener);
      } catch (error) {
        this.#options.log.error('rules write listener failed', {reason: errorText(error)});
      }
    }
  }

  /**
   * One nft transaction, with the listeners told before and after it; `committed` runs once it
   * is, before they are told (the model it wrote is then the applied one for whoever reads).
   */
  async #write(family: IPFamily, script: string, committed?: () => void): Promise<void> {
    this.#writes++;
    this.#writing = true;
    this.#tell((listener) => listener.started(family));
    try {
      await this.#options.host.nft(['-f', '-'], script);
      committed?.();
    } finally {
      this.#writing = false;
      this.#tell((listener) => listener.ended(family, undefined));
    }
  }

  /** The service CIDRs the last successful write dropped the unused addresses of. */
  get appliedServiceCIDRs(): string[] {
    return this.#appliedServiceCIDRs;
  }

  /** nftables has no filter/nat split of the proxy's rules: every rule counts under "nat". */
  protected ruleTotals(): {filter: number; nat: number} {
    let total = 0;
    for (const state of this.families.values()) total += state.rules;
    return {filter: 0, nat: total};
  }

  protected async syncFamily(family: IPFamily, model: ProxyModel, reason: RunReason): Promise<FamilySyncResult> {
    const nodeAddresses = this.#nodeAddressesThisSync;
    const {host, metrics, log} = this.#options;
    const state = this.families.get(family)!;
    const start = this.clock.now();
    let full =
      state.needFullSync || state.nft === undefined || state.lastFullSync === undefined || start - state.lastFullSync >= fullSyncPeriod;
    const renderOptions = {serviceCIDRs: this.#options.serviceCIDRs?.(), nodeAddresses};

    let drift = false;
    if (!full && reason.periodic && state.applied) {
      if (await this.#untouchedSinceVerified(state, start))
        log.detail(3, 'drift check: only our writes changed the table since it was read', {family});
      else {
        this.wholeTablesTouched = true;
        const {difference, readAt} = await this.#drift(family, state.applied, renderOptions);
        if (difference) {
          drift = true;
          metrics.driftRepairs.inc({ip_family: family});
          log.warn('rules changed behind our back; rewriting them', {family, drift: difference});
          full = true;
        } else state.verifiedAt = readAt;
      }
    }

    const changed = changedServicePorts(state.applied, model);
    if (!full && changed.size === 0) {
      log.detail(3, 'rules up to date', {family});
      await this.#deleteStaleChains(family, state);
      return {family, kind: 'unchanged', changedServicePorts: 0, drift};
    }

    if (!full) await this.#deleteStaleChains(family, state);
    else this.wholeTablesTouched = true;
    // A full sync after a failure or at start does not know what the table holds: recreate it.
    const previous = state.applied;
    const recreateTable = full && (state.nft === undefined || drift);
    const writeStartedAt = this.clock.now();
    const sync = renderNftablesSync(model, {
      ...renderOptions,
      ...(full ? {existing: state.nft, recreateTable} : {existing: state.nft, changedServicePorts: changed}),
      now: this.clock.now(),
    });
    log.detail(5, 'nft transaction', {family, script: sync.script});
    try {
      if (sync.script !== '') await this.#write(family, sync.script, () => (state.applied = model));
    } catch (error) {
      metrics.restoreFailures.inc();
      if (!full) metrics.partialRestoreFailures.inc();
      state.needFullSync = true;
      state.nft = undefined;
      state.verifiedAt = undefined;
      throw new Error(`${family} ${full ? 'full' : 'partial'} sync: ${errorText(error)}`, {cause: error});
    }
    // A recreated table holds exactly what was written (one transaction).
    if (recreateTable) state.verifiedAt = writeStartedAt;
    state.nft = sync.state;
    this.#appliedServiceCIDRs = renderOptions.serviceCIDRs ?? [];

    await this.#cleanConntrack(family, previous, model);
    state.applied = model;
    if (full) {
      state.needFullSync = false;
      state.lastFullSync = start;
    }
    state.rules = nftablesRuleCount(sync.state);

    return this.familySynced({family, start, full, changedServicePorts: changed.size, model, drift});
  }

  /**
   * Whether the drift check may skip reading the table: a listener (the API's applied state, which
   * follows nft monitor) vouches that nothing but the proxier's own writes changed the ruleset
   * since the table was last found as written, and that was within driftReadAtLeastEvery. Each
   * reading of a large table costs seconds of CPU and hundreds of MiB at its peak.
   */
  async #untouchedSinceVerified(state: FamilyState, now: number): Promise<boolean> {
    const since = state.verifiedAt;
    if (since === undefined || now - since >= driftReadAtLeastEvery) return false;
    for (const listener of this.#writeListeners) if (await listener.untouchedSince?.(since)) return true;
    return false;
  }

  /**
   * #drift compares the table in the kernel with what the applied model asks for (`difference`
   * undefined when equal). The table is read through the API's applied state when it listens, so
   * that a request that comes meanwhile shares the reading and its parse (each peaks at hundreds
   * of MiB at 10,000 services), else listed here.
   */
  async #drift(
    family: IPFamily,
    applied: ProxyModel,
    options: {serviceCIDRs?: string[]; nodeAddresses?: string[]},
  ): Promise<{difference?: string; readAt?: number}> {
    let table: NftRuleset;
    let readAt = this.clock.now();
    try {
      const shared = [...this.#writeListeners].find((listener) => listener.rulesNow);
      if (shared) {
        const known = await shared.rulesNow!(family);
        table = known.rules as NftRuleset;
        readAt = known.readAt;
      } else table = parseNftablesJson(await this.#list(family));
    } catch (error) {
      return {difference: `cannot list the table: ${errorText(error)}`};
    }
    const difference = diffNftables(parseNftablesScript(renderNftables(applied, options)), table);
    if (difference.equal) return {readAt};
    const lines = difference.text.trim().split('\n');
    return {difference: lines.slice(0, 6).join('; ') + (lines.length > 6 ? `; ... (${lines.length - 6} more lines)` : '')};
  }

  /** Deletes the chains that went stale a second or more ago; a failure only delays it. */
  async #deleteStaleChains(family: IPFamily, state: FamilyState): Promise<void> {
    if (!state.nft) return;
    const due = deleteStaleChains(state.nft, this.clock.now());
    if (!due) return;
    try {
      await this.#write(family, due.script);
      state.nft = due.state;
      this.#options.log.detail(2, 'deleted stale chains', {family, chains: state.nft.staleChains.size});
    } catch (error) {
      this.#options.log.error('cannot delete stale chains; will retry', {family, reason: errorText(error)});
    }
  }

  protected override async prepareSync(): Promise<void> {
    this.#nodeAddressesThisSync = await this.#nodeAddresses();
  }

  async #nodeAddresses(): Promise<string[] | undefined> {
    const wanted = this.#options.model.config?.nodePortAddresses ?? [];
    if (!this.#options.nodeAddresses || !wanted.some((entry) => entry !== 'primary')) return undefined;
    try {
      return await this.#options.nodeAddresses();
    } catch (error) {
      this.#options.log.error('cannot read the node addresses; NodePorts on the node IPs only', {reason: errorText(error)});
      return undefined;
    }
  }

  /** Removes iptables mode's chains and jump rules (nat, filter, mangle), keeping foreign ones. */
  async #cleanupIptablesMode(): Promise<void> {
    const {host, log} = this.#options;
    for (const family of this.families.keys()) {
      for (const table of ['nat', 'filter', 'mangle'] as IptablesTable[]) {
        let input: string;
        try {
          input = cleanupRestoreInput(readOwnedRules(table, await host.iptablesSave(family, table)));
        } catch (error) {
          log.detail(1, 'cannot read iptables table; nothing to clean there', {family, table, reason: errorText(error)});
          continue;
        }
        if (input === '') continue;
        try {
          await host.iptablesRestore(family, input, {noflush: true});
          log.info('removed iptables mode rules', {family, table});
        } catch (error) {
          log.error('cannot remove iptables mode rules', {family, table, reason: errorText(error)});
        }
      }
    }
  }

  async #cleanConntrack(family: IPFamily, previous: ProxyModel | undefined, next: ProxyModel): Promise<void> {
    await deleteConntrackEntries(this.#options, family, planConntrackCleanup(previous, next));
  }
}
