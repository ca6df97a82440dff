// The control plane's workload side, run inside the lab's API server: the scheduler, the
// ReplicaSet, Deployment and DaemonSet controllers and the garbage collector, fed by the store's changes.
import type {ClusterStore} from './cluster-store.ts';
import {DaemonSetController} from './daemonset-controller.ts';
import {DeploymentController} from './deployment-controller.ts';
import type {EventRecorder} from './event-recorder.ts';
import {GarbageCollector} from './garbage-collector.ts';
import type {StoredEvent} from './object-log.ts';
import {ReplicaSetController} from './replicaset-controller.ts';
import {Scheduler} from './scheduler.ts';

export class WorkloadControllers {
  readonly scheduler: Scheduler;
  readonly replicaSets: ReplicaSetController;
  readonly deployments: DeploymentController;
  readonly daemonSets: DaemonSetController;
  readonly garbageCollector: GarbageCollector;
  readonly #store: ClusterStore;
  #unsubscribe: (() => void) | undefined;

  constructor(store: ClusterStore, events: EventRecorder) {
    this.#store = store;
    this.scheduler = new Scheduler(store, events);
    this.replicaSets = new ReplicaSetController(store, events);
    this.deployments = new DeploymentController(store, events);
    this.daemonSets = new DaemonSetController(store, events);
    this.garbageCollector = new GarbageCollector(store);
  }

  start(): void {
    this.scheduler.start();
    this.#unsubscribe = this.#store.log.subscribeAll((event) => this.#onChange(event));
    for (const rs of this.#store.log.list('apps/replicasets')) this.replicaSets.onReplicaSet(rs);
    for (const deployment of this.#store.log.list('apps/deployments')) this.deployments.onDeployment(deployment);
    for (const ds of this.#store.log.list('apps/daemonsets')) this.daemonSets.onDaemonSet(ds);
  }

  stop(): void {
    this.#unsubscribe?.();
    this.scheduler.stop();
    for (const queue of this.#queues()) queue.stop();
  }

  busy(): boolean {
    return this.#queues().some((queue) => queue.busy());
  }

  async whenIdle(): Promise<void> {
    for (const queue of this.#queues()) await queue.whenIdle();
  }

  #queues() {
    return [this.scheduler.queue, this.replicaSets.queue, this.deployments.queue, this.daemonSets.queue, this.garbageCollector.queue];
  }

  #onChange(event: StoredEvent): void {
    const obj = event.object;
    if (event.type === 'DELETED') this.garbageCollector.onDeleted(obj);
    switch (event.storageKey) {
      case 'pods':
        this.replicaSets.onPod(obj);
        this.daemonSets.onPod(obj);
        break;
      case 'nodes':
        this.daemonSets.onNode();
        break;
      case 'apps/replicasets':
        this.replicaSets.onReplicaSet(obj);
        this.deployments.onReplicaSet(obj);
        break;
      case 'apps/deployments':
        this.deployments.onDeployment(obj);
        break;
      case 'apps/daemonsets':
        this.daemonSets.onDaemonSet(obj);
        break;
      case 'apps/controllerrevisions':
        this.daemonSets.onControllerRevision(obj);
        break;
    }
  }
}
