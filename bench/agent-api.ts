// Agent API figures: trace latency on a node holding 10,000 services x 10 endpoints (the rules
// taken from the full sync's read-back, kept current through the agent's own writes, read again
// after anyone else's change), and
// `diff --all-nodes` fan-out across 200 agents simulated in this process.
import {buildProxyModel, type ProxyModel} from '../src/core/model/index.ts';
import {iptablesBackend} from '../src/agent/api/rules/iptables.ts';
import {watchNftRuleset, unwatchedRulesetChanges} from '../src/agent/applied/ruleset-changes.ts';
import {createAgentRuntime} from '../src/agent/api/runtime.ts';
import {startAgentApi} from '../src/agent/api/server.ts';
import type {AgentApiHandlers} from '../src/agent/api/handlers.ts';
import {CommandHost} from '../src/agent/host/command-host.ts';
import {createLogger} from '../src/agent/log.ts';
import type {RulesWriteListener, SyncOutcome, WrittenRules} from '../src/agent/sync/types.ts';
import type {IptablesRuleset} from '../src/core/iptables/ruleset.ts';
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
  heading(
    'agent API: trace over the applied rules',
    `${serviceCount.toLocaleString('en-US')} services x ${endpointsPerService} endpoints, one node, client over WebSocket on loopback`,
  );
  if (!isRoot) {
    skipped('trace latency', 'needs root (the rules go into a scratch network namespace)');
    return;
  }
  const workload = makeWorkload(serviceCount, endpointsPerService);
  const model: ProxyModel = buildProxyModel(
    {services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node},
    {family: 'IPv4', nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]},
  );
  const netns = scratchNamespace('agent-api');
  try {
    // As in the agent: the monitor runs before the rules are written; the proxier tells the API of
    // each write (a full one with its read-back, a partial one with the chains it replaced).
    const changes = await watchNftRuleset({netns, log: quiet}).catch(() => unwatchedRulesetChanges());
    const host = new CommandHost({netns});
    const writeListeners = new Set<RulesWriteListener>();
    const proxier = {
      appliedModels: () => new Map([['IPv4' as const, model]]),
      status: () => ({initialized: true}),
      requestSync: () => {},
      onSync: (_listener: (outcome: SyncOutcome) => void) => () => {},
      onWrite: (listener: RulesWriteListener) => {
        writeListeners.add(listener);
        return () => writeListeners.delete(listener);
      },
    };
    const runtime = createAgentRuntime({
      nodeName: benchNodeName,
      version: 'bench',
      families: ['IPv4'],
      proxier,
      host,
      backend: iptablesBackend,
      changes,
      log: quiet,
    });
    // The namespace starts empty: the full write need not keep anything (--noflush would make
    // iptables-nft note every chain the input names, which at 10,000 services takes most of an hour).
    const write = async (input: string, noflush: boolean, written: () => Promise<WrittenRules>): Promise<void> => {
      for (const listener of writeListeners) listener.started('IPv4');
      await host.iptablesRestore('IPv4', input, {noflush});
      const result = await written();
      for (const listener of writeListeners) listener.ended('IPv4', result);
    };
    const rendered = iptablesBackend.render(model);
    const load = await timed(() =>
      write(rendered, false, async () => {
        const readStartedAt = Date.now();
        return {kind: 'read', text: (await host.iptablesSave('IPv4', 'filter')) + (await host.iptablesSave('IPv4', 'nat')), readStartedAt};
      }),
    );
    figure({name: "full write + read-back (the proxier's full sync)", value: load.ms, unit: 'ms'});
    const settled = await timed(() => changes.settled(60_000));
    figure({
      name: 'nft monitor reports the restore',
      value: settled.ms,
      unit: 'ms',
      note: settled.result ? 'caught up' : 'not within 60 s: the cache is not trusted',
    });
    const api = await startAgentApi({host: '127.0.0.1', port: 0, handlers: runtime, log: quiet});
    const client = await AgentClient.connect({url: api.url, timeoutMs: 0, label: 'the bench agent'});
    try {
      const save = await timed(() => runIn(netns, ['iptables-save']));
      const last = model.servicePorts[model.servicePorts.length - 1];
      const packet = {srcIP: '10.128.0.5', dstIP: last.clusterIP, dstPort: last.port, protocol: last.protocol, origin: 'arriving' as const};
      const service = `${last.namespace}/${last.serviceName}`;
      const cold = await timed(() => client.call('trace', {packet, service}));
      figure({
        name: "first trace (parses the full sync's read-back, renders and diffs)",
        value: cold.ms,
        unit: 'ms',
        floor: {name: 'iptables-save (not run by the trace)', value: save.ms},
      });
      const warm: number[] = [];
      for (let i = 0; i < 20; i++) warm.push((await timed(() => client.call('trace', {packet, service}))).ms);
      warm.sort((a, b) => a - b);
      figure({
        name: 'trace, rules unchanged: p50',
        value: percentile(warm, 50),
        unit: 'ms',
        note: 'goal < 200 ms; answered from the cached rules',
      });
      figure({
        name: 'trace, rules unchanged: p95',
        value: percentile(warm, 95),
        unit: 'ms',
        note: `rules read at ${(cold.result as {readAt: string}).readAt}`,
      });
      figure({name: 'agent heap after the cache is full', value: mib(process.memoryUsage().heapUsed), unit: 'MiB'});

      // The agent's own partial write: the last service's chain rewritten, followed from its input.
      const desired = iptablesBackend.parse(rendered) as IptablesRuleset;
      const svcChain = [...desired.tables.get('nat')!.chains.values()].find(
        (chain) => chain.name.startsWith('KUBE-SVC-') && chain.rules.some((rule) => rule.comment?.includes(service)),
      )!;
      const svcRules = svcChain.rules.map((rule) => rule.text);
      const partial = `*nat\n:${svcChain.name} - [0:0]\n${svcRules.join('\n')}\nCOMMIT\n`;
      const partialWrite = await timed(() =>
        write(partial, true, async () => ({
          kind: 'chains',
          writtenAt: Date.now(),
          tables: [{table: 'nat', declared: [svcChain.name], chains: [svcChain.name], rules: svcRules}],
        })),
      );
      // The trace waits for nft monitor to report the write (so that a foreign change made meanwhile is not missed): timed beside it.
      const [afterOwn, monitorCaughtUp] = await Promise.all([
        timed(() => client.call('trace', {packet, service})),
        timed(() => changes.settled(60_000)),
      ]);
      figure({
        name: 'trace right after an own partial write (cache patched)',
        value: afterOwn.ms,
        unit: 'ms',
        note: `write ${Math.round(partialWrite.ms)} ms; verdict ${afterOwn.result.verdict}, drifted ${afterOwn.result.drifted}, rules read at ${afterOwn.result.readAt}`,
      });
      figure({name: '  of which nft monitor catching up with the write', value: monitorCaughtUp.ms, unit: 'ms'});
      const afterOwnAgain = await timed(() => client.call('trace', {packet, service}));
      figure({name: 'next trace after the own write', value: afterOwnAgain.ms, unit: 'ms'});

      // Someone else's change, asked about the moment it is made: the trace must read the kernel again.
      runIn(netns, ['iptables', '-t', 'nat', '-I', 'KUBE-SERVICES', '1', '-j', 'RETURN']);
      const changed = await timed(() => client.call('trace', {packet, service}));
      figure({
        name: 'trace right after a foreign change (re-read)',
        value: changed.ms,
        unit: 'ms',
        note: `verdict ${changed.result.verdict}, drifted ${changed.result.drifted}`,
      });
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
  heading(
    'plugin: diff --all-nodes fan-out',
    `${agentCount} agents in this process (status + diff each, agents answer at once), concurrency 10, WebSocket on loopback`,
  );
  const status = {
    node: '',
    mode: 'iptables',
    version: 'bench',
    ready: true,
    lastSync: {at: new Date().toISOString(), durationMs: 12, kind: 'full', ok: true},
    services: 100,
    endpoints: 1000,
    drift: {services: [], checkedAt: new Date().toISOString()},
    syncFailures: 0,
    rulesReadAt: new Date().toISOString(),
  };
  const apis: {node: string; api: Awaited<ReturnType<typeof startAgentApi>>}[] = [];
  for (let i = 0; i < agentCount; i++) {
    const node = `node-${i}`;
    const diff =
      i % 50 === 7
        ? {
            equal: false,
            groups: [{servicePort: 'default/web:http', added: ['-A KUBE-SERVICES -j X'], removed: []}],
            text: '--- desired\n+++ applied\n',
            readAt: new Date().toISOString(),
          }
        : {equal: true, groups: [], text: '', readAt: new Date().toISOString()};
    const handlers = {
      status: async () => ({...status, node}),
      diff: async () => diff,
      onSync: () => () => {},
    } as unknown as AgentApiHandlers;
    apis.push({node, api: await startAgentApi({host: '127.0.0.1', port: 0, handlers, log: quiet})});
  }
  try {
    const rssBefore = process.memoryUsage().rss;
    const run = await timed(() =>
      forEachNode(
        apis.map((entry) => entry.node),
        10,
        async (node) => {
          const client = await AgentClient.connect({
            url: apis.find((entry) => entry.node === node)!.api.url,
            timeoutMs: 30_000,
            label: node,
          });
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
    figure({
      name: `diff --all-nodes, ${agentCount} agents`,
      value: run.ms,
      unit: 'ms',
      note: `${differing} differ, ${[...run.result.values()].filter((r) => !r.ok).length} failed`,
    });
    figure({
      name: 'RSS growth during the fan-out',
      value: mib(process.memoryUsage().rss - rssBefore),
      unit: 'MiB',
      note: 'client and 200 agents share this process',
    });
  } finally {
    for (const {api} of apis) await api.stop();
  }
}

if (import.meta.main) await benchAgentApi();
