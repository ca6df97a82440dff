// A pod's sandbox as the lab's kubelet makes it: a network namespace with a veth into the node's
// namespace, an address from the node's podCIDR and the routes the cluster's pods have (see
// netns/README.md: routed /32 pods behind the node's pod gateway).
import {
  addressCommand,
  deleteNamespaces,
  linkUpCommand,
  NetworkPlan,
  type NodeDescription,
  routeCommand,
  vethCommand,
  waitForLinksReady,
} from '../netns/index.ts';

export interface PodSandbox {
  /** The network namespace. */
  namespace: string;
  ip: string;
  /** The veth end in the node's namespace. */
  hostInterface: string;
  /** Whether the kubelet made it (and removes it); a lab's demo pods' sandboxes are made with the lab. */
  owned: boolean;
  /**
   * Resolves once the links pass packets (the kernel activates a new link's queue up to a second
   * later, see netns/README.md); the server starts meanwhile, the pod turns Ready after both.
   */
  linksReady: Promise<void>;
}

/** PodAddresses hands out the node's pod addresses (podCIDR .2-.254) in turn, so that a freed one is not reused at once. */
export class PodAddresses {
  readonly #base: string;
  readonly #used = new Set<number>();
  #next = 2;

  constructor(node: NodeDescription) {
    this.#base = node.podCIDR.split('/')[0].split('.').slice(0, 3).join('.');
    this.#used.add(Number(node.podGateway.split('.')[3]));
    for (const pod of node.pods) this.#used.add(Number(pod.ip.split('.')[3]));
  }

  take(): number {
    for (let tried = 0; tried < 253; tried++) {
      const octet = this.#next;
      this.#next = this.#next >= 254 ? 2 : this.#next + 1;
      if (!this.#used.has(octet)) {
        this.#used.add(octet);
        return octet;
      }
    }
    throw new Error(`node's pod CIDR ${this.#base}.0/24 has no free address`);
  }

  release(octet: number): void {
    this.#used.delete(octet);
  }

  address(octet: number): string {
    return `${this.#base}.${octet}`;
  }
}

/**
 * createSandbox makes the namespace and its veth, and resolves then: the server may start while the
 * addresses and routes are set (linksReady resolves once they are, and the links pass packets).
 */
export async function createSandbox(node: NodeDescription, namespace: string, ip: string, hostInterface: string): Promise<PodSandbox> {
  const links = new NetworkPlan();
  links.host(`netns add ${namespace}`, vethCommand({namespace, name: 'eth0'}, {namespace: node.namespace, name: hostInterface}));
  const addresses = new NetworkPlan();
  addresses.in(
    node.namespace,
    addressCommand(hostInterface, `${node.podGateway}/32`),
    linkUpCommand(hostInterface),
    routeCommand({destination: `${ip}/32`, dev: hostInterface, scope: 'link', src: node.podGateway}),
  );
  addresses.in(
    namespace,
    linkUpCommand('lo'),
    addressCommand('eth0', `${ip}/32`),
    linkUpCommand('eth0'),
    routeCommand({destination: 'default', via: node.podGateway, dev: 'eth0', onlink: true}),
  );
  try {
    await links.apply(`pod sandbox ${namespace}`);
  } catch (error) {
    await deleteNamespaces([namespace]).catch(() => undefined);
    throw error;
  }
  const linksReady = addresses.apply(`pod sandbox ${namespace}`).then(() => waitForLinksReady([namespace]));
  linksReady.catch(() => undefined);
  return {namespace, ip, hostInterface, owned: true, linksReady};
}

/** removeSandbox deletes the namespace (its veth and the node's route go with it). */
export async function removeSandbox(sandbox: PodSandbox): Promise<void> {
  if (sandbox.owned) await deleteNamespaces([sandbox.namespace]);
}
