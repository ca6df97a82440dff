// What every proxier test (iptables, nftables, ipvs; recording host or real kernel) starts from:
// the sync triggers, the options all three proxiers take, and a proxier that has every initial list.
import {createAgentMetrics} from '../../../src/agent/health/metrics.ts';
import {ProxierHealth} from '../../../src/agent/health/proxier-health.ts';
import {memoryLogger} from '../../../src/agent/log.ts';

/** A sync asked for by a change. */
export const requested = {requested: true, periodic: false, retry: false};
/** The periodic resync, which also reads the rules back to look for drift. */
export const periodic = {requested: false, periodic: true, retry: false};

/**
 * proxierOptions: one IPv4 family on node-1, a 30 s resync and no minimum period, fresh metrics,
 * health (on the given clock) and a quiet log; `parts` adds the host, the objects and the backend's
 * own options, and overrides any default.
 */
export function proxierOptions<Parts extends object>(parts: Parts) {
  const clock = (parts as {clock?: ConstructorParameters<typeof ProxierHealth>[1]}).clock;
  return {
    families: ['IPv4' as const],
    model: {nodeName: 'node-1'},
    syncPeriod: 30_000,
    minSyncPeriod: 0,
    metrics: createAgentMetrics(),
    health: new ProxierHealth(60_000, clock),
    log: memoryLogger(),
    ...parts,
  };
}

type ListedKind = 'Service' | 'EndpointSlice' | 'Node';

/** everyListReceived marks the initial lists of services, slices and the node as received, as the watches do. */
export function everyListReceived<Proxier extends {markSynced(kind: ListedKind): void}>(proxier: Proxier): Proxier {
  for (const kind of ['Service', 'EndpointSlice', 'Node'] as const) proxier.markSynced(kind);
  return proxier;
}
