// A namespace cluster for kernel tests: nodes, pods and external clients, demo servers in chosen
// pods, rules read and written with the iptables on PATH, and cleanup on exit, failure or signal.
import {spawnSync} from 'node:child_process';
import type {NodeInput} from '../../src/core/model/index.ts';
import {
  buildCluster,
  deleteNamespacesWithPrefix,
  destroyCluster,
  execInNamespace,
  netnsUnavailableReason,
  newNamespacePrefix,
  type ClusterOptions,
  type ClusterTopology,
  type NodeDescription,
  type PodDescription,
} from '../../src/lab/netns/index.ts';
import {DemoAppGroup} from '../../src/lab/workload/launch.ts';

/** Ports every demo server listens on (the services' targetPorts). */
export const demoPorts = {http: 8080, udp: 5353} as const;

/** Why kernel tests cannot run here (not root, no `ip`), or undefined when they can. */
export const kernelUnavailable = await netnsUnavailableReason();

/**
 * How long a demo server's or probe client's Node process may take to start. In the qemu guest
 * every Node start is emulated, several at once on two virtual CPUs, and slower still while the
 * host is busy.
 */
export const nodeStartTimeoutMs = process.env.PROXYCTL_IN_GUEST === '1' ? 60_000 : 10_000;

export interface KernelLab {
  topology: ClusterTopology;
  apps: DemoAppGroup;
  close(): Promise<void>;
}

/**
 * startKernelLab builds the cluster and starts a demo server in each of `servers` (pod names).
 * Its namespaces and processes go away on close(), and also on SIGINT/SIGTERM.
 */
export async function startKernelLab(options: Omit<ClusterOptions, 'prefix'>, servers: string[]): Promise<KernelLab> {
  const prefix = newNamespacePrefix();
  const apps = new DemoAppGroup();
  const onSignal = (signal: NodeJS.Signals) => {
    apps.killAllNow();
    // Synchronous: the process is about to end and cannot wait for promises.
    spawnSync('sh', ['-c', `for ns in $(ip netns list | awk '{print $1}' | grep '^${prefix}'); do ip netns del "$ns"; done`]);
    process.kill(process.pid, signal);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const close = async () => {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await apps.stopAll();
    await deleteNamespacesWithPrefix(prefix);
  };

  try {
    const topology = await buildCluster({...options, prefix});
    const pods = new Map(topology.nodes.flatMap((node) => node.pods).map((pod) => [pod.name, pod]));
    await apps.start(
      servers.map((name) => {
        const pod = pods.get(name);
        if (!pod) throw new Error(`kernel lab: no pod ${name} in the topology`);
        return {namespace: pod.namespace, name: pod.name, httpPort: demoPorts.http, udpPort: demoPorts.udp};
      }),
      {startTimeoutMs: nodeStartTimeoutMs},
    );
    return {
      topology,
      apps,
      close: async () => {
        await close();
        await destroyCluster(topology);
      },
    };
  } catch (error) {
    await close();
    throw error;
  }
}

/** findPod returns the topology's pod of that name, or throws. */
export function findPod(topology: ClusterTopology, name: string): PodDescription {
  const pod = topology.nodes.flatMap((node) => node.pods).find((candidate) => candidate.name === name);
  if (!pod) throw new Error(`no pod ${name} in the topology`);
  return pod;
}

/** nodeObject is the Kubernetes Node a proxy on this namespace node would read. */
export function nodeObject(node: NodeDescription): NodeInput {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name: node.name},
    spec: {podCIDR: node.podCIDR, podCIDRs: [node.podCIDR]},
    status: {addresses: [{type: 'InternalIP', address: node.ip}]},
  };
}

/** nodeAddresses lists the IPv4 addresses the node's namespace really holds. */
export async function nodeAddresses(node: NodeDescription): Promise<string[]> {
  const {stdout} = await execInNamespace(node.namespace, ['ip', '-4', '-o', 'address', 'show']);
  const addresses = stdout
    .split('\n')
    .map((line) => /\binet (\d+\.\d+\.\d+\.\d+)\//.exec(line)?.[1])
    .filter((address): address is string => address !== undefined);
  return [...new Set(addresses)];
}

/** Which iptables binaries to use: the ones on PATH, or a chosen kernel interface. */
export type IptablesFrontEnd = 'path' | 'nft' | 'legacy';

function iptablesCommand(tool: 'iptables-restore' | 'iptables-save', frontEnd: IptablesFrontEnd): string {
  return frontEnd === 'path' ? tool : tool.replace('iptables-', `iptables-${frontEnd}-`);
}

/**
 * restoreIptables loads a whole ruleset into the node's namespace. The front end decides the
 * kernel interface (nf_tables or legacy); either way the namespace starts empty.
 */
export async function restoreIptables(node: NodeDescription, rules: string, frontEnd: IptablesFrontEnd = 'path'): Promise<void> {
  await execInNamespace(node.namespace, [iptablesCommand('iptables-restore', frontEnd), '-w', '5'], {input: rules});
}

/** saveIptables reads back every table the node's namespace holds. */
export async function saveIptables(node: NodeDescription, frontEnd: IptablesFrontEnd = 'path'): Promise<string> {
  return (await execInNamespace(node.namespace, [iptablesCommand('iptables-save', frontEnd)])).stdout;
}
