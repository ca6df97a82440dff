// The work queue behind the lab's controllers (scheduler, ReplicaSets, Deployments, garbage
// collector): keys queued by watch events are synced once per turn of the event loop, never inside
// the store's write that queued them, and a key may come back after a delay.
import type {ClusterStore} from './cluster-store.ts';
import type {EventRecorder, EventSource} from './event-recorder.ts';
import type {KubeObject} from './object-log.ts';

export class ControllerQueue {
  readonly #name: string;
  readonly #sync: (key: string) => void;
  #pending = new Set<string>();
  #scheduled: NodeJS.Immediate | undefined;
  readonly #timers = new Map<string, NodeJS.Timeout>();
  #idleWaiters: Array<() => void> = [];
  #stopped = false;

  constructor(name: string, sync: (key: string) => void) {
    this.#name = name;
    this.#sync = sync;
  }

  add(key: string): void {
    if (this.#stopped) return;
    this.#pending.add(key);
    this.#scheduled ??= setImmediate(() => this.#flush());
  }

  /** addAfter queues key once delayMs have passed (one timer per key: the earlier wins). */
  addAfter(key: string, delayMs: number): void {
    if (this.#stopped || this.#timers.has(key)) return;
    const timer = setTimeout(() => {
      this.#timers.delete(key);
      this.add(key);
    }, delayMs);
    timer.unref();
    this.#timers.set(key, timer);
  }

  busy(): boolean {
    return this.#pending.size > 0;
  }

  /** Resolves once nothing is queued (delayed keys are not waited for). */
  whenIdle(): Promise<void> {
    if (this.#pending.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  stop(): void {
    this.#stopped = true;
    if (this.#scheduled) clearImmediate(this.#scheduled);
    for (const timer of this.#timers.values()) clearTimeout(timer);
    this.#timers.clear();
    this.#pending.clear();
    this.#resolveIdle();
  }

  #flush(): void {
    this.#scheduled = undefined;
    const work = [...this.#pending];
    this.#pending = new Set();
    for (const key of work) {
      try {
        this.#sync(key);
      } catch (error) {
        // The next change of the object queues it again.
        process.emitWarning(`${this.#name}: ${key}: ${(error as Error).message}`);
      }
    }
    if (this.#pending.size === 0) this.#resolveIdle();
  }

  #resolveIdle(): void {
    const waiters = this.#idleWaiters;
    this.#idleWaiters = [];
    for (const resolve of waiters) resolve();
  }
}

/** namespacedKey is the queue key of a namespaced object; splitKey reads it back. */
export function namespacedKey(namespace: string | undefined, name: string): string {
  return `${namespace ?? ''}/${name}`;
}

export function splitKey(key: string): {namespace: string; name: string} {
  const slash = key.indexOf('/');
  return {namespace: key.slice(0, slash), name: key.slice(slash + 1)};
}

/** QueuedController: a controller of the lab's control plane, with the store it reads and writes, where it records events, and its queue. */
export abstract class QueuedController {
  readonly queue: ControllerQueue;
  protected readonly store: ClusterStore;
  protected readonly events: EventRecorder;

  protected constructor(name: string, store: ClusterStore, events: EventRecorder) {
    this.store = store;
    this.events = events;
    this.queue = new ControllerQueue(name, (key) => this.sync(key));
  }

  /** sync brings the object the key names to what its spec asks for. */
  protected abstract sync(key: string): void;

  /** createOwnedPod creates owner's pod and records SuccessfulCreate or FailedCreate on owner, as kube's controllers do. */
  protected createOwnedPod(owner: KubeObject, pod: KubeObject, source: EventSource): void {
    try {
      const created = this.store.create('pods', pod, owner.metadata.namespace);
      this.events.record(source, owner, 'Normal', 'SuccessfulCreate', `Created pod: ${created.metadata.name}`);
    } catch (error) {
      this.events.record(source, owner, 'Warning', 'FailedCreate', `Error creating: ${(error as Error).message}`);
    }
  }
}
