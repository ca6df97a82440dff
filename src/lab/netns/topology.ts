// A cluster made of network namespaces: nodes joined by a bridge (the node network), routed pods
// behind each node, and external clients outside the cluster CIDR. The returned description is
// plain JSON, so the lab can keep it in a state file and tear the cluster down later.
import {checkNetnsSupport} from './ip-command.ts';
import {
  addressCommand,
  attachToBridgeCommand,
  bridgeCommands,
  linkUpCommand,
  NetworkPlan,
  routeCommand,
  vethCommand,
  waitForLinksReady,
} from './links.ts';
import {createNamespaces, deleteNamespaces, deleteNamespacesWithPrefix, setSysctls} from './namespace.ts';

/** Addresses of the namespace cluster; they exist only inside its namespaces. */
export const clusterAddressing = {
  /** The node network: node i is 10.240.0.(10+i), external client j is 10.240.0.(100+j). */
  nodeCIDR: '10.240.0.0/24',
  /** kube-proxy's --cluster-cidr: node i's pods are in 10.244.i.0/24. */
  clusterCIDR: '10.244.0.0/16',
  serviceCIDR: '10.96.0.0/12',
} as const;

export interface ClusterOptions {
  /** Start of every namespace name, e.g. from newNamespacePrefix(). */
  prefix: string;
  nodes: number;
  podsPerNode: number;
  /** One external client (true), or externalClients of them. */
  externalClient?: boolean;
  externalClients?: number;
  /**
   * CIDRs besides the service CIDR that external clients send to the gateway node: load-balancer
   * IPs and externalIPs, as a router in front of the cluster would.
   */
  externalRoutes?: string[];
  /** The node external clients route service traffic through. Default 0. */
  gatewayNode?: number;
  /**
   * Give the nodes a default route to an upstream namespace that refuses everything (default
   * true). A node without a default route answers "network unreachable" to a packet that no
   * rule DNATed, before the filter table sees it; with one, such packets pass FORWARD as on a
   * real node, and one that escapes the proxy's rules is refused by the upstream instead of
   * vanishing, so a test can tell it from a packet the rules dropped.
   */
  upstream?: boolean;
}

export interface PodDescription {
  name: string;
  namespace: string;
  ip: string;
  /** The node's name. */
  node: string;
  interface: string;
  /** The veth end in the node's namespace that leads to this pod. */
  hostInterface: string;
}

export interface NodeDescription {
  /** Also the Kubernetes Node name. */
  name: string;
  namespace: string;
  ip: string;
  /** Interface on the node network. */
  interface: string;
  podCIDR: string;
  /** The node's address on every pod veth: the pods' default gateway, and the source of traffic it masquerades toward its own pods. */
  podGateway: string;
  pods: PodDescription[];
}

export interface ExternalClientDescription {
  name: string;
  namespace: string;
  ip: string;
  interface: string;
  /** Node IP that the service CIDR and externalRoutes go through. */
  gateway: string;
  routes: string[];
}

/** UpstreamDescription: the nodes' default gateway, which holds every address and listens on none. */
export interface UpstreamDescription {
  namespace: string;
  ip: string;
  interface: string;
}

export interface ClusterTopology {
  prefix: string;
  nodeCIDR: string;
  clusterCIDR: string;
  serviceCIDR: string;
  /** The namespace holding the bridge that joins nodes and clients. */
  network: {namespace: string; bridge: string};
  nodes: NodeDescription[];
  externalClients: ExternalClientDescription[];
  upstream?: UpstreamDescription;
  /** Every namespace of the cluster, for cleanup. */
  namespaces: string[];
}

const nodeInterface = 'eth0';
const podInterface = 'eth0';
const bridgeName = 'br0';

/**
 * describeCluster computes names and addresses without touching the machine; buildCluster
 * creates what it describes.
 */
export function describeCluster(options: ClusterOptions): ClusterTopology {
  const {prefix, nodes, podsPerNode} = options;
  if (!/^[A-Za-z0-9_.-]+$/.test(prefix)) throw new Error(`cluster prefix "${prefix}": use letters, digits, '_', '.' or '-'`);
  if (!Number.isInteger(nodes) || nodes < 1 || nodes > 80) throw new Error(`cluster ${prefix}: nodes ${nodes} is not in 1-80`);
  if (!Number.isInteger(podsPerNode) || podsPerNode < 0 || podsPerNode > 240)
    throw new Error(`cluster ${prefix}: podsPerNode ${podsPerNode} is not in 0-240`);
  const clientCount = options.externalClients ?? (options.externalClient ? 1 : 0);
  if (!Number.isInteger(clientCount) || clientCount < 0 || clientCount > 100)
    throw new Error(`cluster ${prefix}: externalClients ${clientCount} is not in 0-100`);
  const gatewayNode = options.gatewayNode ?? 0;
  if (!Number.isInteger(gatewayNode) || gatewayNode < 0 || gatewayNode >= nodes)
    throw new Error(`cluster ${prefix}: gatewayNode ${gatewayNode} is not one of the ${nodes} nodes`);

  const nodeList: NodeDescription[] = [];
  for (let n = 0; n < nodes; n++) {
    const name = `node-${n}`;
    const pods: PodDescription[] = [];
    for (let p = 0; p < podsPerNode; p++) {
      const podName = `pod-${n}-${p}`;
      pods.push({
        name: podName,
        namespace: `${prefix}${podName}`,
        ip: `10.244.${n}.${10 + p}`,
        node: name,
        interface: podInterface,
        hostInterface: `vp${p}`,
      });
    }
    nodeList.push({
      name,
      namespace: `${prefix}${name}`,
      ip: `10.240.0.${10 + n}`,
      interface: nodeInterface,
      podCIDR: `10.244.${n}.0/24`,
      podGateway: `10.244.${n}.1`,
      pods,
    });
  }
  const routes = [clusterAddressing.serviceCIDR, ...(options.externalRoutes ?? [])];
  const clients: ExternalClientDescription[] = [];
  for (let c = 0; c < clientCount; c++) {
    const name = `client-${c}`;
    clients.push({
      name,
      namespace: `${prefix}${name}`,
      ip: `10.240.0.${100 + c}`,
      interface: 'eth0',
      gateway: nodeList[gatewayNode].ip,
      routes,
    });
  }
  const network = {namespace: `${prefix}network`, bridge: bridgeName};
  const upstream: UpstreamDescription | undefined =
    options.upstream === false ? undefined : {namespace: `${prefix}upstream`, ip: '10.240.0.1', interface: 'eth0'};
  return {
    prefix,
    ...clusterAddressing,
    network,
    nodes: nodeList,
    externalClients: clients,
    ...(upstream ? {upstream} : {}),
    namespaces: [
      network.namespace,
      ...nodeList.map((node) => node.namespace),
      ...nodeList.flatMap((node) => node.pods.map((pod) => pod.namespace)),
      ...clients.map((client) => client.namespace),
      ...(upstream ? [upstream.namespace] : []),
    ],
  };
}

// Nodes forward and do not check where replies come from (the DNATed and masqueraded paths are
// asymmetric by design); redirects are off because nodes and clients share one segment, and a
// redirect would teach a client to bypass the node it must go through.
const nodeSysctls = {
  'net.ipv4.ip_forward': 1,
  'net.ipv4.conf.all.rp_filter': 0,
  'net.ipv4.conf.default.rp_filter': 0,
  'net.ipv4.conf.all.send_redirects': 0,
  'net.ipv4.conf.default.send_redirects': 0,
};
const clientSysctls = {
  'net.ipv4.conf.all.accept_redirects': 0,
  'net.ipv4.conf.default.accept_redirects': 0,
};

/**
 * buildCluster creates the namespaces, links, addresses and routes of describeCluster(options).
 * On failure it deletes whatever it created and rethrows.
 */
export async function buildCluster(options: ClusterOptions): Promise<ClusterTopology> {
  await checkNetnsSupport();
  const topology = describeCluster(options);
  try {
    await createNamespaces(topology.namespaces);
    await Promise.all([
      ...topology.nodes.map((node) => setSysctls(node.namespace, nodeSysctls)),
      ...topology.externalClients.map((client) => setSysctls(client.namespace, clientSysctls)),
    ]);
    await planCluster(topology).apply(`build cluster ${topology.prefix}`);
    await waitForLinksReady(topology.namespaces);
    return topology;
  } catch (error) {
    await deleteNamespacesWithPrefix(topology.prefix).catch(() => undefined);
    throw error;
  }
}

/**
 * Plugs a namespace into the node network: a veth whose other end, `uplink`, is on the bridge, and
 * the namespace's address on the node network; `extra` lines run in the namespace after them.
 */
function joinNodeNetwork(
  plan: NetworkPlan,
  topology: ClusterTopology,
  member: {namespace: string; interface: string; ip: string},
  uplink: string,
  ...extra: string[]
): void {
  const {network} = topology;
  const prefixLength = topology.nodeCIDR.split('/')[1];
  plan.host(vethCommand({namespace: member.namespace, name: member.interface}, {namespace: network.namespace, name: uplink}));
  plan.in(network.namespace, attachToBridgeCommand(uplink, network.bridge), linkUpCommand(uplink));
  plan.in(
    member.namespace,
    linkUpCommand('lo'),
    addressCommand(member.interface, `${member.ip}/${prefixLength}`),
    linkUpCommand(member.interface),
    ...extra,
  );
}

function planCluster(topology: ClusterTopology): NetworkPlan {
  const plan = new NetworkPlan();
  const {network} = topology;
  plan.in(network.namespace, linkUpCommand('lo'), ...bridgeCommands(network.bridge));

  for (const [index, node] of topology.nodes.entries()) {
    joinNodeNetwork(plan, topology, node, `node${index}`);
    for (const other of topology.nodes) {
      if (other !== node) plan.in(node.namespace, routeCommand({destination: other.podCIDR, via: other.ip, dev: node.interface}));
    }
    for (const pod of node.pods) {
      // Routed, not bridged: each pod has its own /32 veth into the node, so traffic between two
      // pods of one node passes the node's IP stack and its iptables without br_netfilter.
      plan.host(vethCommand({namespace: pod.namespace, name: pod.interface}, {namespace: node.namespace, name: pod.hostInterface}));
      plan.in(
        node.namespace,
        addressCommand(pod.hostInterface, `${node.podGateway}/32`),
        linkUpCommand(pod.hostInterface),
        routeCommand({destination: `${pod.ip}/32`, dev: pod.hostInterface, scope: 'link', src: node.podGateway}),
      );
      plan.in(
        pod.namespace,
        linkUpCommand('lo'),
        addressCommand(pod.interface, `${pod.ip}/32`),
        linkUpCommand(pod.interface),
        routeCommand({destination: 'default', via: node.podGateway, dev: pod.interface, onlink: true}),
      );
    }
  }

  for (const [index, client] of topology.externalClients.entries()) {
    joinNodeNetwork(plan, topology, client, `client${index}`);
    for (const destination of client.routes)
      plan.in(client.namespace, routeCommand({destination, via: client.gateway, dev: client.interface}));
  }

  const {upstream} = topology;
  if (upstream) {
    joinNodeNetwork(
      plan,
      topology,
      upstream,
      'upstream',
      // Every address is local here (AnyIP) and nothing listens: TCP gets a reset, UDP a port
      // unreachable, whatever address a node sent it to.
      'route add local 0.0.0.0/0 dev lo',
    );
    for (const node of topology.nodes) {
      plan.in(node.namespace, routeCommand({destination: 'default', via: upstream.ip, dev: node.interface}));
      // So that its refusals find their way back to pods.
      plan.in(upstream.namespace, routeCommand({destination: node.podCIDR, via: node.ip, dev: upstream.interface}));
    }
  }
  return plan;
}

/** destroyCluster deletes every namespace of the cluster (and its processes), also half-built ones. */
export async function destroyCluster(topology: Pick<ClusterTopology, 'prefix' | 'namespaces'>): Promise<void> {
  await deleteNamespaces(topology.namespaces);
  await deleteNamespacesWithPrefix(topology.prefix);
}

/** clusterPods lists every pod of every node. */
export function clusterPods(topology: ClusterTopology): PodDescription[] {
  return topology.nodes.flatMap((node) => node.pods);
}
