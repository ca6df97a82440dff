// The DaemonSet controller: one pod of a DaemonSet's template on every node its template fits
// (nodeSelector, required node affinity, taints, with the tolerations every daemon pod gets), bound
// to that node through node affinity on metadata.name so that the scheduler places it; pods that
// failed, are surplus or sit on nodes that no longer fit go. Template changes roll out node by node
// within maxUnavailable (or maxSurge, new pod first), or wait for the user's deletes (OnDelete).
// Each template is kept as a ControllerRevision (`kubectl rollout history|undo daemonset`).
import type {ClusterStore} from './cluster-store.ts';
import {namespacedKey, QueuedController, splitKey} from './controller-queue.ts';
import type {EventRecorder} from './event-recorder.ts';
import type {KubeObject} from './object-log.ts';
import {sameTemplate, templateHash} from './pod-template.ts';
import {controllerOf, isPodAvailable, isPodReady, ownerReference, podFromTemplate} from './replicaset-controller.ts';
import {matchesNodeSelection, unfitReason, untoleratedTaint} from './scheduler.ts';
import {matchesLabelSelector} from './selectors.ts';
import {intOrPercent, templateGenerationAnnotation} from './workload-rules.ts';
import {withSortedKeys} from './sorted-json.ts';

const source = {component: 'daemonset-controller'};
/** The label naming a daemon pod's template: its ControllerRevision is DAEMONSET-HASH. */
export const revisionHashLabel = 'controller-revision-hash';
/** The label with the DaemonSet's template generation when the pod was made. */
export const templateGenerationLabel = 'pod-template-generation';

/**
 * Taints no daemon pod minds, as kube-controller-manager adds them to each: a node that stops being
 * ready or reachable keeps its daemons, and node pressure or a cordon does not keep them away.
 */
function daemonTolerations(hostNetwork: boolean): Array<Record<string, string>> {
  const exists = (key: string, effect: string) => ({key: `node.kubernetes.io/${key}`, operator: 'Exists', effect});
  return [
    exists('not-ready', 'NoExecute'),
    exists('unreachable', 'NoExecute'),
    exists('disk-pressure', 'NoSchedule'),
    exists('memory-pressure', 'NoSchedule'),
    exists('pid-pressure', 'NoSchedule'),
    exists('unschedulable', 'NoSchedule'),
    ...(hostNetwork ? [exists('network-unavailable', 'NoSchedule')] : []),
  ];
}

/** The template's pod spec with the daemon tolerations (one the template has already is replaced, not repeated). */
function daemonPodSpec(ds: KubeObject): Record<string, any> {
  const spec = structuredClone(ds.spec?.template?.spec ?? {});
  const tolerations: any[] = [...(spec.tolerations ?? [])];
  for (const wanted of daemonTolerations(spec.hostNetwork === true)) {
    const same = (t: any) =>
      (t.key ?? '') === wanted.key && (t.effect ?? '') === wanted.effect && (t.operator ?? 'Equal') === wanted.operator && !t.value;
    const index = tolerations.findIndex(same);
    if (index >= 0) tolerations[index] = wanted;
    else tolerations.push(wanted);
  }
  spec.tolerations = tolerations;
  return spec;
}

/**
 * The node affinity of the daemon pod for `node`: the template's required terms (already checked
 * against the node) give way to one term naming the node, which the scheduler then honours.
 */
function affinityFor(affinity: Record<string, any> | undefined, node: string): Record<string, any> {
  const required = {nodeSelectorTerms: [{matchFields: [{key: 'metadata.name', operator: 'In', values: [node]}]}]};
  const out = structuredClone(affinity ?? {});
  out.nodeAffinity = {...(out.nodeAffinity ?? {}), requiredDuringSchedulingIgnoredDuringExecution: required};
  return out;
}

/** Whether the DaemonSet wants a pod on node (shouldRun), and whether one there may stay (shouldContinueRunning). */
export function nodeVerdict(ds: KubeObject, node: KubeObject): {shouldRun: boolean; shouldContinueRunning: boolean} {
  const pod: KubeObject = {metadata: {name: ds.metadata.name, namespace: ds.metadata.namespace}, spec: daemonPodSpec(ds)};
  const pinned = pod.spec.nodeName;
  if ((pinned && pinned !== node.metadata.name) || !matchesNodeSelection(pod, node))
    return {shouldRun: false, shouldContinueRunning: false};
  if (unfitReason(pod, node) === undefined) return {shouldRun: true, shouldContinueRunning: true};
  // A taint it does not tolerate keeps new pods away; only a NoExecute one evicts the running pod.
  return {shouldRun: false, shouldContinueRunning: untoleratedTaint(pod, node, ['NoExecute']) === undefined};
}

/** The node a daemon pod is for: its nodeName, else the node its affinity names (not yet scheduled). */
function targetNode(pod: KubeObject): string | undefined {
  if (pod.spec?.nodeName) return pod.spec.nodeName;
  const terms: any[] = pod.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms ?? [];
  for (const term of terms)
    for (const field of term.matchFields ?? [])
      if (field.key === 'metadata.name' && field.operator === 'In' && field.values?.length === 1) return field.values[0];
  return undefined;
}

const isDeleting = (pod: KubeObject) => pod.metadata.deletionTimestamp !== undefined;
const isFinished = (pod: KubeObject) => pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed';

/** Bound pods first, then the oldest (ties by name): the pod a node keeps, and the one its status reports. */
function oldestFirst(a: KubeObject, b: KubeObject): number {
  const bound = Number(Boolean(b.spec?.nodeName)) - Number(Boolean(a.spec?.nodeName));
  if (bound !== 0) return bound;
  const age = Date.parse(a.metadata.creationTimestamp ?? '') - Date.parse(b.metadata.creationTimestamp ?? '');
  return age !== 0 ? age : a.metadata.name.localeCompare(b.metadata.name);
}

/** A pod of the current template: its revision hash, or the DaemonSet's template generation, says so. */
function isUpdated(pod: KubeObject, ds: KubeObject, hash: string): boolean {
  const labels = pod.metadata.labels ?? {};
  const generation = ds.metadata.annotations?.[templateGenerationAnnotation];
  return labels[revisionHashLabel] === hash || (generation !== undefined && labels[templateGenerationLabel] === generation);
}

/** The rolling update's bounds for `desired` nodes (percentages rounded up); never both zero. */
function rollingBounds(ds: KubeObject, desired: number): {surge: number; unavailable: number} {
  const strategy = ds.spec?.updateStrategy ?? {};
  if (strategy.type !== 'RollingUpdate') return {surge: 0, unavailable: 0};
  const surge = intOrPercent(strategy.rollingUpdate?.maxSurge ?? 0, desired, true) || 0;
  let unavailable = intOrPercent(strategy.rollingUpdate?.maxUnavailable ?? 1, desired, true) || 0;
  if (desired > 0 && surge === 0 && unavailable === 0) unavailable = 1;
  return {surge, unavailable};
}

/** Whether the DaemonSet surges at all (maxSurge above zero, a percentage of one node rounded up). */
function allowsSurge(ds: KubeObject): boolean {
  return rollingBounds(ds, 1).surge > 0;
}

/** The data of a ControllerRevision: the patch that puts the template back, keys sorted as Go writes a map. */
function revisionData(ds: KubeObject): Record<string, any> {
  const template = structuredClone(ds.spec?.template ?? {});
  // What kubectl compares (`rollout undo`) is the DaemonSet read into Go's types: they write an empty
  // `resources`, and (since 1.34) no zero creationTimestamp.
  if (template.metadata?.creationTimestamp === null) delete template.metadata.creationTimestamp;
  for (const list of [template.spec?.containers, template.spec?.initContainers])
    for (const container of list ?? []) container.resources ??= {};
  return withSortedKeys({spec: {template: {$patch: 'replace', ...template}}}) as Record<string, any>;
}

/** The template a ControllerRevision holds. */
function revisionTemplate(revision: KubeObject): unknown {
  const {$patch: _directive, ...template} = revision.data?.spec?.template ?? {};
  return template;
}

type PodsByNode = Map<string, KubeObject[]>;

export class DaemonSetController extends QueuedController {
  constructor(store: ClusterStore, events: EventRecorder) {
    super('daemonset controller', store, events);
  }

  onDaemonSet(ds: KubeObject): void {
    this.queue.add(namespacedKey(ds.metadata.namespace, ds.metadata.name));
  }

  /** onPod queues the DaemonSet that owns the pod, or those whose selector an orphan matches. */
  onPod(pod: KubeObject): void {
    this.#onOwned(pod);
  }

  /** A node that comes, goes or changes may change where every DaemonSet runs. */
  onNode(): void {
    for (const ds of this.store.log.list('apps/daemonsets')) this.onDaemonSet(ds);
  }

  onControllerRevision(revision: KubeObject): void {
    this.#onOwned(revision);
  }

  #onOwned(obj: KubeObject): void {
    const owner = controllerOf(obj);
    const namespace = obj.metadata.namespace;
    if (owner) {
      if (owner.kind === 'DaemonSet') this.queue.add(namespacedKey(namespace, owner.name));
      return;
    }
    for (const ds of this.store.log.list('apps/daemonsets', namespace))
      if (matchesLabelSelector(ds.spec?.selector, obj.metadata.labels)) this.onDaemonSet(ds);
  }

  protected sync(key: string): void {
    const {namespace, name} = splitKey(key);
    const ds = this.store.tryGet('daemonsets', namespace, name);
    if (!ds || ds.metadata.deletionTimestamp) return;
    const nodes = [...this.store.log.list('nodes')].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
    const revisions = this.#claim(ds, 'controllerrevisions', () => true);
    const hash = this.#currentRevision(ds, revisions);
    this.#manage(ds, nodes, this.#podsByNode(ds), hash);
    if (ds.spec?.updateStrategy?.type === 'RollingUpdate') this.#rollingUpdate(ds, nodes, this.#podsByNode(ds), hash);
    this.#cleanUpRevisions(ds, hash);
    this.#writeStatus(ds, nodes, this.#podsByNode(ds), hash);
  }

  /**
   * The objects of `storageKey` the DaemonSet controls: those its controller reference names, plus
   * orphans its selector matches (adopted); owned ones its selector no longer matches are released.
   */
  #claim(ds: KubeObject, storageKey: string, adoptable: (obj: KubeObject) => boolean): KubeObject[] {
    const type = this.store.type(storageKey);
    const claimed: KubeObject[] = [];
    for (const obj of this.store.log.list(type.storageKey, ds.metadata.namespace)) {
      const owner = controllerOf(obj);
      const matches = matchesLabelSelector(ds.spec?.selector, obj.metadata.labels);
      try {
        if (owner?.uid === ds.metadata.uid && matches) claimed.push(obj);
        else if (owner?.uid === ds.metadata.uid && !obj.metadata.deletionTimestamp) {
          this.store.mutate(type, obj.metadata.namespace, obj.metadata.name, (current) => {
            current.metadata.ownerReferences = (current.metadata.ownerReferences ?? []).filter((ref) => ref.uid !== ds.metadata.uid);
          });
        } else if (!owner && matches && !obj.metadata.deletionTimestamp && adoptable(obj)) {
          const adopted = this.store.mutate(type, obj.metadata.namespace, obj.metadata.name, (current) => {
            current.metadata.ownerReferences = [...(current.metadata.ownerReferences ?? []), ownerReference(ds)];
          });
          claimed.push(adopted);
        }
      } catch {
        // changed or gone meanwhile: its event queues the DaemonSet again
      }
    }
    return claimed;
  }

  /** The DaemonSet's pods by the node they are for; finished pods already being deleted are left out. */
  #podsByNode(ds: KubeObject): PodsByNode {
    const byNode: PodsByNode = new Map();
    for (const pod of this.#claim(ds, 'pods', (pod) => !isFinished(pod))) {
      if (isFinished(pod) && isDeleting(pod)) continue;
      const node = targetNode(pod);
      if (node === undefined) continue;
      byNode.set(node, [...(byNode.get(node) ?? []), pod]);
    }
    for (const pods of byNode.values()) pods.sort(oldestFirst);
    return byNode;
  }

  /** One pod per node that should run one: missing ones made, failed, surplus and misplaced ones deleted. */
  #manage(ds: KubeObject, nodes: KubeObject[], byNode: PodsByNode, hash: string): void {
    const create: string[] = [];
    const remove: KubeObject[] = [];
    for (const node of nodes) {
      const name = node.metadata.name;
      const {shouldRun, shouldContinueRunning} = nodeVerdict(ds, node);
      const pods = byNode.get(name) ?? [];
      if (shouldRun && pods.length === 0) create.push(name);
      else if (shouldContinueRunning) {
        const pruned = this.#prune(ds, name, pods, shouldRun, hash);
        if (pruned.create) create.push(name);
        remove.push(...pruned.remove);
      } else remove.push(...pods.filter((pod) => !isDeleting(pod)));
    }
    // Pods bound to a node that is gone: kube's pod garbage collector removes them at once.
    const known = new Set(nodes.map((node) => node.metadata.name));
    const stranded = [...byNode].filter(([node]) => !known.has(node)).flatMap(([, pods]) => pods);
    this.#apply(ds, hash, create, remove);
    for (const pod of stranded) this.#deletePod(ds, pod, 0);
  }

  /**
   * A node that may keep its daemon: finished pods go, and of the running ones all but the oldest
   * (while surging, the oldest old and oldest updated pod may share the node). A node left with none
   * gets one only while surging: otherwise the last one is still terminating, and its successor waits.
   */
  #prune(ds: KubeObject, node: string, pods: KubeObject[], shouldRun: boolean, hash: string): {create: boolean; remove: KubeObject[]} {
    const remove: KubeObject[] = [];
    const running: KubeObject[] = [];
    for (const pod of pods) {
      if (isDeleting(pod)) continue;
      if (pod.status?.phase === 'Failed') {
        const message = `Found failed daemon pod ${pod.metadata.namespace}/${pod.metadata.name} on node ${node}, will try to kill it`;
        this.events.record(source, ds, 'Warning', 'FailedDaemonPod', message);
        remove.push(pod);
      } else if (pod.status?.phase === 'Succeeded') remove.push(pod);
      else running.push(pod);
    }
    if (!allowsSurge(ds)) return {create: false, remove: [...remove, ...running.slice(1)]};
    if (running.length <= 1) return {create: running.length === 0 && shouldRun, remove};
    const oldestUpdated = running.find((pod) => isUpdated(pod, ds, hash));
    const oldestOld = running.find((pod) => !isUpdated(pod, ds, hash));
    remove.push(...running.filter((pod) => pod !== oldestUpdated && pod !== oldestOld));
    // The old pod goes once the new one is available, or at once when it is not ready anyway.
    const replaced = oldestUpdated && isPodAvailable(oldestUpdated, ds.spec?.minReadySeconds ?? 0, Date.now());
    if (oldestUpdated && oldestOld && (!isPodReady(oldestOld) || replaced)) remove.push(oldestOld);
    return {create: false, remove};
  }

  /** The node's one new and one old pod (not being deleted), or undefined when it has more than one of either. */
  #updatedAndOld(ds: KubeObject, pods: KubeObject[], hash: string): {updated?: KubeObject; old?: KubeObject} | undefined {
    const live = pods.filter((pod) => !isDeleting(pod));
    const updated = live.filter((pod) => isUpdated(pod, ds, hash));
    const old = live.filter((pod) => !isUpdated(pod, ds, hash));
    if (updated.length > 1 || old.length > 1) return undefined;
    return {updated: updated[0], old: old[0]};
  }

  /**
   * Replaces pods of an old template. Without surge, old pods are deleted while fewer than
   * maxUnavailable nodes lack an available pod (the manage pass then makes the new one); with surge,
   * a new pod is made beside at most maxSurge old available ones, and the old one goes once it is available.
   */
  #rollingUpdate(ds: KubeObject, nodes: KubeObject[], byNode: PodsByNode, hash: string): void {
    const wanted = nodes.filter((node) => nodeVerdict(ds, node).shouldRun);
    for (const node of wanted) if (!byNode.has(node.metadata.name)) byNode.set(node.metadata.name, []);
    const {surge, unavailable} = rollingBounds(ds, wanted.length);
    const available = (pod: KubeObject) => isPodAvailable(pod, ds.spec?.minReadySeconds ?? 0, Date.now());
    const shouldRun = (name: string) => {
      const node = nodes.find((candidate) => candidate.metadata.name === name);
      return node !== undefined && nodeVerdict(ds, node).shouldRun;
    };
    const entries = [...byNode].sort(([a], [b]) => a.localeCompare(b));
    if (surge === 0) {
      let missing = 0;
      const replace: KubeObject[] = [];
      const candidates: KubeObject[] = [];
      for (const [, pods] of entries) {
        const found = this.#updatedAndOld(ds, pods, hash);
        if (!found || !found.old === !found.updated) missing++;
        else if (found.updated) missing += available(found.updated) ? 0 : 1;
        else if (!available(found.old!)) replace.push(found.old!);
        else if (missing < unavailable) candidates.push(found.old!);
      }
      const budget = Math.max(0, Math.min(unavailable - missing, candidates.length));
      this.#apply(ds, hash, [], [...replace, ...candidates.slice(0, budget)]);
      return;
    }
    let surging = 0;
    let availableCount = 0;
    const remove: KubeObject[] = [];
    const leaving: KubeObject[] = [];
    const replaceOn: string[] = [];
    const candidates: string[] = [];
    for (const [node, pods] of entries) {
      const found = this.#updatedAndOld(ds, pods, hash);
      if (!found) {
        surging++;
        continue;
      }
      const {updated, old} = found;
      if ((old && available(old)) || (!old && updated && available(updated))) availableCount++;
      if (!old) continue;
      if (!updated) {
        if (!shouldRun(node)) (available(old) ? leaving : remove).push(old);
        else if (!available(old)) replaceOn.push(node);
        else if (surging < surge) candidates.push(node);
      } else if (!available(updated)) surging++;
      else remove.push(old);
    }
    // An available pod on a node the DaemonSet is leaving goes only while enough others are available.
    remove.push(...leaving.slice(0, Math.max(0, availableCount - wanted.length)));
    const room = Math.max(0, Math.min(surge - surging, candidates.length));
    this.#apply(ds, hash, [...replaceOn, ...candidates.slice(0, room)], remove);
  }

  #apply(ds: KubeObject, hash: string, createOn: string[], remove: KubeObject[]): void {
    for (const node of createOn) this.#createPod(ds, node, hash);
    for (const pod of remove) this.#deletePod(ds, pod);
  }

  #createPod(ds: KubeObject, node: string, hash: string): void {
    const generation = ds.metadata.annotations?.[templateGenerationAnnotation];
    const spec = daemonPodSpec(ds);
    spec.affinity = affinityFor(spec.affinity, node);
    const pod = podFromTemplate(ds, {...ds.spec?.template, spec});
    pod.metadata.labels = {
      ...pod.metadata.labels,
      [revisionHashLabel]: hash,
      ...(generation !== undefined ? {[templateGenerationLabel]: generation} : {}),
    };
    this.createOwnedPod(ds, pod, source);
  }

  #deletePod(ds: KubeObject, pod: KubeObject, gracePeriodSeconds?: number): void {
    try {
      this.store.delete('pods', pod.metadata.namespace, pod.metadata.name, {gracePeriodSeconds});
      this.events.record(source, ds, 'Normal', 'SuccessfulDelete', `Deleted pod: ${pod.metadata.name}`);
    } catch (error) {
      if ((error as {code?: number}).code !== 404)
        this.events.record(source, ds, 'Warning', 'FailedDelete', `Error deleting: ${(error as Error).message}`);
    }
  }

  /**
   * The ControllerRevision of the current template (made when missing, or made the newest again
   * when the template went back to it) and its hash, the controller-revision-hash of new pods.
   */
  #currentRevision(ds: KubeObject, revisions: KubeObject[]): string {
    const namespace = ds.metadata.namespace;
    const newest = Math.max(0, ...revisions.map((revision) => Number(revision.revision) || 0));
    const current = revisions.find((revision) => sameTemplate(revisionTemplate(revision), ds.spec?.template));
    if (current) {
      if ((Number(current.revision) || 0) < newest)
        this.store.mutate('controllerrevisions', namespace, current.metadata.name, (revision) => void (revision.revision = newest + 1));
      return current.metadata.labels?.[revisionHashLabel] ?? templateHash(ds.spec?.template);
    }
    const hash = templateHash(ds.spec?.template);
    try {
      this.store.create(
        'controllerrevisions',
        {
          apiVersion: 'apps/v1',
          kind: 'ControllerRevision',
          metadata: {
            name: `${ds.metadata.name}-${hash}`,
            namespace,
            labels: {...(ds.spec?.template?.metadata?.labels ?? {}), [revisionHashLabel]: hash},
            ...(ds.metadata.annotations ? {annotations: ds.metadata.annotations} : {}),
            ownerReferences: [ownerReference(ds)],
          },
          data: revisionData(ds),
          revision: newest + 1,
        },
        namespace,
      );
    } catch {
      // A revision of that name with another template (a hash collision, or another owner's): pods still get the hash.
    }
    return hash;
  }

  /** Revisions beyond revisionHistoryLimit go, the oldest first, unless they are current or a live pod has their hash. */
  #cleanUpRevisions(ds: KubeObject, hash: string): void {
    const limit = ds.spec?.revisionHistoryLimit ?? 10;
    const live = new Set(
      [...this.#podsByNode(ds).values()]
        .flat()
        .flatMap((pod) => (pod.metadata.labels?.[revisionHashLabel] ? [pod.metadata.labels[revisionHashLabel]] : [])),
    );
    const idle = this.store.log
      .list('apps/controllerrevisions', ds.metadata.namespace)
      .filter((revision) => controllerOf(revision)?.uid === ds.metadata.uid)
      .filter((revision) => {
        const revisionHash = revision.metadata.labels?.[revisionHashLabel];
        return revisionHash !== hash && !live.has(revisionHash ?? '');
      })
      .sort((a, b) => (Number(a.revision) || 0) - (Number(b.revision) || 0));
    for (const revision of idle.slice(0, Math.max(0, idle.length - limit))) {
      try {
        this.store.delete('controllerrevisions', revision.metadata.namespace, revision.metadata.name);
      } catch {
        // gone meanwhile
      }
    }
  }

  /** Status as kube-controller-manager counts it: per node that should run a daemon, its oldest pod. */
  #writeStatus(ds: KubeObject, nodes: KubeObject[], byNode: PodsByNode, hash: string): void {
    const now = Date.now();
    const minReady = ds.spec?.minReadySeconds ?? 0;
    let desired = 0;
    let current = 0;
    let misscheduled = 0;
    let ready = 0;
    let available = 0;
    let updated = 0;
    let waiting = false;
    for (const node of nodes) {
      const pods = byNode.get(node.metadata.name) ?? [];
      if (!nodeVerdict(ds, node).shouldRun) {
        if (pods.length > 0) misscheduled++;
        continue;
      }
      desired++;
      if (pods.length === 0) continue;
      current++;
      const pod = pods[0];
      if (isPodReady(pod)) {
        ready++;
        if (isPodAvailable(pod, minReady, now)) available++;
        else waiting = true;
      }
      if (isUpdated(pod, ds, hash)) updated++;
    }
    const status: Record<string, any> = {
      currentNumberScheduled: current,
      numberMisscheduled: misscheduled,
      desiredNumberScheduled: desired,
      numberReady: ready,
      // Go leaves these out when zero (omitempty).
      ...(ds.metadata.generation ? {observedGeneration: ds.metadata.generation} : {}),
      ...(updated ? {updatedNumberScheduled: updated} : {}),
      ...(available ? {numberAvailable: available} : {}),
      ...(desired - available ? {numberUnavailable: desired - available} : {}),
      ...(ds.status?.collisionCount !== undefined ? {collisionCount: ds.status.collisionCount} : {}),
      ...(ds.status?.conditions !== undefined ? {conditions: ds.status.conditions} : {}),
    };
    // A pod Ready for less than minReadySeconds becomes available later, with no event to say so.
    if (waiting || [...byNode.values()].flat().some((pod) => isPodReady(pod) && !isPodAvailable(pod, minReady, now)))
      this.queue.addAfter(namespacedKey(ds.metadata.namespace, ds.metadata.name), minReady * 1000);
    const latest = this.store.tryGet('daemonsets', ds.metadata.namespace, ds.metadata.name);
    if (!latest || JSON.stringify(status) === JSON.stringify(latest.status)) return;
    this.store.mutate('daemonsets', latest.metadata.namespace, latest.metadata.name, (obj) => void (obj.status = status), {
      subresource: 'status',
    });
  }
}
