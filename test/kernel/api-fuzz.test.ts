// Fuzzing the API beside live agents: seeded random mutations of valid Services and EndpointSlices
// (test/lab/apiserver/object-fuzzer.ts) go through the embedded API server while a proxyctl-agent in
// iptables mode and one in nftables mode follow it in a namespace cluster. Every answer is a 2xx or
// a 4xx Status naming the field; afterwards both agents are still running and healthy, and a real
// connection to the valid service still reaches its pods. The seed is printed with any failure.
import assert from 'node:assert/strict';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it, type TestContext} from 'node:test';
import {freeLoopbackPorts} from '../../src/lab/agent-process.ts';
import {
  AgentChild,
  kernelUnavailable,
  type LiveCluster,
  repliedPods,
  serviceObject,
  startLiveCluster,
  until,
} from '../agent/live/live-cluster.ts';
import {fuzzSeed, ObjectFuzzer} from '../lab/apiserver/object-fuzzer.ts';

const iterations = 300;
let cluster: LiveCluster | undefined;
let dir: string | undefined;

function live(t: TestContext): LiveCluster | undefined {
  if (!cluster) t.skip(`needs root: ${kernelUnavailable}`);
  return cluster;
}

describe('fuzzed API objects beside live agents', {concurrency: false, timeout: 240_000}, () => {
  before(async () => {
    if (kernelUnavailable) return;
    cluster = await startLiveCluster({
      nodes: 2,
      podsPerNode: 2,
      externalClients: 0,
      servers: {'pod-0-1': {app: 'web'}, 'pod-1-1': {app: 'web'}},
      agentsOn: [0],
    });
    dir = await mkdtemp(join(tmpdir(), 'pxk-fuzz-'));
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(kubeconfig, cluster.server.kubeconfig(), {mode: 0o600});
    const nftables = new AgentChild(cluster.node(1), kubeconfig, (await freeLoopbackPorts(2)) as [number, number], {
      extraFlags: ['--proxy-mode=nftables'],
    });
    cluster.agents.push(nftables);
    nftables.start();
    await nftables.waitSynced();
    cluster.server.store.create('services', serviceObject('web', {app: 'web'}), 'default');
  });
  after(async () => {
    for (const agent of cluster?.agents ?? []) await agent.kill('SIGKILL');
    await cluster?.close();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it(`${iterations} mutations through the API; the agents stay ready and keep proxying the valid service`, async (t) => {
    const c = live(t);
    if (!c) return;
    const web = (c.server.store.get('services', 'default', 'web').spec as {clusterIP: string}).clusterIP;
    const reachWeb = async (from: string) =>
      repliedPods(await c.probe(c.pod(from).namespace, {protocol: 'tcp', host: web, port: 80, timeoutMs: 3000}, 4), `web from ${from}`);
    await until(
      'web answers on both nodes',
      async () =>
        (await c.probe(c.pod('pod-0-0').namespace, {protocol: 'tcp', host: web, port: 80, timeoutMs: 1000}))[0].outcome === 'reply',
      20_000,
    );

    const fuzzer = new ObjectFuzzer(c.server, fuzzSeed());
    await fuzzer.run(iterations, (line) => t.diagnostic(line));

    for (const agent of c.agents) {
      assert.ok(
        agent.pid !== undefined,
        `seed ${fuzzer.seed}: the agent on ${agent.node.name} is still running; its log ends:\n${agent.lines.slice(-20).join('\n')}`,
      );
      await until(
        `seed ${fuzzer.seed}: the agent on ${agent.node.name} healthy after the fuzzing`,
        async () => (await agent.healthz('/healthz').catch(() => ({status: 0}))).status === 200,
        60_000,
      );
    }
    for (const from of ['pod-0-0', 'pod-1-0']) {
      const pods = await reachWeb(from);
      assert.ok(
        pods.every((pod) => pod === 'pod-0-1' || pod === 'pod-1-1'),
        `seed ${fuzzer.seed}: ${pods}`,
      );
    }
    await fuzzer.cleanUp();
  });
});
