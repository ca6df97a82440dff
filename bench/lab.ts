// The lab's figures: `lab up` with 3 nodes x 10 pods (goal < 10 s); then, in a 3-node lab with its
// agents, Debian's kubectl 1.20 running `kubectl scale deployment web --replicas=50` from one replica to every pod Ready and every
// agent's iptables rules holding all 50 endpoints (goal <= 15 s), and pod start, bound -> Ready as
// the kubelet reports it (goal p50 <= 200 ms); and a rolling update (`kubectl rollout restart`) of
// 20 replicas under a stream of requests through the ClusterIP from a pod (goal: none fails).
import {cpus, loadavg} from 'node:os';
import {execa} from 'execa';
import type {ProbeResult} from '../src/lab/workload/demoapp-client.ts';
import {timeLabUp} from '../src/lab/lab-bench.ts';
import {claimLabDir} from '../src/lab/lab-state.ts';
import {LabSupervisor} from '../src/lab/supervisor.ts';

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(2)} s`;
}

function percentile(values: number[], fraction: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(fraction * sorted.length))];
}

async function benchLabUp(): Promise<void> {
  const timing = await timeLabUp({nodes: 3, podsPerNode: 10});
  const goalMs = 10_000;
  console.log(
    `   lab up, ${timing.nodes} nodes x ${timing.podsPerNode} pods: ${seconds(timing.upMs)} (goal < ${goalMs / 1000} s ${timing.upMs < goalMs ? 'met' : 'NOT met'})`,
  );
  console.log(
    `   supervisor steps, seconds from its start: ${Object.entries(timing.steps)
      .map(([step, ms]) => `${step} ${(ms / 1000).toFixed(2)}`)
      .join(', ')}`,
  );
  console.log(`   lab down: ${seconds(timing.downMs)}`);
}

/** Endpoints of default/web in a node's iptables rules (the KUBE-SVC chain's jumps, by their "-> IP:PORT" comments). */
async function endpointsInRules(nodeNamespace: string): Promise<number> {
  const {stdout} = await execa('ip', ['netns', 'exec', nodeNamespace, 'iptables-save', '-t', 'nat']);
  const endpoints = new Set<string>();
  for (const line of stdout.split('\n')) {
    if (!line.startsWith('-A KUBE-SVC-') || !line.includes('default/web') || !line.includes('-j KUBE-SEP-')) continue;
    const match = / -> ([\d.]+:\d+)/.exec(line);
    if (match) endpoints.add(match[1]);
  }
  return endpoints.size;
}

async function benchScale(replicas: number): Promise<void> {
  const script = await execa(new URL('../scripts/debian-kubectl.sh', import.meta.url).pathname);
  const kubectl = String(script.stdout).trim().split('\n').pop()!;
  const name = `bench-scale-${process.pid}`;
  if (!(await claimLabDir(name))) throw new Error(`lab ${name} exists already`);
  const supervisor = new LabSupervisor({name, nodes: 3, podsPerNode: 0, proxyMode: 'iptables', agents: true}, () => undefined);
  try {
    await supervisor.start();
    const server = supervisor.apiServer!;
    const headers = {authorization: `Bearer ${server.adminToken}`, 'content-type': 'application/json'};
    const post = (path: string, body: unknown) => fetch(`${server.url}${path}`, {method: 'POST', headers, body: JSON.stringify(body)});
    const labels = {app: 'web'};
    await post('/apis/apps/v1/namespaces/default/deployments', {
      metadata: {name: 'web'},
      spec: {
        replicas: 1,
        selector: {matchLabels: labels},
        template: {metadata: {labels}, spec: {containers: [{name: 'web', image: 'nginx', ports: [{containerPort: 8080}]}]}},
      },
    });
    await post('/api/v1/namespaces/default/services', {
      metadata: {name: 'web'},
      spec: {selector: labels, ports: [{port: 80, targetPort: 8080}]},
    });
    const nodes = supervisor.state.topology!.nodes;
    const rulesHold = async (count: number) =>
      (await Promise.all(nodes.map((node) => endpointsInRules(node.namespace)))).every((n) => n === count);
    while (!(await rulesHold(1))) await new Promise((resolve) => setTimeout(resolve, 50));
    const started = performance.now();
    const startsSince = startsMark(supervisor);
    await execa(kubectl, ['--kubeconfig', supervisor.state.kubeconfig, 'scale', 'deployment', 'web', `--replicas=${replicas}`]);
    let readyMs = 0;
    for (;;) {
      if (!readyMs) {
        const ready = server.store.get('deployments', 'default', 'web').status?.readyReplicas ?? 0;
        if (ready === replicas) readyMs = performance.now() - started;
      }
      if (readyMs && (await rulesHold(replicas))) break;
      if (performance.now() - started > 120_000) throw new Error(`scale to ${replicas}: not done after 120 s`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const doneMs = performance.now() - started;
    const starts = startsSince();
    const goalMs = 15_000;
    console.log(
      `   kubectl scale deployment web --replicas=${replicas}, 3 nodes: every pod Ready ${seconds(readyMs)}, every agent's rules hold all ${replicas} endpoints ${seconds(doneMs)} (goal <= ${goalMs / 1000} s ${doneMs <= goalMs ? 'met' : 'NOT met'})`,
    );
    console.log(
      `   pod start during that scale-up (${starts.length} pods at once on ${cpus().length} CPUs), bound -> Ready: p50 ${percentile(starts, 0.5).toFixed(0)} ms, p90 ${percentile(starts, 0.9).toFixed(0)} ms`,
    );
    const single = await startOneAtATime(supervisor, 10);
    const p50 = percentile(single, 0.5);
    console.log(
      `   pod start one at a time (${single.length} pods, kubectl run's path), bound -> Ready as the kubelet reports it: p50 ${p50.toFixed(0)} ms (goal <= 200 ms ${p50 <= 200 ? 'met' : 'NOT met'}), max ${Math.max(...single).toFixed(0)} ms`,
    );
    await rollingUpdateUnderTraffic(supervisor, kubectl, 20, rulesHold);
    console.log(`   load average over the run: ${loadavg()[0].toFixed(1)} (other work on this machine slows every figure)`);
  } finally {
    await supervisor.shutdown();
  }
}

/**
 * rollingUpdateUnderTraffic scales web to `replicas`, then restarts it (kubectl rollout restart)
 * while pod single-0 sends request after request to its ClusterIP, until the rollout is done.
 */
async function rollingUpdateUnderTraffic(
  supervisor: LabSupervisor,
  kubectl: string,
  replicas: number,
  rulesHold: (count: number) => Promise<boolean>,
): Promise<void> {
  const server = supervisor.apiServer!;
  const run = (...args: string[]) => execa(kubectl, ['--kubeconfig', supervisor.state.kubeconfig, ...args]);
  await run('scale', 'deployment', 'web', `--replicas=${replicas}`);
  await run('rollout', 'status', 'deployment/web', '--timeout=120s');
  while (!(await rulesHold(replicas))) await new Promise((resolve) => setTimeout(resolve, 50));
  const clusterIP = server.store.get('services', 'default', 'web').spec.clusterIP as string;
  const netns = server.store.get('pods', 'default', 'single-0').metadata.annotations?.['lab.proxyctl.dev/netns'] as string;
  const client = new URL('../src/lab/workload/demoapp-client.ts', import.meta.url).pathname;
  const results: ProbeResult[] = [];
  let rolledOut = false;
  const stream = (async () => {
    while (!rolledOut) {
      const args = ['netns', 'exec', netns, process.execPath, client, '--protocol', 'tcp', '--host', clusterIP, '--port', '80'];
      const batch = await execa('ip', [...args, '--count', '200', '--timeout-ms', '2000']);
      results.push(...(JSON.parse(String(batch.stdout)) as ProbeResult[]));
    }
  })();
  const started = performance.now();
  await run('rollout', 'restart', 'deployment/web');
  await run('rollout', 'status', 'deployment/web', '--timeout=300s');
  const rolloutMs = performance.now() - started;
  rolledOut = true;
  await stream;
  const failed = results.filter((result) => result.outcome !== 'reply');
  const repliers = new Set(results.flatMap((result) => (result.outcome === 'reply' ? [result.reply.pod] : [])));
  console.log(
    `   kubectl rollout restart deployment/web, ${replicas} replicas, ${seconds(rolloutMs)}, under ${results.length} requests ` +
      `through the ClusterIP from a pod, one after another: ${failed.length} failed (goal 0 ${failed.length === 0 ? 'met' : 'NOT met'}), ` +
      `${repliers.size} pods answered`,
  );
}

/** A mark in every kubelet's start latencies; startsSince(mark) are the ones recorded after it. */
function startsMark(supervisor: LabSupervisor): () => number[] {
  const lengths = supervisor.kubelets.map((kubelet) => kubelet.startLatencies.length);
  return () => supervisor.kubelets.flatMap((kubelet, index) => kubelet.startLatencies.slice(lengths[index]));
}

/** startOneAtATime creates count pods, each after the one before is Ready, and returns their start latencies. */
async function startOneAtATime(supervisor: LabSupervisor, count: number): Promise<number[]> {
  const server = supervisor.apiServer!;
  const startsSince = startsMark(supervisor);
  for (let i = 0; i < count; i++) {
    const pod = server.store.create(
      'pods',
      {metadata: {name: `single-${i}`}, spec: {containers: [{name: 'c', image: 'nginx'}]}},
      'default',
    );
    const deadline = performance.now() + 30_000;
    for (;;) {
      const current = server.store.tryGet('pods', 'default', pod.metadata.name);
      if ((current?.status?.conditions ?? []).some((c: any) => c.type === 'Ready' && c.status === 'True')) break;
      if (performance.now() > deadline) throw new Error(`pod ${pod.metadata.name} not Ready after 30 s`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
  return startsSince();
}

export async function benchLab(): Promise<void> {
  await benchLabUp();
  await benchScale(50);
}
