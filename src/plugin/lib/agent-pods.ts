// Finding agents: the agent pods (label app.kubernetes.io/name=proxyctl-agent in the agent
// namespace), which node each runs on, and the port its API listens on (container port "api").
import {CoreV1Api, type KubeConfig, type V1Pod} from '@kubernetes/client-node';
import {defaultAgentPort} from '../../protocol/version.ts';
import {errorLine, PluginError} from './plugin-error.ts';

export const agentLabelSelector = 'app.kubernetes.io/name=proxyctl-agent';
export const defaultAgentNamespace = 'kube-system';

export interface AgentPod {
  namespace: string;
  name: string;
  node: string;
  /** The API port: the container port named "api", else 10260. */
  port: number;
  running: boolean;
}

function apiPort(pod: V1Pod): number {
  for (const container of pod.spec?.containers ?? []) {
    for (const port of container.ports ?? []) if (port.name === 'api') return port.containerPort;
  }
  return defaultAgentPort;
}

/** apiError turns a client-node failure into a line that says what to do. */
export function apiError(what: string, error: unknown): PluginError {
  const code = (error as {code?: number}).code;
  if (code === 403) return new PluginError(`the API server refused to ${what} (403 Forbidden): ask for the RBAC rights, or use another --context`);
  if (code === 401) return new PluginError(`the API server did not accept your credentials while trying to ${what} (401 Unauthorized): check the kubeconfig's user`);
  const text = errorLine(error);
  if (/ECONNREFUSED|ENOTFOUND|EHOSTUNREACH|ETIMEDOUT|timed out/.test(text)) return new PluginError(`cannot reach the API server to ${what}: ${text}: check --kubeconfig / --context`);
  return new PluginError(`cannot ${what}: ${text}`);
}

export async function listAgentPods(config: KubeConfig, namespace: string): Promise<AgentPod[]> {
  let pods: V1Pod[];
  try {
    pods = (await config.makeApiClient(CoreV1Api).listNamespacedPod({namespace, labelSelector: agentLabelSelector})).items;
  } catch (error) {
    throw apiError(`list agent pods in namespace ${namespace}`, error);
  }
  return pods
    .filter((pod) => pod.spec?.nodeName && !pod.metadata?.deletionTimestamp)
    .map((pod) => ({
      namespace,
      name: pod.metadata!.name!,
      node: pod.spec!.nodeName!,
      port: apiPort(pod),
      running: pod.status?.phase === 'Running' || pod.status?.phase === undefined,
    }))
    .sort((a, b) => a.node.localeCompare(b.node) || a.name.localeCompare(b.name));
}

/** agentOnNode picks the agent pod of `node` (a running one when there are several). */
export function agentOnNode(pods: AgentPod[], node: string, namespace: string): AgentPod {
  const onNode = pods.filter((pod) => pod.node === node);
  if (onNode.length === 0) {
    const nodes = [...new Set(pods.map((pod) => pod.node))];
    throw new PluginError(
      `no proxyctl agent runs on node ${node} (pods labelled ${agentLabelSelector} in namespace ${namespace}${nodes.length > 0 ? ` run on ${nodes.join(', ')}` : ': none found'}): check the node name, --agent-namespace, or the agent DaemonSet`,
    );
  }
  return onNode.find((pod) => pod.running) ?? onNode[0];
}
