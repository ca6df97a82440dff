// Agent API figures: trace latency on a node holding 10,000 services x 10 endpoints (the kernel
// read once, then answered from the cached rules until the ruleset changes), and
// `diff --all-nodes` fan-out across 200 agents simulated in this process.
import {buildProxyModel, type ProxyModel} from '../src/core/model/index.ts';
import {iptablesBackend} from '../src/agent/api/iptables-backend.ts';
import {watchNftRuleset, unwatchedRulesetChanges} from '../src/agent/api/ruleset-changes.ts';
import {createAgentRuntime} from '../src/agent/api/runtime.ts';
import {startAgentApi} from '../src/agent/api/server.ts';
import type {AgentApiHandlers} from '../src/agent/api/handlers.ts';
import {CommandHost} from '../src/agent/host/command-host.ts';
import {createLogger} from '../src/agent/log.ts';
import type {SyncOutcome} from '../src/agent/sync/proxier.ts';
import {AgentClient} from '../src/plugin/lib/agent-client.ts';
import {forEachNode} from '../src/plugin/lib/agent-locator.ts';
import {deleteNamespace, isRoot, runIn, scratchNamespace} from './netns.ts';
import {figure, heading, mib, percentile, skipped, timed} from './report.ts';
import {benchClusterCIDR, benchNodeIP, benchNodeName, makeWorkload} from './workload.ts';

const quiet = createLogger({write: () => {}});

export async function benchAgentApi(): Promise<void> {
  for (const size of [1_000, 10_000]) await benchTrace(size, 10);
  await benchDiffAllNodes(200);
}

async function benchTrace(serviceCount: number, endpointsPerService: number): Promise<void> {
  heading('agent API: trace over the applied rules', `${serviceCount.toLocaleString('en-US')} services x ${endpointsPerService} endpoints, one node, client over WebSocket on loopback`);
  if (!isRoot) {
    skipped('trace latency', 'needs root (the rules go into a scratch network namespace)');
    return;
  }
  const workload = makeWorkload(serviceCount, endpointsPerService);
  const model: ProxyModel = buildProxyModel({services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node}, {family: 'IPv4', nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]});
  const netns = scratchNamespace('agent-api');
  try {
    // As in the agent: the monitor runs before the rules are written, and is trusted once it has reported them.
    const changes = await watchNftRuleset({netns, log: quiet}).catch(() => unwatchedRulesetChanges());
    const load = await timed(() => runIn(netns, ['iptables-restore'], iptablesBackend.render(model)));
    changes.bump(Date.now() - load.ms);
    const caughtUp = await timed(async () => {
      const deadline = Date.now() + 60_000;
      while (!changes.watching() && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100));
      return changes.watching();
    });
    figure({name: 'nft monitor reports the restore', value: caughtUp.ms, unit: 'ms', note: caughtUp.result ? 'caught up' : 'not within 60 s: the cache is not trusted'});
    const host = new CommandHost({netns});
    const proxier = {
      appliedModels: () => new Map([['IPv4' as const, model]]),
      status: () => ({initialized: true}),
      requestSync: () => {},
      onSync: (_listener: (outcome: SyncOutcome) => void) => () => {},
    };
    const runtime = createAgentRuntime({nodeName: benchNodeName, version: 'bench', families: ['IPv4'], proxier, host, backend: iptablesBackend, changes, log: quiet});
    const api = await startAgentApi({host: '127.0.0.1', port: 0, handlers: runtime, log: quiet});
    const client = await AgentClient.connect({url: api.url, timeoutMs: 0, label: 'the bench agent'});
    try {
      const save = await timed(() => runIn(netns, ['iptables-save']));
      const last = model.servicePorts[model.servicePorts.length - 1];
      const packet = {srcIP: '10.128.0.5', dstIP: last.clusterIP, dstPort: last.port, protocol: last.protocol, origin: 'arriving' as const};
      const service = `${last.namespace}/${last.serviceName}`;
      const cold = await timed(() => client.call('trace', {packet, service}));
      figure({name: 'first trace (reads, parses, diffs the kernel)', value: cold.ms, unit: 'ms', floor: {name: 'iptables-save', value: save.ms}});
      // While nft monitor has not caught up (on a ruleset this large it may never), every trace reads the kernel again.
      const cached = changes.watching();
      const warm: number[] = [];
      for (let i = 0; i < (cached ? 20 : 3); i++) warm.push((await timed(() => client.call('trace', {packet, service}))).ms);
      warm.sort((a, b) => a - b);
      figure({name: 'trace, rules unchanged: p50', value: percentile(warm, 50), unit: 'ms', note: `goal < 200 ms; ${cached ? 'answered from the cached rules' : 'nft monitor has not reported a change yet, so each trace reads the kernel'}`});
      figure({name: 'trace, rules unchanged: p95', value: percentile(warm, 95), unit: 'ms', note: `rules read at ${(cold.result as {readAt: string}).readAt}`});
      figure({name: 'agent heap after the cache is full', value: mib(process.memoryUsage().heapUsed), unit: 'MiB'});
      runIn(netns, ['iptables', '-t', 'nat', '-I', 'KUBE-SERVICES', '1', '-j', 'RETURN']);
      await new Promise((resolve) => setTimeout(resolve, 200));
      const changed = await timed(() => client.call('trace', {packet, service}));
      figure({name: 'trace right after a rule changed (re-read)', value: changed.ms, unit: 'ms', note: `verdict ${changed.result.verdict}, drifted ${changed.result.drifted}`});
    } finally {
      client.close();
      await api.stop();
      runtime.close();
    }
  } finally {
    deleteNamespace(netns);
  }
}

async function benchDiffAllNodes(agentCount: number): Promise<void> {
  heading('plugin: diff --all-nodes fan-out', `${agentCount} agents in this process (status + diff each, agents answer at once), concurrency 10, WebSocket on loopback`);
  const status = {node: '', mode: 'iptables', version: 'bench', ready: true, lastSync: {at: new Date().toISOString(), durationMs: 12, kind: 'full', ok: true}, services: 100, endpoints: 1000, drift: {services: [], checkedAt: new Date().toISOString()}, syncFailures: 0, rulesReadAt: new Date().toISOString()};
  const apis: {node: string; api: Awaited<ReturnType<typeof startAgentApi>>}[] = [];
  for (let i = 0; i < agentCount; i++) {
    const node = `node-${i}`;
    const diff = i % 50 === 7 ? {equal: false, groups: [{servicePort: 'default/web:http', added: ['-A KUBE-SERVICES -j X'], removed: []}], text: '--- desired\n+++ applied\n', readAt: new Date().toISOString()} : {equal: true, groups: [], text: '', readAt: new Date().toISOString()};
    const handlers = {status: async () => ({...status, node}), diff: async () => diff, onSync: () => () => {}} as unknown as AgentApiHandlers;
    apis.push({node, api: await startAgentApi({host: '127.0.0.1', port: 0, handlers, log: quiet})});
  }
  try {
    const rssBefore = process.memoryUsage().rss;
    const run = await timed(() =>
      forEachNode(
        apis.map((entry) => entry.node),
        10,
        async (node) => {
          const client = await AgentClient.connect({url: apis.find((entry) => entry.node === node)!.api.url, timeoutMs: 30_000, label: node});
          try {
            const [s, d] = await Promise.all([client.call('status', {}), client.call('diff', {})]);
            return {s, d};
          } finally {
            client.close();
          }
        },
      ),
    );
    const differing = [...run.result.values()].filter((result) => result.ok && !result.value.d.equal).length;
    figure({name: `diff --all-nodes, ${agentCount} agents`, value: run.ms, unit: 'ms', note: `${differing} differ, ${[...run.result.values()].filter((r) => !r.ok).length} failed`});
    figure({name: 'RSS growth during the fan-out', value: mib(process.memoryUsage().rss - rssBefore), unit: 'MiB', note: 'client and 200 agents share this process'});
  } finally {
    for (const {api} of apis) await api.stop();
  }
}

if (import.meta.main) await benchAgentApi();
