// The EndpointSlice controller: turns a Service's selected pods into discovery.k8s.io/v1 EndpointSlices.
import type {ClusterStore} from './cluster-store.ts';
import type {KubeObject, StoredEvent} from './object-log.ts';
import {matchesSelectorMap} from './selectors.ts';
import {ipFamilyOf} from './ip-allocator.ts';

export const serviceNameLabel = 'kubernetes.io/service-name';
export const managedByLabel = 'endpointslice.kubernetes.io/managed-by';
export const controllerName = 'endpointslice-controller.k8s.io';
export const triggerTimeAnnotation = 'endpoints.kubernetes.io/last-change-trigger-time';
const zoneLabel = 'topology.kubernetes.io/zone';
const sliceStorage = 'discovery.k8s.io/endpointslices';

interface EndpointPort {
  name: string;
  port: number;
  protocol: string;
  appProtocol?: string;
}

interface DesiredSlice {
  addressType: string;
  ports: EndpointPort[] | undefined;
  endpoints: Record<string, unknown>[];
}

function rfc3339(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

function podIsReady(pod: KubeObject): boolean {
  return (pod.status?.conditions ?? []).some((c: any) => c.type === 'Ready' && c.status === 'True');
}

/** The port a service port reaches on this pod: a number as is, a name looked up in the containers' ports. */
function findPort(pod: KubeObject, servicePort: any): number | undefined {
  const target = servicePort.targetPort ?? servicePort.port;
  if (typeof target === 'number') return target;
  const wanted = String(target);
  if (/^\d+$/.test(wanted)) return Number(wanted);
  for (const c of pod.spec?.containers ?? []) {
    for (const p of c.ports ?? [])
      if (p.name === wanted && (p.protocol ?? 'TCP') === (servicePort.protocol ?? 'TCP')) return p.containerPort;
  }
  return undefined;
}

function wantsZoneHints(svc: KubeObject): boolean {
  const a = svc.metadata.annotations ?? {};
  const mode = a['service.kubernetes.io/topology-mode'] ?? a['service.kubernetes.io/topology-aware-hints'];
  return (mode !== undefined && mode.toLowerCase() === 'auto') || svc.spec?.trafficDistribution !== undefined;
}

function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a ?? null) === JSON.stringify(b ?? null);
}

export interface EndpointSliceControllerOptions {
  maxEndpointsPerSlice?: number;
  clock?: () => number;
}

export class EndpointSliceController {
  private readonly store: ClusterStore;
  private readonly maxPerSlice: number;
  private readonly clock: () => number;
  private readonly pending = new Map<string, number>(); // "ns/name" -> time of the triggering change
  private scheduled: NodeJS.Immediate | undefined;
  private unsubscribe: (() => void) | undefined;
  private writing = false;
  private idleWaiters: Array<() => void> = [];

  constructor(store: ClusterStore, options: EndpointSliceControllerOptions = {}) {
    this.store = store;
    this.maxPerSlice = options.maxEndpointsPerSlice ?? 100;
    this.clock = options.clock ?? Date.now;
  }

  start(): void {
    this.unsubscribe = this.store.log.subscribeAll((event) => this.onEvent(event));
    for (const svc of this.store.log.list('services')) this.enqueue(svc.metadata.namespace!, svc.metadata.name);
  }

  stop(): void {
    this.unsubscribe?.();
    if (this.scheduled) clearImmediate(this.scheduled);
    this.scheduled = undefined;
    this.pending.clear();
    this.resolveIdle();
  }

  busy(): boolean {
    return this.pending.size > 0;
  }

  /** Resolves once every queued service has been synced. */
  whenIdle(): Promise<void> {
    if (this.pending.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private onEvent(event: StoredEvent): void {
    if (this.writing) return;
    const obj = event.object;
    switch (event.storageKey) {
      case 'services':
        this.enqueue(obj.metadata.namespace!, obj.metadata.name);
        break;
      case 'pods': {
        const ns = obj.metadata.namespace!;
        for (const svc of this.store.log.list('services', ns)) {
          const selector = svc.spec?.selector;
          if (!selector || Object.keys(selector).length === 0) continue;
          if (
            matchesSelectorMap(selector, obj.metadata.labels) ||
            (event.previous && matchesSelectorMap(selector, event.previous.metadata.labels))
          ) {
            this.enqueue(ns, svc.metadata.name);
          }
        }
        break;
      }
      case 'nodes':
        if (event.previous?.metadata.labels?.[zoneLabel] !== obj.metadata.labels?.[zoneLabel]) {
          for (const svc of this.store.log.list('services')) this.enqueue(svc.metadata.namespace!, svc.metadata.name);
        }
        break;
      case sliceStorage: {
        // Someone else changed or removed a slice we manage: put it back.
        const labels = obj.metadata.labels ?? event.previous?.metadata.labels ?? {};
        if (labels[managedByLabel] === controllerName && labels[serviceNameLabel])
          this.enqueue(obj.metadata.namespace!, labels[serviceNameLabel], false);
        break;
      }
    }
  }

  private enqueue(namespace: string, name: string, trigger = true): void {
    const key = `${namespace}/${name}`;
    const now = this.clock();
    if (!this.pending.has(key) || trigger) this.pending.set(key, trigger ? now : (this.pending.get(key) ?? 0));
    this.scheduled ??= setImmediate(() => this.flush());
  }

  /** Syncs every queued service now. */
  flush(): void {
    this.scheduled = undefined;
    const work = [...this.pending];
    this.pending.clear();
    for (const [key, triggerTime] of work) {
      const slash = key.indexOf('/');
      try {
        this.sync(key.slice(0, slash), key.slice(slash + 1), triggerTime);
      } catch (err) {
        // A failed sync is retried on the next change of the service or its pods.
        process.emitWarning(`endpointslice controller: service ${key}: ${(err as Error).message}`);
      }
    }
    if (this.pending.size === 0) this.resolveIdle();
  }

  private resolveIdle(): void {
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  private sync(namespace: string, name: string, triggerTime: number): void {
    const svc = this.store.log.get('services', namespace, name);
    const existing = this.store.log
      .list(sliceStorage, namespace)
      .filter((s) => s.metadata.labels?.[serviceNameLabel] === name && s.metadata.labels?.[managedByLabel] === controllerName);
    const selector = svc?.spec?.selector;
    this.writing = true;
    try {
      if (!svc || !selector || Object.keys(selector).length === 0 || svc.spec.type === 'ExternalName') {
        for (const slice of existing) this.store.delete('endpointslices', namespace, slice.metadata.name);
        return;
      }
      const desired = this.desiredSlices(svc);
      this.reconcile(svc, desired, existing, triggerTime);
    } finally {
      this.writing = false;
    }
  }

  private desiredSlices(svc: KubeObject): DesiredSlice[] {
    const namespace = svc.metadata.namespace!;
    const addressTypes: string[] = svc.spec.ipFamilies?.length ? svc.spec.ipFamilies : ['IPv4'];
    const publishNotReady = svc.spec.publishNotReadyAddresses === true;
    const hints = wantsZoneHints(svc);
    const groups = new Map<string, DesiredSlice>();
    const pods = this.store.log.list('pods', namespace).filter((p) => matchesSelectorMap(svc.spec.selector, p.metadata.labels));
    const zoneOf = new Map<string, string | undefined>();
    for (const pod of pods) {
      if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') continue;
      const ips: string[] = (pod.status?.podIPs ?? []).map((x: any) => x.ip).filter(Boolean);
      if (ips.length === 0 && pod.status?.podIP) ips.push(pod.status.podIP);
      if (ips.length === 0) continue;
      const ports: EndpointPort[] = [];
      for (const sp of svc.spec.ports ?? []) {
        const port = findPort(pod, sp);
        if (port === undefined) continue;
        const entry: EndpointPort = {name: sp.name ?? '', port, protocol: sp.protocol ?? 'TCP'};
        if (sp.appProtocol) entry.appProtocol = sp.appProtocol;
        ports.push(entry);
      }
      const terminating = Boolean(pod.metadata.deletionTimestamp);
      const ready = podIsReady(pod);
      const nodeName: string | undefined = pod.spec?.nodeName;
      if (nodeName && !zoneOf.has(nodeName))
        zoneOf.set(nodeName, this.store.log.get('nodes', undefined, nodeName)?.metadata.labels?.[zoneLabel]);
      const zone = nodeName ? zoneOf.get(nodeName) : undefined;
      for (const addressType of addressTypes) {
        const ip = ips.find((x) => ipFamilyOf(x) === addressType);
        if (!ip) continue;
        const endpoint: Record<string, unknown> = {
          addresses: [ip],
          conditions: {ready: publishNotReady || (ready && !terminating), serving: publishNotReady || ready, terminating},
        };
        if (pod.spec?.hostname && pod.spec?.subdomain === svc.metadata.name) endpoint.hostname = pod.spec.hostname;
        endpoint.targetRef = {kind: 'Pod', namespace, name: pod.metadata.name, uid: pod.metadata.uid};
        if (nodeName) endpoint.nodeName = nodeName;
        if (zone) endpoint.zone = zone;
        const key = `${addressType} ${JSON.stringify(ports)}`;
        let group = groups.get(key);
        if (!group) {
          group = {addressType, ports, endpoints: []};
          groups.set(key, group);
        }
        group.endpoints.push(endpoint);
      }
    }
    const slices: DesiredSlice[] = [];
    for (const group of groups.values()) {
      if (hints && group.endpoints.every((e) => e.zone)) {
        for (const e of group.endpoints) e.hints = {forZones: [{name: e.zone}]};
      }
      for (let i = 0; i < group.endpoints.length; i += this.maxPerSlice) {
        slices.push({addressType: group.addressType, ports: group.ports, endpoints: group.endpoints.slice(i, i + this.maxPerSlice)});
      }
    }
    for (const addressType of addressTypes) {
      // A placeholder slice says "selected, but nothing ready here" rather than "not managed".
      if (!slices.some((s) => s.addressType === addressType)) slices.push({addressType, ports: undefined, endpoints: []});
    }
    return slices;
  }

  private reconcile(svc: KubeObject, desired: DesiredSlice[], existing: KubeObject[], triggerTime: number): void {
    const namespace = svc.metadata.namespace!;
    const name = svc.metadata.name;
    const labels: Record<string, string> = {...(svc.metadata.labels ?? {}), [serviceNameLabel]: name, [managedByLabel]: controllerName};
    if (svc.spec.clusterIP === 'None') labels['service.kubernetes.io/headless'] = '';
    const ownerReferences = [{apiVersion: 'v1', kind: 'Service', name, uid: svc.metadata.uid, controller: true, blockOwnerDeletion: true}];
    const groupKey = (addressType: string, ports: unknown) => `${addressType} ${JSON.stringify(ports ?? [])}`;
    const unused = new Map<string, KubeObject[]>();
    for (const slice of existing) {
      const key = groupKey(slice.addressType, slice.ports);
      unused.set(key, [...(unused.get(key) ?? []), slice]);
    }
    const annotations = (current?: Record<string, string>) => {
      const out: Record<string, string> = {...(current ?? {})};
      if (triggerTime > 0) out[triggerTimeAnnotation] = rfc3339(triggerTime);
      return out;
    };
    const rewrite = (slice: KubeObject, want: DesiredSlice) =>
      this.store.mutate('endpointslices', namespace, slice.metadata.name, (s) => {
        s.metadata.labels = labels;
        s.metadata.annotations = annotations(s.metadata.annotations);
        s.metadata.ownerReferences = ownerReferences;
        s.endpoints = want.endpoints;
        if (want.ports) s.ports = want.ports;
        else delete s.ports;
      });
    const leftovers: DesiredSlice[] = [];
    for (const want of desired) {
      const candidates = unused.get(groupKey(want.addressType, want.ports));
      const slice = candidates?.shift();
      if (!slice) {
        leftovers.push(want);
        continue;
      }
      const same =
        sameJson(slice.endpoints, want.endpoints) &&
        sameJson(slice.metadata.labels, labels) &&
        sameJson(slice.metadata.ownerReferences, ownerReferences);
      if (same) continue;
      rewrite(slice, want);
    }
    // Slices of a changed port mapping are rewritten in place rather than deleted and created.
    const spare = [...unused.values()].flat();
    for (const want of leftovers) {
      const slice = spare.find((s) => s.addressType === want.addressType);
      if (slice) {
        spare.splice(spare.indexOf(slice), 1);
        rewrite(slice, want);
        continue;
      }
      const body: KubeObject = {
        apiVersion: 'discovery.k8s.io/v1',
        kind: 'EndpointSlice',
        metadata: {name: '', generateName: `${name}-`, namespace, labels, annotations: annotations(), ownerReferences},
        addressType: want.addressType,
        endpoints: want.endpoints,
      };
      if (want.ports) body.ports = want.ports;
      this.store.create('endpointslices', body, namespace);
    }
    for (const slice of spare) this.store.delete('endpointslices', namespace, slice.metadata.name);
  }
}
