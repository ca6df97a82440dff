// Events as the control plane's components write them (client-go's event recorder): one core/v1
// Event per object, reason and message, its count and lastTimestamp raised when it happens again.
import {randomBytes} from 'node:crypto';
import type {ClusterStore} from './cluster-store.ts';
import type {KubeObject} from './object-log.ts';

export type EventType = 'Normal' | 'Warning';

/** The component that reports events, as `source.component` and `reportingComponent` name it. */
export interface EventSource {
  component: string;
  /** The node, for a kubelet's events. */
  host?: string;
}

/** kube-apiserver's --event-ttl default: events not seen again for this long are removed. */
export const eventTtlMs = 60 * 60 * 1000;
const sweepEveryMs = 60 * 1000;

function timestamp(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

export class EventRecorder {
  readonly #store: ClusterStore;
  readonly #clock: () => number;
  /** Event name per component, object uid, reason and message: repeats raise its count. */
  readonly #names = new Map<string, {namespace: string; name: string}>();
  #lastSweep = 0;

  constructor(store: ClusterStore, clock: () => number = Date.now) {
    this.#store = store;
    this.#clock = clock;
  }

  /** record writes (or counts again) an event about object; an event that cannot be written is dropped, as client-go drops it. */
  record(source: EventSource, object: KubeObject, type: EventType, reason: string, message: string): void {
    const {metadata} = object;
    const namespace = metadata.namespace ?? 'default';
    const key = `${source.component}\u0000${metadata.uid}\u0000${reason}\u0000${message}`;
    const now = timestamp(this.#clock());
    this.#sweep();
    const known = this.#names.get(key);
    try {
      if (known && this.#store.tryGet('events', known.namespace, known.name)) {
        this.#store.mutate('events', known.namespace, known.name, (event) => {
          event.count = (event.count ?? 1) + 1;
          event.lastTimestamp = now;
        });
        return;
      }
      const name = `${metadata.name}.${randomBytes(8).toString('hex')}`;
      this.#store.create(
        'events',
        {
          apiVersion: 'v1',
          kind: 'Event',
          metadata: {name, namespace},
          involvedObject: {
            apiVersion: object.apiVersion,
            kind: object.kind,
            name: metadata.name,
            ...(metadata.namespace ? {namespace: metadata.namespace} : {}),
            uid: metadata.uid,
            resourceVersion: metadata.resourceVersion,
          },
          reason,
          message,
          type,
          source: {component: source.component, ...(source.host ? {host: source.host} : {})},
          reportingComponent: source.component,
          reportingInstance: source.host ?? source.component,
          firstTimestamp: now,
          lastTimestamp: now,
          count: 1,
        },
        namespace,
      );
      this.#names.set(key, {namespace, name});
    } catch {
      // The namespace is going away, or the event was deleted meanwhile: events are best effort.
    }
  }

  /** At most once a minute, events last seen more than eventTtlMs ago go, as their etcd lease would expire them. */
  #sweep(): void {
    const now = this.#clock();
    if (now - this.#lastSweep < sweepEveryMs) return;
    this.#lastSweep = now;
    for (const event of this.#store.log.list('events')) {
      const seen = Date.parse(event.lastTimestamp ?? event.eventTime ?? event.metadata.creationTimestamp ?? '');
      if (!(now - seen > eventTtlMs)) continue;
      try {
        this.#store.delete('events', event.metadata.namespace, event.metadata.name);
      } catch {
        // gone meanwhile
      }
    }
    for (const [key, {namespace, name}] of this.#names) if (!this.#store.tryGet('events', namespace, name)) this.#names.delete(key);
  }
}
