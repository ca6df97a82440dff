// ObjectStore: the Services, EndpointSlices, Node and ServiceCIDRs the watches hold now, keyed by
// namespace/name, and what the proxier reads at each sync (ClusterObjects).
import type {ClusterObjects, ObjectKind} from './cluster-objects.ts';
import type {WatchEventType} from './reflector.ts';

/** What the agent watches: the proxier's kinds, plus ServiceCIDRs in nftables mode. */
export type WatchedKind = ObjectKind | 'ServiceCIDR';

export type StoreListener = (kind: WatchedKind, type: WatchEventType, object: unknown) => void;

export class ObjectStore implements ClusterObjects {
  readonly #objects: Record<WatchedKind, Map<string, unknown>> = {
    Service: new Map(),
    EndpointSlice: new Map(),
    Node: new Map(),
    ServiceCIDR: new Map(),
  };
  readonly #listeners: StoreListener[] = [];

  onChange(listener: StoreListener): void {
    this.#listeners.push(listener);
  }

  /** apply one watch event. */
  apply(kind: WatchedKind, type: WatchEventType, object: unknown): void {
    const key = objectKey(object);
    const objects = this.#objects[kind];
    if (type === 'DELETED') {
      if (!objects.delete(key)) return;
    } else {
      objects.set(key, object);
    }
    for (const listener of this.#listeners) listener(kind, type, object);
  }

  /** replace everything of a kind with a fresh list: objects gone from it are deleted, others added or updated. */
  replace(kind: WatchedKind, items: unknown[]): void {
    const fresh = new Map(items.map((item) => [objectKey(item), item]));
    for (const [key, object] of this.#objects[kind]) if (!fresh.has(key)) this.apply(kind, 'DELETED', object);
    for (const [key, object] of fresh) {
      const known = this.#objects[kind].get(key);
      if (known !== undefined && resourceVersion(known) !== undefined && resourceVersion(known) === resourceVersion(object)) continue;
      this.apply(kind, known === undefined ? 'ADDED' : 'MODIFIED', object);
    }
  }

  services(): unknown[] {
    return [...this.#objects.Service.values()];
  }

  endpointSlices(): unknown[] {
    return [...this.#objects.EndpointSlice.values()];
  }

  node(): unknown {
    return this.#objects.Node.values().next().value;
  }

  /**
   * The service CIDRs of every ServiceCIDR object (spec.cidrs), sorted and without repeats, as
   * kube-proxy takes them: whatever their status. Entries that are not strings are left out.
   */
  serviceCIDRs(): string[] {
    const cidrs = new Set<string>();
    for (const object of this.#objects.ServiceCIDR.values()) {
      const listed = (object as {spec?: {cidrs?: unknown}}).spec?.cidrs;
      if (Array.isArray(listed)) for (const cidr of listed) if (typeof cidr === 'string') cidrs.add(cidr);
    }
    return [...cidrs].sort();
  }

  get size(): Record<WatchedKind, number> {
    return {
      Service: this.#objects.Service.size,
      EndpointSlice: this.#objects.EndpointSlice.size,
      Node: this.#objects.Node.size,
      ServiceCIDR: this.#objects.ServiceCIDR.size,
    };
  }
}

function objectKey(object: unknown): string {
  const metadata = (object as {metadata?: {namespace?: unknown; name?: unknown}}).metadata ?? {};
  return `${typeof metadata.namespace === 'string' ? metadata.namespace : ''}/${String(metadata.name)}`;
}

function resourceVersion(object: unknown): unknown {
  return (object as {metadata?: {resourceVersion?: unknown}}).metadata?.resourceVersion;
}
