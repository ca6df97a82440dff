// ObservingProxier: the proxier of an observing agent (--observe). Its syncs build the model of
// what kube-proxy should have programmed, per family, from the watched objects, and write
// nothing: the model becomes the "desired" side the agent API renders, and the kernel's rules
// (kube-proxy's) the "applied" side it reads, so diff, trace and the drift check compare kube-proxy
// with what it should have done. It also keeps when each endpoint left its service port, so that
// drift can say "endpoint X still programmed, removed from the EndpointSlice 4m ago".
import {
  changedServicePorts,
  type IPFamily,
  nodeWideChange,
  type ModelOptions,
  type ProxyModel,
  ProxyModelBuilder,
} from '../../core/model/index.ts';
import {type FamilySyncState, ProxierBase, type ProxierBaseOptions} from '../sync/proxier-base.ts';
import type {FamilySyncResult} from '../sync/types.ts';

export interface ObservingProxierOptions extends ProxierBaseOptions {
  /** Everything the model builder needs except the family. */
  model: Omit<ModelOptions, 'family'>;
}

/** When an endpoint address left a service port's endpoints (clock ms), and when one joined. */
export interface EndpointChange {
  at: number;
}

/**
 * EndpointHistory: per service port ("ns/name:port"), the endpoint addresses that left it and
 * those that joined it, with when the observer saw it happen. Forgotten once an address is back
 * (left) or gone again (joined).
 */
export class EndpointHistory {
  readonly #left = new Map<string, Map<string, number>>();
  readonly #joined = new Map<string, Map<string, number>>();

  /** Compares two models of one family and notes what changed at `now`. */
  note(previous: ProxyModel | undefined, next: ProxyModel, now: number): void {
    const before = endpointsByPort(previous);
    const after = endpointsByPort(next);
    for (const [port, addresses] of after) {
      const old = before.get(port);
      for (const address of addresses) {
        this.#left.get(port)?.delete(address);
        // The first model is what the observer found: nothing "joined" then.
        if (previous !== undefined && !old?.has(address)) mapOf(this.#joined, port).set(address, now);
      }
    }
    for (const [port, addresses] of before) {
      const remaining = after.get(port);
      for (const address of addresses) {
        if (remaining?.has(address)) continue;
        this.#joined.get(port)?.delete(address);
        mapOf(this.#left, port).set(address, now);
      }
    }
  }

  /** When `address` left `servicePort`, if the observer saw it leave. */
  leftAt(servicePort: string, address: string): number | undefined {
    return this.#left.get(servicePort)?.get(address);
  }

  /** When `address` joined `servicePort`, if the observer saw it join. */
  joinedAt(servicePort: string, address: string): number | undefined {
    return this.#joined.get(servicePort)?.get(address);
  }
}

/** Nothing outside the service ports differs either: the node's settings and the problems found in the objects. */
function sameAsBefore(previous: ProxyModel, next: ProxyModel): boolean {
  return !nodeWideChange(previous, next) && JSON.stringify(previous.problems) === JSON.stringify(next.problems);
}

function mapOf(maps: Map<string, Map<string, number>>, key: string): Map<string, number> {
  let map = maps.get(key);
  if (!map) maps.set(key, (map = new Map()));
  return map;
}

function endpointsByPort(model: ProxyModel | undefined): Map<string, Set<string>> {
  const result = new Map<string, Set<string>>();
  for (const port of model?.servicePorts ?? []) result.set(port.key, new Set(port.endpoints.map((endpoint) => endpoint.ip)));
  return result;
}

export class ObservingProxier extends ProxierBase<FamilySyncState> {
  readonly endpointHistory = new EndpointHistory();

  constructor(options: ObservingProxierOptions) {
    super(options, (family) => ({builder: new ProxyModelBuilder({...options.model, family}), needFullSync: true}));
  }

  /** start starts the runner; nothing on the node is prepared, since nothing is written. */
  async start(): Promise<void> {
    this.startRunner();
  }

  /** One family's sync: the model kube-proxy should have programmed becomes the desired one. */
  protected async syncFamily(family: IPFamily, model: ProxyModel): Promise<FamilySyncResult> {
    const state = this.families.get(family)!;
    const start = this.clock.now();
    const full = state.needFullSync;
    const previous = state.applied;
    const changed = changedServicePorts(previous, model).size;
    // A rebuild that changed nothing (the periodic one, mostly) keeps the model it had: the answers
    // prepared from it (the drift check, the whole-node diff traces read) stay valid, and the next
    // trace or check does not read and compare the whole node again.
    const unchanged = previous !== undefined && !full && changed === 0 && sameAsBefore(previous, model);
    if (!unchanged) {
      this.endpointHistory.note(previous, model, start);
      state.applied = model;
    }
    state.needFullSync = false;
    return this.familySynced(
      {family, start, full, changedServicePorts: changed, model: state.applied!, drift: false},
      {message: 'desired rules rebuilt (observing: nothing written)', ...(unchanged && {detail: {unchanged: true}})},
    );
  }

  /** The observer writes no rules. */
  protected ruleTotals(): {filter: number; nat: number} {
    return {filter: 0, nat: 0};
  }
}
