// The lab's scheduler: binds every Pending pod without a nodeName (and the default schedulerName)
// to a lab node, as kube-scheduler's default plugins would for the lab's simple nodes: the node
// must be Ready, schedulable, match the pod's nodeSelector and required node affinity (node labels,
// and the node's name through matchFields, which is how a DaemonSet's pod names its node) and carry
// no NoSchedule or NoExecute taint the pod does not tolerate; among those, the one with the fewest
// pods wins (spread). A pod no node fits stays Pending with PodScheduled False and a
// FailedScheduling event, and is tried again when a node changes.
import type {ClusterStore} from './cluster-store.ts';
import {ControllerQueue, namespacedKey, splitKey} from './controller-queue.ts';
import type {EventRecorder} from './event-recorder.ts';
import type {KubeObject} from './object-log.ts';

const source = {component: 'default-scheduler'};

function needsScheduling(pod: KubeObject): boolean {
  return (
    !pod.spec?.nodeName &&
    !pod.metadata.deletionTimestamp &&
    (pod.spec?.schedulerName ?? 'default-scheduler') === 'default-scheduler' &&
    pod.status?.phase !== 'Succeeded' &&
    pod.status?.phase !== 'Failed'
  );
}

function tolerates(pod: KubeObject, taint: {key: string; value?: string; effect?: string}): boolean {
  return (pod.spec?.tolerations ?? []).some(
    (toleration: any) =>
      (toleration.effect === undefined || toleration.effect === '' || toleration.effect === taint.effect) &&
      (toleration.key === undefined || toleration.key === '' || toleration.key === taint.key) &&
      (toleration.operator === 'Exists' || (toleration.value ?? '') === (taint.value ?? '')),
  );
}

/** One node selector requirement (a matchExpressions or matchFields item) against a value the node has, or undefined. */
function meetsRequirement(requirement: any, value: string | undefined): boolean {
  const values: string[] = requirement?.values ?? [];
  switch (requirement?.operator) {
    case 'In':
      return value !== undefined && values.includes(value);
    case 'NotIn':
      return value === undefined || !values.includes(value);
    case 'Exists':
      return value !== undefined;
    case 'DoesNotExist':
      return value === undefined;
    case 'Gt':
    case 'Lt': {
      const number = Number(value);
      const bound = Number(values[0]);
      if (value === undefined || !Number.isInteger(number) || !Number.isInteger(bound)) return false;
      return requirement.operator === 'Gt' ? number > bound : number < bound;
    }
  }
  return false;
}

/**
 * A node selector term: every matchExpressions item (node labels) and matchFields item (only
 * metadata.name) holds; a term with neither matches no node, as kube-scheduler reads it.
 */
function matchesTerm(term: any, node: KubeObject): boolean {
  const expressions: any[] = term?.matchExpressions ?? [];
  const fields: any[] = term?.matchFields ?? [];
  if (expressions.length === 0 && fields.length === 0) return false;
  const labels: Record<string, string> = node.metadata.labels ?? {};
  return (
    expressions.every((requirement) =>
      meetsRequirement(requirement, Object.hasOwn(labels, requirement?.key) ? labels[requirement.key] : undefined),
    ) && fields.every((requirement) => requirement?.key === 'metadata.name' && meetsRequirement(requirement, node.metadata.name))
  );
}

/** matchesNodeSelection: the node has the pod's nodeSelector labels and meets one term of its required node affinity. */
export function matchesNodeSelection(pod: KubeObject, node: KubeObject): boolean {
  const labels = node.metadata.labels ?? {};
  for (const [key, value] of Object.entries(pod.spec?.nodeSelector ?? {})) if (labels[key] !== value) return false;
  const required = pod.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution;
  if (!required) return true;
  return (required.nodeSelectorTerms ?? []).some((term: any) => matchesTerm(term, node));
}

/** The first of the node's taints with one of `effects` that the pod does not tolerate. */
export function untoleratedTaint(pod: KubeObject, node: KubeObject, effects: string[]): {key: string; value?: string} | undefined {
  return (node.spec?.taints ?? []).find((taint: any) => effects.includes(taint.effect) && !tolerates(pod, taint));
}

/** unfitReason: why the pod cannot go to node (kube-scheduler's words), or undefined when it can. */
export function unfitReason(pod: KubeObject, node: KubeObject): string | undefined {
  if (node.spec?.unschedulable && !tolerates(pod, {key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule'}))
    return 'node(s) were unschedulable';
  const ready = (node.status?.conditions ?? []).find((condition: any) => condition.type === 'Ready');
  if (ready?.status !== 'True' && !tolerates(pod, {key: 'node.kubernetes.io/not-ready', effect: 'NoSchedule'}))
    return 'node(s) had untolerated taint {node.kubernetes.io/not-ready: }';
  if (!matchesNodeSelection(pod, node)) return "node(s) didn't match Pod's node affinity/selector";
  const taint = untoleratedTaint(pod, node, ['NoSchedule', 'NoExecute']);
  if (taint) return `node(s) had untolerated taint {${taint.key}: ${taint.value ?? ''}}`;
  return undefined;
}

/** placement: the node for pod, or kube-scheduler's message saying why there is none. */
export function placement(pod: KubeObject, nodes: KubeObject[], podsOnNode: (node: string) => number): {node?: string; message?: string} {
  if (nodes.length === 0) return {message: 'no nodes available to schedule pods'};
  const reasons = new Map<string, number>();
  let best: {name: string; load: number} | undefined;
  for (const node of nodes) {
    const reason = unfitReason(pod, node);
    if (reason) {
      reasons.set(reason, (reasons.get(reason) ?? 0) + 1);
      continue;
    }
    const load = podsOnNode(node.metadata.name);
    if (!best || load < best.load) best = {name: node.metadata.name, load};
  }
  if (best) return {node: best.name};
  const parts = [...reasons]
    .map(([reason, count]) => `${count} ${reason}`)
    .sort()
    .join(', ');
  return {message: `0/${nodes.length} nodes are available: ${parts}.`};
}

export class Scheduler {
  readonly #store: ClusterStore;
  readonly #events: EventRecorder;
  readonly #queue = new ControllerQueue('scheduler', (key) => this.#schedule(key));
  #unsubscribe: Array<() => void> = [];

  constructor(store: ClusterStore, events: EventRecorder) {
    this.#store = store;
    this.#events = events;
  }

  start(): void {
    const log = this.#store.log;
    this.#unsubscribe = [
      log.subscribe('pods', (event) => {
        if (event.type !== 'DELETED' && needsScheduling(event.object))
          this.#queue.add(namespacedKey(event.object.metadata.namespace, event.object.metadata.name));
      }),
      log.subscribe('nodes', () => this.#requeueUnscheduled()),
    ];
    this.#requeueUnscheduled();
  }

  stop(): void {
    for (const unsubscribe of this.#unsubscribe) unsubscribe();
    this.#queue.stop();
  }

  get queue(): ControllerQueue {
    return this.#queue;
  }

  #requeueUnscheduled(): void {
    for (const pod of this.#store.log.list('pods'))
      if (needsScheduling(pod)) this.#queue.add(namespacedKey(pod.metadata.namespace, pod.metadata.name));
  }

  #schedule(key: string): void {
    const {namespace, name} = splitKey(key);
    const pod = this.#store.tryGet('pods', namespace, name);
    if (!pod || !needsScheduling(pod)) return;
    const load = new Map<string, number>();
    for (const other of this.#store.log.list('pods')) {
      const node = other.spec?.nodeName;
      if (node && other.status?.phase !== 'Succeeded' && other.status?.phase !== 'Failed') load.set(node, (load.get(node) ?? 0) + 1);
    }
    const chosen = placement(pod, this.#store.log.list('nodes'), (node) => load.get(node) ?? 0);
    if (chosen.node) {
      const bound = this.#store.bind(namespace, name, chosen.node);
      this.#setScheduledCondition(bound, {status: 'True'});
      this.#events.record(source, bound, 'Normal', 'Scheduled', `Successfully assigned ${namespace}/${name} to ${chosen.node}`);
      return;
    }
    const message = chosen.message!;
    const current = (pod.status?.conditions ?? []).find((condition: any) => condition.type === 'PodScheduled');
    if (current?.message === message) return;
    this.#setScheduledCondition(pod, {status: 'False', reason: 'Unschedulable', message});
    this.#events.record(source, pod, 'Warning', 'FailedScheduling', message);
  }

  #setScheduledCondition(pod: KubeObject, condition: {status: string; reason?: string; message?: string}): void {
    const now = new Date(Math.floor(Date.now() / 1000) * 1000).toISOString().replace('.000Z', 'Z');
    this.#store.mutate(
      'pods',
      pod.metadata.namespace,
      pod.metadata.name,
      (current) => {
        current.status ??= {phase: 'Pending'};
        const others = (current.status.conditions ?? []).filter((c: any) => c.type !== 'PodScheduled');
        current.status.conditions = [{type: 'PodScheduled', ...condition, lastProbeTime: null, lastTransitionTime: now}, ...others];
      },
      {subresource: 'status'},
    );
  }
}
