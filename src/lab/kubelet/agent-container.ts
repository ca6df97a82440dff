// A pod whose container runs the proxyctl-agent image (manifests/daemonset.yaml,
// manifests/observe/daemonset.yaml) gets the real agent, not the demo server: its args as the
// kubelet expands them ($(NODE_NAME) from the pod's env), its service account's credentials, its
// configMap volumes (config-volumes.ts), and the node's network namespace when the pod is
// hostNetwork. A pod of kube-proxy's image gets the agent as a stand-in for kube-proxy: kube-proxy's
// command line is the agent's, and the agent writes kube-proxy's own layout in every mode. The agent
// is a process in the host's namespace, as the lab's own agents are (supervisor.ts): it reaches the
// API server on loopback and works on the node through --netns. Its servers cannot all take their
// container ports on the shared loopback, so each gets a free loopback port; port-forward and
// readiness probes to the container port are sent there.
import {readFileSync} from 'node:fs';
import {loadAgentConfig} from '../../agent/config/load-config.ts';
import type {KubeObject} from '../apiserver/object-log.ts';
import {agentCommand, freeLoopbackPorts} from '../agent-process.ts';
import {pointIntoVolumes, type VolumeMount} from './config-volumes.ts';

/** The programs a lab kubelet runs the agent for, by the image's repository name. */
export type AgentImage = 'proxyctl-agent' | 'kube-proxy';
const agentImages: readonly AgentImage[] = ['proxyctl-agent', 'kube-proxy'];

/**
 * agentImage: whether the pod's image is proxyctl-agent's or kube-proxy's, by its repository name,
 * whatever the registry, tag or digest (`ghcr.io/x/proxyctl-agent:v2`, `registry.k8s.io/kube-proxy:v1.34.0`).
 */
export function agentImage(pod: KubeObject): AgentImage | undefined {
  const image: unknown = pod.spec?.containers?.[0]?.image;
  if (typeof image !== 'string') return undefined;
  const withoutDigest = image.split('@')[0];
  const repository = withoutDigest.slice(withoutDigest.lastIndexOf('/') + 1).split(':')[0];
  return agentImages.find((name) => name === repository);
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
 * hostNetwork pod, else the pod's own), with the kubeconfig of its service account and its args
 * pointed into its configMap volumes (`mounts`). The agent reads
 * its own settings (loadAgentConfig) to learn which port each of its servers takes; the lab then
 * moves each to a free loopback port. Settings the agent refuses are left for it to report: it
 * exits, and its log says why, as in a real pod.
 */
export async function agentLaunch(
  pod: KubeObject,
  options: {netns: string; podIP: string; kubeconfig: string; mounts?: readonly VolumeMount[]},
): Promise<AgentLaunch> {
  const container = pod.spec.containers[0];
  const env = containerEnv(pod, container, options.podIP);
  const args = [...(container.command ?? []).slice(1), ...(container.args ?? [])].map((arg: string) =>
    pointIntoVolumes(expandReferences(String(arg), env), options.mounts ?? []),
  );
  // kube-proxy's own layout: what iptables and ipvs modes write anyway, nftables mode's second layout.
  if (agentImage(pod) === 'kube-proxy') args.push('--nftables-layout', 'kube-proxy');
  const loopbackPorts = new Map<number, number>();
  const moved: string[] = [];
  const listening: Array<[server: keyof AgentServerPorts, port: number]> = [];
  try {
    const {addresses} = loadAgentConfig(args, (path) => readFileSync(path, 'utf8'));
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
