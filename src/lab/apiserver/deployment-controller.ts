// The Deployment controller: one ReplicaSet per pod template (named DEPLOYMENT-HASH, the hash also a
// label of its pods), revisions in annotations for `kubectl rollout history|undo`, rolling updates
// bounded by maxSurge and maxUnavailable (or Recreate), old ReplicaSets kept up to
// revisionHistoryLimit, and the status and conditions `kubectl rollout status` reads.
import type {ClusterStore} from './cluster-store.ts';
import {namespacedKey, QueuedController, splitKey} from './controller-queue.ts';
import type {EventRecorder} from './event-recorder.ts';
import type {KubeObject} from './object-log.ts';
import {sameTemplate, templateHash, templateHashLabel} from './pod-template.ts';
import {controllerOf, ownerReference} from './replicaset-controller.ts';
import {matchesLabelSelector} from './selectors.ts';
import {intOrPercent} from './workload-rules.ts';

const source = {component: 'deployment-controller'};
export const revisionAnnotation = 'deployment.kubernetes.io/revision';
const desiredAnnotation = 'deployment.kubernetes.io/desired-replicas';
const maxAnnotation = 'deployment.kubernetes.io/max-replicas';
/** Deployment annotations a ReplicaSet does not inherit. */
const notInherited = ['kubectl.kubernetes.io/last-applied-configuration', revisionAnnotation, desiredAnnotation, maxAnnotation];

export function revisionOf(rs: KubeObject): number {
  return Number(rs.metadata.annotations?.[revisionAnnotation] ?? 0) || 0;
}

function rfc3339(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

/** The rolling update's bounds for replicas: at most replicas + surge pods, at least replicas - unavailable available. */
export function rollingBounds(deployment: KubeObject): {surge: number; unavailable: number} {
  const replicas = deployment.spec.replicas ?? 1;
  const rolling = deployment.spec.strategy?.rollingUpdate ?? {};
  const surge = intOrPercent(rolling.maxSurge ?? '25%', replicas, true);
  let unavailable = intOrPercent(rolling.maxUnavailable ?? '25%', replicas, false);
  if (surge === 0 && unavailable === 0) unavailable = 1;
  return {surge, unavailable: Math.min(unavailable, replicas)};
}

export class DeploymentController extends QueuedController {
  constructor(store: ClusterStore, events: EventRecorder) {
    super('deployment controller', store, events);
  }

  onDeployment(deployment: KubeObject): void {
    this.queue.add(namespacedKey(deployment.metadata.namespace, deployment.metadata.name));
  }

  onReplicaSet(rs: KubeObject): void {
    const owner = controllerOf(rs);
    if (owner?.kind === 'Deployment') this.queue.add(namespacedKey(rs.metadata.namespace, owner.name));
  }

  protected sync(key: string): void {
    const {namespace, name} = splitKey(key);
    const deployment = this.store.tryGet('deployments', namespace, name);
    if (!deployment || deployment.metadata.deletionTimestamp) return;
    const all = this.#ownedReplicaSets(deployment);
    const previous = all.filter((rs) => !sameTemplate(rs.spec.template, deployment.spec.template));
    if (deployment.spec.paused) {
      // kubectl rollout pause: template changes wait for resume; nothing is created or scaled.
      this.#writeStatus(
        deployment,
        all.find((rs) => !previous.includes(rs)),
      );
      return;
    }
    const newRS = this.#newReplicaSet(deployment, all, previous);
    if (deployment.spec.strategy?.type === 'Recreate') this.#recreate(deployment, newRS, previous);
    else this.#roll(deployment, newRS, previous);
    this.#cleanUp(deployment, previous);
    this.#writeStatus(deployment, newRS);
  }

  #ownedReplicaSets(deployment: KubeObject): KubeObject[] {
    const owned: KubeObject[] = [];
    for (const rs of this.store.log.list('apps/replicasets', deployment.metadata.namespace)) {
      const owner = controllerOf(rs);
      if (owner?.uid === deployment.metadata.uid) owned.push(rs);
      else if (!owner && !rs.metadata.deletionTimestamp && matchesLabelSelector(deployment.spec.selector, rs.metadata.labels)) {
        owned.push(
          this.store.mutate('replicasets', rs.metadata.namespace, rs.metadata.name, (current) => {
            current.metadata.ownerReferences = [...(current.metadata.ownerReferences ?? []), ownerReference(deployment)];
          }),
        );
      }
    }
    return owned;
  }

  /** The ReplicaSet of the current template, made when missing; its revision is the newest. */
  #newReplicaSet(deployment: KubeObject, all: KubeObject[], previous: KubeObject[]): KubeObject {
    const namespace = deployment.metadata.namespace;
    const revision = Math.max(0, ...previous.map(revisionOf)) + 1;
    const inherited = Object.fromEntries(
      Object.entries(deployment.metadata.annotations ?? {}).filter(([key]) => !notInherited.includes(key)),
    );
    let rs = all.find((candidate) => !previous.includes(candidate));
    if (!rs) {
      const hash = templateHash(deployment.spec.template);
      const template = structuredClone(deployment.spec.template);
      template.metadata ??= {};
      template.metadata.labels = {...(template.metadata.labels ?? {}), [templateHashLabel]: hash};
      const selector = structuredClone(deployment.spec.selector);
      selector.matchLabels = {...(selector.matchLabels ?? {}), [templateHashLabel]: hash};
      const {surge} = rollingBounds(deployment);
      rs = this.store.create(
        'replicasets',
        {
          apiVersion: 'apps/v1',
          kind: 'ReplicaSet',
          metadata: {
            name: `${deployment.metadata.name}-${hash}`,
            namespace,
            labels: template.metadata.labels,
            annotations: {
              ...inherited,
              [revisionAnnotation]: String(revision),
              [desiredAnnotation]: String(deployment.spec.replicas),
              [maxAnnotation]: String(deployment.spec.replicas + surge),
            },
            ownerReferences: [ownerReference(deployment)],
          },
          spec: {replicas: 0, minReadySeconds: deployment.spec.minReadySeconds ?? 0, selector, template},
        },
        namespace,
      );
    } else if (revisionOf(rs) < revision) {
      // A template rolled back to (kubectl rollout undo) becomes the newest revision again.
      rs = this.store.mutate('replicasets', namespace, rs.metadata.name, (current) => {
        current.metadata.annotations = {...(current.metadata.annotations ?? {}), ...inherited, [revisionAnnotation]: String(revision)};
      });
    }
    const current = String(revisionOf(rs));
    if (deployment.metadata.annotations?.[revisionAnnotation] !== current) {
      this.store.mutate('deployments', namespace, deployment.metadata.name, (d) => {
        d.metadata.annotations = {...(d.metadata.annotations ?? {}), [revisionAnnotation]: current};
      });
    }
    return rs;
  }

  #scale(deployment: KubeObject, rs: KubeObject, replicas: number): KubeObject {
    const from = rs.spec.replicas ?? 0;
    if (from === replicas) return rs;
    const {surge} = rollingBounds(deployment);
    const scaled = this.store.mutate('replicasets', rs.metadata.namespace, rs.metadata.name, (current) => {
      current.spec.replicas = replicas;
      current.metadata.annotations = {
        ...(current.metadata.annotations ?? {}),
        [desiredAnnotation]: String(deployment.spec.replicas),
        [maxAnnotation]: String(deployment.spec.replicas + surge),
      };
    });
    const direction = replicas > from ? 'up' : 'down';
    this.events.record(
      source,
      deployment,
      'Normal',
      'ScalingReplicaSet',
      `Scaled ${direction} replica set ${rs.metadata.name} from ${from} to ${replicas}`,
    );
    return scaled;
  }

  #recreate(deployment: KubeObject, newRS: KubeObject, previous: KubeObject[]): void {
    for (const rs of previous) this.#scale(deployment, rs, 0);
    if (previous.some((rs) => (rs.status?.replicas ?? 0) > 0)) return; // old pods still running or terminating
    this.#scale(deployment, newRS, deployment.spec.replicas);
  }

  #roll(deployment: KubeObject, newRS: KubeObject, previous: KubeObject[]): void {
    const replicas = deployment.spec.replicas;
    const {surge, unavailable} = rollingBounds(deployment);
    const specOf = (rs: KubeObject) => rs.spec.replicas ?? 0;
    let newest = newRS;
    const total = specOf(newest) + previous.reduce((sum, rs) => sum + specOf(rs), 0);
    if (specOf(newest) > replicas) newest = this.#scale(deployment, newest, replicas);
    else if (total < replicas + surge)
      newest = this.#scale(deployment, newest, specOf(newest) + Math.min(replicas + surge - total, replicas - specOf(newest)));

    const olds = [...previous].sort((a, b) => revisionOf(a) - revisionOf(b));
    const minAvailable = replicas - unavailable;
    const newUnavailable = Math.max(0, specOf(newest) - (newest.status?.availableReplicas ?? 0));
    let allPods = specOf(newest) + olds.reduce((sum, rs) => sum + specOf(rs), 0);
    let room = allPods - minAvailable - newUnavailable;
    // First the old pods that are not available anyway.
    for (const [index, rs] of olds.entries()) {
      if (room <= 0) break;
      const unhealthy = specOf(rs) - (rs.status?.availableReplicas ?? 0);
      if (unhealthy <= 0) continue;
      const cut = Math.min(room, unhealthy);
      olds[index] = this.#scale(deployment, rs, specOf(rs) - cut);
      room -= cut;
      allPods -= cut;
    }
    // Then available ones, while enough stay available.
    const available =
      (newest.status?.availableReplicas ?? 0) + olds.reduce((sum, rs) => sum + Math.min(specOf(rs), rs.status?.availableReplicas ?? 0), 0);
    let spare = Math.min(available - minAvailable, allPods - minAvailable - newUnavailable);
    for (const [index, rs] of olds.entries()) {
      if (spare <= 0) break;
      if (specOf(rs) === 0) continue;
      const cut = Math.min(specOf(rs), spare);
      olds[index] = this.#scale(deployment, rs, specOf(rs) - cut);
      spare -= cut;
    }
  }

  /** Old ReplicaSets scaled to zero beyond revisionHistoryLimit go, the oldest first. */
  #cleanUp(deployment: KubeObject, previous: KubeObject[]): void {
    const limit = deployment.spec.revisionHistoryLimit ?? 10;
    const idle = previous
      .map((rs) => this.store.tryGet('replicasets', rs.metadata.namespace, rs.metadata.name))
      .filter((rs): rs is KubeObject => rs !== undefined && (rs.spec.replicas ?? 0) === 0 && (rs.status?.replicas ?? 0) === 0)
      .sort((a, b) => revisionOf(a) - revisionOf(b));
    for (const rs of idle.slice(0, Math.max(0, idle.length - limit))) {
      try {
        this.store.delete('replicasets', rs.metadata.namespace, rs.metadata.name, {propagationPolicy: 'Background'});
      } catch {
        // gone meanwhile
      }
    }
  }

  #writeStatus(deployment: KubeObject, newRS: KubeObject | undefined): void {
    const replicaSets = this.store.log
      .list('apps/replicasets', deployment.metadata.namespace)
      .filter((rs) => controllerOf(rs)?.uid === deployment.metadata.uid);
    const sum = (field: string) => replicaSets.reduce((total, rs) => total + (rs.status?.[field] ?? 0), 0);
    const current = newRS && (this.store.tryGet('replicasets', newRS.metadata.namespace, newRS.metadata.name) ?? newRS);
    const replicas = deployment.spec.replicas;
    const specTotal = replicaSets.reduce((total, rs) => total + (rs.spec.replicas ?? 0), 0);
    const status: Record<string, any> = {
      observedGeneration: deployment.metadata.generation,
      replicas: sum('replicas'),
      updatedReplicas: current?.status?.replicas ?? 0,
      readyReplicas: sum('readyReplicas'),
      availableReplicas: sum('availableReplicas'),
      unavailableReplicas: Math.max(0, specTotal - sum('availableReplicas')),
    };
    for (const field of ['replicas', 'updatedReplicas', 'readyReplicas', 'availableReplicas', 'unavailableReplicas'])
      if (status[field] === 0 && field !== 'replicas') delete status[field];
    const {unavailable} = rollingBounds(deployment);
    const complete = status.updatedReplicas === replicas && (status.availableReplicas ?? 0) === replicas && status.replicas === replicas;
    const name = current?.metadata.name ?? deployment.metadata.name;
    const conditions = [
      (status.availableReplicas ?? 0) >= replicas - unavailable
        ? {type: 'Available', status: 'True', reason: 'MinimumReplicasAvailable', message: 'Deployment has minimum availability.'}
        : {
            type: 'Available',
            status: 'False',
            reason: 'MinimumReplicasUnavailable',
            message: 'Deployment does not have minimum availability.',
          },
      deployment.spec.paused
        ? {type: 'Progressing', status: 'Unknown', reason: 'DeploymentPaused', message: 'Deployment is paused'}
        : complete
          ? {
              type: 'Progressing',
              status: 'True',
              reason: 'NewReplicaSetAvailable',
              message: `ReplicaSet "${name}" has successfully progressed.`,
            }
          : {type: 'Progressing', status: 'True', reason: 'ReplicaSetUpdated', message: `ReplicaSet "${name}" is progressing.`},
    ];
    const now = rfc3339(Date.now());
    const before = deployment.status?.conditions ?? [];
    status.conditions = conditions.map((condition) => {
      const old = before.find((c: any) => c.type === condition.type);
      const same = old && old.status === condition.status && old.reason === condition.reason && old.message === condition.message;
      if (same) return old;
      return {...condition, lastUpdateTime: now, lastTransitionTime: old?.status === condition.status ? old.lastTransitionTime : now};
    });
    const latest = this.store.tryGet('deployments', deployment.metadata.namespace, deployment.metadata.name);
    if (!latest || JSON.stringify(status) === JSON.stringify(latest.status)) return;
    this.store.mutate('deployments', latest.metadata.namespace, latest.metadata.name, (d) => void (d.status = status), {
      subresource: 'status',
    });
  }
}
