// A live cluster for end-to-end agent tests: a namespace cluster (nodes, pods, external clients)
// with demo servers, the embedded API server in the test process (optionally behind a relay the
// test can cut to play an API server outage), and real proxyctl-agent processes, one per chosen
// node, each writing its rules into its node's namespace with --netns. Everything goes away on
// close(), on failure too.
import assert from 'node:assert/strict';
import {after, before, type TestContext} from 'node:test';
import {type ChildProcess, spawn} from 'node:child_process';
import {existsSync} from 'node:fs';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {createServer, type Server, type Socket, connect} from 'node:net';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {freeLoopbackPorts} from '../../../src/lab/agent-process.ts';
import {type ApiServer, type ApiServerOptions, startApiServer} from '../../../src/lab/apiserver/server.ts';
import type {KubeObject} from '../../../src/lab/apiserver/object-log.ts';
import {nodeObject, podStatus} from '../../../src/lab/lab-objects.ts';
import {execInNamespace, type NodeDescription, type PodDescription} from '../../../src/lab/netns/index.ts';
import type {ProbeResult, ProbeTarget} from '../../../src/lab/workload/demoapp-client.ts';
import {NamespaceProbers} from '../../../src/lab/workload/launch.ts';
import {demoPorts, findPod, type KernelLab, kernelUnavailable, startKernelLab} from '../../kernel/namespace-lab.ts';

export {demoPorts, findPod, kernelUnavailable} from '../../kernel/namespace-lab.ts';

// The agent as users start it: the launcher runs the build (npm test builds first) with the
// image's Node flags, the tree-shaken client-node among them.
const agentLauncher = fileURLToPath(new URL('../../../bin/proxyctl-agent', import.meta.url));
const agentBuild = fileURLToPath(new URL('../../../dist/src/agent/main.js', import.meta.url));
export const clusterCIDR = '10.244.0.0/16';

/** until polls check every 50 ms until it is true, or fails naming what it waited for. */
export async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 15_000): Promise<number> {
  const started = Date.now();
  while (!(await check())) {
    if (Date.now() - started > timeoutMs) assert.fail(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(50);
  }
  return Date.now() - started;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * ApiRelay: a TCP relay in front of the API server, so a test can take the API server away from
 * the agents (every connection cut, new ones refused, as when kube-apiserver's process dies) and
 * bring it back on the same address with its storage intact.
 */
export class ApiRelay {
  readonly port: number;
  readonly #target: number;
  #server: Server | undefined;
  readonly #sockets = new Set<Socket>();

  private constructor(port: number, target: number) {
    this.port = port;
    this.#target = target;
  }

  static async start(target: number): Promise<ApiRelay> {
    const [port] = await freeLoopbackPorts(1);
    const relay = new ApiRelay(port, target);
    await relay.up();
    return relay;
  }

  async up(): Promise<void> {
    if (this.#server) return;
    const server = createServer((client) => {
      const upstream = connect(this.#target, '127.0.0.1');
      for (const socket of [client, upstream]) {
        this.#sockets.add(socket);
        socket.on('close', () => this.#sockets.delete(socket));
        socket.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream);
      upstream.pipe(client);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.#server = server;
  }

  async down(): Promise<void> {
    const server = this.#server;
    if (!server) return;
    this.#server = undefined;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const socket of this.#sockets) socket.destroy();
    await closed;
  }
}

export interface AgentOptions {
  syncPeriod?: string;
  minSyncPeriod?: string;
  verbosity?: number;
  extraFlags?: string[];
}

/** AgentChild: one proxyctl-agent process for one node, its log kept in memory. */
export class AgentChild {
  readonly node: NodeDescription;
  readonly lines: string[] = [];
  readonly healthzPort: number;
  readonly metricsPort: number;
  readonly #kubeconfig: string;
  readonly #options: AgentOptions;
  #child: ChildProcess | undefined;
  #exited: Promise<void> = Promise.resolve();
  #partial = '';
  readonly #lineWaiters = new Set<{pattern: RegExp; resolve: (line: string) => void}>();

  constructor(node: NodeDescription, kubeconfig: string, ports: [number, number], options: AgentOptions) {
    this.node = node;
    this.#kubeconfig = kubeconfig;
    this.healthzPort = ports[0];
    this.metricsPort = ports[1];
    this.#options = options;
  }

  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** `overrides` change the options for this command line only (a restart with --v 4, say). */
  commandLine(overrides: AgentOptions = {}): string[] {
    const options = {...this.#options, ...overrides};
    return [
      agentLauncher,
      '--netns',
      this.node.namespace,
      '--kubeconfig',
      this.#kubeconfig,
      '--hostname-override',
      this.node.name,
      '--cluster-cidr',
      clusterCIDR,
      `--healthz-bind-address=127.0.0.1:${this.healthzPort}`,
      `--metrics-bind-address=127.0.0.1:${this.metricsPort}`,
      // The plugin API is not under test here.
      '--api-bind-address=',
      '--iptables-sync-period',
      options.syncPeriod ?? '30s',
      '--iptables-min-sync-period',
      options.minSyncPeriod ?? '1s',
      '--v',
      String(options.verbosity ?? 2),
      ...(options.extraFlags ?? []),
    ];
  }

  start(overrides: AgentOptions = {}): void {
    assert.equal(this.#child, undefined, `agent on ${this.node.name} is already running`);
    assert.ok(existsSync(agentBuild), `${agentBuild} is missing: npm run build first`);
    const [program, ...args] = this.commandLine(overrides);
    const child = spawn(program, args, {stdio: ['ignore', 'pipe', 'pipe']});
    this.#child = child;
    const take = (chunk: string) => {
      const text = this.#partial + chunk;
      const lines = text.split('\n');
      this.#partial = lines.pop()!;
      this.lines.push(...lines);
      for (const waiter of this.#lineWaiters) {
        const line = lines.find((candidate) => waiter.pattern.test(candidate));
        if (line === undefined) continue;
        this.#lineWaiters.delete(waiter);
        waiter.resolve(line);
      }
    };
    child.stdout!.setEncoding('utf8').on('data', take);
    child.stderr!.setEncoding('utf8').on('data', take);
    this.#exited = new Promise((resolve) =>
      child.once('exit', (code, signal) => {
        this.lines.push(`(agent process ended: ${signal ?? `exit ${code}`})`);
        if (this.#child === child) this.#child = undefined;
        resolve();
      }),
    );
  }

  /** signal sends a signal and returns at once (kill waits for the end). */
  signal(signal: NodeJS.Signals): void {
    this.#child?.kill(signal);
  }

  /** Resolves when the process has ended (at once when none runs). */
  exited(): Promise<void> {
    return this.#exited;
  }

  /** kill sends the signal and waits for the process to end. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = this.#child;
    if (!child) return;
    child.kill(signal);
    await this.#exited;
  }

  /**
   * nextLine resolves with the next log line that matches, as soon as its chunk arrives (waitForLog
   * polls, which is too late for acting inside a sync that lasts tens of ms).
   */
  nextLine(pattern: RegExp, timeoutMs = 15_000): Promise<string> {
    return new Promise((resolve, reject) => {
      const waiter = {
        pattern,
        resolve: (line: string) => {
          clearTimeout(timer);
          resolve(line);
        },
      };
      const timer = setTimeout(() => {
        this.#lineWaiters.delete(waiter);
        reject(
          new Error(
            `agent on ${this.node.name} logged no line matching ${pattern} in ${timeoutMs} ms; its log ends:\n${this.lines.slice(-15).join('\n')}`,
          ),
        );
      }, timeoutMs);
      this.#lineWaiters.add(waiter);
    });
  }

  /** The log lines from index `from` on that match. */
  logged(pattern: RegExp, from = 0): string[] {
    return this.lines.slice(from).filter((line) => pattern.test(line));
  }

  async waitForLog(pattern: RegExp, options: {from?: number; timeoutMs?: number} = {}): Promise<string> {
    await until(
      `agent on ${this.node.name} to log ${pattern}`,
      () => this.logged(pattern, options.from).length > 0 || this.#child === undefined,
      options.timeoutMs,
    );
    const found = this.logged(pattern, options.from)[0];
    assert.ok(found, `agent on ${this.node.name} ended before logging ${pattern}; its log ends:\n${this.lines.slice(-15).join('\n')}`);
    return found;
  }

  /** Waits until /healthz reports a sync (lastUpdated set) and returns the answer. */
  async waitSynced(timeoutMs = 20_000): Promise<void> {
    await until(
      `agent on ${this.node.name} to sync its rules`,
      async () => {
        const answer = await this.healthz('/healthz').catch(() => undefined);
        return Boolean(answer && (answer.body as {lastUpdated?: string}).lastUpdated);
      },
      timeoutMs,
    );
  }

  async healthz(path: '/healthz' | '/livez'): Promise<{status: number; body: unknown}> {
    const response = await fetch(`http://127.0.0.1:${this.healthzPort}${path}`, {signal: AbortSignal.timeout(2000)});
    return {status: response.status, body: await response.json()};
  }

  async metrics(): Promise<string> {
    const response = await fetch(`http://127.0.0.1:${this.metricsPort}/metrics`, {signal: AbortSignal.timeout(5000)});
    assert.equal(response.status, 200);
    return response.text();
  }

  /** The value of one sample in /metrics, e.g. metric('proxyctl_drift_repairs_total', {ip_family: 'IPv4'}); 0 when absent. */
  async metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    return metricValue(await this.metrics(), name, labels);
  }
}

/** metricValue finds one sample in a Prometheus text page; 0 when it is not there. */
export function metricValue(page: string, name: string, labels: Record<string, string> = {}): number {
  for (const line of page.split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!match || match[1] !== name) continue;
    const present = new Map([...(match[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((pair) => [pair[1], pair[2]]));
    if (Object.entries(labels).every(([key, value]) => present.get(key) === value)) return Number(match[3]);
  }
  return 0;
}

export interface LiveClusterOptions {
  nodes: number;
  podsPerNode: number;
  externalClients?: number;
  /** Pods that run a demo server, with the labels their Pod objects carry. */
  servers: Record<string, Record<string, string>>;
  /** Nodes (by index) that run an agent; default all. */
  agentsOn?: number[];
  agent?: AgentOptions;
  apiServer?: ApiServerOptions;
  /** Put a relay between the agents and the API server (for outage tests). */
  relay?: boolean;
}

export interface LiveCluster {
  lab: KernelLab;
  server: ApiServer;
  relay?: ApiRelay;
  agents: AgentChild[];
  node(index: number): NodeDescription;
  pod(name: string): PodDescription;
  /** The ClusterIP the API server allocated to a service of the default namespace. */
  clusterIPOf(service: string): string;
  /** relabel gives a pod new labels; the EndpointSlice controller follows. */
  relabel(pod: string, labels: Record<string, string>): void;
  /**
   * probe makes `count` requests from the namespace, one after the other, through one demo client
   * per namespace kept for the cluster's life (a Node process per probe takes seconds to start in
   * the qemu guest).
   */
  probe(namespace: string, target: ProbeTarget, count?: number): Promise<ProbeResult[]>;
  /** What one TCP request from a namespace to host:port meets (1 s timeout). */
  outcome(namespace: string, host: string, port?: number): Promise<ProbeResult['outcome']>;
  answers(namespace: string, host: string, port?: number): Promise<boolean>;
  close(): Promise<void>;
}

/** A describe block's cluster: live(t) returns it, or skips the case with the reason it cannot run. */
export interface LiveSuite {
  live(t: TestContext): LiveCluster | undefined;
}

/**
 * liveClusterSuite registers, inside a describe block, the hooks that start one live cluster
 * before its cases (then `ready`, the block's own first objects) and close it after them.
 */
export function liveClusterSuite(options: LiveClusterOptions, ready: (cluster: LiveCluster) => Promise<void> = async () => {}): LiveSuite {
  let cluster: LiveCluster | undefined;
  before(async () => {
    if (kernelUnavailable) return;
    cluster = await startLiveCluster(options);
    await ready(cluster);
  });
  after(async () => {
    await cluster?.close();
  });
  return {
    live(t) {
      if (!cluster) t.skip(`needs root: ${kernelUnavailable}`);
      return cluster;
    },
  };
}

export async function startLiveCluster(options: LiveClusterOptions): Promise<LiveCluster> {
  const cleanups: Array<() => Promise<unknown> | unknown> = [];
  const close = async () => {
    for (const cleanup of cleanups.splice(0).reverse()) {
      try {
        await cleanup();
      } catch {
        // keep cleaning up the rest
      }
    }
  };
  try {
    const lab = await startKernelLab(
      {nodes: options.nodes, podsPerNode: options.podsPerNode, externalClients: options.externalClients ?? 1},
      Object.keys(options.servers),
    );
    cleanups.push(() => lab.close());
    const server = await startApiServer({port: 0, ...options.apiServer});
    cleanups.push(() => server.stop());
    const dir = await mkdtemp(join(tmpdir(), 'pxa-live-'));
    cleanups.push(() => rm(dir, {recursive: true, force: true}));
    let relay: ApiRelay | undefined;
    let kubeconfigText = server.kubeconfig();
    if (options.relay) {
      relay = await ApiRelay.start(server.port);
      cleanups.push(() => relay!.down());
      kubeconfigText = kubeconfigText.replace(server.secureUrl, `https://127.0.0.1:${relay.port}`);
      assert.ok(kubeconfigText.includes(`:${relay.port}`), 'the kubeconfig points at the relay');
    }
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(kubeconfig, kubeconfigText, {mode: 0o600});

    const now = new Date().toISOString();
    lab.topology.nodes.forEach((node, index) => server.store.create('nodes', nodeObject(node, index, now)));
    for (const [name, labels] of Object.entries(options.servers)) {
      const pod = findPod(lab.topology, name);
      const node = lab.topology.nodes.find((candidate) => candidate.name === pod.node)!;
      server.store.create('pods', podObject(pod, node.ip, labels, now), 'default', {keepStatus: true});
    }

    const agents: AgentChild[] = [];
    for (const index of options.agentsOn ?? lab.topology.nodes.map((_, i) => i)) {
      const ports = (await freeLoopbackPorts(2)) as [number, number];
      const agent = new AgentChild(lab.topology.nodes[index], kubeconfig, ports, options.agent ?? {});
      agents.push(agent);
      cleanups.push(() => agent.kill('SIGKILL'));
      agent.start();
    }
    for (const agent of agents) await agent.waitSynced();

    const probers = new NamespaceProbers();
    cleanups.push(() => probers.closeAll());
    const probe = (namespace: string, target: ProbeTarget, count = 1) => probers.probe(namespace, target, count);
    const outcome = async (namespace: string, host: string, port = 80) =>
      (await probe(namespace, {protocol: 'tcp', host, port, timeoutMs: 1000}))[0].outcome;
    return {
      lab,
      server,
      relay,
      agents,
      node: (index) => lab.topology.nodes[index],
      pod: (name) => findPod(lab.topology, name),
      clusterIPOf: (service) => (server.store.get('services', 'default', service) as unknown as {spec: {clusterIP: string}}).spec.clusterIP,
      relabel: (pod, labels) => {
        server.store.mutate('pods', 'default', pod, (object) => {
          object.metadata.labels = labels;
        });
      },
      probe,
      outcome,
      answers: async (namespace, host, port) => (await outcome(namespace, host, port)) === 'reply',
      close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}

/** podObject is a running, ready demo Pod as a kubelet would report it. */
export function podObject(pod: PodDescription, hostIP: string, labels: Record<string, string>, now: string): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {name: pod.name, namespace: 'default', labels},
    spec: {
      nodeName: pod.node,
      terminationGracePeriodSeconds: 30,
      containers: [
        {
          name: 'demoapp',
          image: 'proxyctl/demoapp:lab',
          ports: [
            {name: 'http', containerPort: demoPorts.http, protocol: 'TCP'},
            {name: 'udp-echo', containerPort: demoPorts.udp, protocol: 'UDP'},
          ],
        },
      ],
    },
    status: podStatus({hostIP, podIP: pod.ip, ready: true, now, containerName: 'demoapp', image: 'proxyctl/demoapp:lab', pid: 1}),
  };
}

/** A Service selecting pods by labels; ClusterIP and NodePort are allocated by the API server. */
export function serviceObject(name: string, selector: Record<string, string> | undefined, spec: Record<string, unknown> = {}): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name, namespace: 'default'},
    spec: {...(selector ? {selector} : {}), ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http}], ...spec},
  };
}

/** An EndpointSlice of a service's http port, every endpoint ready; addresses need not be pods'. */
export function endpointSliceObject(serviceName: string, endpoints: Array<{ip: string; node: string}>): KubeObject {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name: `${serviceName}-1`, namespace: 'default', labels: {'kubernetes.io/service-name': serviceName}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: demoPorts.http}],
    endpoints: endpoints.map((endpoint) => ({addresses: [endpoint.ip], conditions: {ready: true}, nodeName: endpoint.node})),
  };
}

/** The name of a service port's KUBE-SVC- chain in the node's nat table, or undefined. */
export async function serviceChainOf(node: NodeDescription, servicePort: string): Promise<string | undefined> {
  const {stdout} = await execInNamespace(node.namespace, ['iptables-save', '-t', 'nat']);
  return stdout
    .split('\n')
    .find((line) => line.startsWith('-A KUBE-SVC-') && line.includes(servicePort))
    ?.split(' ')[1];
}

/** The pods that answered, or a failure naming the first result that was not a reply. */
export function repliedPods(results: ProbeResult[], what: string): string[] {
  return results.map((result) => {
    assert.equal(result.outcome, 'reply', `${what}: ${JSON.stringify(result)}`);
    return (result as Extract<ProbeResult, {outcome: 'reply'}>).reply.pod;
  });
}

/** The node's proxy rules (nat and filter) as iptables-save prints them, without the comment lines and counters. */
export async function savedRules(node: NodeDescription): Promise<string> {
  const {stdout} = await execInNamespace(node.namespace, ['iptables-save']);
  return stdout
    .split('\n')
    .filter((line) => !line.startsWith('#'))
    .map((line) => line.replace(/\[\d+:\d+\]/g, '[0:0]'))
    .join('\n');
}

/** The DNAT destinations of a service port in the node's nat table ("default/web:http" -> ["10.244.0.11:8080"]). */
export async function dnatDestinations(node: NodeDescription, servicePort: string): Promise<string[]> {
  return (await dnatDestinationsByServicePort(node)).get(servicePort) ?? [];
}

/** Every service port's DNAT destinations, sorted, from one read of the node's nat table. */
export async function dnatDestinationsByServicePort(node: NodeDescription): Promise<Map<string, string[]>> {
  const {stdout} = await execInNamespace(node.namespace, ['iptables-save', '-t', 'nat']);
  const found = new Map<string, Set<string>>();
  for (const line of stdout.split('\n')) {
    if (!line.startsWith('-A KUBE-SEP-')) continue;
    const servicePort = /--comment (?:"([^"]+)"|(\S+))/.exec(line);
    const destination = /--to-destination (\S+)/.exec(line)?.[1];
    if (!servicePort || !destination) continue;
    const name = servicePort[1] ?? servicePort[2];
    found.set(name, (found.get(name) ?? new Set()).add(destination));
  }
  return new Map([...found].map(([name, destinations]) => [name, [...destinations].sort()]));
}
