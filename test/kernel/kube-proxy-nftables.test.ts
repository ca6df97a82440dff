// kube-proxy's own nftables rules in the kernel: the table kube-proxy's TestOverallNFTablesRules
// says it writes (test/core/nftables/kube-proxy-fixtures), its endpoint, node and client addresses
// moved onto a namespace cluster, loaded into node-0 with `nft -f`. Real TCP from pods and external
// clients; each case traces `nft list ruleset` of node-0 (parseNftablesListing) and checks the
// tracer predicted where the packets went. Root only.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {
  diffNftables,
  parseNftablesJson,
  parseNftablesListing,
  parseNftablesScript,
  renderNftables,
  traceNftables,
} from '../../src/core/nftables/index.ts';
import {createNamespace, deleteNamespace, execInNamespace, newNamespacePrefix} from '../../src/lab/netns/index.ts';
import {
  fakeProxierRenderOptions,
  fixtureModel,
  fixtureObjects,
  kubeProxyTable,
  transactionOrder,
} from '../core/nftables/kube-proxy-fixtures.ts';
import {demoPorts, kernelUnavailable, nodeAddresses, startKernelLab} from './namespace-lab.ts';
import {
  assertTraceAgrees,
  describeTrace,
  firstPacket,
  type NodeTracer,
  replies,
  type Sender,
  ServiceScenario,
  type Target,
} from './service-scenario.ts';

/** Where each of the fixture's endpoints runs in the namespace cluster. */
const endpointPods: Record<string, string> = {
  '10.180.0.1': 'pod-0-1', // ns1/svc1
  '10.180.0.2': 'pod-1-0', // ns2/svc2 (not on the fixture's node)
  '10.180.0.3': 'pod-0-2', // ns3/svc3, ns5/svc5
  '10.180.0.4': 'pod-1-1', // ns4/svc4
  '10.180.0.5': 'pod-0-3', // ns4/svc4
};

/** The fixture's addresses that outside clients send to through node-0. */
const routedToNode0 = ['172.30.0.0/16', '1.2.3.4/32', '5.6.7.8/32', '192.168.99.0/24'];

const scenario = new ServiceScenario();
let listedRuleset = '';

/**
 * movedOntoLab: kube-proxy's table with the fixture's addresses replaced by the lab's: endpoints
 * (and their port 80, the demo servers listen on 8080), the node IP, the pod CIDR of the local
 * traffic detector, and the loadBalancerSourceRanges (allowing client-0 only). ClusterIPs,
 * externalIPs and load-balancer IPs stay as kube-proxy's test has them.
 */
function movedOntoLab(script: string): string {
  const lab = scenario.lab!.topology;
  let moved = script;
  for (const [fixtureIP, pod] of Object.entries(endpointPods)) {
    const ip = scenario.at(pod).ip;
    const address = fixtureIP.replaceAll('.', '\\.');
    moved = moved
      .replace(new RegExp(`${address}([:/])80\\b`, 'g'), `${ip}$1${demoPorts.http}`)
      .replace(new RegExp(`${address}(?!\\d)`, 'g'), ip);
  }
  return moved
    .replaceAll('192.168.0.2', lab.nodes[0].ip)
    .replaceAll('10.0.0.0/8', lab.clusterCIDR)
    .replaceAll('203.0.113.0/25', `${lab.externalClients[0].ip}/32`);
}

const trace: NodeTracer = (entry, sender, target) =>
  traceNftables(parseNftablesListing(listedRuleset), firstPacket(sender, target), {
    localAddresses: scenario.localAddresses.get(entry.name)!,
  });

describe("kube-proxy's nftables rules in the kernel", {concurrency: false, timeout: 180_000}, () => {
  let loaded = '';
  before(async () => {
    if (kernelUnavailable) return;
    scenario.lab = await startKernelLab({nodes: 2, podsPerNode: 4, externalClients: 2, externalRoutes: routedToNode0}, [
      ...new Set(Object.values(endpointPods)),
    ]);
    const node0 = scenario.node(0);
    loaded = movedOntoLab(kubeProxyTable('overall.nft'));
    await execInNamespace(node0.namespace, ['nft', '-f', '-'], {input: transactionOrder(loaded)});
    listedRuleset = (await execInNamespace(node0.namespace, ['nft', 'list', 'ruleset'])).stdout;
    scenario.localAddresses.set(node0.name, await nodeAddresses(node0));
  });
  after(() => scenario.close());

  it("the kernel lists kube-proxy's table as its script wrote it, and trace reads that listing", (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    assert.equal(diffNftables(parseNftablesScript(loaded), parseNftablesListing(listedRuleset)).text, '');
    assert.match(listedRuleset, /chain filter-prerouting-pre-dnat \{/);
  });

  const svc = (ip: string, port = 80): Target => ({protocol: 'tcp', ip, port});
  const check = async (sender: Sender, target: Target, count: number, timeoutMs = 2000) => {
    const results = await scenario.send(sender, target, count, timeoutMs);
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
    return results;
  };
  /** A pod's connections all reach the fixture endpoint's pod, with the pod's own source address. */
  const reachedKeepingSource = async (target: Target, count: number, fixtureEndpoint: string) => {
    const sender = scenario.pod('pod-0-0');
    for (const result of replies(await check(sender, target, count), `pod-0-0 to ${target.ip}`)) {
      assert.equal(result.reply.pod, endpointPods[fixtureEndpoint]);
      assert.equal(result.reply.clientIP, sender.ip);
    }
  };

  it('pod -> ClusterIP: DNAT through the endpoint chain, pod source kept', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    await reachedKeepingSource(svc('172.30.0.41'), 4, '10.180.0.1');
  });

  it('off-cluster client -> ClusterIP is masqueraded', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.client(0);
    for (const result of replies(await check(sender, svc('172.30.0.41'), 3), 'client to svc1'))
      assert.notEqual(result.reply.clientIP, sender.ip);
  });

  it('hairpin: an endpoint reaching itself through its service is masqueraded by its endpoint chain', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod(endpointPods['10.180.0.1']);
    for (const result of replies(await check(sender, svc('172.30.0.41'), 2), 'hairpin')) {
      assert.equal(result.reply.pod, sender.name);
      assert.notEqual(result.reply.clientIP, sender.ip);
    }
  });

  it('numgen spreads over both endpoint chains, on and off the node', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const results = replies(await check(scenario.pod('pod-0-0'), svc('172.30.0.44'), 24), 'pod to svc4');
    assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].sort(), ['pod-0-3', 'pod-1-1']);
    const predicted = trace(scenario.node(0), scenario.pod('pod-0-0'), svc('172.30.0.44'));
    assert.deepEqual(
      predicted.branches.map((branch) => branch.probability),
      [0.5, 0.5],
      describeTrace(predicted),
    );
  });

  it('externalIP, NodePort and an allowed load-balancer source are masqueraded to the endpoint', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const client = scenario.client(0);
    replies(await check(client, svc('192.168.99.33'), 6), 'client to svc4 externalIP');
    replies(await check(client, svc(scenario.node(0).ip, 3003), 3), 'client to svc3 NodePort');
    for (const result of replies(await check(client, svc('5.6.7.8'), 3), 'client to svc5 LB IP')) {
      assert.equal(result.reply.pod, endpointPods['10.180.0.3']);
    }
  });

  it('a source outside loadBalancerSourceRanges is dropped by the firewall chain', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const results = await check(scenario.client(1), svc('5.6.7.8'), 1, 1500);
    assert.equal(results[0].outcome, 'timeout', JSON.stringify(results[0]));
  });

  it('externalTrafficPolicy Local without a local endpoint: NodePort dropped, pods short-circuited to the cluster endpoints', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const dropped = await check(scenario.client(0), svc(scenario.node(0).ip, 3001), 1, 1500);
    assert.equal(dropped[0].outcome, 'timeout', JSON.stringify(dropped[0]));
    await reachedKeepingSource(svc('1.2.3.4'), 2, '10.180.0.2');
  });

  it('no endpoints and unknown ports are rejected, unallocated ClusterIPs dropped', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    assert.equal((await check(sender, svc('172.30.0.46'), 1, 3000))[0].outcome, 'refused');
    assert.equal((await check(sender, svc('172.30.0.41', 81), 1, 3000))[0].outcome, 'refused');
    assert.equal((await check(sender, svc('172.30.0.50'), 1, 1500))[0].outcome, 'timeout');
  });

  it('session affinity: a client the kernel remembered is traced through its affinity set', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    replies(await check(sender, svc('172.30.0.45'), 1), 'pod to svc5');
    // The kernel added the client to the endpoint's affinity set; the listing shows it.
    const listed = (await execInNamespace(scenario.node(0).namespace, ['nft', 'list', 'ruleset'])).stdout;
    const affinitySet = [...parseNftablesListing(listed).sets.values()].find((set) => set.name.startsWith('affinity-'))!;
    assert.ok(
      affinitySet.elements.some((element) => element.key === sender.ip),
      `the kernel remembered ${sender.ip}: ${JSON.stringify(affinitySet.elements)}`,
    );
    const predicted = traceNftables(parseNftablesListing(listed), firstPacket(sender, svc('172.30.0.45')), {
      localAddresses: scenario.localAddresses.get(scenario.node(0).name)!,
    });
    assert.ok(
      predicted.hops.some((hop) => hop.rule.startsWith(`ip saddr @${affinitySet.name} goto`)),
      describeTrace(predicted),
    );
    const results = await scenario.send(sender, svc('172.30.0.45'), 3);
    assertTraceAgrees(predicted, results, sender, svc('172.30.0.45'));
  });
});

describe("kube-proxy's nftables table in the kernel against the rendered one", {timeout: 60_000}, () => {
  it('no difference; a map element deleted behind its back is named by service', async (t) => {
    if (kernelUnavailable) {
      t.skip(`needs root: ${kernelUnavailable}`);
      return;
    }
    const namespace = `${newNamespacePrefix()}kpdiff`;
    await createNamespace(namespace);
    try {
      await execInNamespace(namespace, ['nft', '-f', '-'], {input: transactionOrder(kubeProxyTable('overall.nft'))});
      const listed = async () => (await execInNamespace(namespace, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy'])).stdout;
      const desired = parseNftablesScript(renderNftables(fixtureModel(fixtureObjects('overall.yaml')), fakeProxierRenderOptions));
      assert.equal(diffNftables(desired, parseNftablesJson(await listed())).text, '');

      await execInNamespace(namespace, ['nft', 'delete', 'element', 'ip', 'kube-proxy', 'service-ips', '{ 172.30.0.44 . tcp . 80 }']);
      const difference = diffNftables(desired, parseNftablesJson(await listed()));
      assert.deepEqual(
        difference.groups.map((group) => [group.servicePort, group.added, group.removed]),
        [['ns4/svc4:p80', ['element service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }'], []]],
      );
    } finally {
      await deleteNamespace(namespace);
    }
  });
});
