// AgentLocator: how a command reaches agents. Through the API server (agent pods by label, a
// port-forward to the one on the node asked for), so that RBAC on pods/portforward decides who may
// talk to an agent; or straight to --agent-url.
import type {KubeConfig} from '@kubernetes/client-node';
import {AgentClient} from './agent-client.ts';
import {agentOnNode, listAgentPods, type AgentPod} from './agent-pods.ts';
import {loadPluginKubeConfig} from './kube-config.ts';
import {errorLine, PluginError} from './plugin-error.ts';
import {openPortForward} from './port-forward.ts';

export interface LocatorOptions {
  kubeconfig?: string;
  context?: string;
  /** Where the agent pods are (--agent-namespace). */
  agentNamespace: string;
  /** ws://host:port/ of one agent: no API server involved. */
  agentUrl?: string;
  /** Bearer token for --agent-url agents that listen beyond loopback; default: the kubeconfig user's token. */
  token?: string;
  timeoutMs: number;
}

export class AgentLocator {
  readonly #options: LocatorOptions;
  #config: KubeConfig | undefined;
  #pods: Promise<AgentPod[]> | undefined;

  constructor(options: LocatorOptions) {
    if (options.agentUrl !== undefined && !/^wss?:\/\/[^/\s]+/.test(options.agentUrl)) {
      throw new PluginError(`--agent-url ${JSON.stringify(options.agentUrl)}: must be ws://HOST:PORT/ (the agent's --api-bind-address)`);
    }
    this.#options = options;
  }

  get direct(): boolean {
    return this.#options.agentUrl !== undefined;
  }

  kubeConfig(): KubeConfig {
    this.#config ??= loadPluginKubeConfig(this.#options);
    return this.#config;
  }

  /** The agent pods, listed once per command. */
  agentPods(): Promise<AgentPod[]> {
    this.#pods ??= listAgentPods(this.kubeConfig(), this.#options.agentNamespace);
    return this.#pods;
  }

  /** Nodes that run an agent (with --agent-url: the one agent, named by what it says of itself). */
  async nodes(): Promise<string[]> {
    if (this.direct) {
      const client = await this.open();
      try {
        return [(await client.call('status', {})).node];
      } finally {
        client.close();
      }
    }
    const pods = await this.agentPods();
    if (pods.length === 0) {
      throw new PluginError(
        `no proxyctl agents found (pods labelled app.kubernetes.io/name=proxyctl-agent in namespace ${this.#options.agentNamespace}): is the agent ` +
          `DaemonSet installed? --agent-namespace names its namespace`,
      );
    }
    return [...new Set(pods.map((pod) => pod.node))];
  }

  /**
   * The nodes a command asked for: NODE, or every node with --all-nodes, or the only agent when
   * there is one. With --agent-url: the one agent (its node is what it says it is). `howToName` is
   * how the command takes a node, for the error that asks for one.
   */
  async chooseNodes(node: string | undefined, allNodes: boolean, howToName = 'name a NODE'): Promise<(string | undefined)[]> {
    if (node !== undefined && allNodes) throw new PluginError('name a NODE or use --all-nodes, not both');
    if (this.direct) return [node];
    if (node !== undefined) return [node];
    const nodes = await this.nodes();
    if (allNodes || nodes.length === 1) return nodes;
    throw new PluginError(
      `agents run on ${nodes.length} nodes (${nodes.slice(0, 5).join(', ')}${nodes.length > 5 ? ', ...' : ''}): ${howToName} or use --all-nodes`,
    );
  }

  /** open connects to the agent on `node` (any node with --agent-url). */
  async open(node?: string): Promise<AgentClient> {
    const {agentUrl, timeoutMs} = this.#options;
    if (agentUrl !== undefined) {
      return AgentClient.connect({url: agentUrl, token: this.#token(), timeoutMs, label: `the agent at ${agentUrl}`});
    }
    if (!node) throw new PluginError('which node? name one (NODE argument or --node), or use --all-nodes');
    const pod = agentOnNode(await this.agentPods(), node, this.#options.agentNamespace);
    const stream = await withTimeout(
      openPortForward(this.kubeConfig(), {namespace: pod.namespace, pod: pod.name, port: pod.port}),
      timeoutMs,
      `the API server did not open a port-forward to agent pod ${pod.namespace}/${pod.name} in time: raise --request-timeout`,
    );
    // The URL only names the agent in the handshake; the bytes go through the port-forward.
    return AgentClient.connect({
      url: `ws://${pod.name}.${pod.namespace}:${pod.port}/`,
      stream: () => stream,
      timeoutMs,
      label: `the agent on node ${node} (pod ${pod.namespace}/${pod.name})`,
    });
  }

  #token(): string | undefined {
    if (this.#options.token) return this.#options.token;
    try {
      return this.kubeConfig().getCurrentUser()?.token;
    } catch {
      // No kubeconfig: agents on loopback need no token.
      return undefined;
    }
  }
}

export function withTimeout<T>(promise: Promise<T>, timeoutMs: number, message: string): Promise<T> {
  if (timeoutMs <= 0) return promise;
  let timer: NodeJS.Timeout;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(new PluginError(message)), timeoutMs);
    }),
  ]);
}

/** forEachNode runs `work` for each node, `concurrency` at a time, and never lets one failure stop the others. */
export async function forEachNode<T>(
  nodes: string[],
  concurrency: number,
  work: (node: string) => Promise<T>,
  onDone?: (node: string, done: number) => void,
): Promise<Map<string, {ok: true; value: T} | {ok: false; error: string}>> {
  const results = new Map<string, {ok: true; value: T} | {ok: false; error: string}>();
  let next = 0;
  let done = 0;
  const worker = async () => {
    while (next < nodes.length) {
      const node = nodes[next++];
      try {
        results.set(node, {ok: true, value: await work(node)});
      } catch (error) {
        results.set(node, {ok: false, error: errorLine(error)});
      }
      onDone?.(node, ++done);
    }
  };
  await Promise.all(Array.from({length: Math.max(1, Math.min(concurrency, nodes.length))}, worker));
  return results;
}
