// ObjectStore: the Services, EndpointSlices and Node the watches hold now, keyed by namespace/name,
// and what the proxier reads at each sync (ClusterObjects).
import type {ClusterObjects, ObjectKind} from '../sync/proxier.ts';
import type {WatchEventType} from './reflector.ts';

export type StoreListener = (kind: ObjectKind, type: WatchEventType, object: unknown) => void;

export class ObjectStore implements ClusterObjects {
  readonly #objects: Record<ObjectKind, Map<string, unknown>> = {Service: new Map(), EndpointSlice: new Map(), Node: new Map()};
  readonly #listeners: StoreListener[] = [];

  onChange(listener: StoreListener): void {
    this.#listeners.push(listener);
  }

  /** apply one watch event. */
  apply(kind: ObjectKind, type: WatchEventType, object: unknown): void {
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
  replace(kind: ObjectKind, items: unknown[]): void {
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

  get size(): Record<ObjectKind, number> {
    return {Service: this.#objects.Service.size, EndpointSlice: this.#objects.EndpointSlice.size, Node: this.#objects.Node.size};
  }
}

function objectKey(object: unknown): string {
  const metadata = (object as {metadata?: {namespace?: unknown; name?: unknown}}).metadata ?? {};
  return `${typeof metadata.namespace === 'string' ? metadata.namespace : ''}/${String(metadata.name)}`;
}

function resourceVersion(object: unknown): unknown {
  return (object as {metadata?: {resourceVersion?: unknown}}).metadata?.resourceVersion;
}
