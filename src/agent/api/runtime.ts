// The agent's answers to the plugin (AgentApiHandlers) from the proxier's state: desired rules are
// rendered from the model whose rules the proxier wrote; applied rules are read back from the
// kernel (cached until the ruleset changes); diff and trace work on those two; probe makes real
// connections; sync asks the proxier's runner and waits for the sync it starts.
import {isIP} from 'node:net';
import type {IPFamily, ProxyModel} from '../../core/model/index.ts';
import type {DiffGroup, DiffResult, ProbeParams, ProbeResult, RulesResult, StatusResult, SyncEvent, SyncKind, SyncResult as SyncAnswer, TraceAnswer} from '../../protocol/methods.ts';
import {type Host, savedTables} from '../host/host.ts';
import type {Logger} from '../log.ts';
import type {RulesWriteListener, SyncOutcome} from '../sync/proxier.ts';
import {releaseGarbage} from '../sync/sync-bookkeeping.ts';
import {type AppliedRules, AppliedState} from '../applied/applied-state.ts';
import type {AgentApiHandlers} from './handlers.ts';
import {readNodeAddresses} from './node-addresses.ts';
import {probeHere, probeInNetns} from './probe.ts';
import type {RulesetChanges} from '../applied/ruleset-changes.ts';
import type {ParsedRules, RulesBackend, RulesDiff} from './rules/backend.ts';

/** ProxierView: what the runtime needs of the proxier (IptablesProxier has it). */
export interface ProxierView {
  appliedModels(): Map<IPFamily, ProxyModel>;
  status(): {initialized: boolean};
  requestSync(options?: {full?: boolean}): void;
  onSync(listener: (outcome: SyncOutcome) => void): () => void;
  /** Tells of each write of rules and what it left, and of its readings (the iptables and nftables proxiers do): the applied state then follows them without reading the kernel. */
  onWrite?(listener: RulesWriteListener): () => void;
  /** Reads the kernel's rules as the backend parses them, with the proxier's own reader. */
  readApplied?(family: IPFamily): Promise<string>;
}

export interface AgentRuntimeOptions {
  nodeName: string;
  /** The agent's release. */
  version: string;
  families: IPFamily[];
  proxier: ProxierView;
  /** Reads the applied rules; its netns is the node's. */
  host: Host;
  backend: RulesBackend;
  changes: RulesetChanges;
  log: Logger;
  /** Same clock as the proxier's (ms). */
  now?: () => number;
  /** The node's addresses; default `ip -j address` in the host's netns. */
  nodeAddresses?: () => Promise<string[]>;
  /** Default: connections from the netns asked for, else the node's. */
  probe?: (params: ProbeParams, netns: string | undefined) => Promise<ProbeResult>;
  /** Longest wait for a sync the plugin asked for (default 60 s). */
  syncTimeoutMs?: number;
}

export interface AgentRuntime extends AgentApiHandlers {
  close(): void;
}


interface DriftCheck {
  key: string;
  /** The applied rules the check compared, per family. */
  readings: AppliedRules[];
  services: string[];
  checkedAt: string;
}

const addressesTtlMs = 5000;

function syncKind(outcome: SyncOutcome): SyncKind {
  return outcome.results.some((result) => result.kind === 'full') ? 'full' : 'partial';
}

function toEvent(outcome: SyncOutcome): SyncEvent {
  const event: SyncEvent = {at: new Date(outcome.startedAt).toISOString(), durationMs: outcome.durationMs, kind: syncKind(outcome), ok: outcome.ok};
  if (outcome.ok) event.rules = outcome.rules;
  else event.error = outcome.error ?? 'unknown error';
  return event;
}

/** Rules of several families in one text: each under a header line naming the family. */
function joinFamilies(parts: {family: IPFamily; text: string}[]): string {
  if (parts.length === 1) return parts[0].text;
  return parts.map((part) => `# ${part.family}\n${part.text}`).join('\n');
}

function driftedServices(groups: DiffGroup[]): string[] {
  return groups.filter((group) => group.added.length > 0 || group.removed.length > 0).map((group) => group.servicePort || '(rules of no service)');
}

export function createAgentRuntime(options: AgentRuntimeOptions): AgentRuntime {
  const {nodeName, version, families, proxier, host, backend, changes, log} = options;
  const now = options.now ?? Date.now;
  const syncTimeoutMs = options.syncTimeoutMs ?? 60_000;
  const nodeAddresses = options.nodeAddresses ?? (() => readNodeAddresses(host.netns));
  const probe = options.probe ?? ((params, netns) => (netns ? probeInNetns(netns, params.target, params.count) : probeHere(params.target, params.count)));

  // The kernel's rules as the proxier publishes them (its writes and drift-check readings); a
  // reading of its own is taken only by a proxier that does not publish them (ipvs).
  const applied = new AppliedState({
    read: proxier.readApplied
      ? (family) => proxier.readApplied!(family)
      : async (family) => (backend.readApplied ? backend.readApplied(host, family) : savedTables(await host.iptablesSave(family), ['filter', 'nat'])),
    parse: (text) => backend.parse(text),
    patch: backend.patch && ((rules, tables) => backend.patch!(rules, tables)),
    format: backend.format && ((rules) => backend.format!(rules)),
    textOf: backend.textOf && ((rules) => backend.textOf!(rules)),
    changes,
    now,
    // Only a proxier that says what it wrote can vouch for its writers' changes.
    spawns: proxier.onWrite && host.onSpawn?.bind(host),
  });
  const stopFollowingProxier = proxier.onWrite?.(applied);
  let lastOutcome: SyncOutcome | undefined;
  let everSynced = false;
  let failures = 0;
  let drift: DriftCheck | undefined;
  let addresses: {list: string[]; at: number} | undefined;
  const listeners = new Set<(event: SyncEvent) => void>();

  const stopWatchingSyncs = proxier.onSync((outcome) => {
    lastOutcome = outcome;
    if (outcome.ok) everSynced = true;
    else failures++;
    const event = toEvent(outcome);
    for (const listener of listeners) listener(event);
    if (outcome.ok) warmUp();
  });

  // After a sync, prepare what the next trace or diff needs (desired rules, a fresh reading of the
  // kernel, the drift check), so that the plugin does not wait seconds for it on a large node.
  let warming: Promise<void> | undefined;
  let warmAgain = false;
  const warmUp = (): void => {
    if (warming) {
      warmAgain = true;
      return;
    }
    warming = (async () => {
      await new Promise((resolve) => setImmediate(resolve));
      await currentDrift();
    })()
      .catch((error: Error) => log.detail(2, 'agent api: preparing rules after a sync failed', {reason: error.message}))
      .finally(() => {
        warming = undefined;
        if (warmAgain && !closed) {
          warmAgain = false;
          warmUp();
        }
      });
  };
  let closed = false;

  const models = (): [IPFamily, ProxyModel][] => {
    const byFamily = proxier.appliedModels();
    const present = families.filter((family) => byFamily.has(family)).map((family): [IPFamily, ProxyModel] => [family, byFamily.get(family)!]);
    if (present.length === 0) throw new Error(`node ${nodeName} has no rules yet: the agent has not finished its first sync (it waits for the lists of services, endpoint slices and its node)`);
    return present;
  };

  // Rendered when asked, not kept: at 10,000 services the text alone is 31 MB, and the answers
  // that need it most (the drift check, and trace's drift question from it) are kept instead.
  const desiredFor = (model: ProxyModel): ParsedRules => backend.parse(backend.render(model));

  const readApplied = (family: IPFamily): Promise<AppliedRules> =>
    applied.get(family).catch((error: Error) => {
      throw new Error(`cannot read the rules on node ${nodeName}: ${error.message}`);
    });

  // At 10,000 services a diff takes seconds, filtered to one service or not: compute the whole
  // diff once per (reading of the kernel, model) and answer trace's drift question from it.
  const fullDiffs = new WeakMap<AppliedRules, {model: ProxyModel; result: RulesDiff}>();
  const fullDiff = (model: ProxyModel, current: AppliedRules): RulesDiff => {
    const known = fullDiffs.get(current);
    if (known && known.model === model) return known.result;
    const result = backend.diff(desiredFor(model), current.rules);
    fullDiffs.set(current, {model, result});
    // The diff parsed every rule of both sides: give that memory back now, not at V8's leisure;
    // once this request is answered, when nothing on the stack holds the desired rules any more.
    setImmediate(releaseGarbage);
    return result;
  };

  const diffAll = async (service?: string): Promise<DiffResult> => {
    const groups: DiffGroup[] = [];
    const texts: {family: IPFamily; text: string}[] = [];
    let equal = true;
    let readAt = Infinity;
    const readings: AppliedRules[] = [];
    for (const [family, model] of models()) {
      const current = await readApplied(family);
      readings.push(current);
      const result = service ? backend.diff(desiredFor(model), current.rules, service) : fullDiff(model, current);
      equal &&= result.equal;
      groups.push(...result.groups);
      texts.push({family, text: result.text});
      readAt = Math.min(readAt, current.readAt);
    }
    const answer: DiffResult = {equal, groups, text: equal ? '' : joinFamilies(texts.filter((part) => part.text !== '')), readAt: new Date(readAt).toISOString()};
    if (!service) {
      const services = driftedServices(groups);
      if (services.length > 0 && (drift?.services.join() ?? '') !== services.join()) log.warn('agent api: applied rules differ from the desired ones', {services: services.slice(0, 5).join(',')});
      drift = {key: driftKey(), readings, services, checkedAt: answer.readAt};
    }
    return answer;
  };

  // A drift check stays valid while neither the kernel's rules (the cache's readings) nor the desired ones change.
  const driftKey = (): string => `${proxier.appliedModels().size}:${lastOutcome?.startedAt ?? 0}`;
  const driftCurrent = (check: DriftCheck | undefined): check is DriftCheck =>
    check !== undefined && check.key === driftKey() && check.readings.every((reading) => applied.current(reading.family) === reading);

  const currentDrift = async (): Promise<DriftCheck | undefined> => {
    if (driftCurrent(drift)) {
      // Confirms the readings (waits for the change monitor) before trusting the check.
      for (const reading of drift.readings) await readApplied(reading.family);
      if (driftCurrent(drift)) return drift;
    }
    try {
      await diffAll();
    } catch (error) {
      log.detail(2, 'agent api: drift check failed', {reason: (error as Error).message});
    }
    return drift;
  };

  const localAddresses = async (): Promise<string[]> => {
    if (addresses && now() - addresses.at < addressesTtlMs) return addresses.list;
    const list = await nodeAddresses();
    addresses = {list, at: now()};
    return list;
  };

  const waitForSync = (requestedAt: number): Promise<SyncOutcome> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        stop();
        reject(new Error(`no sync finished within ${syncTimeoutMs / 1000} s on node ${nodeName}; the agent's log says why`));
      }, syncTimeoutMs);
      const stop = proxier.onSync((outcome) => {
        // A sync that was already running may not include what the caller wants written.
        if (outcome.startedAt < requestedAt) return;
        clearTimeout(timer);
        stop();
        resolve(outcome);
      });
    });

  return {
    async status(): Promise<StatusResult> {
      const byFamily = proxier.appliedModels();
      const services = new Set<string>();
      const endpoints = new Set<string>();
      for (const model of byFamily.values()) {
        for (const port of model.servicePorts) {
          services.add(`${port.namespace}/${port.serviceName}`);
          for (const endpoint of port.endpoints) endpoints.add(endpoint.key);
        }
      }
      // status answers at once with the last drift check (checkedAt says when); a stale one is
      // redone in the background, since on a large node a check reads the kernel for seconds.
      const check = drift;
      if (byFamily.size > 0 && !driftCurrent(drift)) warmUp();
      const readings = families.map((family) => applied.last(family)?.readAt).filter((at): at is number => at !== undefined);
      return {
        node: nodeName,
        mode: backend.mode,
        version,
        ready: everSynced,
        lastSync: lastOutcome ? {at: new Date(lastOutcome.startedAt).toISOString(), durationMs: lastOutcome.durationMs, kind: syncKind(lastOutcome), ok: lastOutcome.ok} : null,
        services: services.size,
        endpoints: endpoints.size,
        drift: {services: check?.services ?? [], checkedAt: check?.checkedAt ?? null},
        syncFailures: failures,
        rulesReadAt: readings.length > 0 ? new Date(Math.max(...readings)).toISOString() : null,
      };
    },

    async 'rules.desired'(): Promise<RulesResult> {
      const parts = models().map(([family, model]) => ({family, text: backend.render(model)}));
      return {mode: backend.mode, text: joinFamilies(parts), readAt: new Date(now()).toISOString()};
    },

    async 'rules.applied'(): Promise<RulesResult> {
      const parts: {family: IPFamily; text: string}[] = [];
      let readAt = Infinity;
      for (const family of families) {
        const current = await readApplied(family);
        parts.push({family, text: current.text});
        readAt = Math.min(readAt, current.readAt);
      }
      return {mode: backend.mode, text: joinFamilies(parts), readAt: new Date(readAt).toISOString()};
    },

    diff: (params) => diffAll(params.service),

    async trace(params): Promise<TraceAnswer> {
      const family: IPFamily = isIP(params.packet.dstIP) === 6 ? 'IPv6' : 'IPv4';
      if (!families.includes(family)) throw new Error(`node ${nodeName} proxies ${families.join(' and ')} only; ${params.packet.dstIP} is ${family}`);
      const model = models().find(([f]) => f === family)?.[1];
      if (!model) throw new Error(`node ${nodeName} has no ${family} rules yet: its first sync has not finished`);
      const current = await readApplied(family);
      const result = backend.trace(current.rules, params.packet, {localAddresses: await localAddresses()});
      const warnings = [...result.warnings];
      const service = result.servicePort ?? params.service;
      if (params.service && result.servicePort && !`${result.servicePort}:`.startsWith(`${params.service}:`) && result.servicePort !== params.service) {
        warnings.push(`the rules on node ${nodeName} send this packet to ${result.servicePort}, not to ${params.service}`);
      }
      const changed = fullDiff(model, current).groups.filter((group) => group.added.length > 0 || group.removed.length > 0);
      const repair = `see kubectl proxyctl diff ${nodeName}; kubectl proxyctl sync ${nodeName} rewrites them`;
      const ownDrift = service !== undefined && changed.some((group) => group.servicePort === service || group.servicePort.startsWith(`${service}:`));
      if (ownDrift) warnings.push(`the rules applied on node ${nodeName} for ${service} differ from the desired ones: ${repair}`);
      // Rules of no single service (KUBE-SERVICES' last rules, jumps from built-in chains, masquerading) can change any packet's path.
      const sharedDrift = changed.some((group) => group.servicePort === '');
      if (sharedDrift) warnings.push(`rules on node ${nodeName} that belong to no single service differ from the desired ones, so this path may not be what the agent meant: ${repair}`);
      const drifted = ownDrift || sharedDrift;
      return {...result, warnings, readAt: new Date(current.readAt).toISOString(), drifted};
    },

    async probe(params): Promise<ProbeResult> {
      return probe(params, params.from?.netns ?? host.netns);
    },

    async sync(params): Promise<SyncAnswer> {
      if (!proxier.status().initialized) throw new Error(`node ${nodeName} cannot sync yet: the agent is still waiting for the lists of services, endpoint slices and its node`);
      // A partial sync rewrites only changed services: drifted rules need a full one to be repaired.
      const check = await currentDrift();
      const drifted = check?.services.length ?? 0;
      const full = params.full === true || drifted > 0;
      log.detail(2, 'agent api: sync requested', {full, driftedServices: drifted});
      const requestedAt = now();
      const done = waitForSync(requestedAt);
      proxier.requestSync({full});
      const outcome = await done;
      if (!outcome.ok) throw new Error(`the sync on node ${nodeName} failed: ${outcome.error}`);
      return {durationMs: outcome.durationMs, kind: syncKind(outcome), rules: outcome.rules, driftBefore: {services: check?.services ?? [], checkedAt: check?.checkedAt ?? null}};
    },

    onSync(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },

    close() {
      closed = true;
      stopWatchingSyncs();
      listeners.clear();
      stopFollowingProxier?.();
      applied.close();
    },
  };
}
