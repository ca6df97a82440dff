// nftables mode and the service CIDRs, with a real proxyctl-agent (--proxy-mode nftables --netns
// NODE) against the embedded API server in a namespace cluster. As kube-proxy's nftables mode, the
// agent learns the CIDRs from networking.k8s.io/v1 ServiceCIDR objects and drops new connections to
// their addresses that are no ClusterIP (`cluster-ips-check`: `ip daddr { CIDRS } drop`), where a
// ClusterIP's unknown port is rejected. Without the rule the node would route the packet to its
// upstream, which refuses everything: so "timeout" here means the agent's rule dropped it.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {execInNamespace} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {type LiveCluster, liveClusterSuite, repliedPods, serviceObject, until} from '../agent/live/live-cluster.ts';

/** Outside the API server's service range (10.96.0.0/12): only the agent's flag names it. */
const flagCIDR = '172.31.0.0/16';
const unusedServiceIP = '10.96.200.200';

/** The destinations of the "Drop traffic to unallocated ClusterIPs" rule in the node's table, or [] without one. */
async function droppedCIDRs(c: LiveCluster): Promise<string[]> {
  const {stdout} = await execInNamespace(c.node(0).namespace, ['nft', 'list', 'chain', 'ip', 'kube-proxy', 'cluster-ips-check']);
  const rule = stdout.split('\n').find((line) => line.includes('Drop traffic to unallocated ClusterIPs'));
  const match = rule ? /ip daddr (\{ [^}]+ \}|\S+) drop/.exec(rule) : null;
  return match
    ? match[1]
        .replace(/[{}]/g, '')
        .split(',')
        .map((cidr) => cidr.trim())
        .filter(Boolean)
        .sort()
    : [];
}

async function waitForDrop(c: LiveCluster, expected: string[]): Promise<void> {
  await until(
    `the drop rule for ${expected.join(',') || 'nothing'}`,
    async () => JSON.stringify(await droppedCIDRs(c)) === JSON.stringify([...expected].sort()),
    20_000,
  );
}

/** What a new TCP connection from pod-0-0 to address:80 meets. */
async function connect(c: LiveCluster, address: string, port = 80): Promise<ProbeResult['outcome']> {
  const [result] = await c.probe(c.pod('pod-0-0').namespace, {protocol: 'tcp', host: address, port, timeoutMs: 1500});
  return result.outcome;
}

describe('nftables mode drops traffic to unused addresses of the service CIDRs', {concurrency: false, timeout: 180_000}, () => {
  const {live} = liveClusterSuite(
    {
      nodes: 1,
      podsPerNode: 2,
      externalClients: 0,
      servers: {'pod-0-1': {app: 'web'}},
      agent: {extraFlags: ['--proxy-mode=nftables', `--service-cluster-ip-range=${flagCIDR}`]},
    },
    async (cluster) => {
      cluster.server.store.create('services', serviceObject('web', {app: 'web'}), 'default');
    },
  );

  it("takes the API server's ServiceCIDR `kubernetes`: an unused address is dropped, an unknown port of a ClusterIP refused", async (t) => {
    const c = live(t);
    if (!c) return;
    await waitForDrop(c, ['10.96.0.0/12']);
    const web = c.clusterIPOf('web');
    await until('web answers', async () => (await connect(c, web)) === 'reply', 20_000);
    assert.deepEqual(
      repliedPods(await c.probe(c.pod('pod-0-0').namespace, {protocol: 'tcp', host: web, port: 80, timeoutMs: 3000}), 'web'),
      ['pod-0-1'],
    );
    assert.equal(await connect(c, unusedServiceIP), 'timeout', `${unusedServiceIP} is in 10.96.0.0/12 and no ClusterIP`);
    assert.equal(await connect(c, web, 81), 'refused', 'a ClusterIP port no service defines is rejected');
    // While ServiceCIDR objects exist, the flag's range is not used: the upstream refuses.
    assert.equal(await connect(c, '172.31.0.9'), 'refused', 'outside every ServiceCIDR, the packet is left to routing');
  });

  it('a new ServiceCIDR is dropped once the agent has seen it; without any, the flag takes over', async (t) => {
    const c = live(t);
    if (!c) return;
    assert.equal(await connect(c, '10.200.0.9'), 'refused', 'before the ServiceCIDR exists, routing decides');
    c.server.store.create('servicecidrs', {metadata: {name: 'extra'}, spec: {cidrs: ['10.200.0.0/16']}});
    await waitForDrop(c, ['10.200.0.0/16', '10.96.0.0/12']);
    assert.equal(await connect(c, '10.200.0.9'), 'timeout');

    c.server.store.delete('servicecidrs', undefined, 'extra');
    c.server.store.delete('servicecidrs', undefined, 'kubernetes');
    await waitForDrop(c, [flagCIDR]);
    assert.equal(await connect(c, '172.31.0.9'), 'timeout', 'the --service-cluster-ip-range range is dropped');
    assert.equal(await connect(c, unusedServiceIP), 'refused', 'no longer a service CIDR: left to routing');
    const agent = c.agents[0];
    assert.ok(agent.logged(/service CIDRs changed/).length >= 2, agent.lines.join('\n'));
  });
});
