// The agent live, with real packets: two namespace nodes each running proxyctl-agent (a child
// process writing into its node's namespace), the embedded API server and its EndpointSlice
// controller turning Pods into slices, and demo servers answering in pod namespaces. Services are
// applied, scaled, have pods deleted, carry malformed neighbours and a long-lived UDP flow, or ask
// for health checks (externalTrafficPolicy Local); every check is a request from a pod, another
// node or the external client.
import assert from 'node:assert/strict';
import {fileURLToPath} from 'node:url';
import {describe, it} from 'node:test';
import {execInNamespace, spawnInNamespace} from '../../../src/lab/netns/index.ts';
import {fetchJsonInNetns} from '../health/fetch-in-netns.ts';
import {
  dnatDestinations,
  demoPorts,
  endpointSliceObject,
  liveClusterSuite,
  repliedPods,
  serviceObject,
  sleep,
  until,
} from './live-cluster.ts';

// node-0: pod-0-0 client, pod-0-1 web, pod-0-2 grace; node-1: pod-1-0 client, pod-1-1 web, pod-1-2 grace.
const servers = {
  'pod-0-1': {app: 'web', dns: 'yes'},
  'pod-1-1': {app: 'web', dns: 'yes'},
  'pod-0-2': {app: 'grace'},
  'pod-1-2': {app: 'grace'},
};
/** "Within a few seconds": minSyncPeriod (1 s) plus watch delivery and one sync, with room for a busy machine. */
const programmingBudgetMs = 5000;

describe('live agent: traffic through services it programs', {concurrency: false, timeout: 240_000}, () => {
  const {live} = liveClusterSuite({nodes: 2, podsPerNode: 3, externalClients: 1, servers, agent: {minSyncPeriod: '1s', syncPeriod: '30s'}});

  it('a Service applied is reachable from a pod, another node and its NodePort within seconds; scaled to zero it refuses; back it answers', async (t) => {
    const c = live(t);
    if (!c) return;
    const applied = Date.now();
    const created = c.server.store.create('services', serviceObject('web', {app: 'web'}, {type: 'NodePort'}), 'default') as unknown as {
      spec: {clusterIP: string; ports: Array<{nodePort: number}>};
    };
    const clusterIP = created.spec.clusterIP;
    const nodePort = created.spec.ports[0].nodePort;
    const http = {protocol: 'tcp' as const, port: 80, host: clusterIP, timeoutMs: 1000};

    await until('web from pod-0-0', () => c.answers(c.pod('pod-0-0').namespace, clusterIP), programmingBudgetMs);
    await until('web from pod-1-0 on the other node', () => c.answers(c.pod('pod-1-0').namespace, clusterIP), programmingBudgetMs);
    const external = {protocol: 'tcp' as const, host: c.node(0).ip, port: nodePort, timeoutMs: 1000};
    await until(
      'the NodePort from the external client',
      () => c.answers(c.lab.topology.externalClients[0].namespace, external.host, nodePort),
      programmingBudgetMs,
    );
    const reachableAfter = Date.now() - applied;
    assert.ok(reachableAfter <= programmingBudgetMs, `reachable from everywhere after ${reachableAfter} ms`);
    // Both endpoints, from both nodes.
    const pods = new Set([
      ...repliedPods(await c.probe(c.pod('pod-1-0').namespace, http, 30), 'pod-1-0 -> web'),
      ...repliedPods(await c.probe(c.pod('pod-0-0').namespace, http, 30), 'pod-0-0 -> web'),
    ]);
    assert.deepEqual([...pods].sort(), ['pod-0-1', 'pod-1-1']);
    // The NodePort of node-1 too, reached from the external client across the node network.
    repliedPods(
      await c.probe(c.lab.topology.externalClients[0].namespace, {...external, host: c.node(1).ip}, 3),
      'external -> node-1 NodePort',
    );

    // Scale to zero: no pod matches any more, the controller empties the slice.
    c.relabel('pod-0-1', {app: 'web-off', dns: 'yes'});
    c.relabel('pod-1-1', {app: 'web-off', dns: 'yes'});
    await until(
      'web refused from pod-1-0',
      async () => (await c.outcome(c.pod('pod-1-0').namespace, clusterIP)) === 'refused',
      programmingBudgetMs,
    );
    await until(
      'the NodePort refused',
      async () => (await c.outcome(c.lab.topology.externalClients[0].namespace, external.host, nodePort)) === 'refused',
      programmingBudgetMs,
    );
    const refused = await c.probe(c.pod('pod-0-0').namespace, http, 3);
    for (const result of refused) assert.equal(result.outcome, 'refused', `no endpoints: ${JSON.stringify(result)}`);

    c.relabel('pod-0-1', {app: 'web', dns: 'yes'});
    c.relabel('pod-1-1', {app: 'web', dns: 'yes'});
    await until('web back from pod-1-0', () => c.answers(c.pod('pod-1-0').namespace, clusterIP), programmingBudgetMs);
    await until(
      'the NodePort back',
      () => c.answers(c.lab.topology.externalClients[0].namespace, external.host, nodePort),
      programmingBudgetMs,
    );
  });

  it('a pod deleted leaves the rules; terminating endpoints are used only while no endpoint is ready', async (t) => {
    const c = live(t);
    if (!c) return;
    c.server.store.create('services', serviceObject('grace', {app: 'grace'}), 'default');
    const http = {protocol: 'tcp' as const, port: 80, host: c.clusterIPOf('grace'), timeoutMs: 1000};
    const client = c.pod('pod-0-0').namespace;
    const both = ['pod-0-2', 'pod-1-2'];
    const answering = async () =>
      new Set((await c.probe(client, http, 20)).flatMap((result) => (result.outcome === 'reply' ? [result.reply.pod] : [])));
    await until('grace reaches both pods', async () => (await answering()).size === 2, programmingBudgetMs);

    // A graceful delete: the pod keeps serving while it terminates (the demo server still runs).
    c.server.store.delete('pods', 'default', 'pod-0-2', {gracePeriodSeconds: 120});
    const gone = `${c.pod('pod-0-2').ip}:${demoPorts.http}`;
    await until(
      'the terminating endpoint to leave the rules of node-0',
      async () => !(await dnatDestinations(c.node(0), 'default/grace:http')).includes(gone),
      programmingBudgetMs,
    );
    await until('node-1 too', async () => !(await dnatDestinations(c.node(1), 'default/grace:http')).includes(gone), programmingBudgetMs);
    assert.deepEqual(
      new Set(repliedPods(await c.probe(client, http, 20), 'one ready, one terminating')),
      new Set(['pod-1-2']),
      'a ready endpoint exists: the terminating one gets nothing',
    );

    // The last ready one terminates too: as kube-proxy, fall back to the serving terminating endpoints.
    c.server.store.delete('pods', 'default', 'pod-1-2', {gracePeriodSeconds: 120});
    await until(
      'both terminating endpoints in the rules',
      async () => (await dnatDestinations(c.node(0), 'default/grace:http')).length === 2,
      programmingBudgetMs,
    );
    assert.deepEqual(new Set(repliedPods(await c.probe(client, http, 30), 'only terminating endpoints')), new Set(both));

    // Gone for good: no endpoint left in the rules, and the service refuses. (A pod's server stops
    // as it is deleted, so a refusal alone can come before the rules change.)
    for (const pod of both) c.server.store.delete('pods', 'default', pod, {gracePeriodSeconds: 0});
    await until(
      'no endpoint of grace in the rules of either node',
      async () =>
        (await dnatDestinations(c.node(0), 'default/grace:http')).length === 0 &&
        (await dnatDestinations(c.node(1), 'default/grace:http')).length === 0,
      programmingBudgetMs,
    );
    assert.equal(await c.outcome(client, http.host), 'refused');
  });

  it('a malformed Service and EndpointSlice next to good ones: the good ones work, the bad ones are logged by name and reason', async (t) => {
    const c = live(t);
    if (!c) return;
    const marks = c.agents.map((agent) => agent.lines.length);
    // The lab API server validates as kube-apiserver does and would refuse both objects. Real
    // proxies still meet such objects: written by an older API server with looser validation, or
    // restored into etcd directly. So they go into the server's storage here, as etcd would hold
    // them, and reach the agents through the same watches as everything else.
    const log = c.server.store.log;
    log.write('services', 'ADDED', {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'broken', namespace: 'default', uid: 'broken-uid', creationTimestamp: new Date().toISOString()},
      spec: {
        type: 'ClusterIP',
        clusterIP: '10.96.300.7',
        clusterIPs: ['10.96.300.7'],
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}],
      },
    });
    c.server.store.create('services', serviceObject('manual', undefined), 'default');
    const manual = endpointSliceObject('manual', [
      {ip: '10.244.0.999', node: 'node-0'},
      {ip: c.pod('pod-1-1').ip, node: c.pod('pod-1-1').node},
    ]);
    log.write('discovery.k8s.io/endpointslices', 'ADDED', {
      ...manual,
      metadata: {...manual.metadata, uid: 'manual-1-uid', creationTimestamp: new Date().toISOString()},
    });

    const http = {protocol: 'tcp' as const, port: 80, host: c.clusterIPOf('manual'), timeoutMs: 1000};
    await until('manual answers from its good endpoint', () => c.answers(c.pod('pod-0-0').namespace, http.host), programmingBudgetMs);
    assert.deepEqual(new Set(repliedPods(await c.probe(c.pod('pod-0-0').namespace, http, 10), 'manual')), new Set(['pod-1-1']));
    repliedPods(await c.probe(c.pod('pod-1-0').namespace, {...http, host: c.clusterIPOf('web')}, 5), 'web next to the bad objects');

    for (const [index, agent] of c.agents.entries()) {
      const service = await agent.waitForLog(/warn object skipped object="Service default\/broken"/, {from: marks[index]});
      assert.match(service, /reason=.*spec\.clusterIP.*10\.96\.300\.7/);
      const slice = await agent.waitForLog(/warn object skipped object="EndpointSlice default\/manual-1"/, {from: marks[index]});
      assert.match(slice, /reason=.*endpoints\[0\]\.addresses\[0\].*10\.244\.0\.999/);
      // Logged once, not at every sync.
      await sleep(1500);
      assert.equal(agent.logged(/object skipped object="Service default\/broken"/, marks[index]).length, 1);
      assert.ok((await agent.metric('proxyctl_object_problems')) >= 2, 'the problems are counted on /metrics');
      assert.equal(
        agent.logged(/level=error|^\S+ error /, marks[index]).length,
        0,
        `no errors: ${agent.logged(/ error /, marks[index]).join('\n')}`,
      );
    }
  });

  it('UDP: a long-lived flow never keeps reaching a deleted endpoint; its conntrack entries are cleared', async (t) => {
    const c = live(t);
    if (!c) return;
    c.server.store.create(
      'services',
      {
        ...serviceObject('dns', {dns: 'yes'}),
        spec: {selector: {dns: 'yes'}, ports: [{name: 'dns', protocol: 'UDP', port: 53, targetPort: demoPorts.udp}]},
      },
      'default',
    );
    const vip = c.clusterIPOf('dns');
    const client = c.pod('pod-0-0');
    await until(
      'dns answers',
      async () => (await c.probe(client.namespace, {protocol: 'udp', host: vip, port: 53, timeoutMs: 500}))[0].outcome === 'reply',
      programmingBudgetMs,
    );
    const deletedBefore = await c.agents[0].metric('kubeproxy_conntrack_reconciler_deleted_entries_total', {ip_family: 'IPv4'});

    const replies: Array<{ms: number; pod: string}> = [];
    const flow = spawnInNamespace(client.namespace, [
      process.execPath,
      fileURLToPath(new URL('./udp-flow.ts', import.meta.url)),
      '--host',
      vip,
      '--port',
      '53',
      '--interval-ms',
      '50',
    ]);
    t.after(() => {
      flow.kill('SIGKILL');
    });
    let partial = '';
    flow.stdout!.setEncoding('utf8');
    flow.stdout!.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop()!;
      for (const line of lines) if (line) replies.push(JSON.parse(line) as {ms: number; pod: string});
    });
    await until('the flow to get 10 replies', () => replies.length >= 10, 5000);
    const stuckTo = new Set(replies.map((reply) => reply.pod));
    assert.equal(stuckTo.size, 1, `one flow, one endpoint (conntrack): ${[...stuckTo].join(', ')}`);
    const [endpoint] = stuckTo;
    const other = endpoint === 'pod-0-1' ? 'pod-1-1' : 'pod-0-1';
    const endpointIP = c.pod(endpoint).ip;

    // The endpoint leaves the service; its server keeps running and would answer a stale entry.
    const removedAt = replies.length;
    c.relabel(endpoint, {app: 'web'});
    await until(`the flow to move to ${other}`, () => replies.slice(removedAt).some((reply) => reply.pod === other), programmingBudgetMs);
    const movedAt = replies.length;
    await sleep(2000);
    const afterMove = replies.slice(movedAt);
    assert.ok(afterMove.length >= 20, `the flow goes on (${afterMove.length} replies in 2 s)`);
    assert.deepEqual(new Set(afterMove.map((reply) => reply.pod)), new Set([other]), 'never the deleted endpoint again');

    const {stdout} = await execInNamespace(c.node(0).namespace, ['conntrack', '-L', '-p', 'udp', '--orig-dst', vip]);
    assert.ok(!stdout.includes(`src=${endpointIP} `), `no conntrack entry still leads to ${endpointIP}:\n${stdout}`);
    assert.ok(stdout.includes(`src=${c.pod(other).ip} `), `the flow's entry now leads to ${other}:\n${stdout}`);
    const deletedAfter = await c.agents[0].metric('kubeproxy_conntrack_reconciler_deleted_entries_total', {ip_family: 'IPv4'});
    assert.ok(deletedAfter > deletedBefore, `conntrack deletions counted (${deletedBefore} -> ${deletedAfter})`);
    assert.ok(
      c.agents[0].logged(new RegExp(`conntrack entries deleted .*${endpointIP.replace(/\./g, '\\.')}`)).length > 0,
      'the deletion is logged',
    );
    c.relabel(endpoint, {app: 'web', dns: 'yes'});
  });

  it('externalTrafficPolicy Local: each node answers its healthCheckNodePort on its own IP with its own local endpoint count', async (t) => {
    const c = live(t);
    if (!c) return;
    // Only pod-0-1 (on node-0) is selected at first.
    c.relabel('pod-0-1', {app: 'web', dns: 'yes', lb: 'local'});
    const created = c.server.store.create(
      'services',
      serviceObject('lb-local', {lb: 'local'}, {type: 'LoadBalancer', externalTrafficPolicy: 'Local'}),
      'default',
    ) as unknown as {spec: {healthCheckNodePort: number}};
    const port = created.spec.healthCheckNodePort;
    assert.ok(port >= 30000 && port <= 32767, `a healthCheckNodePort from the NodePort range: ${port}`);
    // As a cloud load balancer probes: from outside the cluster, each node at its own address.
    const balancer = c.lab.topology.externalClients[0].namespace;
    const check = (node: number) => fetchJsonInNetns(balancer, `http://${c.node(node).ip}:${port}/`);
    const body = (localEndpoints: number) => ({
      service: {namespace: 'default', name: 'lb-local'},
      localEndpoints,
      serviceProxyHealthy: true,
    });
    await until('node-0 to answer 200', async () => (await check(0)).status === 200, programmingBudgetMs);
    await until('node-1 to answer 503', async () => (await check(1)).status === 503, programmingBudgetMs);
    assert.deepEqual(await check(0), {status: 200, json: body(1)});
    assert.deepEqual(await check(1), {status: 503, json: body(0)});

    // An endpoint on node-1 too: each node counts its own.
    c.relabel('pod-1-1', {app: 'web', dns: 'yes', lb: 'local'});
    await until('node-1 to answer 200', async () => (await check(1)).status === 200, programmingBudgetMs);
    assert.deepEqual(await check(1), {status: 200, json: body(1)});
    assert.deepEqual(await check(0), {status: 200, json: body(1)});

    // Gone from node-0: it is taken out of the load balancer, node-1 stays in.
    c.relabel('pod-0-1', {app: 'web', dns: 'yes'});
    await until('node-0 to answer 503', async () => (await check(0)).status === 503, programmingBudgetMs);
    assert.deepEqual(await check(1), {status: 200, json: body(1)});
    for (const [index, agent] of c.agents.entries())
      assert.deepEqual(agent.logged(/cannot open health check port/), [], `agent on node-${index} opened its port`);

    c.server.store.delete('services', 'default', 'lb-local');
    c.relabel('pod-1-1', {app: 'web', dns: 'yes'});
    for (const node of [0, 1])
      await until(
        `node-${node}'s health check port to close`,
        async () => (await check(node)).error === 'ECONNREFUSED',
        programmingBudgetMs,
      );
  });

  it('all along, with nobody touching the rules: no drift reported, no sync failed', async (t) => {
    const c = live(t);
    if (!c) return;
    for (const agent of c.agents) {
      assert.deepEqual(agent.logged(/rules changed behind our back|sync failed/), [], `agent on ${agent.node.name}`);
      assert.equal(await agent.metric('proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 0);
      assert.ok(
        (await agent.metric('kubeproxy_sync_partial_proxy_rules_duration_seconds_count')) >= 5,
        'the changes went through partial syncs',
      );
    }
  });
});
