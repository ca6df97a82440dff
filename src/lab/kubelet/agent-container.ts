// A pod whose container runs the proxyctl-agent image (manifests/daemonset.yaml,
// manifests/observe/daemonset.yaml) gets the real agent, not the demo server: its args as the
// kubelet expands them ($(NODE_NAME) from the pod's env), its service account's credentials, and
// the node's network namespace when the pod is hostNetwork. The agent is a process in the host's
// namespace, as the lab's own agents are (supervisor.ts): it reaches the API server on loopback and
// works on the node through --netns. Its servers cannot all take their container ports on the
// shared loopback, so each gets a free loopback port; port-forward and readiness probes to the
// container port are sent there.
import {loadAgentConfig} from '../../agent/config/load-config.ts';
import type {KubeObject} from '../apiserver/object-log.ts';
import {agentCommand, freeLoopbackPorts} from '../agent-process.ts';

/** The image's repository name, whatever registry and tag: `proxyctl-agent:0.1.0`, `ghcr.io/x/proxyctl-agent@sha256:...`. */
const agentRepositoryName = 'proxyctl-agent';

export function runsAgentImage(pod: KubeObject): boolean {
  const image: unknown = pod.spec?.containers?.[0]?.image;
  if (typeof image !== 'string') return false;
  const withoutDigest = image.split('@')[0];
  const lastPart = withoutDigest.slice(withoutDigest.lastIndexOf('/') + 1);
  return lastPart.split(':')[0] === agentRepositoryName;
}

/** The value a `fieldRef` env var takes, for the fields the kubelet offers (downward API). */
function fieldValue(pod: KubeObject, fieldPath: string, podIP: string): string | undefined {
  switch (fieldPath) {
    case 'spec.nodeName':
      return pod.spec?.nodeName;
    case 'spec.serviceAccountName':
      return pod.spec?.serviceAccountName;
    case 'metadata.name':
      return pod.metadata.name;
    case 'metadata.namespace':
      return pod.metadata.namespace;
    case 'metadata.uid':
      return pod.metadata.uid;
    case 'status.podIP':
      return podIP;
    case 'status.hostIP':
      return pod.status?.hostIP ?? podIP;
    default:
      return undefined;
  }
}

/** containerEnv: the container's env as its process gets it (value and fieldRef; other sources are not read). */
export function containerEnv(pod: KubeObject, container: any, podIP: string): Map<string, string> {
  const env = new Map<string, string>();
  for (const variable of container.env ?? []) {
    if (typeof variable?.name !== 'string') continue;
    if (typeof variable.value === 'string') env.set(variable.name, expandReferences(variable.value, env));
    else if (typeof variable.valueFrom?.fieldRef?.fieldPath === 'string') {
      const value = fieldValue(pod, variable.valueFrom.fieldRef.fieldPath, podIP);
      if (value !== undefined) env.set(variable.name, value);
    }
  }
  return env;
}

/**
 * expandReferences: the kubelet's $(VAR) expansion of args and env values: a defined variable is
 * replaced, an undefined one stays as written, and $$ is a literal $.
 */
export function expandReferences(text: string, env: ReadonlyMap<string, string>): string {
  return text.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (whole, name: string | undefined) =>
    name === undefined ? '$' : (env.get(name) ?? whole),
  );
}

/** The loopback ports the agent's servers listen on, by server (absent: that server is off). */
export type AgentServerPorts = Partial<Record<'healthz' | 'metrics' | 'api', number>>;

export interface AgentLaunch {
  command: string[];
  /** Container port -> the loopback port the agent's server really listens on. */
  loopbackPorts: Map<number, number>;
  servers: AgentServerPorts;
}

/**
 * agentLaunch: the command that runs the pod's agent on `netns` (the node's namespace for a
 * hostNetwork pod, else the pod's own), with the kubeconfig of its service account. The agent reads
 * its own settings (loadAgentConfig) to learn which port each of its servers takes; the lab then
 * moves each to a free loopback port. Settings the agent refuses are left for it to report: it
 * exits, and its log says why, as in a real pod.
 */
export async function agentLaunch(pod: KubeObject, options: {netns: string; podIP: string; kubeconfig: string}): Promise<AgentLaunch> {
  const container = pod.spec.containers[0];
  const env = containerEnv(pod, container, options.podIP);
  const args = [...(container.command ?? []).slice(1), ...(container.args ?? [])].map((arg: string) => expandReferences(String(arg), env));
  const loopbackPorts = new Map<number, number>();
  const moved: string[] = [];
  const listening: Array<[server: keyof AgentServerPorts, port: number]> = [];
  try {
    const {addresses} = loadAgentConfig(args, () => {
      throw new Error('the lab mounts no volumes');
    });
    for (const server of ['healthz', 'metrics', 'api'] as const) {
      const port = addresses[server]?.port;
      if (port !== undefined) listening.push([server, port]);
    }
  } catch {
    // The agent refuses these settings itself, with the reason in its log.
  }
  const free = await freeLoopbackPorts(listening.length);
  const servers: AgentServerPorts = {};
  listening.forEach(([server, port], index) => {
    loopbackPorts.set(port, free[index]);
    servers[server] = free[index];
    moved.push(`--${server}-bind-address`, `127.0.0.1:${free[index]}`);
  });
  return {
    command: [...agentCommand(), ...args, '--netns', options.netns, '--kubeconfig', options.kubeconfig, ...moved],
    loopbackPorts,
    servers,
  };
}
