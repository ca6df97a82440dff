// In-memory object storage with one global revision counter and a bounded event log, as etcd gives kube-apiserver.
import {gone} from './api-error.ts';

export interface ObjectMeta {
  name: string;
  namespace?: string;
  generateName?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  deletionGracePeriodSeconds?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: Array<Record<string, any>>;
  finalizers?: string[];
  /** Field ownership (field-manager.ts). */
  managedFields?: Array<Record<string, any>>;
  [key: string]: unknown;
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  [key: string]: any;
}

export type ChangeType = 'ADDED' | 'MODIFIED' | 'DELETED';

/** One change; `encoded` caches serialisations so N watchers cost one JSON.stringify per form. */
export interface StoredEvent {
  revision: number;
  storageKey: string;
  type: ChangeType;
  object: KubeObject;
  previous?: KubeObject;
  encoded: Map<string, string>;
}

export type Subscriber = (event: StoredEvent) => void;

export function objectKey(namespace: string | undefined, name: string): string {
  return namespace ? `${namespace}/${name}` : name;
}

export class ObjectLog {
  private revision: number;
  private readonly tables = new Map<string, Map<string, KubeObject>>();
  /** Sorted keys per table, dropped when a key is added or removed (not when an object changes). */
  private readonly sortedKeys = new Map<string, string[]>();
  private log: StoredEvent[] = [];
  private logStart = 0;
  private compacted: number;
  private readonly window: number;
  private readonly subscribers = new Map<string, Set<Subscriber>>();
  private readonly anySubscribers = new Set<Subscriber>();

  /** `window` is how many events are kept for watches that resume from an older revision. */
  constructor(window: number, firstRevision = 1) {
    this.window = Math.max(1, window);
    this.revision = firstRevision;
    this.compacted = firstRevision;
  }

  get currentRevision(): number {
    return this.revision;
  }

  /** Events with a revision greater than this are still kept. */
  get compactedRevision(): number {
    return this.compacted;
  }

  get(storageKey: string, namespace: string | undefined, name: string): KubeObject | undefined {
    return this.tables.get(storageKey)?.get(objectKey(namespace, name));
  }

  /** Objects sorted by namespace/name, as etcd returns them. */
  list(storageKey: string, namespace?: string): KubeObject[] {
    const table = this.tables.get(storageKey);
    if (!table) return [];
    let keys = this.sortedKeys.get(storageKey);
    if (!keys) {
      keys = [...table.keys()].sort();
      this.sortedKeys.set(storageKey, keys);
    }
    const out: KubeObject[] = [];
    for (const key of keys) {
      const obj = table.get(key)!;
      if (namespace && obj.metadata.namespace !== namespace) continue;
      out.push(obj);
    }
    return out;
  }

  count(storageKey: string): number {
    return this.tables.get(storageKey)?.size ?? 0;
  }

  /** Stores `object` (which the caller must not change afterwards), stamping the next revision into it. */
  write(storageKey: string, type: ChangeType, object: KubeObject): KubeObject {
    let table = this.tables.get(storageKey);
    if (!table) {
      table = new Map();
      this.tables.set(storageKey, table);
    }
    const key = objectKey(object.metadata.namespace, object.metadata.name);
    const previous = table.get(key);
    this.revision++;
    object.metadata.resourceVersion = String(this.revision);
    if (type === 'DELETED') table.delete(key);
    else table.set(key, object);
    if (type === 'DELETED' || !previous) this.sortedKeys.delete(storageKey);
    const event: StoredEvent = {revision: this.revision, storageKey, type, object, previous, encoded: new Map()};
    this.append(event);
    for (const fn of this.subscribers.get(storageKey) ?? []) fn(event);
    for (const fn of this.anySubscribers) fn(event);
    return object;
  }

  private append(event: StoredEvent): void {
    this.log.push(event);
    if (this.log.length - this.logStart > this.window) {
      this.compacted = this.log[this.logStart].revision;
      this.log[this.logStart] = undefined as unknown as StoredEvent;
      this.logStart++;
      if (this.logStart > 4096 && this.logStart * 2 > this.log.length) {
        this.log = this.log.slice(this.logStart);
        this.logStart = 0;
      }
    }
  }

  /** Events of one resource after `revision`; 410 Gone when some of them were already dropped. */
  eventsSince(storageKey: string, revision: number): StoredEvent[] {
    if (revision < this.compacted) throw gone(`too old resource version: ${revision} (${this.compacted})`);
    let lo = this.logStart;
    let hi = this.log.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.log[mid].revision <= revision) lo = mid + 1;
      else hi = mid;
    }
    const out: StoredEvent[] = [];
    for (let i = lo; i < this.log.length; i++) if (this.log[i].storageKey === storageKey) out.push(this.log[i]);
    return out;
  }

  subscribe(storageKey: string, fn: Subscriber): () => void {
    let set = this.subscribers.get(storageKey);
    if (!set) {
      set = new Set();
      this.subscribers.set(storageKey, set);
    }
    set.add(fn);
    return () => set.delete(fn);
  }

  subscribeAll(fn: Subscriber): () => void {
    this.anySubscribers.add(fn);
    return () => this.anySubscribers.delete(fn);
  }

  watcherCount(): number {
    let n = this.anySubscribers.size;
    for (const set of this.subscribers.values()) n += set.size;
    return n;
  }
}
