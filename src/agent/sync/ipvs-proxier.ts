// IpvsProxier: ipvs mode, as kube-proxy's (pkg/proxy/ipvs). Each sync renders the node's desired
// state per family (core/ipvs) and writes only the difference to what the kernel holds
// (planIpvsSync): `ipset restore` for set entries, the small iptables layer with
// `iptables-restore --noflush`, `ip -batch` for kube-ipvs0's addresses, and `ipvsadm -R` for
// virtual and real servers (ipvsadm -R adds to the table; ipvsadm-restore would clear it first).
// A full sync, at start, every syncPeriod and after any failure, compares with the state read
// from the kernel (repairing drift); the syncs between compare with what the last sync wrote.
// A real server whose endpoint went away drains: weight 0 while `ipvsadm -Lnc` shows live
// connections to it, deleted once it has none (at once for UDP and SCTP, as kube-proxy does) or
// when the drain bound passes.
import {
  diffIpvs,
  ipvsIptablesChains,
  planIpvsSync,
  realServerKey,
  renderIpvs,
  type IpvsState,
  virtualServerKey,
} from '../../core/ipvs/index.ts';
import {
  changedServicePorts,
  cidrContains,
  type IPFamily,
  joinHostPort,
  type ModelOptions,
  parseCIDR,
  parseIP,
  type ProxyModel,
  ProxyModelBuilder,
} from '../../core/model/index.ts';
import type {Host} from '../host/host.ts';
import {readOwnedTable} from './cleanup.ts';
import {planConntrackCleanup} from './conntrack-cleanup.ts';
import {
  changeBoundAddresses,
  ensureDummyDevice,
  ipvsSysctls,
  type IpvsSettings,
  liveConnections,
  missingIpvsJumpRules,
  readIpvsKernelState,
  setIpvsTimeouts,
  setSysctls,
  withJumpRules,
} from './ipvs-host.ts';
import {removeNftablesTables} from './nftables-proxier.ts';
import {cleanupRestoreInput} from './owned-rules.ts';
import type {ClusterObjects} from '../watch/cluster-objects.ts';
import type {RunReason} from './runner.ts';
import {type FamilySyncState, ProxierBase, type ProxierBaseOptions} from './proxier-base.ts';
import {deleteConntrackEntries} from './sync-bookkeeping.ts';
import type {FamilySyncResult} from './types.ts';
import {errorText} from '../../core/error-text.ts';

export interface IpvsProxierOptions extends ProxierBaseOptions {
  host: Host;
  objects: ClusterObjects;
  /** Everything buildProxyModel needs except the family. */
  model: Omit<ModelOptions, 'family'>;
  ipvs: IpvsSettings;
  /** Longest drain of a removed real server that still has connections (default 15 min). */
  drainTimeout?: number;
  /** How soon a sync checks draining real servers again (default min(syncPeriod, 5 s)). */
  drainCheckPeriod?: number;
}

interface FamilyState extends FamilySyncState {
  /** What the kernel holds after the last successful write (draining real servers at weight 0). */
  written?: IpvsState;
  /** Draining real servers (realServerKey) and when their drain began. */
  draining: Map<string, number>;
}

export class IpvsProxier extends ProxierBase<FamilyState> {
  readonly #options: IpvsProxierOptions;
  readonly #excluded: NonNullable<ReturnType<typeof parseCIDR>>[];
  #drainTimer: unknown;
  #stopped = false;

  constructor(options: IpvsProxierOptions) {
    super(options, (family) => ({builder: new ProxyModelBuilder({...options.model, family}), needFullSync: true, draining: new Map()}));
    this.#options = options;
    this.#excluded = options.ipvs.excludeCIDRs.map(parseCIDR).filter((cidr) => cidr !== undefined);
  }

  /** start prepares the node (kube-ipvs0, sysctls, timeouts), removes the other modes' rules and starts the runner. */
  async start(): Promise<void> {
    const {host, log, families, ipvs} = this.#options;
    await ensureDummyDevice(host, log);
    await setSysctls(host, ipvsSysctls(ipvs, families), log);
    try {
      await setIpvsTimeouts(host, ipvs, log);
    } catch (error) {
      log.error('cannot set ipvs timeouts', {reason: errorText(error)});
    }
    await removeNftablesTables(host, families, log);
    await this.#removeIptablesModeChains();
    this.startRunner();
  }

  override async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#drainTimer !== undefined) this.clock.clearTimer(this.#drainTimer);
    this.#drainTimer = undefined;
    await super.stop();
  }

  /** The real servers draining now (weight 0, waiting for their connections to end), per family. */
  draining(): Map<IPFamily, string[]> {
    return new Map([...this.families].map(([family, state]) => [family, [...state.draining.keys()].sort()]));
  }

  /** syncRules is one sync of every family (the runner's function; tests call it directly). */
  override async syncRules(reason: RunReason = {requested: true, periodic: false, retry: false}): Promise<FamilySyncResult[]> {
    try {
      return await super.syncRules(reason);
    } finally {
      this.#scheduleDrainCheck();
    }
  }

  /** The iptables layer's rules per table, all families together. */
  protected ruleTotals(): {filter: number; nat: number} {
    const totals = {filter: 0, nat: 0};
    for (const state of this.families.values()) {
      if (!state.written) continue;
      let table: 'nat' | 'filter' | undefined;
      for (const line of state.written.iptables.split('\n')) {
        if (line === '*nat' || line === '*filter') table = line.slice(1) as 'nat' | 'filter';
        else if (table && line.startsWith('-A ')) totals[table]++;
      }
    }
    return totals;
  }

  /** The iptables layer's rule counts, as iptables mode's gauge shows them. */
  protected override syncSucceeded(): void {
    const totals = this.ruleTotals();
    for (const table of ['nat', 'filter'] as const) this.#options.metrics.iptablesRules.set({table}, totals[table]);
  }

  protected async syncFamily(family: IPFamily, model: ProxyModel, reason: RunReason): Promise<FamilySyncResult> {
    const {host, metrics, log} = this.#options;
    const state = this.families.get(family)!;
    const start = this.clock.now();
    // As kube-proxy's ipvs mode, every periodic sync compares with the kernel.
    const full = state.needFullSync || state.written === undefined || reason.periodic;
    const changed = changedServicePorts(state.applied, model);
    if (!full && changed.size === 0 && state.draining.size === 0) {
      log.detail(3, 'ipvs state up to date', {family});
      return {family, kind: 'unchanged', changedServicePorts: 0, drift: false};
    }

    const desired = renderIpvs(model, {scheduler: this.#options.ipvs.scheduler});
    let drift = false;
    let changes = 0;
    try {
      let applied: IpvsState;
      if (full) {
        applied = this.#ours(await readIpvsKernelState(host, family));
        if (reason.periodic && state.written && changed.size === 0) {
          const difference = diffIpvs(state.written, applied);
          if (!difference.equal) {
            drift = true;
            metrics.driftRepairs.inc({ip_family: family});
            const lines = difference.text.split('\n').filter((line) => /^[+-](?![+-])/.test(line));
            log.warn('ipvs state changed behind our back; rewriting it', {
              family,
              drift: lines.slice(0, 6).join('; ') + (lines.length > 6 ? `; ... (${lines.length - 6} more)` : ''),
            });
          }
        }
      } else {
        applied = state.written!;
      }
      const drained = await this.#drained(family, state, desired, applied, start);
      const plan = planIpvsSync(desired, withWeightZero(applied, drained), {drained});
      changes = plan.changes;
      log.detail(5, 'ipvs sync plan', {
        family,
        ipset: plan.ipset,
        ipvsadm: plan.ipvsadm,
        bind: plan.bind.join(','),
        unbind: plan.unbind.join(','),
      });

      // Sets first: the iptables layer matches them. Addresses before virtual servers: the node
      // must take packets for an address before IPVS serves it.
      if (plan.ipset) await host.ipset(['restore'], plan.ipset);
      const layer = full
        ? withJumpRules(desired.iptables, missingIpvsJumpRules(applied.iptables))
        : desired.iptables !== state.written!.iptables
          ? desired.iptables
          : '';
      if (layer) await host.iptablesRestore(family, layer, {noflush: true});
      await changeBoundAddresses(host, family, plan.bind, plan.unbind);
      if (plan.ipvsadm) await host.ipvsadm(['-R'], plan.ipvsadm);

      for (const key of plan.draining)
        if (!state.draining.has(key)) log.detail(1, 'real server draining at weight 0', {family, realServer: key});
      for (const key of drained) log.detail(1, 'real server deleted', {family, realServer: key});
      state.draining = new Map(plan.draining.map((key) => [key, state.draining.get(key) ?? start]));
      state.written = withDraining(desired, plan.draining);
    } catch (error) {
      metrics.restoreFailures.inc();
      if (!full) metrics.partialRestoreFailures.inc();
      state.needFullSync = true;
      throw new Error(`${family} ${full ? 'full' : 'partial'} sync: ${errorText(error)}`, {cause: error});
    }

    await deleteConntrackEntries(this.#options, family, planConntrackCleanup(state.applied, model));
    state.applied = model;
    if (full) state.needFullSync = false;
    return this.familySynced(
      {family, start, full, changedServicePorts: changed.size, model, drift},
      {message: 'synced ipvs state', detail: {changes}},
    );
  }

  /** #ours leaves out virtual servers in excludeCIDRs (another program's): never changed or deleted, as in kube-proxy. */
  #ours(state: IpvsState): IpvsState {
    if (this.#excluded.length === 0) return state;
    return {
      ...state,
      virtualServers: state.virtualServers.filter((server) => {
        const ip = parseIP(server.address);
        return !(ip && this.#excluded.some((cidr) => cidrContains(cidr, ip)));
      }),
    };
  }

  /**
   * #drained: the real servers of `applied` that are no longer desired and may be deleted now: no
   * live connection in `ipvsadm -Lnc`, UDP or SCTP (kube-proxy does not drain those), or draining
   * longer than the bound.
   */
  async #drained(family: IPFamily, state: FamilyState, desired: IpvsState, applied: IpvsState, now: number): Promise<Set<string>> {
    const wanted = new Map(
      desired.virtualServers.map((server) => [
        virtualServerKey(server),
        new Set(server.realServers.map((real) => joinHostPort(real.address, real.port))),
      ]),
    );
    const removed: {key: string; protocol: string}[] = [];
    for (const server of applied.virtualServers) {
      const keep = wanted.get(virtualServerKey(server));
      if (!keep) continue;
      for (const real of server.realServers)
        if (!keep.has(joinHostPort(real.address, real.port))) removed.push({key: realServerKey(server, real), protocol: server.protocol});
    }
    const drained = new Set<string>();
    if (removed.length === 0) return drained;
    const bound = this.#options.drainTimeout ?? 15 * 60_000;
    let live: Map<string, number> | undefined;
    if (removed.some((entry) => entry.protocol === 'TCP')) {
      try {
        live = liveConnections(await this.#options.host.ipvsadm(['-Lnc']));
      } catch (error) {
        this.#options.log.error('cannot list ipvs connections; draining real servers stay at weight 0', {family, reason: errorText(error)});
      }
    }
    for (const {key, protocol} of removed) {
      const since = state.draining.get(key);
      if (protocol !== 'TCP' || (live !== undefined && !live.has(key)) || (since !== undefined && now - since >= bound)) drained.add(key);
    }
    return drained;
  }

  /** While real servers drain, a sync comes back soon to delete the ones that have drained. */
  #scheduleDrainCheck(): void {
    const draining = [...this.families.values()].some((state) => state.draining.size > 0);
    if (this.#stopped || !draining || this.#drainTimer !== undefined) return;
    const period = this.#options.drainCheckPeriod ?? Math.min(this.#options.syncPeriod, 5000);
    this.#drainTimer = this.clock.setTimer(() => {
      this.#drainTimer = undefined;
      this.runner.run();
    }, period);
  }

  /**
   * Removes iptables mode's chains (per-service chains, KUBE-NODEPORTS, ...) and the jumps to them,
   * as kube-proxy cleans up the other modes at start. Chains ipvs mode writes too keep their rules
   * until the first sync replaces them, so traffic through them never stops.
   */
  async #removeIptablesModeChains(): Promise<void> {
    const {host, log} = this.#options;
    for (const family of this.families.keys()) {
      for (const table of ['nat', 'filter', 'mangle'] as const) {
        const owned = await readOwnedTable(host, log, family, table, 'cannot read iptables table; nothing to clean there');
        if (!owned) continue;
        const kept = new Set<string>(table === 'mangle' ? [] : ipvsIptablesChains[table]);
        const chains = owned.chains.filter((chain) => !kept.has(chain));
        if (chains.length === 0) continue;
        const removed = new Set(chains);
        // Every rule outside the removed chains that leads into one of them goes first.
        const leading = owned.rules.filter((rule) => {
          const chain = /^-A\s+(\S+)/.exec(rule)?.[1];
          const target = /\s-[jg]\s+(\S+)/.exec(rule)?.[1];
          return chain !== undefined && !removed.has(chain) && target !== undefined && removed.has(target);
        });
        const input = cleanupRestoreInput({table, chains, rules: [], jumpRules: leading});
        try {
          await host.iptablesRestore(family, input, {noflush: true});
          log.info('removed iptables mode chains', {family, table, chains: chains.length});
        } catch (error) {
          log.error('cannot remove iptables mode chains', {family, table, reason: errorText(error)});
        }
      }
    }
  }
}

/** withWeightZero: the applied state with the drained real servers at weight 0, so that the plan deletes them. */
function withWeightZero(applied: IpvsState, drained: Set<string>): IpvsState {
  if (drained.size === 0) return applied;
  return {
    ...applied,
    virtualServers: applied.virtualServers.map((server) => ({
      ...server,
      realServers: server.realServers.map((real) => (drained.has(realServerKey(server, real)) ? {...real, weight: 0} : real)),
    })),
  };
}

/** withDraining: the desired state plus the real servers left draining at weight 0, i.e. what the kernel holds after the write. */
function withDraining(desired: IpvsState, draining: string[]): IpvsState {
  if (draining.length === 0) return desired;
  const byServer = new Map<string, {address: string; port: number}[]>();
  for (const key of draining) {
    const [server, real] = key.split(' -> ');
    const match = /^\[?(.*?)\]?:(\d+)$/.exec(real)!;
    const list = byServer.get(server) ?? [];
    list.push({address: match[1], port: Number(match[2])});
    byServer.set(server, list);
  }
  const text = (real: {address: string; port: number}) => joinHostPort(real.address, real.port);
  return {
    ...desired,
    virtualServers: desired.virtualServers.map((server) => {
      const extra = byServer.get(virtualServerKey(server));
      if (!extra) return server;
      const realServers = [...server.realServers, ...extra.map((real) => ({...real, weight: 0}))].sort((a, b) =>
        text(a) < text(b) ? -1 : text(a) > text(b) ? 1 : 0,
      );
      return {...server, realServers};
    }),
  };
}
