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

function timestamp(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

export class EventRecorder {
  readonly #store: ClusterStore;
  readonly #clock: () => number;
  /** Event name per component, object uid, reason and message: repeats raise its count. */
  readonly #names = new Map<string, {namespace: string; name: string}>();

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
}
