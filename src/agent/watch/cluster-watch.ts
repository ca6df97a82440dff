// ClusterWatch: the watches the agent runs, as kube-proxy's informers: Services and EndpointSlices
// (skipping those another proxy owns and headless ones, by label), the agent's own Node (by field
// selector) and, for nftables mode, the cluster's ServiceCIDRs. They fill one ObjectStore with
// compact records (compact-object.ts).
import type {Logger} from '../log.ts';
import type {Clock} from '../clock.ts';
import type {KubernetesClient} from './kubernetes-client.ts';
import {compactObject} from './compact-object.ts';
import {ObjectStore, type WatchedKind} from './object-store.ts';
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
  onSynced?: (kind: WatchedKind) => void;
  /** Also watch networking.k8s.io/v1 ServiceCIDRs (nftables mode drops traffic to their unused addresses). */
  serviceCIDRs?: boolean;
}

export class ClusterWatch {
  readonly store = new ObjectStore();
  readonly reflectors: Reflector[];

  constructor(options: ClusterWatchOptions) {
    const common = {
      client: options.client,
      log: options.log,
      clock: options.clock,
      watchdogMs: options.watchdogMs,
      backoffInitialMs: options.backoffInitialMs,
      backoffMaxMs: options.backoffMaxMs,
    };
    const reflector = (kind: WatchedKind, name: string, path: string, selectors: {labelSelector?: string; fieldSelector?: string}) =>
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
    if (options.serviceCIDRs) this.reflectors.push(reflector('ServiceCIDR', 'servicecidrs', '/apis/networking.k8s.io/v1/servicecidrs', {}));
  }

  start(): void {
    for (const reflector of this.reflectors) reflector.start();
  }

  async stop(): Promise<void> {
    await Promise.all(this.reflectors.map((reflector) => reflector.stop()));
  }
}
