// ClusterWatch: the three watches the agent runs, as kube-proxy's informers: Services and
// EndpointSlices (skipping those another proxy owns and headless ones, by label), and the agent's
// own Node (by field selector). They fill one ObjectStore with compact records (compact-object.ts).
import type {Logger} from '../log.ts';
import type {Clock} from '../sync/clock.ts';
import type {ObjectKind} from '../sync/proxier.ts';
import type {KubernetesClient} from './kubernetes-client.ts';
import {compactObject} from './compact-object.ts';
import {ObjectStore} from './object-store.ts';
import {Reflector} from './reflector.ts';

/** kube-proxy's informer selector: no service-proxy-name label (another proxy's), not headless. */
export const proxyLabelSelector = '!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless';

export interface ClusterWatchOptions {
  client: KubernetesClient;
  nodeName: string;
  log: Logger;
  /** Silence after which a watch lists again (the agent uses configSyncPeriod). */
  watchdogMs: number;
  clock?: Clock;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** Called when the first list of a kind is in. */
  onSynced?: (kind: ObjectKind) => void;
}

export class ClusterWatch {
  readonly store = new ObjectStore();
  readonly reflectors: Reflector[];

  constructor(options: ClusterWatchOptions) {
    const common = {client: options.client, log: options.log, clock: options.clock, watchdogMs: options.watchdogMs, backoffInitialMs: options.backoffInitialMs, backoffMaxMs: options.backoffMaxMs};
    const reflector = (kind: ObjectKind, name: string, path: string, selectors: {labelSelector?: string; fieldSelector?: string}) =>
      new Reflector({
        ...common,
        ...selectors,
        name,
        path,
        keep: (object) => compactObject(kind, object),
        onReplace: (items) => this.store.replace(kind, items),
        onEvent: (type, object) => this.store.apply(kind, type, object),
        onSynced: () => options.onSynced?.(kind),
      });
    this.reflectors = [
      reflector('Service', 'services', '/api/v1/services', {labelSelector: proxyLabelSelector}),
      reflector('EndpointSlice', 'endpointslices', '/apis/discovery.k8s.io/v1/endpointslices', {labelSelector: proxyLabelSelector}),
      reflector('Node', `node ${options.nodeName}`, '/api/v1/nodes', {fieldSelector: `metadata.name=${options.nodeName}`}),
    ];
  }

  start(): void {
    for (const reflector of this.reflectors) reflector.start();
  }

  async stop(): Promise<void> {
    await Promise.all(this.reflectors.map((reflector) => reflector.stop()));
  }
}
