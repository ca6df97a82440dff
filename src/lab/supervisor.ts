// The lab supervisor: the long-lived process behind `lab up`. It builds the namespace cluster, hosts
// the embedded API server, runs the demo workloads and one agent per node, records everything in
// state.json, and on SIGTERM (`lab down`) removes all of it. `lab up` starts it detached:
//   node src/lab/supervisor.ts --spec '{"name":"proxyctl","nodes":2,...}'
// and hears from it over the IPC channel: progress lines, then "ready" or "failed".
import {randomBytes} from 'node:crypto';
import {readFileSync} from 'node:fs';
import {mkdir} from 'node:fs/promises';
import {parseAllDocuments} from 'yaml';
import {parseArgs} from 'node:util';
import {join} from 'node:path';
import type {KubeObject} from './apiserver/object-log.ts';
import {resolveResourceName} from './apiserver/resources.ts';
import {canonicalJson} from './apiserver/sorted-json.ts';
import {type ApiServer, startApiServer} from './apiserver/server.ts';
import {isPodReady} from './apiserver/replicaset-controller.ts';
import type {AgentImage, AgentServerPorts} from './kubelet/agent-container.ts';
import {AgentProcess, agentHasSynced, freeLoopbackPorts, lastLines} from './agent-process.ts';
import {
  agentNamespace,
  agentPodName,
  agentPodObject,
  agentPodStatus,
  demoPodObject,
  demoPodRoles,
  demoServiceObjects,
  agentUrlAnnotation,
  kubeProxyConfigMapObject,
  kubeProxyLabel,
  kubeProxyObjects,
  nodeObject,
  standInConfiguration,
} from './lab-objects.ts';
import {PodLogs} from './kubelet/container-log.ts';
import {LabKubelet} from './kubelet/kubelet.ts';
import {
  type AgentState,
  type LabSpec,
  type LabState,
  labClusterName,
  labDir,
  labNamespacePrefix,
  removeLabDir,
  writeLabState,
} from './lab-state.ts';
import {
  buildCluster,
  clusterAddressing,
  clusterPods,
  deleteNamespacesWithPrefix,
  describeCluster,
  type NodeDescription,
} from './netns/index.ts';
import {count} from './lab-status.ts';
import {labPodResolver} from './pod-port-forward.ts';
import {errorText} from '../core/error-text.ts';

/** SupervisorMessage: what the supervisor tells `lab up` over IPC. */
export type SupervisorMessage = {type: 'progress'; text: string} | {type: 'ready'; state: LabState} | {type: 'failed'; message: string};

const agentSyncTimeoutMs = 30_000;
/** A daemon pod's first readiness probe may come before its agent listens: Ready at the next, a period (10 s) later. */
const daemonPodsTimeoutMs = agentSyncTimeoutMs + 15_000;
const demoPodsTimeoutMs = 30_000;

/** How state.json names a pod: NAME in default, else NAMESPACE/NAME. */
function podKey(namespace: string, name: string): string {
  return namespace === 'default' ? name : `${namespace}/${name}`;
}

export class LabSupervisor {
  readonly state: LabState;
  readonly #report: (message: SupervisorMessage) => void;
  readonly #logs = new PodLogs();
  readonly #kubelets: LabKubelet[] = [];
  readonly #agents: AgentProcess[] = [];
  #server: ApiServer | undefined;
  #started = Date.now();
  #shutdown: Promise<void> | undefined;
  #starting: Promise<void> | undefined;
  #unsubscribeAgents: (() => void) | undefined;
  /** Agent pods being replaced after a delete through the API. */
  readonly #replacing = new Set<string>();
  /** Kubeconfig paths of the service accounts whose pods run the agent, by "namespace/name". */
  readonly #serviceAccountKubeconfigs = new Map<string, Promise<string>>();

  constructor(spec: LabSpec, report: (message: SupervisorMessage) => void) {
    this.#report = report;
    const dir = labDir(spec.name);
    this.state = {
      spec,
      phase: 'starting',
      supervisorPid: process.pid,
      startedAt: new Date().toISOString(),
      prefix: labNamespacePrefix(spec.name),
      dir,
      kubeconfig: join(dir, 'kubeconfig'),
      supervisorLog: join(dir, 'supervisor.log'),
      agents: [],
      workloads: {},
      timings: {},
    };
  }

  #step(name: string, text?: string): void {
    this.state.timings[name] = Date.now() - this.#started;
    if (text) this.#report({type: 'progress', text});
  }

  #saving: Promise<void> = Promise.resolve();

  /** #save writes state.json; writes queue up, so that an older state never lands last. */
  #save(): Promise<void> {
    this.#saving = this.#saving.catch(() => undefined).then(() => writeLabState(this.state));
    return this.#saving;
  }

  /** The embedded API server, once started; tests running a lab in-process write through its store. */
  get apiServer(): ApiServer | undefined {
    return this.#server;
  }

  get agentProcesses(): readonly AgentProcess[] {
    return this.#agents;
  }

  /** The nodes' kubelets, once the lab is built (their startLatencies are the lab's pod-start figures). */
  get kubelets(): readonly LabKubelet[] {
    return this.#kubelets;
  }

  get stopRequested(): boolean {
    return this.#shutdown !== undefined;
  }

  /** start builds the whole lab and resolves when nodes, pods and agents are ready. */
  start(): Promise<void> {
    this.#starting ??= this.#build();
    return this.#starting;
  }

  // Between steps: a stop asked for meanwhile ends the build, and shutdown removes what exists.
  #continue(): void {
    if (this.#shutdown) throw new Error('lab removed while it was being built');
  }

  async #build(): Promise<void> {
    const {spec} = this.state;
    await this.#save();

    const planned = describeCluster({prefix: this.state.prefix, nodes: spec.nodes, podsPerNode: spec.podsPerNode, externalClient: true});
    // Recorded before anything exists, so that `lab down` from another shell finds all of it.
    this.state.topology = planned;
    await this.#save();
    const topology = await buildCluster({
      prefix: this.state.prefix,
      nodes: spec.nodes,
      podsPerNode: spec.podsPerNode,
      externalClient: true,
    });
    this.state.topology = topology;
    this.#continue();
    this.#step(
      'namespaces',
      `network: ${count(topology.nodes.length, 'node')}, ${count(clusterPods(topology).length, 'pod')}, 1 ` +
        `external client (${topology.namespaces.length} namespaces)`,
    );

    const server = await startApiServer({
      port: 0,
      serviceCIDR: clusterAddressing.serviceCIDR,
      clusterName: labClusterName(spec.name),
      resolvePodAddress: labPodResolver({
        prefix: this.state.prefix,
        agents: () => this.state.agents,
        loopbackPort: (pod, port) =>
          this.#kubelets.find((kubelet) => kubelet.nodeName === pod.spec?.nodeName)?.loopbackPort(pod.metadata.uid!, port),
      }),
      podLogs: this.#logs,
    });
    this.#server = server;
    this.state.apiServer = {url: server.url, port: server.port};
    await server.writeKubeconfig(this.state.kubeconfig);
    // Every object first, then the processes: the agents' first sync sees the whole cluster, so
    // that a ready lab has complete rules, and agents and demo servers start side by side.
    const now = new Date().toISOString();
    const roles = demoPodRoles(topology.nodes);
    for (const [index, node] of topology.nodes.entries()) {
      server.store.create('nodes', nodeObject(node, index, now), undefined, {keepStatus: true});
      for (const pod of node.pods)
        server.store.create('pods', demoPodObject(pod, node.ip, roles.get(pod.name) ?? 'toolbox', now), 'default', {keepStatus: true});
    }
    for (const service of demoServiceObjects()) server.store.create('services', service, 'default');
    await server.settle();
    await this.#save();
    this.#step('apiServer', `API server: ${server.url}`);
    this.#continue();

    const agentsReady = spec.agents ? this.#startAgents(topology.nodes) : Promise.resolve();
    agentsReady.catch(() => undefined);
    await this.#startWorkloads(topology.nodes);
    this.#step('pods', `${count(clusterPods(topology).length, 'demo pod')} ready`);
    this.#continue();
    await agentsReady;
    this.#continue();
    if (spec.agents)
      this.#step(
        'agents',
        spec.observe
          ? `${count(this.state.agents.length, 'observing agent')} (manifests/observe/) beside ` +
              `${count(this.state.standIns?.length ?? 0, 'stand-in')} for kube-proxy (${spec.proxyMode} mode)`
          : `${count(this.#agents.length, 'agent')} synced (${spec.proxyMode} mode)`,
      );

    await server.settle();
    this.state.phase = 'ready';
    this.state.readyAt = new Date().toISOString();
    this.#step('ready');
    await this.#save();
  }

  /** One kubelet per node runs every pod bound to it: first the lab's demo pods, whose servers `lab up` waits for. */
  async #startWorkloads(nodes: NodeDescription[]): Promise<void> {
    const server = this.#server!;
    for (const node of nodes) {
      const kubelet = new LabKubelet({
        store: server.store,
        events: server.events,
        logs: this.#logs,
        node,
        prefix: this.state.prefix,
        // The lab's own agent Pods stand for processes the supervisor runs (#startAgents).
        ignore: (pod) => pod.metadata.namespace === agentNamespace && pod.metadata.annotations?.[agentUrlAnnotation] !== undefined,
        serviceAccountKubeconfig: (namespace, name) => this.#serviceAccountKubeconfig(namespace, name),
        onAgent: (pod, image, agent) => this.#podAgentChanged(node, pod, image, agent),
        agentLogFile: (_pod, image) => this.#agentLogFile(node, image),
        podsDirectory: join(this.state.dir, 'pods'),
        onProcess: (pod, pid) => {
          const key = podKey(pod.metadata.namespace!, pod.metadata.name);
          if (pid === undefined) delete this.state.workloads[key];
          else this.state.workloads[key] = pid;
          if (this.state.phase === 'ready') void this.#save().catch(() => undefined);
        },
        onSandbox: (pod, netns) => {
          const namespaces = (this.state.podNamespaces ??= {});
          if (netns === undefined) delete namespaces[podKey(pod.namespace, pod.name)];
          else namespaces[podKey(pod.namespace, pod.name)] = netns;
          if (this.state.phase === 'ready') void this.#save().catch(() => undefined);
        },
      });
      this.#kubelets.push(kubelet);
      kubelet.start();
    }
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`demo pods not ready after ${demoPodsTimeoutMs / 1000} s`)), demoPodsTimeoutMs);
    });
    try {
      await Promise.race([
        Promise.all(this.#kubelets.map((kubelet, index) => kubelet.whenReady(nodes[index].pods.map((pod) => `default/${pod.name}`)))),
        timeout,
      ]);
    } finally {
      clearTimeout(timer);
    }
    await this.#save();
  }

  /**
   * A kubeconfig with a token of the service account, as the kubelet mounts one into a pod: an
   * agent run by a kubelet has only what RBAC grants its service account.
   */
  #serviceAccountKubeconfig(namespace: string, name: string): Promise<string> {
    const key = `${namespace}/${name}`;
    let path = this.#serviceAccountKubeconfigs.get(key);
    if (!path) {
      const server = this.#server!;
      const user = `system:serviceaccount:${namespace}:${name}`;
      const token = randomBytes(24).toString('base64url');
      server.access.addUser({name: user, token, groups: ['system:serviceaccounts', `system:serviceaccounts:${namespace}`]});
      const directory = join(this.state.dir, 'serviceaccounts');
      const file = join(directory, `${namespace}.${name}.kubeconfig`);
      path = mkdir(directory, {recursive: true, mode: 0o700})
        .then(() => server.writeKubeconfig(file, {user, token, namespace}))
        .then(() => file);
      this.#serviceAccountKubeconfigs.set(key, path);
    }
    return path;
  }

  async #startAgents(nodes: NodeDescription[]): Promise<void> {
    const server = this.#server!;
    const {spec} = this.state;
    if (spec.observe) {
      await this.#startStandIns(nodes);
      await this.#startObservers(nodes);
      return;
    }
    const ports = await freeLoopbackPorts(nodes.length * 3);
    if (this.#shutdown) return;
    for (const [index, node] of nodes.entries()) {
      const [healthzPort, metricsPort, apiPort] = ports.slice(index * 3, index * 3 + 3);
      const agentState = {
        node: node.name,
        namespace: node.namespace,
        pod: agentPodName(node.name),
        healthzPort,
        metricsPort,
        apiPort,
        log: join(this.state.dir, `agent-${node.name}.log`),
        restarts: 0,
      };
      this.state.agents.push(agentState);
      server.store.create(
        'pods',
        agentPodObject(node, `ws://127.0.0.1:${apiPort}`, new Date().toISOString(), this.#nodeUid(node)),
        agentNamespace,
        {
          keepStatus: true,
        },
      );
      const agent = new AgentProcess({
        state: agentState,
        kubeconfig: this.state.kubeconfig,
        settings: {clusterCIDR: clusterAddressing.clusterCIDR, proxyMode: spec.proxyMode},
        onChange: (changed) => this.#agentChanged(node, changed),
      });
      this.#agents.push(agent);
    }
    for (const agent of this.#agents) agent.start();
    this.#unsubscribeAgents = server.store.log.subscribe('pods', (event) => {
      const {namespace, name, deletionTimestamp} = event.object.metadata;
      if (namespace !== agentNamespace || this.#shutdown || this.#replacing.has(name)) return;
      const index = this.#agents.findIndex((agent) => agent.state.pod === name);
      if (index < 0 || !(event.type === 'DELETED' || deletionTimestamp)) return;
      void this.#replaceAgent(this.#agents[index], nodes[index]);
    });
    await this.#save();
    await Promise.all(this.#agents.map((agent) => agent.waitSynced(agentSyncTimeoutMs)));
  }

  /**
   * With --observe, kube-proxy first, as kubeadm installs it: its ConfigMap (the mode and the
   * cluster CIDR), its ServiceAccount and RBAC, and the DaemonSet kube-system/kube-proxy, whose pods
   * the nodes' kubelets run with the agent standing in for kube-proxy (kube-proxy's command line,
   * its layout in every mode). Done once each node's kube-proxy has synced.
   */
  async #startStandIns(nodes: NodeDescription[]): Promise<void> {
    const server = this.#server!;
    const configuration = standInConfiguration(this.state.spec.proxyMode, clusterAddressing.clusterCIDR);
    server.store.create('configmaps', kubeProxyConfigMapObject(configuration), 'kube-system');
    this.state.standIns = [];
    for (const object of kubeProxyObjects())
      server.store.create(resolveResourceName(object.kind!).storageKey, object, object.metadata.namespace);
    await this.#daemonPodsSynced(nodes, {labels: kubeProxyLabel, running: () => this.state.standIns ?? [], what: 'kube-proxy'});
  }

  /**
   * With --observe, the observers are installed as a user installs them beside kube-proxy:
   * manifests/observe/ applied (ServiceAccount, RBAC, the DaemonSet), its pods run by the nodes'
   * kubelets as the real agent with only their service account's rights. Ready once each node's
   * observer Pod is Ready (its readiness probe reads the agent's /healthz) and its agent has read
   * the node once (which that probe cannot tell: /healthz is 200 while the agent starts).
   */
  async #startObservers(nodes: NodeDescription[]): Promise<void> {
    const server = this.#server!;
    const objects = observeManifestObjects();
    for (const object of objects) server.store.create(resolveResourceName(object.kind!).storageKey, object, object.metadata.namespace);
    const daemonSet = objects.find((object) => object.kind === 'DaemonSet')!;
    await this.#daemonPodsSynced(nodes, {labels: daemonSet.spec.selector.matchLabels, running: () => this.state.agents, what: 'observer'});
  }

  /**
   * Resolves once every node runs a Ready pod of the DaemonSet (by its pods' labels) whose agent has
   * synced once, or read its node when observing (which the pod's readiness cannot tell: /healthz
   * is 200 while the agent starts, as kube-proxy's).
   */
  async #daemonPodsSynced(
    nodes: NodeDescription[],
    daemon: {labels: Record<string, string>; running: () => AgentState[]; what: string},
  ): Promise<void> {
    const server = this.#server!;
    await server.settle();
    await this.#save();
    const deadline = Date.now() + daemonPodsTimeoutMs;
    const selected = (pod: KubeObject) => Object.entries(daemon.labels).every(([key, value]) => pod.metadata.labels?.[key] === value);
    for (;;) {
      const pods = server.store.log.list('pods', agentNamespace).filter(selected);
      const synced = await Promise.all(
        nodes.map(async (node) => {
          const agent = daemon.running().find((candidate) => candidate.node === node.name);
          const podReady = pods.some((pod) => pod.metadata.name === agent?.pod && isPodReady(pod));
          return podReady && (await agentHasSynced(agent!.healthzPort));
        }),
      );
      const waiting = nodes.filter((_, index) => !synced[index]);
      if (waiting.length === 0 || this.#shutdown) return;
      if (Date.now() > deadline) {
        const log = daemon.running().find((agent) => agent.node === waiting[0].name)?.log;
        throw new Error(
          `the ${daemon.what} pods on ${waiting.map((node) => node.name).join(', ')} are not Ready, or have not synced, ` +
            `after ${daemonPodsTimeoutMs / 1000} s (kubectl -n ${agentNamespace} describe pods)` +
            (log ? `; ${log} ends:\n${lastLines(log)}` : ''),
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  /** Where a kubelet's agent pod's log is kept: kube-proxy-node-N.log for kube-proxy's stand-in, agent-node-N.log for the rest. */
  #agentLogFile(node: NodeDescription, image: AgentImage): string {
    return join(this.state.dir, `${image === 'kube-proxy' ? 'kube-proxy' : 'agent'}-${node.name}.log`);
  }

  /** A kubelet's agent pod started (or stopped) its process: state.json's agent of that node follows it. */
  #podAgentChanged(
    node: NodeDescription,
    pod: KubeObject,
    image: AgentImage,
    agent: {pid: number; servers: AgentServerPorts} | undefined,
  ): void {
    const list = image === 'kube-proxy' ? (this.state.standIns ??= []) : this.state.agents;
    const index = list.findIndex((candidate) => candidate.node === node.name);
    const known = index >= 0 ? list[index] : undefined;
    if (agent) {
      const {healthz = 0, metrics = 0, api = 0} = agent.servers;
      const entry = {
        node: node.name,
        namespace: node.namespace,
        pod: pod.metadata.name,
        healthzPort: healthz,
        metricsPort: metrics,
        apiPort: api,
        log: this.#agentLogFile(node, image),
        // A new pod starts counting again; the same pod's container started once more is a restart.
        restarts: known?.pod === pod.metadata.name ? known.restarts + 1 : 0,
        pid: agent.pid,
      };
      if (known) list[index] = entry;
      else list.push(entry);
    } else if (known) known.pid = undefined;
    if (this.state.phase === 'ready') void this.#save().catch(() => undefined);
  }

  /**
   * An agent Pod deleted through the API is replaced as its DaemonSet would: the kubelet stops the
   * agent (SIGTERM: the rules stay), the Pod goes, a new one is made and the agent starts again.
   */
  async #replaceAgent(agent: AgentProcess, node: NodeDescription): Promise<void> {
    const server = this.#server!;
    const name = agent.state.pod;
    this.#replacing.add(name);
    try {
      await agent.restart(() => {
        try {
          server.store.delete('pods', agentNamespace, name, {gracePeriodSeconds: 0});
        } catch {
          // already gone
        }
        server.store.create(
          'pods',
          agentPodObject(node, `ws://127.0.0.1:${agent.state.apiPort}`, new Date().toISOString(), this.#nodeUid(node)),
          agentNamespace,
          {keepStatus: true},
        );
      });
    } finally {
      this.#replacing.delete(name);
    }
    await this.#save().catch(() => undefined);
  }

  #nodeUid(node: NodeDescription): string | undefined {
    return this.#server?.store.tryGet('nodes', undefined, node.name)?.metadata.uid;
  }

  #agentChanged(node: NodeDescription, agent: AgentProcess): void {
    const server = this.#server;
    if (!server || this.#shutdown) return;
    const status = agentPodStatus(
      node,
      {ready: agent.synced, pid: agent.state.pid, restarts: agent.state.restarts},
      new Date().toISOString(),
    );
    try {
      server.store.mutate('pods', agentNamespace, agent.state.pod, (pod) => void (pod.status = status), {subresource: 'status'});
    } catch {
      // The pod was deleted through the API; the agent runs on.
    }
    if (this.state.phase === 'ready') void this.#save().catch(() => undefined);
  }

  /**
   * shutdown removes everything the lab made: agents (their rules go with the namespaces), demo
   * apps, the API server, the namespaces and the state directory. Safe to call more than once.
   */
  shutdown(): Promise<void> {
    this.#shutdown ??= this.#teardown();
    return this.#shutdown;
  }

  async #teardown(): Promise<void> {
    // What a step in progress creates must exist before it can be removed.
    await this.#starting?.catch(() => undefined);
    if (this.state.phase === 'ready') {
      this.state.phase = 'stopping';
      await this.#save().catch(() => undefined);
    }
    this.#unsubscribeAgents?.();
    await Promise.allSettled(this.#agents.map((agent) => agent.stop()));
    for (const kubelet of this.#kubelets) kubelet.stop();
    await this.#server?.stop().catch(() => undefined);
    await deleteNamespacesWithPrefix(this.state.prefix).catch(() => undefined);
    await removeLabDir(this.state.spec.name).catch(() => undefined);
  }

  /** killNow: for a process exit that cannot wait; `lab down` finishes the job. */
  killNow(): void {
    for (const agent of this.#agents) agent.killNow();
    for (const kubelet of this.#kubelets) kubelet.stop();
  }
}

/** manifests/observe/'s objects, RBAC first, as `kubectl apply -f manifests/observe/` makes them. */
function observeManifestObjects(): KubeObject[] {
  // From src/lab in the source tree, from dist/src/lab in the build: the package's manifests/.
  const directory = new URL(import.meta.url.endsWith('.ts') ? '../../manifests/observe/' : '../../../manifests/observe/', import.meta.url);
  const objects = ['rbac.yaml', 'daemonset.yaml'].flatMap((file) =>
    parseAllDocuments(readFileSync(new URL(file, directory), 'utf8'))
      .map((document) => document.toJS() as KubeObject | null)
      .filter((object): object is KubeObject => object !== null),
  );
  // kubectl apply keeps what it applied on the object, so that applying the same files again
  // finds nothing to change.
  // (Go's JSON of the object as read, with `annotations: {}` when it has none, and a newline).
  for (const object of objects) {
    object.metadata.annotations ??= {};
    const applied = `${canonicalJson(object)}\n`;
    object.metadata.annotations['kubectl.kubernetes.io/last-applied-configuration'] = applied;
  }
  return objects;
}

async function main(): Promise<void> {
  const {values} = parseArgs({options: {spec: {type: 'string'}}});
  if (!values.spec) throw new Error('lab supervisor: --spec is required');
  const spec = JSON.parse(values.spec) as LabSpec;
  const send = (message: SupervisorMessage) => {
    const line = message.type === 'progress' ? message.text : message.type === 'failed' ? `failed: ${message.message}` : 'ready';
    process.stdout.write(`${new Date().toISOString()} ${line}\n`);
    if (process.send && process.connected) process.send(message);
  };
  const supervisor = new LabSupervisor(spec, send);
  const stop = (signal: string) => {
    process.stdout.write(`${new Date().toISOString()} ${signal}: removing the lab\n`);
    void supervisor.shutdown().finally(() => process.exit(0));
  };
  // Listeners stay (on, not once): execa's exit hook re-raises a signal nobody else listens to,
  // which would kill this process in the middle of its teardown.
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => stop(signal));
  process.on('exit', () => supervisor.killNow());
  try {
    await supervisor.start();
  } catch (error) {
    // A signal asked for the stop; its handler removes the lab and exits.
    if (supervisor.stopRequested) return;
    const message = errorText(error);
    supervisor.state.phase = 'failed';
    supervisor.state.error = message;
    await supervisor.shutdown();
    send({type: 'failed', message});
    process.exit(1);
  }
  send({type: 'ready', state: supervisor.state});
  if (process.connected) process.disconnect();
}

if (import.meta.main) {
  main().catch((error: unknown) => {
    process.stderr.write(`lab supervisor: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(1);
  });
}
