// Health and metrics endpoints over real HTTP on 127.0.0.1 (and, for health check ports with
// --netns, inside network namespaces): what a kubelet probe, a cloud load balancer and Prometheus see.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {startHealthServer} from '../../../src/agent/health/health-server.ts';
import {createAgentMetrics} from '../../../src/agent/health/metrics.ts';
import {startMetricsServer} from '../../../src/agent/health/metrics-server.ts';
import {ProxierHealth} from '../../../src/agent/health/proxier-health.ts';
import {ServiceHealthServers} from '../../../src/agent/health/service-health.ts';
import {FakeClock} from '../fake-clock.ts';
import {createNetns, inNetns, isRoot} from '../netns.ts';
import {fetchJsonInNetns} from './fetch-in-netns.ts';

async function get(url: string): Promise<{status: number; json: any; text: string; headers: Headers}> {
  const response = await fetch(url);
  const text = await response.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return {status: response.status, json, text, headers: response.headers};
}

async function healthSetup() {
  const clock = new FakeClock();
  const health = new ProxierHealth(60_000, clock);
  const metrics = createAgentMetrics();
  const server = await startHealthServer({host: '127.0.0.1', port: 0, health, metrics});
  return {clock, health, metrics, server};
}

test('healthz: healthy at start, with kube-proxy JSON fields', async (t) => {
  const {server} = await healthSetup();
  t.after(() => server.close());
  const answer = await get(`${server.url}/healthz`);
  assert.equal(answer.status, 200);
  assert.equal(answer.headers.get('content-type'), 'application/json');
  assert.deepEqual(Object.keys(answer.json).sort(), ['currentTime', 'lastUpdated', 'nodeEligible']);
  assert.equal(answer.json.nodeEligible, true);
  assert.equal(answer.json.currentTime, new Date(Date.UTC(2026, 0, 1)).toISOString());
});

test('healthz and livez: 503 once a queued update is older than the timeout, 200 again after a sync', async (t) => {
  const {clock, health, server, metrics} = await healthSetup();
  t.after(() => server.close());
  health.queuedUpdate();
  await clock.advance(59_000);
  assert.equal((await get(`${server.url}/healthz`)).status, 200, 'queued but not late yet');
  await clock.advance(2_000);
  assert.equal((await get(`${server.url}/healthz`)).status, 503);
  assert.equal((await get(`${server.url}/livez`)).status, 503);
  health.updated();
  const answer = await get(`${server.url}/healthz`);
  assert.equal(answer.status, 200);
  assert.equal(answer.json.lastUpdated, new Date(clock.now()).toISOString());
  const text = await metrics.registry.metrics();
  assert.match(text, /kubeproxy_proxy_healthz_total\{code="503"\} 1/);
  assert.match(text, /kubeproxy_proxy_healthz_total\{code="200"\} 2/);
  assert.match(text, /kubeproxy_proxy_livez_total\{code="503"\} 1/);
});

for (const [name, node] of [
  ['deletionTimestamp', {metadata: {name: 'node-1', deletionTimestamp: '2026-01-01T00:00:00Z'}}],
  [
    'ToBeDeletedByClusterAutoscaler taint',
    {metadata: {name: 'node-1'}, spec: {taints: [{key: 'ToBeDeletedByClusterAutoscaler', effect: 'NoSchedule'}]}},
  ],
] as const) {
  test(`a node with ${name}: healthz 503 with nodeEligible false, livez still 200`, async (t) => {
    const {health, server} = await healthSetup();
    t.after(() => server.close());
    health.syncNode(node);
    const healthz = await get(`${server.url}/healthz`);
    assert.equal(healthz.status, 503);
    assert.equal(healthz.json.nodeEligible, false);
    const livez = await get(`${server.url}/livez`);
    assert.equal(livez.status, 200);
    assert.equal(livez.json.nodeEligible, undefined);
    health.syncNode({metadata: {name: 'node-1'}, spec: {taints: [{key: 'node.kubernetes.io/unschedulable'}]}});
    assert.equal((await get(`${server.url}/healthz`)).status, 200, 'other taints do not matter');
  });
}

test('unknown paths are 404', async (t) => {
  const {server} = await healthSetup();
  t.after(() => server.close());
  assert.equal((await get(`${server.url}/readyz`)).status, 404);
});

test('service health: 200 with local endpoints, 503 without, port closed when the service goes', async (t) => {
  let proxyHealthy = true;
  const servers = new ServiceHealthServers({hosts: ['127.0.0.1'], proxyHealthy: () => proxyHealthy});
  t.after(() => servers.close());
  const port = await freePort();
  await servers.sync([{namespace: 'default', name: 'web', healthCheckNodePort: port, localEndpoints: 2}]);
  const ok = await get(`http://127.0.0.1:${port}/`);
  assert.equal(ok.status, 200);
  assert.deepEqual(ok.json, {service: {namespace: 'default', name: 'web'}, localEndpoints: 2, serviceProxyHealthy: true});
  assert.equal(ok.headers.get('x-load-balancing-endpoint-weight'), '2');

  proxyHealthy = false;
  const sick = await get(`http://127.0.0.1:${port}/`);
  assert.equal(sick.status, 503);
  assert.equal(sick.json.serviceProxyHealthy, false);
  proxyHealthy = true;

  await servers.sync([{namespace: 'default', name: 'web', healthCheckNodePort: port, localEndpoints: 0}]);
  const none = await get(`http://127.0.0.1:${port}/`);
  assert.equal(none.status, 503);
  assert.equal(none.json.localEndpoints, 0);

  await servers.sync([]);
  await assert.rejects(fetch(`http://127.0.0.1:${port}/`), 'the port is closed');
  assert.equal(servers.ports().size, 0);
});

test('service health: a port that cannot be opened is reported, others still open', async (t) => {
  const blocker = await startHealthServer({host: '127.0.0.1', port: 0, health: new ProxierHealth(1000)});
  t.after(() => blocker.close());
  const errors: string[] = [];
  const servers = new ServiceHealthServers({
    hosts: ['127.0.0.1'],
    proxyHealthy: () => true,
    onError: (target, error) => errors.push(`${target.name}: ${(error as NodeJS.ErrnoException).code}`),
  });
  t.after(() => servers.close());
  const port = await freePort();
  await servers.sync([
    {namespace: 'default', name: 'taken', healthCheckNodePort: blocker.port, localEndpoints: 1},
    {namespace: 'default', name: 'free', healthCheckNodePort: port, localEndpoints: 1},
  ]);
  assert.deepEqual(errors, ['taken: EADDRINUSE']);
  assert.deepEqual([...servers.ports().keys()], ['default/free']);
});

test("metrics: kube-proxy's names are served on /metrics", async (t) => {
  const metrics = createAgentMetrics({processMetrics: true});
  metrics.syncDuration.observe({ip_family: 'IPv4'}, 0.01);
  metrics.iptablesRules.set({table: 'nat'}, 12);
  const server = await startMetricsServer({host: '127.0.0.1', port: 0, registry: metrics.registry, mode: 'iptables'});
  t.after(() => server.close());
  const answer = await get(`${server.url}/metrics`);
  assert.equal(answer.status, 200);
  for (const name of [
    'kubeproxy_sync_proxy_rules_duration_seconds_bucket',
    'kubeproxy_sync_full_proxy_rules_duration_seconds',
    'kubeproxy_sync_partial_proxy_rules_duration_seconds',
    'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
    'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
    'kubeproxy_network_programming_duration_seconds',
    'kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 12',
    'kubeproxy_sync_proxy_rules_iptables_restore_failures_total',
    'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total',
    'kubeproxy_sync_proxy_rules_endpoint_changes_pending',
    'kubeproxy_sync_proxy_rules_endpoint_changes_total',
    'kubeproxy_sync_proxy_rules_service_changes_pending',
    'kubeproxy_sync_proxy_rules_service_changes_total',
    'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
    'kubeproxy_conntrack_reconciler_deleted_entries_total',
    'proxyctl_drift_repairs_total',
    'process_cpu_seconds_total',
  ]) {
    assert.ok(answer.text.includes(name), `${name} on /metrics`);
  }
  assert.equal((await get(`${server.url}/proxyMode`)).text, 'iptables');
  assert.equal((await get(`${server.url}/healthz`)).text, 'ok');
});

async function freePort(): Promise<number> {
  const probe = await startHealthServer({host: '127.0.0.1', port: 0, health: new ProxierHealth(1000)});
  await probe.close();
  return probe.port;
}

test('service health with --netns: the listener is in the node namespace, so two nodes share a port and answer for themselves', {
  skip: isRoot ? undefined : 'needs root: creates network namespaces',
}, async (t) => {
  const nodes = [createNetns(t), createNetns(t)];
  for (const node of nodes) inNetns(node, ['ip', 'link', 'set', 'lo', 'up']);
  const port = await freePort();
  const servers = nodes.map((netns) => new ServiceHealthServers({netns, proxyHealthy: () => true}));
  t.after(() => Promise.all(servers.map((server) => server.close())));
  await servers[0].sync([{namespace: 'default', name: 'web', healthCheckNodePort: port, localEndpoints: 2}]);
  await servers[1].sync([{namespace: 'default', name: 'web', healthCheckNodePort: port, localEndpoints: 0}]);
  assert.deepEqual([...servers[0].ports()], [['default/web', port]]);
  assert.deepEqual([...servers[1].ports()], [['default/web', port]], 'the same port opens in the second namespace');

  assert.deepEqual(await fetchJsonInNetns(nodes[0], `http://127.0.0.1:${port}/`), {
    status: 200,
    json: {service: {namespace: 'default', name: 'web'}, localEndpoints: 2, serviceProxyHealthy: true},
  });
  assert.deepEqual(await fetchJsonInNetns(nodes[1], `http://[::1]:${port}/`), {
    status: 503,
    json: {service: {namespace: 'default', name: 'web'}, localEndpoints: 0, serviceProxyHealthy: true},
  });
  await assert.rejects(fetch(`http://127.0.0.1:${port}/`, {signal: AbortSignal.timeout(2000)}), 'nothing listens on the host');

  // Counts change in place; closing the port closes it in its namespace.
  await servers[1].sync([{namespace: 'default', name: 'web', healthCheckNodePort: port, localEndpoints: 1}]);
  assert.equal((await fetchJsonInNetns(nodes[1], `http://127.0.0.1:${port}/`)).status, 200);
  await servers[0].sync([]);
  assert.deepEqual(await fetchJsonInNetns(nodes[0], `http://127.0.0.1:${port}/`), {error: 'ECONNREFUSED'});

  // A port taken inside the namespace is reported with its cause and the namespace.
  const errors: string[] = [];
  const blocked = new ServiceHealthServers({
    netns: nodes[1],
    proxyHealthy: () => true,
    onError: (target, error) => errors.push(`${target.name}: ${(error as NodeJS.ErrnoException).code} ${(error as Error).message}`),
  });
  t.after(() => blocked.close());
  await blocked.sync([{namespace: 'default', name: 'other', healthCheckNodePort: port, localEndpoints: 1}]);
  assert.equal(errors.length, 1);
  assert.match(errors[0], new RegExp(`^other: EADDRINUSE listen on \\[::\\]:${port} in network namespace ${nodes[1]}: `));
});
