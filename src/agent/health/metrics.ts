// The agent's Prometheus metrics, under kube-proxy's names (pkg/proxy/metrics) so that existing
// dashboards and alerts keep working, plus proxyctl_* for what only proxyctl does.
import {Counter, Gauge, Histogram, Registry, collectDefaultMetrics, type Metric} from 'prom-client';
import {nfacctCounters} from '../../core/iptables/chains.ts';

/** kube-proxy's sync latency buckets: 1 ms doubling 15 times (to about 16 s). */
const syncBuckets = Array.from({length: 15}, (_, index) => 0.001 * 2 ** index);

/** kube-proxy's network programming buckets: 0.25 s steps to 0.5, 1 s to 59, 5 s to 115, 30 s to 300. */
const programmingBuckets = [
  ...[0.25, 0.5],
  ...Array.from({length: 59}, (_, index) => 1 + index),
  ...Array.from({length: 12}, (_, index) => 60 + 5 * index),
  ...Array.from({length: 7}, (_, index) => 120 + 30 * index),
];

export interface AgentMetrics {
  registry: Registry;
  syncDuration: Histogram<'ip_family'>;
  syncFullDuration: Histogram<'ip_family'>;
  syncPartialDuration: Histogram<'ip_family'>;
  lastSyncTimestamp: Gauge;
  lastQueuedTimestamp: Gauge;
  networkProgrammingDuration: Histogram<'ip_family'>;
  iptablesRules: Gauge<'table'>;
  restoreFailures: Counter;
  partialRestoreFailures: Counter;
  endpointChangesPending: Gauge;
  endpointChangesTotal: Counter;
  serviceChangesPending: Gauge;
  serviceChangesTotal: Counter;
  noLocalEndpoints: Gauge<'traffic_policy'>;
  healthzTotal: Counter<'code'>;
  livezTotal: Counter<'code'>;
  conntrackDeletedEntries: Counter<'ip_family'>;
  driftRepairs: Counter<'ip_family'>;
  modelProblems: Gauge;
}

/** Reads the packets counted in every nfacct object, by name; a failure when they cannot be read. */
export type NfacctReader = () => Promise<Map<string, number>>;

/**
 * kube-proxy's nfacct-backed counters (pkg/proxy/metrics), registered in iptables mode: each is
 * read from its nfacct object at every scrape. One that cannot be read has no sample, as with
 * kube-proxy, which leaves the series absent rather than reporting a false 0.
 */
export const nfacctMetrics = [
  {
    name: 'kubeproxy_iptables_ct_state_invalid_dropped_packets_total',
    help: 'packets dropped by iptables to work around conntrack problems',
    counter: nfacctCounters.ctStateInvalidDropped,
  },
  {
    name: 'kubeproxy_iptables_localhost_nodeports_accepted_packets_total',
    help: 'Number of packets accepted on nodeports of loopback interface',
    counter: nfacctCounters.localhostNodePortsAccepted,
  },
] as const;

function nfacctCounterMetric(definition: (typeof nfacctMetrics)[number], read: NfacctReader): Metric {
  const {name, help, counter} = definition;
  const value = async () => {
    const packets = await read()
      .then((counters) => counters.get(counter))
      .catch(() => undefined);
    return {
      name,
      help,
      type: 'counter' as const,
      aggregator: 'sum' as const,
      values: packets === undefined ? [] : [{value: packets, labels: {}}],
    };
  };
  return {name, help, type: 'counter', aggregator: 'sum', get: value, reset: () => undefined} as unknown as Metric;
}

/** `read` shared by the callers that come while it runs: the counters of one scrape are read with one command. */
function sharedWhileRunning(read: NfacctReader): NfacctReader {
  let running: Promise<Map<string, number>> | undefined;
  return () => (running ??= read().finally(() => (running = undefined)));
}

/**
 * createAgentMetrics registers every metric in a registry of its own (one per agent, so tests can
 * make many); with `nfacct` (iptables mode), also the counters read from nfacct objects.
 */
export function createAgentMetrics(options: {processMetrics?: boolean; nfacct?: NfacctReader} = {}): AgentMetrics {
  const registry = new Registry();
  if (options.processMetrics) collectDefaultMetrics({register: registry});
  if (options.nfacct) {
    const read = sharedWhileRunning(options.nfacct);
    for (const definition of nfacctMetrics) registry.registerMetric(nfacctCounterMetric(definition, read));
  }
  const registers = [registry];
  return {
    registry,
    syncDuration: new Histogram({
      name: 'kubeproxy_sync_proxy_rules_duration_seconds',
      help: 'SyncProxyRules latency in seconds',
      labelNames: ['ip_family'],
      buckets: syncBuckets,
      registers,
    }),
    syncFullDuration: new Histogram({
      name: 'kubeproxy_sync_full_proxy_rules_duration_seconds',
      help: 'SyncProxyRules latency in seconds for full resyncs',
      labelNames: ['ip_family'],
      buckets: syncBuckets,
      registers,
    }),
    syncPartialDuration: new Histogram({
      name: 'kubeproxy_sync_partial_proxy_rules_duration_seconds',
      help: 'SyncProxyRules latency in seconds for partial resyncs',
      labelNames: ['ip_family'],
      buckets: syncBuckets,
      registers,
    }),
    lastSyncTimestamp: new Gauge({
      name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
      help: 'The last time proxy rules were successfully synced',
      registers,
    }),
    lastQueuedTimestamp: new Gauge({
      name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
      help: 'The last time a sync of proxy rules was queued',
      registers,
    }),
    networkProgrammingDuration: new Histogram({
      name: 'kubeproxy_network_programming_duration_seconds',
      help: 'In Cluster Network Programming Latency in seconds',
      labelNames: ['ip_family'],
      buckets: programmingBuckets,
      registers,
    }),
    iptablesRules: new Gauge({
      name: 'kubeproxy_sync_proxy_rules_iptables_total',
      help: 'Total number of iptables rules owned by the proxy',
      labelNames: ['table'],
      registers,
    }),
    restoreFailures: new Counter({
      name: 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total',
      help: 'Cumulative proxy iptables restore failures',
      registers,
    }),
    partialRestoreFailures: new Counter({
      name: 'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total',
      help: 'Cumulative proxy iptables partial restore failures',
      registers,
    }),
    endpointChangesPending: new Gauge({
      name: 'kubeproxy_sync_proxy_rules_endpoint_changes_pending',
      help: 'Pending proxy rules Endpoint changes',
      registers,
    }),
    endpointChangesTotal: new Counter({
      name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total',
      help: 'Cumulative proxy rules Endpoint changes',
      registers,
    }),
    serviceChangesPending: new Gauge({
      name: 'kubeproxy_sync_proxy_rules_service_changes_pending',
      help: 'Pending proxy rules Service changes',
      registers,
    }),
    serviceChangesTotal: new Counter({
      name: 'kubeproxy_sync_proxy_rules_service_changes_total',
      help: 'Cumulative proxy rules Service changes',
      registers,
    }),
    noLocalEndpoints: new Gauge({
      name: 'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
      help: 'Number of services with a Local traffic policy and no endpoints',
      labelNames: ['traffic_policy'],
      registers,
    }),
    healthzTotal: new Counter({
      name: 'kubeproxy_proxy_healthz_total',
      help: 'Cumulative proxy healthz HTTP status',
      labelNames: ['code'],
      registers,
    }),
    livezTotal: new Counter({
      name: 'kubeproxy_proxy_livez_total',
      help: 'Cumulative proxy livez HTTP status',
      labelNames: ['code'],
      registers,
    }),
    conntrackDeletedEntries: new Counter({
      name: 'kubeproxy_conntrack_reconciler_deleted_entries_total',
      help: 'Cumulative conntrack flows deleted by conntrack reconciler',
      labelNames: ['ip_family'],
      registers,
    }),
    driftRepairs: new Counter({
      name: 'proxyctl_drift_repairs_total',
      help: "Syncs that found the agent's rules changed by someone else and rewrote them",
      labelNames: ['ip_family'],
      registers,
    }),
    modelProblems: new Gauge({
      name: 'proxyctl_object_problems',
      help: 'Objects (or parts of them) skipped because they are malformed',
      registers,
    }),
  };
}
