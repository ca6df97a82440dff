// Links, addresses and routes inside network namespaces: veth pairs, bridges, IPv4 addresses and
// routes, each as an `ip` batch line (to build many at once with NetworkPlan) and as a single call.
import {runCommand, runIpBatch} from './ip-command.ts';

/** LinkEnd names an interface inside a namespace. */
export interface LinkEnd {
  namespace: string;
  name: string;
}

/** Route is one IPv4 route: to destination (a CIDR or "default"), via a gateway and/or a device. */
export interface Route {
  destination: string;
  via?: string;
  dev?: string;
  /** Preferred source address for packets the namespace itself sends on this route. */
  src?: string;
  /** 'link' for a destination reached directly on dev without a gateway. */
  scope?: 'link';
  /** Trust that the gateway is on dev even though no address of dev covers it. */
  onlink?: boolean;
}

// Linux limits interface names to 15 bytes; checking here gives a clear error before ip does.
const interfaceName = /^[A-Za-z0-9_.-]{1,15}$/;

function checkInterfaceName(name: string): string {
  if (!interfaceName.test(name)) throw new Error(`interface name "${name}": must be 1-15 letters, digits, '_', '.' or '-'`);
  return name;
}

/**
 * vethCommand is a host-batch line creating a veth pair whose ends are born in their namespaces,
 * so no interface ever appears in the host's namespace (and no host name can clash).
 */
export function vethCommand(end: LinkEnd, peer: LinkEnd): string {
  return `link add ${checkInterfaceName(end.name)} netns ${end.namespace} type veth peer name ${checkInterfaceName(peer.name)} netns ${peer.namespace}`;
}

/** bridgeCommands are namespace-batch lines creating an up bridge. */
export function bridgeCommands(name: string): string[] {
  return [`link add ${checkInterfaceName(name)} type bridge`, `link set ${name} up`];
}

export function attachToBridgeCommand(link: string, bridge: string): string {
  return `link set ${checkInterfaceName(link)} master ${checkInterfaceName(bridge)}`;
}

export function linkUpCommand(name: string): string {
  return `link set ${checkInterfaceName(name)} up`;
}

/** addressCommand adds an address in CIDR form ("10.240.0.10/24", "10.244.1.1/32") to dev. */
export function addressCommand(dev: string, cidr: string): string {
  if (!cidr.includes('/')) throw new Error(`address ${cidr} on ${dev}: give a prefix length, e.g. ${cidr}/32`);
  return `address add ${cidr} dev ${checkInterfaceName(dev)}`;
}

export function routeCommand(route: Route): string {
  if (route.via === undefined && route.dev === undefined)
    throw new Error(`route to ${route.destination}: needs a gateway (via) or a device (dev)`);
  const parts = ['route', 'add', route.destination];
  if (route.via !== undefined) parts.push('via', route.via);
  if (route.dev !== undefined) parts.push('dev', checkInterfaceName(route.dev));
  if (route.src !== undefined) parts.push('src', route.src);
  if (route.scope !== undefined) parts.push('scope', route.scope);
  if (route.onlink) parts.push('onlink');
  return parts.join(' ');
}

/**
 * NetworkPlan collects `ip` commands for the host namespace (creating namespaces and the veth
 * pairs between them) and for each namespace, then runs them as one host batch followed by one
 * batch per namespace, several at a time: a whole cluster in a few dozen processes.
 */
export class NetworkPlan {
  readonly #hostLines: string[] = [];
  readonly #namespaceLines = new Map<string, string[]>();

  /** host adds a line run in the host's namespace (it must only name other namespaces' links). */
  host(...lines: string[]): this {
    this.#hostLines.push(...lines);
    return this;
  }

  /** in adds lines run inside the namespace, in order. */
  in(namespace: string, ...lines: string[]): this {
    let list = this.#namespaceLines.get(namespace);
    if (!list) {
      list = [];
      this.#namespaceLines.set(namespace, list);
    }
    list.push(...lines);
    return this;
  }

  /** apply runs the host batch, then the namespaces' batches with at most `parallel` at once. */
  async apply(purpose: string, parallel = 8): Promise<void> {
    await runIpBatch(`${purpose}: host namespace`, this.#hostLines);
    const pending = [...this.#namespaceLines];
    const workers = Array.from({length: Math.min(parallel, pending.length)}, async () => {
      for (let next = pending.shift(); next; next = pending.shift()) {
        const [namespace, lines] = next;
        await runIpBatch(`${purpose}: namespace ${namespace}`, lines, namespace);
      }
    });
    await Promise.all(workers);
  }
}

/** addVethPair creates one veth pair between (or within) namespaces; both ends stay down. */
export async function addVethPair(end: LinkEnd, peer: LinkEnd): Promise<void> {
  await runIpBatch(`veth ${end.namespace}/${end.name} <-> ${peer.namespace}/${peer.name}`, [vethCommand(end, peer)]);
}

export async function addBridge(namespace: string, name: string): Promise<void> {
  await runIpBatch(`bridge ${name} in ${namespace}`, bridgeCommands(name), namespace);
}

export async function attachToBridge(namespace: string, link: string, bridge: string): Promise<void> {
  await runIpBatch(`attach ${link} to bridge ${bridge} in ${namespace}`, [attachToBridgeCommand(link, bridge)], namespace);
}

export async function setLinkUp(namespace: string, name: string): Promise<void> {
  await runIpBatch(`set ${name} up in ${namespace}`, [linkUpCommand(name)], namespace);
}

export async function addAddress(namespace: string, dev: string, cidr: string): Promise<void> {
  await runIpBatch(`address ${cidr} on ${dev} in ${namespace}`, [addressCommand(dev, cidr)], namespace);
}

export async function addRoute(namespace: string, route: Route): Promise<void> {
  await runIpBatch(`route to ${route.destination} in ${namespace}`, [routeCommand(route)], namespace);
}

/**
 * waitForLinksReady resolves once every link set up in the namespaces has carrier and a working
 * queue. The kernel activates a link's queue from its link-watch work, which runs at most once a
 * second: until then the link silently drops what is sent (ARP requests first), and the first
 * connection through it stalls for a second.
 */
export async function waitForLinksReady(namespaces: string[], timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let waiting = [...namespaces];
  let lastNotReady: string[] = [];
  while (waiting.length > 0) {
    const states = await Promise.all(waiting.map(async (namespace) => ({namespace, notReady: await linksNotReady(namespace)})));
    waiting = states.filter((state) => state.notReady.length > 0).map((state) => state.namespace);
    lastNotReady = states.flatMap((state) => state.notReady.map((link) => `${state.namespace}/${link}`));
    if (waiting.length === 0) return;
    if (Date.now() > deadline) throw new Error(`links not ready after ${timeoutMs} ms: ${lastNotReady.slice(0, 10).join(', ')}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function linksNotReady(namespace: string): Promise<string[]> {
  const {stdout} = await runCommand(`list links in ${namespace}`, ['ip', '-n', namespace, '-o', 'link', 'show', 'up']);
  // "2: eth0@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP ..."
  return stdout
    .split('\n')
    .filter((line) => line.trim() !== '')
    .filter((line) => / qdisc noop /.test(line) || /NO-CARRIER/.test(line) || !/LOWER_UP/.test(line))
    .map((line) => line.split(':')[1]?.trim().split('@')[0] ?? line);
}
