// One pod on a lab node, from bound to gone: its sandbox, its container's process (the demo
// server, or the real agent for the proxyctl-agent and kube-proxy images; restarted when it dies unasked),
// readiness, the status and events a kubelet reports, and graceful termination.
import {createWriteStream} from 'node:fs';
import {rm} from 'node:fs/promises';
import {createInterface} from 'node:readline';
import {execa} from 'execa';
import type {ClusterStore} from '../apiserver/cluster-store.ts';
import type {EventRecorder, EventSource, EventType} from '../apiserver/event-recorder.ts';
import type {KubeObject} from '../apiserver/object-log.ts';
import {type NodeDescription, spawnInNamespace} from '../netns/index.ts';
import {siblingProgram} from '../workload/launch.ts';
import {type AgentImage, agentImage, agentLaunch, type AgentServerPorts} from './agent-container.ts';
import {writeConfigMapVolumes} from './config-volumes.ts';
import type {PodLogs, RunLog} from './container-log.ts';
import {type PodSandbox, removeSandbox} from './pod-sandbox.ts';
import {type ContainerState, ignoredFeatures, kubeletPodStatus, type PodRun, servedPorts} from './pod-status.ts';
import type {NodeProber} from './prober.ts';

/** How long the demo server keeps serving after SIGTERM (bounded by the pod's grace period). */
export const drainMs = 3000;
const maxBackoffMs = 10_000;

/** What a node's kubelet hands each of its pod workers. */
export interface NodeContext {
  store: ClusterStore;
  events: EventRecorder;
  logs: PodLogs;
  node: NodeDescription;
  prober: NodeProber;
  /** Makes (or finds, for a lab's demo pods) the pod's sandbox. */
  sandbox(pod: KubeObject): Promise<PodSandbox>;
  /** The sandbox is gone: its address may be handed out again. */
  released(sandbox: PodSandbox, pod: {namespace: string; name: string}): void;
  /** The worker is done with its pod (removed from the API and torn down). */
  finished(uid: string, pid?: number): void;
  /** The demo server runs (pid) or stopped (undefined). */
  processChanged(pod: KubeObject, pid: number | undefined): void;
  /** The pod turned Ready for the first time, after boundMs. */
  firstReady(pod: KubeObject, boundMs: number): void;
  /** A kubeconfig with the token of the pod's service account, for a container that talks to the API server. */
  serviceAccountKubeconfig(pod: KubeObject): Promise<string>;
  /** The agent a pod of `image` runs started (its pid, its servers' loopback ports) or stopped (undefined). */
  agentChanged(pod: KubeObject, image: AgentImage, agent: {pid: number; servers: AgentServerPorts} | undefined): void;
  /** A file that keeps the agent's log beyond the pod's (`kubectl logs` reads the pod's), if any. */
  agentLogFile(pod: KubeObject, image: AgentImage): string | undefined;
  /** Where the pod's files (its configMap volumes) go, if anywhere; removed with the pod. */
  podDirectory(pod: KubeObject): string | undefined;
}

type Child = ReturnType<typeof spawnInNamespace>;

function rfc3339(ms = Date.now()): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

export class PodWorker {
  readonly #context: NodeContext;
  readonly #namespace: string;
  readonly #name: string;
  readonly #uid: string;
  readonly #seenAt = performance.now();
  readonly #source: EventSource;
  #pod: KubeObject;
  #sandbox: PodSandbox | undefined;
  #child: Child | undefined;
  #run: PodRun;
  #terminating = false;
  #gone = false;
  #everReady = false;
  /** The next run of each probe, by container index. */
  readonly #probeTimers = new Map<number, NodeJS.Timeout>();
  #restartTimer: NodeJS.Timeout | undefined;
  /** The agent's image (proxyctl-agent's, or kube-proxy's for its stand-in), when the container runs the agent rather than the demo server. */
  readonly #agentImage: AgentImage | undefined;
  /** The agent's servers: container port -> the loopback port it really listens on. */
  #loopbackPorts = new Map<number, number>();
  #agentServers: AgentServerPorts = {};

  constructor(context: NodeContext, pod: KubeObject) {
    this.#context = context;
    this.#pod = pod;
    this.#namespace = pod.metadata.namespace!;
    this.#name = pod.metadata.name;
    this.#uid = pod.metadata.uid!;
    this.#source = {component: 'kubelet', host: context.node.name};
    this.#agentImage = agentImage(pod);
    const earlier = pod.status?.containerStatuses?.[0];
    this.#run = {
      hostIP: context.node.ip,
      startTime: pod.status?.startTime ?? rfc3339(),
      container: {state: 'waiting', reason: 'ContainerCreating'},
      restartCount: earlier?.restartCount ?? 0,
      ready: false,
      phase: 'Pending',
    };
  }

  get uid(): string {
    return this.#uid;
  }

  get #runsAgent(): boolean {
    return this.#agentImage !== undefined;
  }

  /** loopbackPort: where the agent's server of containerPort listens on the host, if this pod runs one. */
  loopbackPort(containerPort: number): number | undefined {
    return this.#loopbackPorts.get(containerPort);
  }

  /** start makes the sandbox and runs the container's process; a failure is reported on the pod. */
  async start(): Promise<void> {
    const ignored = ignoredFeatures(this.#pod, this.#runsAgent);
    if (ignored.length > 0) {
      const runs =
        this.#agentImage === 'kube-proxy'
          ? 'The lab runs proxyctl-agent as a stand-in for kube-proxy'
          : this.#agentImage
            ? 'The lab runs proxyctl-agent for this image'
            : 'The lab runs its demo server for every image';
      this.#event('Normal', 'IgnoredByLab', `${runs} and ignores: ${ignored.join('; ')}`);
    }
    try {
      this.#sandbox = await this.#context.sandbox(this.#pod);
    } catch (error) {
      this.#event('Warning', 'FailedCreatePodSandBox', `Failed to create pod sandbox: ${(error as Error).message}`);
      this.#run.container = {state: 'waiting', reason: 'ContainerCreating', message: (error as Error).message};
      this.#report();
      return;
    }
    if (this.#gone) {
      await this.#teardown();
      return;
    }
    this.#run.podIP = this.#sandbox.ip;
    // A new pod shows its address while its server starts; the lab's demo pods are Running already.
    if (this.#sandbox.owned) this.#report();
    void this.#startContainer();
  }

  /** update: the pod changed in the API; a deletionTimestamp starts termination. */
  update(pod: KubeObject): void {
    this.#pod = pod;
    if (pod.metadata.deletionTimestamp && !this.#terminating) this.#terminate();
  }

  /** removed: the pod is gone from the API (grace over, or forced): stop at once and clean up. */
  removed(): void {
    if (this.#gone) return;
    this.#gone = true;
    this.#terminating = true;
    this.#stopTimers();
    if (this.#child) this.#child.kill('SIGKILL');
    else void this.#teardown();
  }

  /** kill: the lab is going down. */
  kill(): void {
    this.#gone = true;
    this.#terminating = true;
    this.#stopTimers();
    this.#child?.kill('SIGKILL');
  }

  async #startContainer(): Promise<void> {
    // A process handle is a promise of its end: it is handed over wrapped, so that awaiting the
    // agent's preparation does not wait for the process to exit.
    const started = this.#runsAgent ? await this.#startAgent() : {child: this.#startDemoServer()};
    if (!started) return;
    const {child} = started;
    this.#child = child;
    const log = this.#context.logs.newRun(this.#namespace, this.#name);
    const logFile = this.#agentImage ? this.#context.agentLogFile(this.#pod, this.#agentImage) : undefined;
    const file = logFile ? createWriteStream(logFile, {flags: 'a'}).on('error', () => undefined) : undefined;
    if (file) void child.finally(() => file.end());
    const record = (line: string) => {
      log.append(line);
      file?.write(`${line}\n`);
    };
    const startedAt = rfc3339();
    // The demo server says when it listens; the agent runs from its start, and its readiness
    // probe (its /healthz) says when it has synced.
    let listening = this.#runsAgent;
    if (listening) this.#running(child, startedAt);
    createInterface({input: child.stdout!}).on('line', (line) => {
      record(line);
      if (!listening && line.includes('"ready":true')) {
        listening = true;
        this.#running(child, startedAt);
      }
    });
    createInterface({input: child.stderr!}).on('line', record);
    void child.then((result) => this.#exited(child, log, startedAt, result.exitCode, result.signal));
  }

  #startDemoServer(): Child {
    const sandbox = this.#sandbox!;
    const ports = servedPorts(this.#pod);
    const command = [process.execPath, siblingProgram('../workload/demoapp', import.meta.url)];
    command.push('--name', this.#name, '--access-log', '--drain-ms', String(drainMs), '--wait-for-address', sandbox.ip);
    for (const port of ports.tcp) command.push('--http-port', String(port));
    for (const port of ports.udp) command.push('--udp-port', String(port));
    return spawnInNamespace(sandbox.namespace, command);
  }

  /** The agent runs in the host's namespace and works on the pod's (--netns); undefined when it cannot start. */
  async #startAgent(): Promise<{child: Child} | undefined> {
    const sandbox = this.#sandbox!;
    let command: string[];
    try {
      const kubeconfig = await this.#context.serviceAccountKubeconfig(this.#pod);
      const podDirectory = this.#context.podDirectory(this.#pod);
      const mounts = podDirectory
        ? await writeConfigMapVolumes(this.#pod, this.#pod.spec.containers[0], this.#context.store, podDirectory)
        : [];
      const launch = await agentLaunch(this.#pod, {netns: sandbox.namespace, podIP: sandbox.ip, kubeconfig, mounts});
      command = launch.command;
      this.#loopbackPorts = launch.loopbackPorts;
      this.#agentServers = launch.servers;
    } catch (error) {
      const message = (error as Error).message;
      const mount = message.startsWith('MountVolume');
      this.#event('Warning', mount ? 'FailedMount' : 'Failed', mount ? message : `Error: ${message}`);
      this.#run.container = {state: 'waiting', reason: mount ? 'ContainerCreating' : 'CreateContainerConfigError', message};
      this.#report();
      // As the kubelet, try again: the ConfigMap or the service account may come.
      this.#restartTimer = setTimeout(() => {
        if (!this.#terminating) void this.#startContainer();
      }, maxBackoffMs);
      return undefined;
    }
    if (this.#terminating || this.#gone) return undefined;
    return {child: execa(command[0], command.slice(1), {reject: false, buffer: false, stdin: 'ignore' as 'ignore' | 'pipe'})};
  }

  #running(child: Child, startedAt: string): void {
    if (this.#child !== child || this.#gone) return;
    this.#run.container = {state: 'running', startedAt, pid: child.pid!};
    this.#run.phase = 'Running';
    const image = this.#pod.spec?.containers?.[0]?.image;
    this.#event('Normal', 'Pulled', `Container image "${image}" already present on machine`);
    this.#event('Normal', 'Started', `Started container ${this.#pod.spec?.containers?.map((c: any) => c.name).join(', ')}`);
    this.#context.processChanged(this.#pod, child.pid);
    if (this.#agentImage) this.#context.agentChanged(this.#pod, this.#agentImage, {pid: child.pid!, servers: this.#agentServers});
    const sandbox = this.#sandbox!;
    void sandbox.linksReady.then(
      () => {
        if (this.#child !== child || this.#gone) return;
        if (this.#readinessProbes().length === 0) this.#setReady(true);
        else {
          this.#report();
          this.#startProbes(child);
        }
      },
      (error: Error) => this.#event('Warning', 'FailedCreatePodSandBox', `pod network not up: ${error.message}`),
    );
  }

  #exited(child: Child, log: RunLog, startedAt: string, exitCode: number | undefined, signal: string | undefined): void {
    log.end();
    if (this.#child !== child) return;
    this.#child = undefined;
    this.#stopTimers();
    this.#context.processChanged(this.#pod, undefined);
    if (this.#agentImage) this.#context.agentChanged(this.#pod, this.#agentImage, undefined);
    const signalNumber = signal === 'SIGKILL' ? 9 : signal === 'SIGTERM' ? 15 : undefined;
    const code = exitCode ?? 128 + (signalNumber ?? 0);
    const terminated: ContainerState = {
      state: 'terminated',
      reason: code === 0 ? 'Completed' : 'Error',
      exitCode: code,
      ...(signalNumber ? {signal: signalNumber} : {}),
      startedAt,
      finishedAt: rfc3339(),
      pid: child.pid,
    };
    this.#run.ready = false;
    if (this.#terminating) {
      this.#run.container = terminated;
      void this.#finish();
      return;
    }
    const policy = this.#pod.spec?.restartPolicy ?? 'Always';
    if (policy === 'Never' || (policy === 'OnFailure' && code === 0)) {
      this.#run.container = terminated;
      this.#run.phase = code === 0 ? 'Succeeded' : 'Failed';
      this.#report();
      return;
    }
    this.#run.lastTerminated = terminated as Extract<ContainerState, {state: 'terminated'}>;
    const delay = Math.min(maxBackoffMs, 1000 * 2 ** Math.min(this.#run.restartCount, 4));
    this.#run.restartCount++;
    this.#run.container = {state: 'waiting', reason: 'CrashLoopBackOff', message: `back-off ${delay / 1000}s restarting failed container`};
    this.#event('Warning', 'BackOff', 'Back-off restarting failed container');
    this.#report();
    this.#restartTimer = setTimeout(() => {
      if (!this.#terminating) void this.#startContainer();
    }, delay);
  }

  /** The readiness probes the lab runs (httpGet, tcpSocket), one per container that has one. */
  #readinessProbes(): any[] {
    return (this.#pod.spec?.containers ?? [])
      .map((c: any) => c.readinessProbe)
      .filter((probe: any) => probe && (probe.httpGet || probe.tcpSocket));
  }

  /** The probe's port: a number, or a container port's name. */
  #probePort(port: number | string): number | undefined {
    if (typeof port === 'number') return port;
    if (/^\d+$/.test(port)) return Number(port);
    for (const container of this.#pod.spec?.containers ?? [])
      for (const declared of container.ports ?? []) if (declared.name === port) return declared.containerPort;
    return undefined;
  }

  /** Runs each probe on its own period; the pod is Ready while every probe's last verdict is a pass. */
  #startProbes(child: Child): void {
    const probes = this.#readinessProbes();
    const verdicts = probes.map(() => false);
    probes.forEach((probe, index) => {
      const counts = {successes: 0, failures: 0};
      const tick = async () => {
        const ok = await this.#probeOnce(child, probe);
        if (ok === undefined) return;
        counts.successes = ok ? counts.successes + 1 : 0;
        counts.failures = ok ? 0 : counts.failures + 1;
        if (ok && counts.successes >= (probe.successThreshold ?? 1)) verdicts[index] = true;
        if (!ok && counts.failures >= (probe.failureThreshold ?? 3)) verdicts[index] = false;
        this.#setReady(verdicts.every(Boolean));
        this.#probeTimers.set(index, setTimeout(tick, (probe.periodSeconds ?? 10) * 1000));
      };
      this.#probeTimers.set(index, setTimeout(tick, (probe.initialDelaySeconds ?? 0) * 1000));
    });
  }

  /** One probe: true or false, or undefined when the container it was for is gone. */
  async #probeOnce(child: Child, probe: any): Promise<boolean | undefined> {
    if (this.#child !== child || this.#gone) return undefined;
    const action = probe.httpGet ?? probe.tcpSocket;
    const port = this.#probePort(action.port);
    const request = {
      kind: probe.httpGet ? 'http' : 'tcp',
      path: probe.httpGet?.path,
      timeoutMs: (probe.timeoutSeconds ?? 1) * 1000,
    } as const;
    const loopbackPort = port === undefined ? undefined : this.#loopbackPorts.get(port);
    const answer =
      port === undefined
        ? {ok: false, message: `port ${JSON.stringify(action.port)} is not a container port of the pod`}
        : loopbackPort !== undefined
          ? await this.#context.prober.probeOnHost({...request, host: '127.0.0.1', port: loopbackPort})
          : await this.#context.prober.probe({...request, host: action.host ?? this.#sandbox!.ip, port});
    if (this.#child !== child || this.#gone) return undefined;
    if (!answer.ok) this.#event('Warning', 'Unhealthy', `Readiness probe failed: ${answer.message}`);
    return answer.ok;
  }

  #setReady(ready: boolean): void {
    const changed = this.#run.ready !== ready;
    this.#run.ready = ready;
    if (changed || !ready) this.#report();
    if (ready && !this.#everReady) {
      this.#everReady = true;
      this.#context.firstReady(this.#pod, performance.now() - this.#seenAt);
    }
  }

  /** Graceful termination: SIGTERM now, SIGKILL at the deadline the API server set. */
  #terminate(): void {
    this.#terminating = true;
    if (this.#restartTimer) clearTimeout(this.#restartTimer);
    const child = this.#child;
    if (!child) {
      void this.#finish();
      return;
    }
    this.#event('Normal', 'Killing', `Stopping container ${this.#pod.spec?.containers?.map((c: any) => c.name).join(', ')}`);
    child.kill('SIGTERM');
    const deadline = Date.parse(this.#pod.metadata.deletionTimestamp!);
    const timer = setTimeout(() => child.kill('SIGKILL'), Math.max(0, deadline - Date.now()));
    void child.then(() => clearTimeout(timer));
  }

  /** The container stopped during termination: report it, remove the pod, tear the sandbox down. */
  async #finish(): Promise<void> {
    if (!this.#gone) {
      this.#report();
      try {
        this.#context.store.delete('pods', this.#namespace, this.#name, {gracePeriodSeconds: 0, preconditions: {uid: this.#uid}});
      } catch {
        // gone already
      }
    }
    this.#gone = true;
    await this.#teardown();
  }

  async #teardown(): Promise<void> {
    this.#stopTimers();
    const podDirectory = this.#runsAgent ? this.#context.podDirectory(this.#pod) : undefined;
    if (podDirectory) await rm(podDirectory, {recursive: true, force: true}).catch(() => undefined);
    const sandbox = this.#sandbox;
    this.#sandbox = undefined;
    if (sandbox) {
      await removeSandbox(sandbox).catch(() => undefined);
      this.#context.released(sandbox, {namespace: this.#namespace, name: this.#name});
    }
    this.#context.finished(this.#uid);
  }

  #stopTimers(): void {
    for (const timer of this.#probeTimers.values()) clearTimeout(timer);
    this.#probeTimers.clear();
    clearTimeout(this.#restartTimer);
  }

  #report(): void {
    if (this.#gone) return;
    try {
      this.#context.store.mutate(
        'pods',
        this.#namespace,
        this.#name,
        (pod) => {
          if (pod.metadata.uid !== this.#uid) throw new Error('replaced');
          pod.status = kubeletPodStatus(pod, this.#run);
        },
        {subresource: 'status'},
      );
    } catch {
      // The pod is gone or was replaced; its DELETED event ends this worker.
    }
  }

  #event(type: EventType, reason: string, message: string): void {
    this.#context.events.record(this.#source, this.#pod, type, reason, message);
  }
}
