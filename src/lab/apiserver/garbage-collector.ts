// The garbage collector: when an object is deleted, the objects it owns (ownerReferences naming its
// uid) are deleted too, in the background, as kube-controller-manager's collector does; with
// propagationPolicy Orphan they stay and lose the reference. An object with other owners still
// there only loses the reference.
import type {ClusterStore} from './cluster-store.ts';
import {ControllerQueue} from './controller-queue.ts';
import type {KubeObject} from './object-log.ts';
import {isReview, resourceTypes} from './resources.ts';

function dependentStorageKeys(): string[] {
  return [...new Set(resourceTypes.filter((type) => type.namespaced && !isReview(type)).map((type) => type.storageKey))];
}

export class GarbageCollector {
  readonly #store: ClusterStore;
  /** Deleted owners by uid: their namespace (undefined for cluster-scoped owners). */
  readonly #deleted = new Map<string, {namespace?: string; orphan: boolean}>();
  readonly #queue = new ControllerQueue('garbage collector', (uid) => this.#collect(uid));

  constructor(store: ClusterStore) {
    this.#store = store;
  }

  get queue(): ControllerQueue {
    return this.#queue;
  }

  onDeleted(obj: KubeObject): void {
    const uid = obj.metadata.uid;
    if (!uid) return;
    const orphan = this.#store.takePropagationPolicy(uid) === 'Orphan';
    this.#deleted.set(uid, {namespace: obj.metadata.namespace, orphan});
    this.#queue.add(uid);
  }

  #collect(uid: string): void {
    const owner = this.#deleted.get(uid);
    this.#deleted.delete(uid);
    if (!owner) return;
    for (const storageKey of dependentStorageKeys()) {
      for (const obj of this.#store.log.list(storageKey, owner.namespace)) {
        const refs = obj.metadata.ownerReferences ?? [];
        if (!refs.some((ref) => ref.uid === uid)) continue;
        const others = refs.filter((ref) => ref.uid !== uid);
        try {
          if (owner.orphan || others.length > 0) {
            this.#store.mutate(storageKey, obj.metadata.namespace, obj.metadata.name, (current) => {
              current.metadata.ownerReferences = others;
              if (others.length === 0) delete current.metadata.ownerReferences;
            });
          } else if (!obj.metadata.deletionTimestamp) {
            this.#store.delete(storageKey, obj.metadata.namespace, obj.metadata.name, {propagationPolicy: 'Background'});
          }
        } catch {
          // deleted meanwhile
        }
      }
    }
  }
}
