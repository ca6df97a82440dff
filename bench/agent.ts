// The live agent's figures at 1,000 and 10,000 services x 10 endpoints, each next to the kernel
// floor of the same work: a proxyctl-agent process writes into a scratch network namespace, fed by
// the embedded API server in this process. In iptables mode (`agent`):
// - start -> first full sync (the agent's log line), next to one full `iptables-restore` of the
//   same rules into an empty namespace (the mean of one before the agent runs and one after);
// - one endpoint change, from the API write to its rules in the kernel (the new endpoint's DNAT
//   rule, as xtables-monitor reports the transaction when it commits), next to a one-service
//   `iptables-restore --noflush` into the same full table (both the median of 9); what the agent
//   adds is measured against that restore as the same monitor saw it;
// - the agent's RSS after its first sync, after the changes and two drift checks, and at its peak;
// - then the agent API in use, as the plugin uses it: 10 traces (of services across the range) and
//   2 diffs over its WebSocket, with the RSS after them and the peak while they read and parse the
//   kernel's rules (the peak is reset first, through /proc/PID/clear_refs).
// In nftables mode (`agent-nftables`) the same, next to `nft -f` of the same table into an empty
// namespace and the smallest transaction on the full table (the moved endpoint's map element
// replaced); the change is the endpoint map's new element, as `nft monitor` reports it.
// PXBENCH_AGENT_NODE_OPTIONS sets NODE_OPTIONS for the agent process alone, e.g.
// --max-old-space-size=256 to see how much of its RSS is garbage V8 has not collected yet.
// PXBENCH_AGENT_SIGNAL (e.g. SIGUSR2 with --heapsnapshot-signal=SIGUSR2 in the options above) is
// sent to the agent once its first sync is done and measured, to take a heap snapshot there.
// PXBENCH_AGENT_LOG=FILE appends the agent's log to FILE, each line after the milliseconds since
// the agent started, with PXBENCH_AGENT_VERBOSITY (default 2) as its --v, or more where a figure needs it.
import {type ChildProcess, spawn} from 'node:child_process';
import {appendFileSync, writeFileSync} from 'node:fs';
import {mkdtemp, readFile, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {buildProxyModel, changedServicePorts, type ProxyModel} from '../src/core/model/index.ts';
import {renderIptables} from '../src/core/iptables/render.ts';
import {endpointMapShard, namePrefixes, servicePortNameBase} from '../src/core/nftables/names.ts';
import {endpointTargetsMap, renderNftablesSync} from '../src/core/nftables/render.ts';
import {coreIptablesRules} from '../src/agent/sync/iptables-rules.ts';
import {restoreInputText} from '../src/agent/host/host.ts';
import {freeLoopbackPorts} from '../src/lab/agent-process.ts';
import {AgentClient} from '../src/plugin/lib/agent-client.ts';
import {startApiServer} from '../src/lab/apiserver/server.ts';
import type {KubeObject} from '../src/lab/apiserver/object-log.ts';
import {deleteNamespace, isRoot, monitorKinds, runIn, runInAsync, scratchNamespace, startRulesetMonitor} from './netns.ts';
import {figure, heading, mib, percentile, skipped, timed} from './report.ts';
import {benchClusterCIDR, benchNodeName, endpointSliceFor, makeWorkload, type Workload} from './workload.ts';

// The agent as users start it: bin/proxyctl-agent runs the build (npm run bench builds first) with
// the memory settings of the image's entrypoint.
const agentLauncher = fileURLToPath(new URL('../bin/proxyctl-agent', import.meta.url));
/**
 * Endpoint changes per size, and floor writes; the medians are printed. At 10,000 services one
 * restore takes 200-300 ms from one write to the next, more than the agent adds: nine of each.
 */
const changeRounds = 9;
/** Two syncPeriods (the default 30 s) after the first sync, and a few seconds for the second drift check to end. */
const settledAfterDriftChecksMs = 65_000;
/**
 * When the RSS after the API's use is read again: past the 2 s after its last request at which the
 * agent lets go of parsed rules that do not hold their text (nftables' listing).
 */
const apiSettledAfterMs = 5000;

export async function benchAgent(
  sizes = [1000, 10000],
  endpointsPerService = 10,
  modeName: 'iptables' | 'nftables' = 'iptables',
): Promise<void> {
  const mode = modeName === 'nftables' ? nftablesMode : iptablesMode;
  if (!isRoot) {
    heading(
      `agent (${mode.name} mode): start, endpoint change, memory`,
      'a proxyctl-agent process writing into a scratch network namespace',
    );
    skipped('every figure', `needs root (scratch network namespaces, ${mode.name} inside them)`);
    return;
  }
  const overheads: Array<{size: number; ms: number}> = [];
  for (const size of sizes) overheads.push({size, ms: await benchSize(size, endpointsPerService, mode)});
  if (overheads.length > 1) {
    const [first, last] = [overheads[0], overheads.at(-1)!];
    heading(
      `agent (${mode.name} mode): what the agent adds to one endpoint change, by cluster size`,
      `median change latency minus the median of the ${mode.changeFloorName} floor as the same monitor saw it`,
    );
    for (const entry of overheads) figure({name: `${entry.size.toLocaleString('en-US')} services`, value: entry.ms, unit: 'ms'});
    figure({
      name: `${last.size.toLocaleString('en-US')} vs ${first.size.toLocaleString('en-US')} services`,
      value: last.ms,
      unit: 'ms',
      floor: {name: `the ${first.size.toLocaleString('en-US')}-service figure`, value: Math.max(first.ms, 1)},
      note: 'goal: flat',
    });
  }
}

async function benchSize(serviceCount: number, endpointsPerService: number, mode: AgentBenchMode): Promise<number> {
  const workload = makeWorkload(serviceCount, endpointsPerService);
  heading(
    `agent (${mode.name} mode): start, endpoint change, memory`,
    `${workload.label}, one TCP port each, ClusterIP; agent process with --netns, embedded API server`,
  );
  const modelOptions = {family: 'IPv4' as const, nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]};
  const model = buildProxyModel({services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node}, modelOptions);

  // Floor 1: the same rules, loaded in one go into an empty namespace, before the agent runs and
  // again after it stopped: the kernel's time for it drifts by a fifth from one minute to the next.
  const loadFloor = async (): Promise<{ms: number; size: string}> => {
    const floorNamespace = scratchNamespace(`agent-floor-${serviceCount}`);
    try {
      return await mode.fullLoadFloor(floorNamespace, model);
    } finally {
      deleteNamespace(floorNamespace);
    }
  };
  const fullFloorBefore = await loadFloor();

  const namespace = scratchNamespace(`agent-${serviceCount}`);
  const dir = await mkdtemp(join(tmpdir(), 'pxbench-agent-'));
  const server = await startApiServer({port: 0});
  let agent: AgentRun | undefined;
  try {
    loadWorkload(server.store, workload);
    const kubeconfig = join(dir, 'kubeconfig');
    await server.writeKubeconfig(kubeconfig);

    agent = await startAgentRun(namespace, kubeconfig, mode.name);
    const firstSync = await agent.waitForLine(/synced rules .*kind=full/, 600_000);
    const startMs = firstSync.at - agent.startedAt;
    const syncSeconds = Number(/ seconds=([\d.]+)/.exec(firstSync.line)?.[1] ?? NaN);
    const rssAfterStart = await agent.rss();
    const heapAfterStart = await agent.heap();
    // And once whatever the agent does right after a sync (a garbage collection) is done.
    await new Promise((resolve) => setTimeout(resolve, 2000));
    const rssSettled = await agent.rss();
    const heapSettled = await agent.heap();
    const signal = process.env.PXBENCH_AGENT_SIGNAL;
    if (signal) {
      agent.signal(signal as NodeJS.Signals);
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }

    // The API prepares its drift check after the first sync (a reading of the whole table, the
    // desired rules rendered and compared); the monitor below starts once that is done, as
    // `nft monitor` reads the whole ruleset before it listens and would compete with it.
    await agent.waitForDriftCheck(300_000);

    // Endpoint changes: service s gets endpoint 0 replaced by an address no endpoint had before.
    // The kernel's rules are watched with the mode's monitor, which hears of each transaction as it
    // commits; started now, after the first sync, so that it never prints the whole ruleset.
    // nft monitor reads the whole table before it listens: minutes on a busy machine at 10,000 services.
    const monitor = await startRulesetMonitor(namespace, mode.monitor, 600_000);
    const latencies: number[] = [];
    let current: ProxyModel = model;
    const slices = workload.endpointSlices.slice();
    let floorAlone: number[];
    let floorSeen: number[];
    let rssChecked: {rss: number; peak: number} | undefined;
    let apiUse: ApiUse | undefined;
    try {
      for (let round = 1; round <= changeRounds; round++) {
        const s = Math.floor((serviceCount * round) / (changeRounds + 1));
        const slice = endpointSliceFor(s, endpointsPerService, round);
        const applied = mode.changeApplied(current, s, slice.endpoints![0].addresses![0]);
        // A lone change: the previous sync ended more than minSyncPeriod (1 s) ago, so nothing holds this one back.
        await new Promise((resolve) => setTimeout(resolve, 1200));
        const [mark, from] = [agent.lines.length, monitor.seen];
        const written = performance.now();
        server.store.update('endpointslices', slice as unknown as KubeObject, 'bench');
        const seenAt = await monitor.waitFor(applied, from, 60_000).catch((error: Error) => {
          throw new Error(`${error.message}; the agent's log ends:\n${agent!.lines.slice(-8).join('\n')}`);
        });
        latencies.push(seenAt - written);
        // Let the sync finish and the next one be allowed, so rounds do not overlap.
        await agent.waitForLine(/synced rules .*kind=partial/, 120_000, mark);
        slices[s] = slice;
        current = buildProxyModel({services: workload.services, endpointSlices: slices, node: workload.node}, modelOptions);
      }

      // The RSS that stays: after the drift checks of the agent's first minute (syncPeriod 30 s;
      // each reads the whole tables back), not only after the first sync.
      const untilChecked = firstSync.at + settledAfterDriftChecksMs - performance.now();
      if (untilChecked > 0) await new Promise((resolve) => setTimeout(resolve, untilChecked));
      rssChecked = await agent.rss();
      apiUse = await useAgentApi(agent, current);
      await agent.stop();
      // Floor 2: the same kind of change written straight to the kernel, seen by the same monitor.
      // The write's own duration is the floor; the time from its start to the monitor seeing it is
      // what "what the agent adds" is measured against. Timed as often as the agent's change, the
      // median taken; the way back to `current` is written untimed between rounds.
      const s = Math.floor(serviceCount / 2) + 1;
      const nextSlices = slices.slice();
      nextSlices[s] = endpointSliceFor(s, endpointsPerService, changeRounds + 1);
      const next = buildProxyModel({services: workload.services, endpointSlices: nextSlices, node: workload.node}, modelOptions);
      const [oldAddress, newAddress] = [slices[s], nextSlices[s]].map((slice) => slice.endpoints![0].addresses![0]);
      const floorChange = await mode.floorChange(namespace, current, next, {s, oldAddress, newAddress});
      const applied = mode.changeApplied(current, s, newAddress);
      [floorAlone, floorSeen] = [[], []];
      for (let round = 0; round < changeRounds; round++) {
        const from = monitor.seen;
        const written = performance.now();
        const ended = floorChange.forward().then(() => performance.now() - written);
        floorSeen.push((await monitor.waitFor(applied, from, 60_000)) - written);
        floorAlone.push(await ended);
        await floorChange.back();
      }
    } finally {
      monitor.stop();
    }
    latencies.sort((a, b) => a - b);
    const changeMs = percentile(latencies, 50);
    const changeFloor = percentile(
      floorAlone.sort((a, b) => a - b),
      50,
    );
    const changeFloorSeen = percentile(
      floorSeen.sort((a, b) => a - b),
      50,
    );
    const fullFloorAfter = await loadFloor();

    const fullFloorMs = (fullFloorBefore.ms + fullFloorAfter.ms) / 2;
    figure({
      name: `start -> first full sync (${fullFloorBefore.size})`,
      value: startMs,
      unit: 'ms',
      floor: {name: mode.fullFloorName, value: fullFloorMs, goal: mode.fullFloorGoal},
      note:
        `the sync itself ${(syncSeconds * 1000).toFixed(0)} ms; floor ${(fullFloorBefore.ms / 1000).toFixed(2)} s before the agent, ${(fullFloorAfter.ms / 1000).toFixed(2)} s after` +
        (mode.fullSyncGoalMs !== undefined
          ? `; goal <= ${mode.fullSyncGoalMs / 1000} s ${startMs <= mode.fullSyncGoalMs ? 'met' : 'NOT met'}`
          : ''),
    });

    figure({
      name: `one endpoint change: API write -> kernel (p50 of ${changeRounds})`,
      value: changeMs,
      unit: 'ms',
      floor: {name: mode.changeFloorName, value: changeFloor, goal: mode.changeFloorGoal},
      note:
        `min ${latencies[0].toFixed(0)} ms, max ${latencies.at(-1)!.toFixed(0)} ms, seen by ${mode.monitor.name} as it committed; ` +
        `the floor's write seen ${changeFloorSeen.toFixed(0)} ms after it started` +
        (mode.changeGoalMs !== undefined ? `; goal <= ${mode.changeGoalMs} ms ${changeMs <= mode.changeGoalMs ? 'met' : 'NOT met'}` : ''),
    });
    figure({
      name: 'agent RSS after the first sync',
      value: mib(rssAfterStart.rss),
      unit: 'MiB',
      note: `peak ${mib(rssAfterStart.peak).toFixed(0)} MiB, ${heapText(heapAfterStart)}; goal < 200 MiB`,
    });
    figure({
      name: 'agent RSS 2 s after the first sync',
      value: mib(rssSettled.rss),
      unit: 'MiB',
      note: `${heapText(heapSettled)}; goal < 200 MiB`,
    });
    if (rssChecked)
      figure({
        name: `agent RSS after the endpoint changes and two drift checks (${settledAfterDriftChecksMs / 1000} s after the first sync)`,
        value: mib(rssChecked.rss),
        unit: 'MiB',
        note: `peak ${mib(rssChecked.peak).toFixed(0)} MiB; goal < 200 MiB`,
      });
    if (apiUse) {
      const {traces, diffs, during, settled} = apiUse;
      const ms = (list: number[]) => list.map((value) => value.toFixed(0)).join(', ');
      figure({
        name: `agent RSS after ${traces.length} traces and ${diffs.length} diffs through its API`,
        value: mib(during.rss),
        unit: 'MiB',
        note: `traces ${ms(traces)} ms, diffs ${ms(diffs)} ms; goal < 250 MiB`,
      });
      figure({
        name: '  peak while the API read and parsed the rules',
        value: mib(during.peak),
        unit: 'MiB',
        note: 'VmHWM, reset just before the first trace',
      });
      const end = agent.finalRss;
      figure({
        name: `  RSS ${apiSettledAfterMs / 1000} s later`,
        value: mib(settled.rss),
        unit: 'MiB',
        note: `${agent.finalHeap ? heapText(agent.finalHeap) : 'JS heap unknown'}${end ? `; at stop ${mib(end.rss).toFixed(0)} MiB` : ''}`,
      });
    }
    return changeMs - changeFloorSeen;
  } finally {
    await agent?.stop();
    await server.stop();
    deleteNamespace(namespace);
    await rm(dir, {recursive: true, force: true});
  }
}

interface ApiUse {
  traces: number[];
  diffs: number[];
  /** RSS right after the last diff, and the peak since the first trace started. */
  during: {rss: number; peak: number};
  settled: {rss: number; peak: number};
}

/** Traces of this many services spread across the model, then this many whole-node diffs, as `kubectl proxyctl trace` and `diff NODE` ask. */
const apiTraces = 10;
const apiDiffs = 2;

/** tracesAcross traces `count` services spread across the model through the agent API, as `kubectl proxyctl trace` asks; each must reach DNAT. Their times, ms. */
export async function tracesAcross(client: AgentClient, model: ProxyModel, count: number): Promise<number[]> {
  const traces: number[] = [];
  for (let i = 0; i < count; i++) {
    const port = model.servicePorts[Math.floor(((i + 0.5) * model.servicePorts.length) / count)];
    const packet = {srcIP: '10.128.0.5', dstIP: port.clusterIP, dstPort: port.port, protocol: port.protocol, origin: 'arriving' as const};
    const trace = await timed(() => client.call('trace', {packet, service: `${port.namespace}/${port.serviceName}`}));
    if (trace.result.verdict !== 'DNAT')
      throw new Error(`trace of ${port.namespace}/${port.serviceName} through the agent API: ${trace.result.verdict}, not DNAT`);
    traces.push(trace.ms);
  }
  return traces;
}

/** useAgentApi uses the agent's WebSocket API as the plugin does and measures the agent's RSS around it. */
async function useAgentApi(agent: AgentRun, model: ProxyModel): Promise<ApiUse> {
  agent.resetPeak();
  const client = await AgentClient.connect({url: agent.apiUrl, timeoutMs: 0, label: 'the bench agent'});
  try {
    const traces = await tracesAcross(client, model, apiTraces);
    const diffs: number[] = [];
    for (let i = 0; i < apiDiffs; i++) {
      const diff = await timed(() => client.call('diff', {}));
      if (!diff.result.equal) throw new Error(`diff through the agent API found drift:\n${diff.result.text.slice(0, 2000)}`);
      diffs.push(diff.ms);
    }
    const during = await agent.rss();
    await new Promise((resolve) => setTimeout(resolve, apiSettledAfterMs));
    return {traces, diffs, during, settled: await agent.rss()};
  } finally {
    client.close();
  }
}

/** What differs between the modes: how the rules are loaded alone, and how a change is seen. */
interface AgentBenchMode {
  name: 'iptables' | 'nftables';
  fullFloorName: string;
  /** The goal for start -> first full sync as a ratio to the floor, where the mode's issue sets one. */
  fullFloorGoal?: number;
  /** Loads the rules of `model` alone into the empty `namespace`; the time and the size loaded. */
  fullLoadFloor(namespace: string, model: ProxyModel): Promise<{ms: number; size: string}>;
  /** An absolute goal for start -> first full sync, where the mode's issue sets one. */
  fullSyncGoalMs?: number;
  /** What sees the kernel's changes. */
  monitor: (typeof monitorKinds)[keyof typeof monitorKinds];
  /** Tells the line the monitor prints when the kernel takes the change that puts `newAddress` among service `s`'s endpoints. */
  changeApplied(model: ProxyModel, s: number, newAddress: string): (line: string) => boolean;
  changeFloorName: string;
  changeFloorGoal?: number;
  changeGoalMs?: number;
  /**
   * The kernel floor of one endpoint change, on the agent's full table in `namespace` (the agent
   * has stopped): service `s`'s endpoint at `oldAddress` moved to `newAddress` (`next`), written
   * straight to the kernel, and the way back to `current`.
   */
  floorChange(
    namespace: string,
    current: ProxyModel,
    next: ProxyModel,
    change: {s: number; oldAddress: string; newAddress: string},
  ): Promise<{forward(): Promise<unknown>; back(): Promise<unknown>}>;
}

const iptablesMode: AgentBenchMode = {
  name: 'iptables',
  fullFloorName: 'full iptables-restore',
  fullFloorGoal: 1.2,
  async fullLoadFloor(namespace, model) {
    const rules = renderIptables(model, {includeJumps: true});
    const {ms} = await timed(() => runIn(namespace, ['iptables-restore', '-w', '5'], rules));
    return {ms, size: `${rules.split('\n').length.toLocaleString('en-US')} lines`};
  },
  monitor: monitorKinds.xtables,
  // The endpoint chain's new DNAT rule, as xtables-monitor prints it: " EVENT: -4 -t nat -A KUBE-SEP-… -j DNAT --to-destination ADDRESS:8080".
  changeApplied: (_model, _s, newAddress) => (line) =>
    line.includes(' -t nat -A ') && line.endsWith(` --to-destination ${newAddress}:8080`),
  changeFloorName: `one-service iptables-restore --noflush (p50 of ${changeRounds})`,
  changeFloorGoal: 1.2,
  async floorChange(namespace, current, next) {
    // One service's chains rewritten with --noflush into the same full table; KUBE-SERVICES and
    // the other fixed chains, which an endpoint change leaves as they are, are not in it.
    // The changed port's chains that the change leaves unused are deleted, as the agent does; the
    // kernel also holds services the workload does not know (default/kubernetes), which stay.
    const rules = coreIptablesRules();
    const oneServiceInput = (from: ProxyModel, to: ProxyModel): string => {
      const changed = changedServicePorts(from, to);
      const input = restoreInputText(rules.render(to, {changedServicePorts: changed, previous: from}).input);
      if (input.includes(':KUBE-SERVICES '))
        throw new Error('the one-service floor would rewrite KUBE-SERVICES: the change is not an endpoint change');
      return input;
    };
    const [forward, back] = [oneServiceInput(current, next), oneServiceInput(next, current)];
    const restore = ['iptables-restore', '-w', '5', '--noflush'];
    return {forward: () => runInAsync(namespace, restore, forward), back: () => runInAsync(namespace, restore, back)};
  },
};

const nftablesMode: AgentBenchMode = {
  name: 'nftables',
  fullFloorName: 'nft -f of the same table',
  async fullLoadFloor(namespace, model) {
    const {script} = renderNftablesSync(model);
    const {ms} = await timed(() => runIn(namespace, ['nft', '-f', '-'], script));
    return {ms, size: `${(script.length / 1e6).toFixed(1)} MB script`};
  },
  fullSyncGoalMs: 10_000,
  monitor: monitorKinds.nft,
  // The endpoint map's new element, "KEY : ADDRESS . PORT".
  changeApplied: (_model, _s, newAddress) => (line) =>
    line.startsWith('add element ip kube-proxy ') && line.includes(` : ${newAddress} . 8080`),
  changeFloorName: `one-element nft transaction on the full table (p50 of ${changeRounds})`,
  changeGoalMs: 100,
  async floorChange(namespace, current, _next, {s, oldAddress, newAddress}) {
    // The smallest change nft can make: the element of the moved endpoint replaced in its map.
    const port = current.servicePorts.find((candidate) => candidate.namespace === 'bench' && candidate.serviceName === `svc-${s}`);
    if (!port) throw new Error(`bench/svc-${s} is not in the model`);
    const map = endpointTargetsMap('tcp', endpointMapShard(namePrefixes.clusterPolicy + servicePortNameBase(port)));
    const listed = runIn(namespace, ['nft', 'list', 'map', 'ip', 'kube-proxy', map]);
    const key = new RegExp(`(\\d+) : ${oldAddress.replaceAll('.', '\\.')} \\. 8080\\b`).exec(listed)?.[1];
    if (key === undefined) throw new Error(`no element for ${oldAddress} in ${map}`);
    const replace = (address: string) =>
      `delete element ip kube-proxy ${map} { ${key} }\nadd element ip kube-proxy ${map} { ${key} : ${address} . 8080 }\n`;
    return {
      forward: () => runInAsync(namespace, ['nft', '-f', '-'], replace(newAddress)),
      back: () => runInAsync(namespace, ['nft', '-f', '-'], replace(oldAddress)),
    };
  },
};

/** Puts the workload into the API server's storage as etcd would hold it (the objects are already complete and valid). */
export function loadWorkload(store: Awaited<ReturnType<typeof startApiServer>>['store'], workload: Workload): void {
  store.create('namespaces', {apiVersion: 'v1', kind: 'Namespace', metadata: {name: 'bench'}});
  store.create('nodes', workload.node as unknown as KubeObject);
  const now = new Date().toISOString();
  const stamp = (object: unknown, index: number, kind: string) => {
    const copy = structuredClone(object) as KubeObject;
    copy.metadata.uid = `${kind}-${index}`;
    copy.metadata.creationTimestamp = now;
    return copy;
  };
  workload.services.forEach((service, index) => store.log.write('services', 'ADDED', stamp(service, index, 'svc')));
  workload.endpointSlices.forEach((slice, index) =>
    store.log.write('discovery.k8s.io/endpointslices', 'ADDED', stamp(slice, index, 'eps')),
  );
}

/** The agent's V8 heap from its /metrics: bytes in use, and bytes V8 holds per space (what counts in RSS), and memory outside the heap that V8 knows of. */
interface HeapFigures {
  used: number;
  total: number;
  spaces: Map<string, number>;
  external: number;
}

function heapText(heap: HeapFigures): string {
  const space = (name: string) => mib(heap.spaces.get(name) ?? NaN).toFixed(0);
  return (
    `JS heap in use ${mib(heap.used).toFixed(0)} MiB of ${mib(heap.total).toFixed(0)} MiB held ` +
    `(new ${space('new')}, old ${space('old')}, large objects ${space('large_object')}), external ${mib(heap.external).toFixed(0)} MiB`
  );
}

export interface AgentRun {
  startedAt: number;
  pid: number;
  metricsUrl: string;
  lines: string[];
  waitForLine(pattern: RegExp, timeoutMs: number, from?: number): Promise<{line: string; at: number}>;
  rss(): Promise<{rss: number; peak: number}>;
  /** The heap figures from the agent's /metrics. */
  heap(): Promise<HeapFigures>;
  signal(signal: NodeJS.Signals): void;
  /** The agent's WebSocket API, on loopback. */
  apiUrl: string;
  /** Starts the peak RSS (VmHWM) afresh. */
  resetPeak(): void;
  /** Resolves once the agent API has checked the applied rules for drift (status says when it did). */
  waitForDriftCheck(timeoutMs: number): Promise<void>;
  finalRss: {rss: number; peak: number} | undefined;
  finalHeap: HeapFigures | undefined;
  stop(): Promise<void>;
}

/** startAgentRun starts bin/proxyctl-agent on `namespace`; `mode` undefined leaves --proxy-mode out (an observer finds its mode), `extraFlags` follow. */
export async function startAgentRun(
  namespace: string,
  kubeconfig: string,
  mode: 'iptables' | 'nftables' | undefined,
  extraFlags: string[] = [],
  nodeOptions = process.env.PXBENCH_AGENT_NODE_OPTIONS,
  /** The least --v a figure needs the log lines of; PXBENCH_AGENT_VERBOSITY (default 2) when higher. */
  leastVerbosity = 0,
): Promise<AgentRun> {
  const [healthzPort, metricsPort, apiPort] = await freeLoopbackPorts(3);
  const args = [
    '--netns',
    namespace,
    '--kubeconfig',
    kubeconfig,
    '--hostname-override',
    benchNodeName,
    '--cluster-cidr',
    benchClusterCIDR,
    `--healthz-bind-address=127.0.0.1:${healthzPort}`,
    `--metrics-bind-address=127.0.0.1:${metricsPort}`,
    `--api-bind-address=127.0.0.1:${apiPort}`,
    ...(mode ? ['--proxy-mode', mode] : []),
    '--v',
    String(Math.max(leastVerbosity, Number(process.env.PXBENCH_AGENT_VERBOSITY ?? '2'))),
    ...extraFlags,
  ];
  const logFile = process.env.PXBENCH_AGENT_LOG;
  const startedAt = performance.now();
  const env = nodeOptions === undefined ? process.env : {...process.env, NODE_OPTIONS: nodeOptions};
  const child: ChildProcess = spawn(agentLauncher, args, {stdio: ['ignore', 'ignore', 'pipe'], env});
  const lines: string[] = [];
  const arrivals: number[] = [];
  let partial = '';
  let exited = false;
  const exit = new Promise<void>((resolve) => child.once('exit', () => ((exited = true), resolve())));
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
    const parts = (partial + chunk).split('\n');
    partial = parts.pop()!;
    for (const line of parts) {
      lines.push(line);
      if (logFile) appendFileSync(logFile, `${(performance.now() - startedAt).toFixed(1)} ${line}\n`);
      arrivals.push(performance.now());
    }
  });
  const readRss = async () => {
    const status = await readFile(`/proc/${child.pid}/status`, 'utf8');
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
    return {rss: kib('VmRSS'), peak: kib('VmHWM')};
  };
  const heap = async (): Promise<HeapFigures> => {
    const page = await (await fetch(run.metricsUrl)).text();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)`, 'm').exec(page)?.[1] ?? NaN);
    const spaces = new Map<string, number>();
    for (const match of page.matchAll(/^nodejs_heap_space_size_total_bytes\{space="(\w+)"\} (\S+)/gm))
      spaces.set(match[1], Number(match[2]));
    return {
      used: value('nodejs_heap_size_used_bytes'),
      total: value('nodejs_heap_size_total_bytes'),
      spaces,
      external: value('nodejs_external_memory_bytes'),
    };
  };
  const run: AgentRun = {
    startedAt,
    pid: child.pid!,
    metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`,
    lines,
    finalRss: undefined,
    finalHeap: undefined,
    heap,
    signal: (name) => child.kill(name),
    apiUrl: `ws://127.0.0.1:${apiPort}/`,
    resetPeak: () => writeFileSync(`/proc/${child.pid}/clear_refs`, '5'),
    async waitForDriftCheck(timeoutMs) {
      const client = await AgentClient.connect({url: run.apiUrl, timeoutMs: 0, label: 'the bench agent'});
      try {
        const deadline = performance.now() + timeoutMs;
        while ((await client.call('status', {})).drift.checkedAt === null) {
          if (performance.now() > deadline) throw new Error(`the agent API made no drift check within ${timeoutMs / 1000} s`);
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
      } finally {
        client.close();
      }
    },
    async waitForLine(pattern, timeoutMs, from = 0) {
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        const index = lines.findIndex((line, i) => i >= from && pattern.test(line));
        if (index >= 0) return {line: lines[index], at: arrivals[index]};
        if (exited) throw new Error(`agent ended before logging ${pattern}:\n${lines.slice(-10).join('\n')}`);
        if (performance.now() > deadline)
          throw new Error(`agent did not log ${pattern} within ${timeoutMs / 1000} s:\n${lines.slice(-10).join('\n')}`);
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    },
    rss: readRss,
    async stop() {
      if (exited) return;
      run.finalRss = await readRss().catch(() => undefined);
      run.finalHeap = await heap().catch(() => undefined);
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exit;
      clearTimeout(timer);
    },
  };
  return run;
}
