// A lab node's kubelet: runs every pod the API server binds to its node (the demo server whatever
// the image, in a network namespace of its own with an address from the node's podCIDR, or in the
// node's for a hostNetwork pod; the real agent for the proxyctl-agent image, agent-container.ts),
// and reports it as a kubelet does. It runs inside the lab supervisor and reads the store directly.
import {join} from 'node:path';
import type {ClusterStore} from '../apiserver/cluster-store.ts';
import type {EventRecorder} from '../apiserver/event-recorder.ts';
import type {KubeObject, StoredEvent} from '../apiserver/object-log.ts';
import {netnsAnnotation} from '../lab-objects.ts';
import type {NodeDescription, PodDescription} from '../netns/index.ts';
import type {PodLogs} from './container-log.ts';
import type {AgentImage, AgentServerPorts} from './agent-container.ts';
import {createSandbox, PodAddresses, type PodSandbox} from './pod-sandbox.ts';
import {type NodeContext, PodWorker} from './pod-worker.ts';
import {NodeProber} from './prober.ts';

export interface KubeletOptions {
  store: ClusterStore;
  events: EventRecorder;
  logs: PodLogs;
  node: NodeDescription;
  /** Start of the lab's namespace names; a pod's is PREFIX + "p-" + the start of its uid. */
  prefix: string;
  /** Pods the lab runs itself (the agents): not this kubelet's. */
  ignore?: (pod: KubeObject) => boolean;
  /** The demo server's pid as it starts (a number) and stops (undefined), by pod. */
  onProcess?: (pod: KubeObject, pid: number | undefined) => void;
  /** The network namespace the kubelet made for a pod, once made (a name) and once removed (undefined). */
  onSandbox?: (pod: {namespace: string; name: string}, netns: string | undefined) => void;
  /** A kubeconfig path with a token of the service account (namespace, name), for pods that run the agent. */
  serviceAccountKubeconfig?: (namespace: string, serviceAccount: string) => Promise<string>;
  /** An agent pod's process started (pid and its servers' loopback ports) or stopped (undefined). */
  onAgent?: (pod: KubeObject, image: AgentImage, agent: {pid: number; servers: AgentServerPorts} | undefined) => void;
  /** Where an agent pod's log is kept as a file too, if anywhere. */
  agentLogFile?: (pod: KubeObject, image: AgentImage) => string | undefined;
  /** A directory under which each pod the agent runs gets one (by uid) for its configMap volumes. */
  podsDirectory?: string;
}

export class LabKubelet {
  readonly #options: KubeletOptions;
  readonly #addresses: PodAddresses;
  readonly #prober: NodeProber;
  /** Workers by pod uid. */
  readonly #workers = new Map<string, PodWorker>();
  /** The lab's demo pods, whose sandboxes the lab built, by name. */
  readonly #prepared = new Map<string, PodDescription>();
  /** Bound -> Ready, milliseconds, per pod that became Ready (for the lab's figures). */
  readonly startLatencies: number[] = [];
  readonly #readyWaiters = new Map<string, Array<() => void>>();
  readonly #readyPods = new Set<string>();
  #unsubscribe: (() => void) | undefined;

  constructor(options: KubeletOptions) {
    this.#options = options;
    this.#addresses = new PodAddresses(options.node);
    this.#prober = new NodeProber(options.node.namespace);
    for (const pod of options.node.pods) this.#prepared.set(pod.name, pod);
  }

  get nodeName(): string {
    return this.#options.node.name;
  }

  start(): void {
    const {store} = this.#options;
    this.#unsubscribe = store.log.subscribe('pods', (event) => this.#onPod(event));
    for (const pod of store.log.list('pods')) this.#onPod({type: 'ADDED', object: pod} as StoredEvent);
  }

  /** whenReady resolves once each named pod ("namespace/name") has turned Ready under this kubelet. */
  whenReady(keys: string[]): Promise<void> {
    return Promise.all(
      keys.map((key) =>
        this.#readyPods.has(key)
          ? undefined
          : new Promise<void>((resolve) => this.#readyWaiters.set(key, [...(this.#readyWaiters.get(key) ?? []), resolve])),
      ),
    ).then(() => undefined);
  }

  /** stop kills every pod's server at once (the lab is going down; its namespaces go with it). */
  stop(): void {
    this.#unsubscribe?.();
    for (const worker of this.#workers.values()) worker.kill();
    this.#workers.clear();
    this.#prober.stop();
  }

  /** loopbackPort: where the agent of the pod (by uid) serves containerPort on the host's loopback, if it runs one here. */
  loopbackPort(podUid: string, containerPort: number): number | undefined {
    return this.#workers.get(podUid)?.loopbackPort(containerPort);
  }

  #onPod(event: Pick<StoredEvent, 'type' | 'object'>): void {
    const pod = event.object;
    if (pod.spec?.nodeName !== this.#options.node.name || this.#options.ignore?.(pod)) return;
    const uid = pod.metadata.uid!;
    const worker = this.#workers.get(uid);
    if (event.type === 'DELETED') {
      worker?.removed();
      this.#options.logs.forget(pod.metadata.namespace!, pod.metadata.name);
      return;
    }
    if (worker) {
      worker.update(pod);
      return;
    }
    if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') return;
    const created = new PodWorker(this.#context(), pod);
    this.#workers.set(uid, created);
    void created.start().then(() => {
      const current = this.#options.store.tryGet('pods', pod.metadata.namespace, pod.metadata.name);
      if (current?.metadata.uid === uid && current.metadata.deletionTimestamp) created.update(current);
    });
  }

  #context(): NodeContext {
    const {store, events, logs, node} = this.#options;
    return {
      store,
      events,
      logs,
      node,
      prober: this.#prober,
      sandbox: (pod) => this.#sandbox(pod),
      released: (sandbox, pod) => {
        if (!sandbox.owned) return;
        this.#addresses.release(Number(sandbox.ip.split('.')[3]));
        this.#options.onSandbox?.(pod, undefined);
      },
      finished: (uid) => this.#workers.delete(uid),
      processChanged: (pod, pid) => this.#options.onProcess?.(pod, pid),
      firstReady: (pod, boundMs) => {
        this.startLatencies.push(boundMs);
        const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
        this.#readyPods.add(key);
        for (const resolve of this.#readyWaiters.get(key) ?? []) resolve();
        this.#readyWaiters.delete(key);
      },
      serviceAccountKubeconfig: (pod) => {
        const serviceAccount = pod.spec?.serviceAccountName ?? 'default';
        if (!this.#options.serviceAccountKubeconfig)
          throw new Error(`no credentials for service account ${serviceAccount}: this kubelet has none to give`);
        return this.#options.serviceAccountKubeconfig(pod.metadata.namespace!, serviceAccount);
      },
      agentChanged: (pod, image, agent) => this.#options.onAgent?.(pod, image, agent),
      agentLogFile: (pod, image) => this.#options.agentLogFile?.(pod, image),
      podDirectory: (pod) => (this.#options.podsDirectory ? join(this.#options.podsDirectory, pod.metadata.uid!) : undefined),
    };
  }

  async #sandbox(pod: KubeObject): Promise<PodSandbox> {
    const {node} = this.#options;
    if (pod.spec?.hostNetwork === true) {
      // On the node's network, as a hostNetwork pod is: its address is the node's.
      this.#annotate(pod, node.namespace);
      return {namespace: node.namespace, ip: node.ip, hostInterface: '', owned: false, linksReady: Promise.resolve()};
    }
    const prepared = this.#prepared.get(pod.metadata.name);
    if (prepared && pod.metadata.namespace === 'default' && pod.metadata.annotations?.[netnsAnnotation] === prepared.namespace) {
      // The lab's own demo pod: its sandbox was built with the lab, and stays until `lab down`.
      return {
        namespace: prepared.namespace,
        ip: prepared.ip,
        hostInterface: prepared.hostInterface,
        owned: false,
        linksReady: Promise.resolve(),
      };
    }
    const octet = this.#addresses.take();
    const namespace = `${this.#options.prefix}p-${pod.metadata.uid!.slice(0, 13)}`;
    try {
      const sandbox = await createSandbox(this.#options.node, namespace, this.#addresses.address(octet), `vk${octet}`);
      this.#annotate(pod, namespace);
      this.#options.onSandbox?.({namespace: pod.metadata.namespace!, name: pod.metadata.name}, namespace);
      return sandbox;
    } catch (error) {
      this.#addresses.release(octet);
      throw error;
    }
  }

  /** Pods carry their namespace (for `trace --probe` and `lab exec`), as the lab's demo pods do. */
  #annotate(pod: KubeObject, namespace: string): void {
    try {
      this.#options.store.mutate('pods', pod.metadata.namespace, pod.metadata.name, (current) => {
        if (current.metadata.uid !== pod.metadata.uid) throw new Error('replaced');
        current.metadata.annotations = {...(current.metadata.annotations ?? {}), [netnsAnnotation]: namespace};
      });
    } catch {
      // gone meanwhile
    }
  }
}
