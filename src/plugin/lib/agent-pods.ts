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

const networkReasons: Record<string, string> = {
  ECONNREFUSED: 'connection refused (nothing listens there)',
  ECONNRESET: 'the connection was reset',
  ENOTFOUND: 'no such host',
  EAI_AGAIN: 'the host name could not be resolved',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ETIMEDOUT: 'timed out',
  UND_ERR_CONNECT_TIMEOUT: 'timed out connecting',
  UND_ERR_SOCKET: 'the connection closed',
  DEPTH_ZERO_SELF_SIGNED_CERT: "the server's certificate is self-signed and not trusted (set certificate-authority in the kubeconfig)",
  SELF_SIGNED_CERT_IN_CHAIN: "the server's certificate chain is not trusted (set certificate-authority in the kubeconfig)",
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "the server's certificate cannot be verified (set certificate-authority in the kubeconfig)",
  ERR_TLS_CERT_ALTNAME_INVALID: "the server's certificate is not for this address",
};

/** Why a request never got an answer: fetch says "fetch failed" and keeps the reason in its causes. */
function networkReason(error: unknown): string | undefined {
  for (
    let cause = error as {code?: string; message?: string; cause?: unknown} | undefined, depth = 0;
    cause && depth < 5;
    cause = cause.cause as typeof cause, depth++
  ) {
    if (cause.code && networkReasons[cause.code]) return networkReasons[cause.code];
    if (cause.code && /^E[A-Z]+$|^UND_ERR|^ERR_TLS|CERT/.test(cause.code)) return `${cause.message ?? cause.code} (${cause.code})`;
  }
  const text = errorLine(error);
  return /fetch failed|ECONNREFUSED|ENOTFOUND|EHOSTUNREACH|ETIMEDOUT|timed out|socket hang up/.test(text) ? text : undefined;
}

/** apiError turns a client-node failure into a line that says what failed, where, and what to do. */
export function apiError(config: KubeConfig, what: string, error: unknown): PluginError {
  const code = (error as {code?: number}).code;
  if (code === 403)
    return new PluginError(`the API server refused to ${what} (403 Forbidden): ask for the RBAC rights, or use another --context`);
  if (code === 401)
    return new PluginError(
      `the API server did not accept your credentials while trying to ${what} (401 Unauthorized): check the kubeconfig's user`,
    );
  const unreachable = networkReason(error);
  if (unreachable) {
    const server = config.getCurrentCluster()?.server ?? '(no server in the kubeconfig)';
    return new PluginError(`cannot reach the API server at ${server} to ${what}: ${unreachable}: check --kubeconfig / --context`);
  }
  return new PluginError(`cannot ${what}: ${errorLine(error)}`);
}

export async function listAgentPods(config: KubeConfig, namespace: string): Promise<AgentPod[]> {
  let pods: V1Pod[];
  try {
    pods = (await config.makeApiClient(CoreV1Api).listNamespacedPod({namespace, labelSelector: agentLabelSelector})).items;
  } catch (error) {
    throw apiError(config, `list agent pods in namespace ${namespace}`, error);
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
      `no proxyctl agent runs on node ${node} (pods labelled ${agentLabelSelector} in namespace ${namespace}${
        nodes.length > 0 ? ` run ` + `on ${nodes.join(', ')}` : ': none found'
      }): check the node name, --agent-namespace, or the agent DaemonSet`,
    );
  }
  return onNode.find((pod) => pod.running) ?? onNode[0];
}
