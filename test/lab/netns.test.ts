// The namespace layer: cluster descriptions, a real 3x10 cluster (speed, addressing, routing,
// cleanup), crash leftovers, and error messages.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import {after, before, describe, it} from 'node:test';
import {
  buildCluster,
  clusterPods,
  createNamespaces,
  deleteNamespacesWithPrefix,
  deleteOrphanedNamespaces,
  describeCluster,
  destroyCluster,
  execInNamespace,
  listNamespaces,
  namespacePids,
  netnsUnavailableReason,
  newNamespacePrefix,
  readSysctl,
  routeCommand,
  runIpBatch,
  spawnInNamespace,
  vethCommand,
  type ClusterTopology,
} from '../../src/lab/netns/index.ts';
import {DemoAppGroup, openProber, probeFromNamespace} from '../../src/lab/workload/launch.ts';

const unavailable = await netnsUnavailableReason();
const prefix = newNamespacePrefix();

// A crash of this file must not leave namespaces behind either.
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    spawnSync('sh', [
      '-c',
      `for ns in $(ip netns list | awk '{print $1}' | grep '^${prefix}'); do ip netns pids "$ns" | xargs -r kill -9; ip netns del "$ns"; done`,
    ]);
    process.exit(130);
  });
}
after(async () => {
  if (!unavailable) await deleteNamespacesWithPrefix(prefix);
});

describe('describeCluster', () => {
  it('names namespaces after the prefix and gives each node its own pod CIDR', () => {
    const topology = describeCluster({prefix: 'pxt-1-abc-', nodes: 2, podsPerNode: 2, externalClient: true});
    assert.deepEqual(
      topology.nodes.map((node) => [node.name, node.namespace, node.ip, node.podCIDR, node.podGateway]),
      [
        ['node-0', 'pxt-1-abc-node-0', '10.240.0.10', '10.244.0.0/24', '10.244.0.1'],
        ['node-1', 'pxt-1-abc-node-1', '10.240.0.11', '10.244.1.0/24', '10.244.1.1'],
      ],
    );
    assert.deepEqual(
      clusterPods(topology).map((pod) => [pod.name, pod.namespace, pod.ip, pod.node]),
      [
        ['pod-0-0', 'pxt-1-abc-pod-0-0', '10.244.0.10', 'node-0'],
        ['pod-0-1', 'pxt-1-abc-pod-0-1', '10.244.0.11', 'node-0'],
        ['pod-1-0', 'pxt-1-abc-pod-1-0', '10.244.1.10', 'node-1'],
        ['pod-1-1', 'pxt-1-abc-pod-1-1', '10.244.1.11', 'node-1'],
      ],
    );
    assert.deepEqual(topology.externalClients, [
      {
        name: 'client-0',
        namespace: 'pxt-1-abc-client-0',
        ip: '10.240.0.100',
        interface: 'eth0',
        gateway: '10.240.0.10',
        routes: ['10.96.0.0/12'],
      },
    ]);
    assert.deepEqual(topology.upstream, {namespace: 'pxt-1-abc-upstream', ip: '10.240.0.1', interface: 'eth0'});
    assert.equal(topology.namespaces.length, 1 + 2 + 4 + 1 + 1);
    assert.ok(topology.namespaces.every((name) => name.startsWith('pxt-1-abc-')));
  });

  it('is plain JSON, so a state file can hold it', () => {
    const topology = describeCluster({
      prefix: 'pxt-1-abc-',
      nodes: 3,
      podsPerNode: 1,
      externalClients: 2,
      externalRoutes: ['10.250.0.0/24'],
    });
    assert.deepEqual(JSON.parse(JSON.stringify(topology)), topology);
    assert.deepEqual(topology.externalClients[1].routes, ['10.96.0.0/12', '10.250.0.0/24']);
  });

  it('rejects sizes and prefixes it cannot build, naming the cluster', () => {
    assert.throws(() => describeCluster({prefix: 'pxt-1-', nodes: 0, podsPerNode: 1}), /cluster pxt-1-: nodes 0 is not in 1-80/);
    assert.throws(() => describeCluster({prefix: 'pxt-1-', nodes: 1, podsPerNode: 241}), /podsPerNode 241 is not in 0-240/);
    assert.throws(() => describeCluster({prefix: 'a b', nodes: 1, podsPerNode: 1}), /cluster prefix "a b"/);
    assert.throws(
      () => describeCluster({prefix: 'pxt-1-', nodes: 2, podsPerNode: 1, gatewayNode: 2}),
      /gatewayNode 2 is not one of the 2 nodes/,
    );
  });
});

describe('ip command lines', () => {
  it('creates veth ends directly inside their namespaces', () => {
    assert.equal(
      vethCommand({namespace: 'a', name: 'eth0'}, {namespace: 'b', name: 'vp0'}),
      'link add eth0 netns a type veth peer name vp0 netns b',
    );
  });
  it('refuses interface names the kernel would refuse', () => {
    assert.throws(
      () => vethCommand({namespace: 'a', name: 'a-very-long-interface'}, {namespace: 'b', name: 'x'}),
      /interface name "a-very-long-interface": must be 1-15/,
    );
  });
  it('writes routes with gateway, device and flags', () => {
    assert.equal(
      routeCommand({destination: 'default', via: '10.244.0.1', dev: 'eth0', onlink: true}),
      'route add default via 10.244.0.1 dev eth0 onlink',
    );
    assert.throws(() => routeCommand({destination: '10.0.0.0/8'}), /route to 10.0.0.0\/8: needs a gateway/);
  });
});

describe('a namespace cluster', {concurrency: false}, () => {
  let topology: ClusterTopology | undefined;
  let buildMs = 0;
  const apps = new DemoAppGroup();

  before(async () => {
    if (unavailable) return;
    const started = Date.now();
    topology = await buildCluster({prefix: `${prefix}c-`, nodes: 3, podsPerNode: 10, externalClient: true});
    buildMs = Date.now() - started;
  });
  after(async () => {
    await apps.stopAll();
    if (topology) await destroyCluster(topology);
  });

  it('builds 3 nodes x 10 pods in a few seconds', (t) => {
    if (unavailable) return t.skip(`needs root: ${unavailable}`);
    assert.ok(buildMs < 5000, `took ${buildMs} ms`);
  });

  it('creates every namespace it describes', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    const existing = new Set(await listNamespaces());
    assert.deepEqual(
      topology.namespaces.filter((name) => !existing.has(name)),
      [],
    );
  });

  it('lets nodes forward, without reverse-path filtering', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    for (const node of topology.nodes) {
      assert.equal(await readSysctl(node.namespace, 'net.ipv4.ip_forward'), '1', node.name);
      assert.equal(await readSysctl(node.namespace, 'net.ipv4.conf.all.rp_filter'), '0', node.name);
    }
  });

  it('routes pod to pod, on one node and across nodes, keeping the source address', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    const [server, sameNode] = topology.nodes[0].pods;
    const otherNode = topology.nodes[2].pods[9];
    await apps.start([{namespace: server.namespace, name: server.name, httpPort: 8080, udpPort: 5353}]);
    for (const client of [sameNode, otherNode]) {
      for (const protocol of ['tcp', 'udp'] as const) {
        const [result] = await probeFromNamespace(client.namespace, {protocol, host: server.ip, port: protocol === 'tcp' ? 8080 : 5353});
        assert.equal(result.outcome, 'reply', `${client.name} -> ${server.name} ${protocol}: ${JSON.stringify(result)}`);
        if (result.outcome !== 'reply') continue;
        assert.deepEqual(result.reply, {pod: server.name, podIP: server.ip, clientIP: client.ip, protocol});
      }
    }
  });

  it('a demo client kept running in a namespace answers many probes, together, as separate runs would', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    const [server, client] = topology.nodes[2].pods.slice(3, 5);
    await apps.start([{namespace: server.namespace, name: server.name, httpPort: 8080, udpPort: 5353}]);
    const prober = openProber(client.namespace);
    try {
      const targets = [
        ...Array.from({length: 6}, () => ({protocol: 'tcp' as const, host: server.ip, port: 8080})),
        {protocol: 'udp' as const, host: server.ip, port: 5353},
        {protocol: 'tcp' as const, host: server.ip, port: 8081},
      ];
      const results = await Promise.all(targets.map((target) => prober.probe({...target, timeoutMs: 2000})));
      for (const result of results.slice(0, 7)) {
        assert.equal(result.outcome, 'reply', JSON.stringify(result));
        if (result.outcome === 'reply') assert.deepEqual([result.reply.pod, result.reply.clientIP], [server.name, client.ip]);
      }
      assert.equal(results[7].outcome, 'refused', `nothing listens on 8081: ${JSON.stringify(results[7])}`);
    } finally {
      await prober.close();
    }
    await assert.rejects(prober.probe({protocol: 'tcp', host: server.ip, port: 8080}), /demo client in .* ended/);
  });

  it('reaches nodes from the external client, but not pods (no route to the cluster CIDR)', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    const client = topology.externalClients[0];
    const node = topology.nodes[1];
    // Nothing listens on the node: an immediate refusal proves the route both ways.
    const [toNode] = await probeFromNamespace(client.namespace, {protocol: 'tcp', host: node.ip, port: 8080});
    assert.equal(toNode.outcome, 'refused', JSON.stringify(toNode));
    const [toPod] = await probeFromNamespace(client.namespace, {protocol: 'tcp', host: topology.nodes[0].pods[0].ip, port: 8080});
    assert.equal(toPod.outcome, 'unreachable', JSON.stringify(toPod));
  });

  it('gives nodes a default route only to the upstream, which refuses every address', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    for (const node of topology.nodes) {
      const {stdout} = await execInNamespace(node.namespace, ['ip', '-4', 'route', 'show', 'default']);
      assert.equal(stdout.trim(), `default via ${topology.upstream!.ip} dev eth0`, node.name);
    }
    const {stdout} = await execInNamespace(topology.upstream!.namespace, ['ip', '-4', 'route', 'show', 'default']);
    assert.equal(stdout.trim(), '', 'the upstream itself has no way out');
    const pod = topology.nodes[1].pods[2];
    for (const protocol of ['tcp', 'udp'] as const) {
      const [result] = await probeFromNamespace(pod.namespace, {protocol, host: '10.250.0.99', port: 80, timeoutMs: 3000});
      assert.equal(result.outcome, 'refused', `${protocol}: ${JSON.stringify(result)}`);
    }
  });

  it('deletes the whole cluster, with the processes inside', async (t) => {
    if (!topology) return t.skip(`needs root: ${unavailable}`);
    const server = topology.nodes[1].pods[0];
    const [app] = await apps.start([{namespace: server.namespace, name: server.name, httpPort: 8080, udpPort: 5353}]);
    assert.deepEqual(await namespacePids(server.namespace), [app.pid]);
    await destroyCluster(topology);
    const left = (await listNamespaces()).filter((name) => name.startsWith(topology!.prefix));
    assert.deepEqual(left, []);
    assert.throws(() => process.kill(app.pid, 0), /ESRCH/);
    topology = undefined;
  });
});

describe('namespace cleanup', () => {
  it('deletes every namespace of a prefix and nothing else', async (t) => {
    if (unavailable) return t.skip(`needs root: ${unavailable}`);
    await createNamespaces([`${prefix}p-a`, `${prefix}p-b`, `${prefix}q-a`]);
    assert.deepEqual((await deleteNamespacesWithPrefix(`${prefix}p-`)).sort(), [`${prefix}p-a`, `${prefix}p-b`]);
    const left = (await listNamespaces()).filter((name) => name.startsWith(prefix));
    assert.deepEqual(left, [`${prefix}q-a`]);
    await deleteNamespacesWithPrefix(`${prefix}q-`);
  });

  it('refuses an empty prefix', async () => {
    await assert.rejects(deleteNamespacesWithPrefix(''), /empty prefix would match every namespace/);
  });

  it('deletes what a dead run left, and keeps what a live run holds', async (t) => {
    if (unavailable) return t.skip(`needs root: ${unavailable}`);
    const exited = spawnSync(process.execPath, ['-e', '0']);
    const deadPid = exited.pid;
    assert.ok(deadPid);
    const base = `pxtorphan${process.pid}`;
    const dead = `${base}-${deadPid}-aaaaaa-node-0`;
    const live = `${base}-${process.pid}-bbbbbb-node-0`;
    await createNamespaces([dead, live]);
    try {
      const sleeper = spawnInNamespace(dead, ['sleep', '60']);
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.deepEqual(await deleteOrphanedNamespaces(base), [dead]);
      assert.deepEqual(
        (await listNamespaces()).filter((name) => name.startsWith(base)),
        [live],
      );
      const result = await sleeper;
      assert.equal(result.signal, 'SIGKILL', 'the process inside the orphaned namespace is ended');
    } finally {
      await deleteNamespacesWithPrefix(`${base}-`);
    }
  });
});

describe('a failed build', () => {
  it('names the namespace that failed and leaves nothing behind', async (t) => {
    if (unavailable) return t.skip(`needs root: ${unavailable}`);
    const clusterPrefix = `${prefix}f-`;
    // A namespace of the same name already exists: `ip netns add` fails on it.
    await createNamespaces([`${clusterPrefix}node-1`]);
    await assert.rejects(
      buildCluster({prefix: clusterPrefix, nodes: 2, podsPerNode: 1}),
      /create \d+ network namespaces \(line \d+: "netns add pxt-.*-f-node-1"\): .*File exists/,
    );
    assert.deepEqual(
      (await listNamespaces()).filter((name) => name.startsWith(clusterPrefix)),
      [],
    );
  });
});

describe('ip batches', () => {
  it('say which line failed', async (t) => {
    if (unavailable) return t.skip(`needs root: ${unavailable}`);
    const name = `${prefix}batch`;
    await createNamespaces([name]);
    try {
      await assert.rejects(
        runIpBatch('configure test links', ['link set lo up', 'address add 10.1.2.3/32 dev nosuchdev'], name),
        (error: Error) => error.message.includes('configure test links (line 2: "address add 10.1.2.3/32 dev nosuchdev")'),
      );
    } finally {
      await deleteNamespacesWithPrefix(name);
    }
  });
});
