// The agent's answers to the plugin (AgentApiHandlers) from the proxier's state: desired rules are
// rendered from the model whose rules the proxier wrote; applied rules are read back from the
// kernel (cached until the ruleset changes); diff and trace work on those two; probe makes real
// connections; sync asks the proxier's runner and waits for the sync it starts. This file builds
// what the method handlers (methods/) share and routes each method to its handler.
import type {IPFamily} from '../../core/model/index.ts';
import type {ProbeParams, ProbeResult} from '../../protocol/methods.ts';
import {type Host, savedTables} from '../host/host.ts';
import type {Logger} from '../log.ts';
import type {RulesWriteListener} from '../sync/types.ts';
import {AppliedState} from '../applied/applied-state.ts';
import type {AgentApiHandlers} from './handlers.ts';
import {answerBehaviour} from './methods/behaviour.ts';
import {answerAppliedRules, answerDesiredRules} from './methods/rules.ts';
import {answerStatus} from './methods/status.ts';
import {answerSync} from './methods/sync.ts';
import {answerTrace} from './methods/trace.ts';
import {readNodeAddresses} from './node-addresses.ts';
import {probeHere, probeInNetns} from './probe.ts';
import type {RulesetChanges} from '../applied/ruleset-changes.ts';
import type {RulesBackend} from './rules/backend.ts';
import {type ObserveRuntime, RuntimeState, type ProxierSyncs} from './runtime-state.ts';

/** ProxierView: what the runtime needs of the proxier (IptablesProxier has it). */
export interface ProxierView extends ProxierSyncs {
  /**
   * Tells of each write of rules and what it left, and of its readings (the iptables and nftables
   * proxiers do): the applied state then follows them without reading the kernel.
   */
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
  /** Set when the agent observes kube-proxy (--observe). */
  observe?: ObserveRuntime;
  /** The cluster's service CIDRs, as the proxier last used them (behaviour's unused service addresses). */
  serviceCIDRs?: () => string[];
}

/**
 * How often an observer looks whether the ruleset monitor saw a change (two numbers read, nothing
 * more): a change waits up to this long before its drift check starts, on top of the monitor's
 * (in ipvs mode, the looks') own delay.
 */
const observeChangePollMs = 250;

export interface AgentRuntime extends AgentApiHandlers {
  close(): void;
  /** An observer's first reading of the kernel, in (or failed); settled at once for a proxying agent. */
  firstReading: Promise<void>;
}

export function createAgentRuntime(options: AgentRuntimeOptions): AgentRuntime {
  const {nodeName, version, families, proxier, host, backend, changes, log} = options;
  const now = options.now ?? Date.now;
  const syncTimeoutMs = options.syncTimeoutMs ?? 60_000;
  const nodeAddresses = options.nodeAddresses ?? (() => readNodeAddresses(host.netns));
  const probe =
    options.probe ??
    ((params, netns) => (netns ? probeInNetns(netns, params.target, params.count) : probeHere(params.target, params.count)));

  // The kernel's rules as the proxier publishes them (its writes and drift-check readings); a
  // reading of its own is taken only by a proxier that does not publish them (ipvs).
  const applied = new AppliedState({
    read: proxier.readApplied
      ? (family) => proxier.readApplied!(family)
      : async (family) =>
          backend.readApplied ? backend.readApplied(host, family) : savedTables(await host.iptablesSave(family), ['filter', 'nat']),
    parse: (text) => backend.parse(text),
    patch: backend.patch && ((rules, tables) => backend.patch!(rules, tables)),
    follow: backend.follow && ((family, rules, touched) => backend.follow!(host, family, rules, touched)),
    format: backend.format && ((rules) => backend.format!(rules)),
    textOf: backend.textOf && ((rules) => backend.textOf!(rules)),
    changes,
    now,
    // Only a proxier that says what it wrote can vouch for its writers' changes.
    spawns: proxier.onWrite && host.onSpawn?.bind(host),
    onRead: (family, {seconds, characters}) =>
      log.detail(2, 'agent api: rules read whole', {family, seconds: Number(seconds.toFixed(3)), characters}),
  });
  const stopFollowingProxier = proxier.onWrite?.(applied);

  const state = new RuntimeState({
    nodeName,
    version,
    families,
    proxier,
    host,
    backend,
    log,
    applied,
    now,
    syncTimeoutMs,
    nodeAddresses,
    probe,
    observe: options.observe,
  });
  const firstReading = options.observe ? state.readFirst() : Promise.resolve();
  const stopWatchingSyncs = proxier.onSync((outcome) => state.recordSync(outcome));
  // An observer's drift comes from kube-proxy's changes, not its own syncs: a change the monitor
  // saw starts a drift check, so that drift is logged and counted within seconds of it.
  let foreignSeen = changes.lastForeignChangeAt();
  const followForeignChanges =
    options.observe &&
    setInterval(() => {
      const at = changes.lastForeignChangeAt();
      if (!changes.watching() || at === foreignSeen) return;
      foreignSeen = at;
      state.warmUp();
    }, observeChangePollMs);
  if (followForeignChanges) followForeignChanges.unref();

  // The router: one handler per method.
  return {
    status: () => answerStatus(state),
    'rules.desired': () => answerDesiredRules(state),
    'rules.applied': () => answerAppliedRules(state),
    diff: (params) => state.diffAll(params.service),
    trace: (params) => answerTrace(state, params),
    behaviour: (params) => answerBehaviour(state, params, options.serviceCIDRs?.() ?? []),
    probe: async (params) => state.probe(params, params.from?.netns ?? state.host.netns),
    sync: (params) => answerSync(state, params),

    onSync(listener) {
      state.listeners.add(listener);
      return () => state.listeners.delete(listener);
    },

    firstReading,
    close() {
      state.closed = true;
      if (followForeignChanges) clearInterval(followForeignChanges);
      stopWatchingSyncs();
      state.listeners.clear();
      stopFollowingProxier?.();
      applied.close();
    },
  };
}
