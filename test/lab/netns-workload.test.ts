// The demo workload in real namespaces: replies over HTTP and UDP, and a client that tells a
// refusal (REJECT, nothing listening) from silence (DROP).
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {
  buildCluster,
  deleteNamespacesWithPrefix,
  destroyCluster,
  execInNamespace,
  netnsUnavailableReason,
  newNamespacePrefix,
  type ClusterTopology,
} from '../../src/lab/netns/index.ts';
import {DemoAppGroup, probeFromNamespace} from '../../src/lab/workload/launch.ts';

const unavailable = await netnsUnavailableReason();
const prefix = newNamespacePrefix();
const apps = new DemoAppGroup();
let topology: ClusterTopology | undefined;

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    apps.killAllNow();
    void deleteNamespacesWithPrefix(prefix).finally(() => process.exit(130));
  });
}

describe('demo workload', {concurrency: false}, () => {
  before(async () => {
    if (unavailable) return;
    topology = await buildCluster({prefix, nodes: 1, podsPerNode: 2});
    const server = topology.nodes[0].pods[0];
    await apps.start([{namespace: server.namespace, name: server.name, httpPort: 8080, udpPort: 5353}]);
  });
  after(async () => {
    await apps.stopAll();
    if (topology) await destroyCluster(topology);
  });

  for (const protocol of ['tcp', 'udp'] as const) {
    const port = protocol === 'tcp' ? 8080 : 5353;

    it(`answers ${protocol} with its name, its address and the client's`, async (t) => {
      if (!topology) return t.skip(`needs root: ${unavailable}`);
      const [server, client] = topology.nodes[0].pods;
      const results = await probeFromNamespace(client.namespace, {protocol, host: server.ip, port}, 3);
      assert.equal(results.length, 3);
      for (const result of results) {
        assert.equal(result.outcome, 'reply', JSON.stringify(result));
        if (result.outcome !== 'reply') continue;
        assert.deepEqual(result.reply, {pod: server.name, podIP: server.ip, clientIP: client.ip, protocol});
        assert.equal(result.localAddress, client.ip);
      }
    });

    it(`reports ${protocol} to a closed port as refused, at once`, async (t) => {
      if (!topology) return t.skip(`needs root: ${unavailable}`);
      const [server, client] = topology.nodes[0].pods;
      const [result] = await probeFromNamespace(client.namespace, {protocol, host: server.ip, port: port + 1, timeoutMs: 3000});
      assert.equal(result.outcome, 'refused', JSON.stringify(result));
      assert.ok(result.ms < 1000, `took ${result.ms} ms`);
    });

    it(`reports ${protocol} REJECTed as refused and DROPped as timeout`, async (t) => {
      if (!topology) return t.skip(`needs root: ${unavailable}`);
      const [server, client] = topology.nodes[0].pods;
      const reject =
        protocol === 'tcp' ? ['-j', 'REJECT', '--reject-with', 'tcp-reset'] : ['-j', 'REJECT', '--reject-with', 'icmp-port-unreachable'];
      const rule = ['-p', protocol, '--dport', String(port)];
      await execInNamespace(server.namespace, ['iptables', '-I', 'INPUT', ...rule, ...reject]);
      try {
        const [refused] = await probeFromNamespace(client.namespace, {protocol, host: server.ip, port, timeoutMs: 3000});
        assert.equal(refused.outcome, 'refused', JSON.stringify(refused));
      } finally {
        await execInNamespace(server.namespace, ['iptables', '-D', 'INPUT', ...rule, ...reject]);
      }
      await execInNamespace(server.namespace, ['iptables', '-I', 'INPUT', ...rule, '-j', 'DROP']);
      try {
        const [dropped] = await probeFromNamespace(client.namespace, {protocol, host: server.ip, port, timeoutMs: 400});
        assert.equal(dropped.outcome, 'timeout', JSON.stringify(dropped));
        assert.ok(dropped.ms >= 400, `took ${dropped.ms} ms`);
      } finally {
        await execInNamespace(server.namespace, ['iptables', '-D', 'INPUT', ...rule, '-j', 'DROP']);
      }
    });
  }
});
