// `kubectl proxyctl trace` end to end in the lab, on a node whose agent proxies 10,000 services x
// 10 endpoints: a one-node lab, the services and their EndpointSlices created through the lab's
// API server (selector-less services, so the slices are the bench's own), then the plugin run as
// a user runs it (a new process: kubeconfig, service and slices from the API server, the agent
// found by label and reached through a pods/portforward WebSocket). Its floor is the plugin
// process itself (`kubectl proxyctl --version`, which the launcher answers before loading oclif or
// any command): Node's start and the launcher; bench/plugin.ts breaks the rest of a start down.
// The same command is also run inside this process, once loaded, which leaves out the process
// start and module loading (client-node above all): the trace's own path
// through the API server, the port-forward and the agent.
import {execFile} from 'node:child_process';
import {fileURLToPath} from 'node:url';
import {promisify} from 'node:util';
import {CoreV1Api, DiscoveryV1Api, KubeConfig, type V1EndpointSlice, type V1Service} from '@kubernetes/client-node';
import Trace from '../src/plugin/commands/trace.ts';
import {downLab, upLab} from '../src/lab/lab-control.ts';
import {figure, heading, percentile, skipped, timed} from './report.ts';

const execFileAsync = promisify(execFile);
// Not bench/netns.ts's isRoot: importing it installs signal handlers that exit at once, before the lab is down.
const isRoot = process.getuid?.() === 0;
const plugin = fileURLToPath(new URL('../bin/kubectl-proxyctl', import.meta.url));
const runs = 7;

export async function benchLabTrace(serviceCount = 10_000, endpointsPerService = 10): Promise<void> {
  const label = `${serviceCount.toLocaleString('en-US')} services x ${endpointsPerService} endpoints`;
  heading(
    'lab: kubectl proxyctl trace end to end',
    `one-node lab, ${label} (ClusterIP, one TCP port each), plugin as a new process through the port-forward`,
  );
  if (!isRoot) {
    skipped('every figure', 'needs root (the lab builds network namespaces)');
    return;
  }
  const name = `bench-trace-${process.pid}`;
  // Interrupted, the lab goes too.
  const interrupted = () => void downLab(name).finally(() => process.exit(130));
  process.once('SIGINT', interrupted).once('SIGTERM', interrupted);
  try {
    const state = await upLab({name, nodes: 1, podsPerNode: 1});
    const config = new KubeConfig();
    config.loadFromFile(state.kubeconfig);
    const created = await timed(() => createServices(config, serviceCount, endpointsPerService));
    figure({name: `create ${label} through the API server`, value: created.ms, unit: 'ms'});

    const env = {...process.env, KUBECONFIG: state.kubeconfig, NO_COLOR: '1'};
    const traceLast = () =>
      execFileAsync(plugin, ['trace', `svc-${serviceCount - 1}`, '--node', 'node-0', '-o', 'json'], {env, maxBuffer: 64 << 20});
    // Synced when the last service traces to its endpoints.
    const synced = await timed(async () => {
      const deadline = Date.now() + 600_000;
      for (;;) {
        const answer = await traceLast()
          .then((run) => JSON.parse(run.stdout) as {verdict: string; branches?: unknown[]})
          .catch(() => undefined);
        if (answer?.verdict === 'DNAT' && answer.branches?.length === endpointsPerService) return;
        if (Date.now() > deadline)
          throw new Error(`svc-${serviceCount - 1} did not trace to its ${endpointsPerService} endpoints within 600 s`);
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    });
    figure({
      name: 'until the agent traces the last service',
      value: synced.ms,
      unit: 'ms',
      note: 'its sync, then its first reading of the kernel',
    });

    const startup: number[] = [];
    for (let i = 0; i < runs; i++) startup.push((await timed(() => execFileAsync(plugin, ['--version'], {env}))).ms);
    const floor = percentile(
      startup.sort((a, b) => a - b),
      50,
    );
    const traces: number[] = [];
    for (let i = 0; i < runs; i++) traces.push((await timed(traceLast)).ms);
    traces.sort((a, b) => a - b);
    const p50 = percentile(traces, 50);
    figure({
      name: `kubectl proxyctl trace, p50 of ${runs}`,
      value: p50,
      unit: 'ms',
      floor: {name: 'kubectl proxyctl --version', value: floor},
      note: `min ${traces[0].toFixed(0)} ms, max ${traces.at(-1)!.toFixed(0)} ms, a new process each`,
    });

    const argv = ['trace', `svc-${serviceCount - 1}`, '--node', 'node-0', '-o', 'json'];
    const inProcess: number[] = [];
    for (let i = 0; i <= runs; i++) {
      const run = await timed(() => runQuietly(() => Trace.run(argv.slice(1), projectRoot), env.KUBECONFIG));
      if (!/"verdict": "DNAT"/.test(run.result)) throw new Error(`the in-process trace did not answer DNAT:\n${run.result.slice(0, 500)}`);
      if (i > 0) inProcess.push(run.ms); // the first run loads the modules
    }
    inProcess.sort((a, b) => a - b);
    const warm = percentile(inProcess, 50);
    figure({
      name: `the same trace in a loaded plugin, p50 of ${runs}`,
      value: warm,
      unit: 'ms',
      note: `min ${inProcess[0].toFixed(0)} ms, max ${inProcess.at(-1)!.toFixed(0)} ms: service, slices and agent pod from the API server, port-forward, trace; goal < 200 ms ${warm < 200 ? 'met' : 'NOT met'}`,
    });
  } finally {
    process.off('SIGINT', interrupted).off('SIGTERM', interrupted);
    await downLab(name).catch((error: Error) => console.error(`lab down ${name}: ${error.message}`));
  }
}

const projectRoot = fileURLToPath(new URL('..', import.meta.url));

/** runQuietly runs a plugin command with KUBECONFIG set and returns what it wrote to stdout. */
export async function runQuietly(command: () => Promise<unknown>, kubeconfig: string | undefined): Promise<string> {
  const write = process.stdout.write;
  const previous = process.env.KUBECONFIG;
  let out = '';
  process.stdout.write = ((chunk: string | Uint8Array) => {
    out += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString();
    return true;
  }) as typeof process.stdout.write;
  process.env.KUBECONFIG = kubeconfig;
  try {
    await command();
  } finally {
    process.stdout.write = write;
    if (previous === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = previous;
  }
  return out;
}

async function createServices(config: KubeConfig, serviceCount: number, endpointsPerService: number): Promise<void> {
  const core = config.makeApiClient(CoreV1Api);
  const discovery = config.makeApiClient(DiscoveryV1Api);
  const create = async (s: number) => {
    const service: V1Service = {
      metadata: {name: `svc-${s}`, namespace: 'default'},
      spec: {type: 'ClusterIP', ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}]},
    };
    await core.createNamespacedService({namespace: 'default', body: service});
    const endpoints = [];
    // 10.250.0.0/16 and up: addresses no lab pod has, on other nodes (the trace predicts, nothing is probed).
    for (let e = 0; e < endpointsPerService; e++) {
      const n = s * endpointsPerService + e;
      endpoints.push({addresses: [`10.${250 + (n >> 16)}.${(n >> 8) & 255}.${n & 255}`], conditions: {ready: true}, nodeName: 'elsewhere'});
    }
    const slice: V1EndpointSlice = {
      metadata: {name: `svc-${s}-bench`, namespace: 'default', labels: {'kubernetes.io/service-name': `svc-${s}`}},
      addressType: 'IPv4',
      ports: [{name: 'http', protocol: 'TCP', port: 8080}],
      endpoints,
    };
    await discovery.createNamespacedEndpointSlice({namespace: 'default', body: slice});
  };
  let next = 0;
  const worker = async () => {
    while (next < serviceCount) await create(next++);
  };
  await Promise.all(Array.from({length: 16}, worker));
}

/** Run alone: node bench/lab-trace.ts [SERVICES] */
if (import.meta.url === `file://${process.argv[1]}`) await benchLabTrace(Number(process.argv[2] ?? 10_000));
