// The ReplicaSet controller: keeps spec.replicas active pods of a ReplicaSet's template (pods it
// owns through a controller ownerReference; orphans its selector matches are adopted), deletes
// the surplus (unscheduled, then not ready, then the youngest first) and reports status.
import type {ClusterStore} from './cluster-store.ts';
import {namespacedKey, QueuedController, splitKey} from './controller-queue.ts';
import type {EventRecorder} from './event-recorder.ts';
import type {KubeObject} from './object-log.ts';
import {matchesLabelSelector} from './selectors.ts';

const source = {component: 'replicaset-controller'};

/** The controller ownerReference of obj, if any. */
export function controllerOf(obj: KubeObject): Record<string, any> | undefined {
  return (obj.metadata.ownerReferences ?? []).find((ref) => ref.controller === true);
}

export function ownerReference(owner: KubeObject): Record<string, any> {
  return {
    apiVersion: owner.apiVersion,
    kind: owner.kind,
    name: owner.metadata.name,
    uid: owner.metadata.uid,
    controller: true,
    blockOwnerDeletion: true,
  };
}

/** podFromTemplate: a new pod of owner's pod template, named after the owner, owned by it. */
export function podFromTemplate(owner: KubeObject, template: any = owner.spec?.template): KubeObject {
  const copy = structuredClone(template ?? {});
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      ...(copy.metadata ?? {}),
      name: '',
      generateName: `${owner.metadata.name}-`,
      namespace: owner.metadata.namespace,
      ownerReferences: [ownerReference(owner)],
    },
    spec: copy.spec ?? {},
  };
}

export function isPodActive(pod: KubeObject): boolean {
  return !pod.metadata.deletionTimestamp && pod.status?.phase !== 'Succeeded' && pod.status?.phase !== 'Failed';
}

export function isPodReady(pod: KubeObject): boolean {
  return (pod.status?.conditions ?? []).some((condition: any) => condition.type === 'Ready' && condition.status === 'True');
}

/** isPodAvailable: Ready for at least minReadySeconds (kube-controller-manager's rule). */
export function isPodAvailable(pod: KubeObject, minReadySeconds: number, now: number): boolean {
  const ready = (pod.status?.conditions ?? []).find((condition: any) => condition.type === 'Ready' && condition.status === 'True');
  if (!ready) return false;
  if (!minReadySeconds) return true;
  return Date.parse(ready.lastTransitionTime ?? '') + minReadySeconds * 1000 <= now;
}

/** Pods worth deleting first: unscheduled, not running, not ready, then the youngest. */
function deletionRank(pod: KubeObject): [number, number, number, number] {
  return [
    pod.spec?.nodeName ? 1 : 0,
    pod.status?.phase === 'Running' ? 1 : 0,
    isPodReady(pod) ? 1 : 0,
    -Date.parse(pod.metadata.creationTimestamp ?? '0'),
  ];
}

export class ReplicaSetController extends QueuedController {
  constructor(store: ClusterStore, events: EventRecorder) {
    super('replicaset controller', store, events);
  }

  /** onPod queues the ReplicaSet that owns the pod, or whose selector an orphan matches. */
  onPod(pod: KubeObject): void {
    const owner = controllerOf(pod);
    const namespace = pod.metadata.namespace;
    if (owner) {
      if (owner.kind === 'ReplicaSet') this.queue.add(namespacedKey(namespace, owner.name));
      return;
    }
    for (const rs of this.store.log.list('apps/replicasets', namespace))
      if (matchesLabelSelector(rs.spec?.selector, pod.metadata.labels)) this.queue.add(namespacedKey(namespace, rs.metadata.name));
  }

  onReplicaSet(rs: KubeObject): void {
    this.queue.add(namespacedKey(rs.metadata.namespace, rs.metadata.name));
  }

  protected sync(key: string): void {
    const {namespace, name} = splitKey(key);
    const rs = this.store.tryGet('replicasets', namespace, name);
    if (!rs || rs.metadata.deletionTimestamp) return;
    const pods = this.#ownedPods(rs);
    const active = pods.filter(isPodActive);
    const wanted = rs.spec?.replicas ?? 1;
    if (active.length < wanted) {
      for (let i = active.length; i < wanted; i++) this.#createPod(rs);
    } else if (active.length > wanted) {
      const surplus = [...active].sort((a, b) => compareRanks(deletionRank(a), deletionRank(b))).slice(0, active.length - wanted);
      for (const pod of surplus) {
        try {
          this.store.delete('pods', namespace, pod.metadata.name);
          this.events.record(source, rs, 'Normal', 'SuccessfulDelete', `Deleted pod: ${pod.metadata.name}`);
        } catch {
          // already gone
        }
      }
    }
    this.#writeStatus(rs);
  }

  #ownedPods(rs: KubeObject): KubeObject[] {
    const owned: KubeObject[] = [];
    for (const pod of this.store.log.list('pods', rs.metadata.namespace)) {
      const owner = controllerOf(pod);
      if (owner?.uid === rs.metadata.uid) owned.push(pod);
      else if (!owner && isPodActive(pod) && matchesLabelSelector(rs.spec?.selector, pod.metadata.labels)) {
        const adopted = this.store.mutate('pods', pod.metadata.namespace, pod.metadata.name, (current) => {
          current.metadata.ownerReferences = [...(current.metadata.ownerReferences ?? []), ownerReference(rs)];
        });
        owned.push(adopted);
      }
    }
    return owned;
  }

  #createPod(rs: KubeObject): void {
    this.createOwnedPod(rs, podFromTemplate(rs), source);
  }

  #writeStatus(rs: KubeObject): void {
    const now = Date.now();
    const pods = this.store.log
      .list('pods', rs.metadata.namespace)
      .filter((pod) => controllerOf(pod)?.uid === rs.metadata.uid && isPodActive(pod));
    const minReady = rs.spec?.minReadySeconds ?? 0;
    const templateLabels = rs.spec?.template?.metadata?.labels ?? {};
    const status = {
      replicas: pods.length,
      fullyLabeledReplicas: pods.filter((pod) => Object.entries(templateLabels).every(([k, v]) => pod.metadata.labels?.[k] === v)).length,
      readyReplicas: pods.filter(isPodReady).length,
      availableReplicas: pods.filter((pod) => isPodAvailable(pod, minReady, now)).length,
      observedGeneration: rs.metadata.generation,
    };
    if (minReady > 0 && status.readyReplicas > status.availableReplicas)
      this.queue.addAfter(namespacedKey(rs.metadata.namespace, rs.metadata.name), minReady * 1000);
    if (JSON.stringify(status) === JSON.stringify(rs.status)) return;
    this.store.mutate('replicasets', rs.metadata.namespace, rs.metadata.name, (current) => void (current.status = status), {
      subresource: 'status',
    });
  }
}

function compareRanks(a: number[], b: number[]): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}
