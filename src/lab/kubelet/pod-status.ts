// A pod's status as a kubelet reports it: phase, the conditions (a condition's lastTransitionTime
// kept while its status stays), addresses, and one status per container (all of a lab pod's
// containers are its one demo server).
import type {KubeObject} from '../apiserver/object-log.ts';
import {agentImage} from './agent-container.ts';

export type ContainerState =
  | {state: 'waiting'; reason: string; message?: string}
  | {state: 'running'; startedAt: string; pid: number}
  | {state: 'terminated'; reason: string; exitCode: number; signal?: number; startedAt?: string; finishedAt: string; pid?: number};

export interface PodRun {
  hostIP: string;
  podIP?: string;
  startTime: string;
  container: ContainerState;
  /** How the run before this one ended. */
  lastTerminated?: Extract<ContainerState, {state: 'terminated'}>;
  restartCount: number;
  ready: boolean;
  phase: 'Pending' | 'Running' | 'Succeeded' | 'Failed';
}

function rfc3339(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

function stateObject(container: ContainerState): Record<string, unknown> {
  switch (container.state) {
    case 'waiting':
      return {waiting: {reason: container.reason, ...(container.message ? {message: container.message} : {})}};
    case 'running':
      return {running: {startedAt: container.startedAt}};
    case 'terminated': {
      const {state: _state, pid, ...terminated} = container;
      return {terminated: {...terminated, ...(pid ? {containerID: `pid://${pid}`} : {})}};
    }
  }
}

export function kubeletPodStatus(pod: KubeObject, run: PodRun): Record<string, any> {
  const now = rfc3339(Date.now());
  const before: any[] = pod.status?.conditions ?? [];
  const condition = (type: string, status: boolean, reason?: string) => {
    const text = status ? 'True' : 'False';
    const old = before.find((c) => c.type === type);
    return {
      type,
      status: text,
      lastProbeTime: null,
      lastTransitionTime: old?.status === text ? old.lastTransitionTime : now,
      ...(reason && !status ? {reason} : {}),
    };
  };
  const running = run.container.state === 'running';
  const containersReady = running && run.ready;
  const pid = run.container.state === 'running' ? run.container.pid : undefined;
  const containers: any[] = pod.spec?.containers ?? [];
  const program = agentImage(pod) ? 'proxyctl-agent' : 'demoapp';
  return {
    phase: run.phase,
    conditions: [
      condition('PodReadyToStartContainers', run.podIP !== undefined),
      condition('Initialized', true),
      condition('Ready', containersReady, 'ContainersNotReady'),
      condition('ContainersReady', containersReady, 'ContainersNotReady'),
      condition('PodScheduled', true),
    ],
    hostIP: run.hostIP,
    hostIPs: [{ip: run.hostIP}],
    ...(run.podIP ? {podIP: run.podIP, podIPs: [{ip: run.podIP}]} : {}),
    startTime: run.startTime,
    qosClass: pod.status?.qosClass ?? 'BestEffort',
    containerStatuses: containers.map((container) => ({
      name: container.name,
      image: container.image,
      imageID: `lab://${program}@${container.image}`,
      ready: containersReady,
      started: running,
      restartCount: run.restartCount,
      ...(pid ? {containerID: `pid://${pid}`} : {}),
      state: stateObject(run.container),
      ...(run.lastTerminated ? {lastState: stateObject(run.lastTerminated)} : {}),
    })),
  };
}

/**
 * ignoredFeatures: what of the pod's spec the lab does not run, for an event on the pod. The agent
 * (runsAgent) gets its args and env; the demo server neither.
 */
export function ignoredFeatures(pod: KubeObject, runsAgent = false): string[] {
  const spec = pod.spec ?? {};
  const ignored: string[] = [];
  // The agent gets its configMap volumes (kubelet/config-volumes.ts); nothing else is mounted.
  const unmounted: any[] = (spec.volumes ?? []).filter((volume: any) => !(runsAgent && volume.configMap));
  const isUnmounted = (name: string) => unmounted.some((volume) => volume.name === name);
  if (unmounted.length) ignored.push(`volumes (${unmounted.map((v: any) => v.name).join(', ')})`);
  if (spec.initContainers?.length) ignored.push(`init containers (${spec.initContainers.map((c: any) => c.name).join(', ')})`);
  for (const container of spec.containers ?? []) {
    const what: string[] = [];
    if (!runsAgent && (container.command || container.args)) what.push('command/args');
    if (!runsAgent && container.env?.length) what.push('env');
    if (container.envFrom?.length) what.push('envFrom');
    if ((container.volumeMounts ?? []).some((mount: any) => isUnmounted(mount.name))) what.push('volumeMounts');
    if (container.resources && Object.keys(container.resources).some((key) => Object.keys(container.resources[key] ?? {}).length > 0))
      what.push('resources');
    if (container.livenessProbe) what.push('livenessProbe');
    if (container.startupProbe) what.push('startupProbe');
    if (container.readinessProbe && !container.readinessProbe.httpGet && !container.readinessProbe.tcpSocket)
      what.push('readinessProbe (only httpGet and tcpSocket are run)');
    for (const port of container.ports ?? []) {
      if (port.hostPort) what.push(`hostPort ${port.hostPort}`);
      if (port.protocol === 'SCTP') what.push(`SCTP port ${port.containerPort}`);
    }
    if (what.length > 0) ignored.push(`container ${container.name}: ${what.join(', ')}`);
  }
  return ignored;
}

/** servedPorts: every TCP and UDP containerPort of the pod's containers, or 8080/TCP when none is declared. */
export function servedPorts(pod: KubeObject): {tcp: number[]; udp: number[]} {
  const tcp = new Set<number>();
  const udp = new Set<number>();
  for (const container of pod.spec?.containers ?? []) {
    for (const port of container.ports ?? []) {
      if ((port.protocol ?? 'TCP') === 'TCP') tcp.add(port.containerPort);
      else if (port.protocol === 'UDP') udp.add(port.containerPort);
    }
  }
  if (tcp.size === 0 && udp.size === 0) tcp.add(8080);
  return {tcp: [...tcp], udp: [...udp]};
}
