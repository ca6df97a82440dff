// Where the lab's API server sends a pods/portforward stream. An agent (the lab's own agent Pods,
// and pods of the proxyctl-agent image its kubelets run) maps its container ports to the loopback
// ports its process really serves on (agents share the host's loopback, so each has its own); any
// other lab pod is reached inside its network namespace through a small relay process, as kubectl
// port-forward reaches localhost inside a pod.
import {spawn} from 'node:child_process';
import {Duplex} from 'node:stream';
import type {KubeObject} from './apiserver/object-log.ts';
import type {PodAddressResolver, PodTarget} from './apiserver/portforward-target.ts';
import {agentContainerPorts, agentNamespace, agentUrlAnnotation, netnsAnnotation} from './lab-objects.ts';
import type {AgentState} from './lab-state.ts';
import {siblingProgram} from './workload/launch.ts';

export interface LabPortForwardOptions {
  /** Only namespaces under this prefix are entered: an annotation cannot send a stream elsewhere. */
  prefix: string;
  agents: () => AgentState[];
  /** Where a pod that runs the agent image (kubelet/agent-container.ts) serves a container port on the host's loopback. */
  loopbackPort?: (pod: KubeObject, containerPort: number) => number | undefined;
}

export function labPodResolver(options: LabPortForwardOptions): PodAddressResolver {
  return (pod: KubeObject, port: number): PodTarget => {
    const what = `pod ${pod.metadata.namespace}/${pod.metadata.name}`;
    // The lab's own agent Pods (their agent-url annotation says so) stand for processes the supervisor runs.
    if (pod.metadata.namespace === agentNamespace && pod.metadata.annotations?.[agentUrlAnnotation] !== undefined) {
      const agent = options.agents().find((candidate) => candidate.pod === pod.metadata.name);
      if (!agent) throw new Error(`${what}: no agent of this lab runs for it`);
      const ports: Record<number, number> = {
        [agentContainerPorts.api]: agent.apiPort,
        [agentContainerPorts.healthz]: agent.healthzPort,
        [agentContainerPorts.metrics]: agent.metricsPort,
      };
      const hostPort = ports[port];
      if (hostPort === undefined) {
        throw new Error(
          `${what} serves no port ${port} (api ${agentContainerPorts.api}, healthz ${agentContainerPorts.healthz}, metrics ${agentContainerPorts.metrics})`,
        );
      }
      return {host: '127.0.0.1', port: hostPort};
    }
    const loopbackPort = options.loopbackPort?.(pod, port);
    if (loopbackPort !== undefined) return {host: '127.0.0.1', port: loopbackPort};
    const namespace = pod.metadata.annotations?.[netnsAnnotation];
    if (typeof namespace !== 'string' || !namespace.startsWith(options.prefix)) {
      throw new Error(`${what} does not run in this lab (no ${netnsAnnotation} annotation naming one of its namespaces)`);
    }
    return {connect: () => connectInNamespace(namespace, port)};
  };
}

/** connectInNamespace opens a TCP stream to 127.0.0.1:port inside the namespace; rejects with the dial error. */
export function connectInNamespace(namespace: string, port: number): Promise<Duplex> {
  const child = spawn('ip', ['netns', 'exec', namespace, process.execPath, siblingProgram('netns-relay', import.meta.url), String(port)], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  return new Promise((resolve, reject) => {
    let said = '';
    const fail = (message: string) => {
      child.kill('SIGKILL');
      reject(new Error(`connect to port ${port} in network namespace ${namespace}: ${message}`));
    };
    child.once('error', (error) => fail(error.message));
    child.once('exit', (code) => fail(said.trim() || `relay exited with ${code}`));
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', function onData(chunk: string) {
      said += chunk;
      if (!said.includes('\n')) return;
      child.stderr.off('data', onData);
      if (!said.startsWith('connected')) return fail(said.replace(/^error: /, '').trim());
      child.removeAllListeners('exit');
      const stream = Duplex.from({readable: child.stdout, writable: child.stdin});
      stream.once('close', () => child.kill('SIGTERM'));
      child.once('exit', () => stream.destroy());
      resolve(stream);
    });
  });
}
