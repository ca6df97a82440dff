// kube-proxy's published iptables rules (test/fixtures/kube-proxy/iptables/overall) loaded into a
// node namespace with iptables-restore, through either front end, as a node running kube-proxy
// holds them. Read back with iptables-save, `diff --rules` against the case's objects finds no
// drift, and real packets from a pod and from outside go where `trace --rules` over that dump says:
// the endpoint reached is a predicted branch, the source rewritten exactly when the branch
// masquerades, refusals and drops where the trace says REJECT and DROP. Root only.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import type {TraceResult} from '../../src/core/trace/types.ts';
import {createNamespaces, deleteNamespacesWithPrefix, newNamespacePrefix, runIpBatch, setSysctls} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {DemoAppGroup, probeFromNamespace} from '../../src/lab/workload/launch.ts';
import {kubeProxyCases, loadKubeProxyIptables} from '../fixtures/kube-proxy/fixtures.ts';
import {runPlugin, describeRun} from '../plugin/agent-cluster.ts';
import {readRulesDump, splitDump, traceDump} from '../../src/plugin/lib/rules-dump.ts';
import {kernelUnavailable} from './namespace-lab.ts';
import {mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

const fixture = kubeProxyCases('iptables').find((one) => one.name === 'overall')!;
const skip = kernelUnavailable ? `needs root: ${kernelUnavailable}` : false;

/** The endpoints of the overall case that run a server, each in its own namespace. */
const endpoints = ['10.180.0.1', '10.180.0.3', '10.180.0.4', '10.180.0.5'];
const pod = '10.0.0.2';
const allowedClient = '203.0.113.2';
const blockedClient = '203.0.113.130';
/** The node's own addresses: towards the pod, towards outside, and its InternalIP. */
const nodeAddresses = ['10.0.0.1', '203.0.113.1', '192.168.0.2'];

interface Case {
  what: string;
  from: 'pod' | 'outside';
  source: string;
  destination: string;
  port: number;
  /** What kube-proxy's rules must do with it, from kube-proxy's own test (and which port). */
  verdict: TraceResult['verdict'];
  count?: number;
}

const cases: Case[] = [
  {what: 'pod to a ClusterIP (ns1/svc1)', from: 'pod', source: pod, destination: '172.30.0.41', port: 80, verdict: 'DNAT'},
  {
    what: 'pod to a ClusterIP with two endpoints (ns4/svc4)',
    from: 'pod',
    source: pod,
    destination: '172.30.0.44',
    port: 80,
    verdict: 'DNAT',
    count: 12,
  },
  {
    what: 'pod to a ClusterIP without endpoints (ns6/svc6)',
    from: 'pod',
    source: pod,
    destination: '172.30.0.46',
    port: 80,
    verdict: 'REJECT',
  },
  {
    what: 'allowed client to a load-balancer IP with source ranges (ns5/svc5)',
    from: 'outside',
    source: allowedClient,
    destination: '5.6.7.8',
    port: 80,
    verdict: 'DNAT',
  },
  {
    what: 'blocked client to that load-balancer IP',
    from: 'outside',
    source: blockedClient,
    destination: '5.6.7.8',
    port: 80,
    verdict: 'DROP',
  },
  {
    what: 'outside to a NodePort (ns3/svc3)',
    from: 'outside',
    source: allowedClient,
    destination: '192.168.0.2',
    port: 3003,
    verdict: 'DNAT',
  },
  {
    what: 'outside to an external IP of a Local service without local endpoints (ns2/svc2)',
    from: 'outside',
    source: allowedClient,
    destination: '192.168.99.22',
    port: 80,
    verdict: 'DROP',
  },
];

for (const frontEnd of ['nft', 'legacy'] as const) {
  describe(`kube-proxy's overall iptables rules, loaded with iptables-${frontEnd}`, {skip}, () => {
    const prefix = newNamespacePrefix('pxkp');
    const ns = {node: `${prefix}node`, pod: `${prefix}pod`, outside: `${prefix}out`};
    const endpointNs = (ip: string) => `${prefix}ep${ip.split('.').at(-1)}`;
    const apps = new DemoAppGroup();
    const dir = mkdtempSync(join(tmpdir(), 'pxkpkernel-'));
    let saved = '';

    before(async () => {
      await createNamespaces([...Object.values(ns), ...endpoints.map(endpointNs)]);
      await buildNode(prefix, ns, endpointNs);
      saved = await loadKubeProxyIptables(ns.node, fixture, frontEnd);
      await apps.start(endpoints.map((ip) => ({namespace: endpointNs(ip), name: `ep-${ip}`, httpPort: 80, udpPort: 5353})));
    });
    after(async () => {
      await apps.stopAll();
      await deleteNamespacesWithPrefix(prefix);
      rmSync(dir, {recursive: true, force: true});
    });

    it('iptables-save of the loaded rules: diff --rules finds no drift (exit 0)', async () => {
      const path = join(dir, `node.${frontEnd}.iptables-save`);
      writeFileSync(path, saved);
      const run = await runPlugin(['diff', '--rules', path, '-f', fixture.objects, ...fixture.flags]);
      assert.equal(run.code, 0, describeRun(run));
      assert.equal(run.stdout, '');
    });

    for (const one of cases) {
      it(`${one.what}: the kernel does what trace --rules says (${one.verdict})`, async () => {
        const dump = readRulesDump(splitDump('iptables-save', saved));
        const packet = {
          srcIP: one.source,
          dstIP: one.destination,
          dstPort: one.port,
          protocol: 'TCP',
          origin: 'arriving',
          inInterface: one.from === 'pod' ? 'vpod' : 'vout',
        } as const;
        const predicted = traceDump(dump, packet, nodeAddresses);
        assert.equal(predicted.verdict, one.verdict, JSON.stringify(predicted.warnings));
        const results = await probeFromNamespace(
          one.from === 'pod' ? ns.pod : ns.outside,
          {protocol: 'tcp', host: one.destination, port: one.port, sourceIP: one.source, timeoutMs: one.verdict === 'DROP' ? 700 : 3000},
          one.count ?? 2,
        );
        assertAgrees(predicted, results, one);
      });
    }
  });
}

function assertAgrees(predicted: TraceResult, results: ProbeResult[], one: Case): void {
  const branches = predicted.branches.map((branch) => `${branch.endpoint} masquerade=${branch.masquerade}`).join(', ');
  const context = `${one.what}: trace ${predicted.verdict} [${branches}]`;
  const reached = new Set<string>();
  for (const result of results) {
    if (result.outcome === 'reply') {
      assert.equal(predicted.verdict, 'DNAT', `the kernel delivered to ${result.reply.podIP}; ${context}`);
      const branch = predicted.branches.find((candidate) => candidate.endpoint === `${result.reply.podIP}:80`);
      assert.ok(branch, `the kernel reached ${result.reply.podIP}:80, no predicted branch; ${context}`);
      assert.equal(branch.masquerade, result.reply.clientIP !== one.source, `the endpoint saw ${result.reply.clientIP}; ${context}`);
      reached.add(branch.endpoint);
    } else if (result.outcome === 'refused') {
      assert.equal(predicted.verdict, 'REJECT', `the kernel refused; ${context}`);
    } else if (result.outcome === 'timeout') {
      assert.equal(predicted.verdict, 'DROP', `the kernel dropped; ${context}`);
    } else {
      assert.fail(`${JSON.stringify(result)}; ${context}`);
    }
  }
  // Over a dozen connections each of two equally likely endpoints answers (odds of missing one: 1 in 2048).
  if ((one.count ?? 0) >= 12) assert.equal(reached.size, predicted.branches.length, context);
}

/**
 * buildNode wires the node namespace to a pod (10.0.0.2, inside the cluster CIDR), to the outside
 * (203.0.113.2 and .130, behind the node's 203.0.113.1) and to one namespace per endpoint, each
 * reached by a host route and proxy ARP, as a CNI does. 192.168.0.2 is the node's InternalIP.
 */
async function buildNode(prefix: string, ns: {node: string; pod: string; outside: string}, endpointNs: (ip: string) => string) {
  const node = ns.node;
  const links = [
    `link add vpod netns ${node} type veth peer name eth0 netns ${ns.pod}`,
    `link add vout netns ${node} type veth peer name eth0 netns ${ns.outside}`,
    ...endpoints.map((ip, index) => `link add vep${index} netns ${node} type veth peer name eth0 netns ${endpointNs(ip)}`),
  ];
  await runIpBatch(`veths of ${prefix}`, links);
  await runIpBatch(
    `node ${node}`,
    [
      'link set lo up',
      'link set vpod up',
      'link set vout up',
      'addr add 10.0.0.1/24 dev vpod',
      'addr add 203.0.113.1/24 dev vout',
      'addr add 192.168.0.2/32 dev vout',
      // A default route, as every node has: packets the rules do not DNAT are forwarded, and meet filter FORWARD.
      'route add default dev vpod',
      ...endpoints.flatMap((ip, index) => [`link set vep${index} up`, `route add ${ip}/32 dev vep${index}`]),
    ],
    node,
  );
  await setSysctls(node, {
    'net.ipv4.ip_forward': 1,
    'net.ipv4.conf.all.rp_filter': 0,
    'net.ipv4.conf.default.rp_filter': 0,
    // Packets forwarded out the interface they came in on would teach the sender an ICMP redirect.
    'net.ipv4.conf.all.send_redirects': 0,
    'net.ipv4.conf.vpod.send_redirects': 0,
    'net.ipv4.conf.vout.send_redirects': 0,
    ...Object.fromEntries(endpoints.map((_, index) => [`net.ipv4.conf.vep${index}.proxy_arp`, 1])),
  });
  await runIpBatch(
    `pod ${ns.pod}`,
    ['link set lo up', 'link set eth0 up', `addr add ${pod}/24 dev eth0`, 'route add default via 10.0.0.1'],
    ns.pod,
  );
  await runIpBatch(
    `outside ${ns.outside}`,
    [
      'link set lo up',
      'link set eth0 up',
      `addr add ${allowedClient}/24 dev eth0`,
      `addr add ${blockedClient}/24 dev eth0`,
      'route add default via 203.0.113.1',
    ],
    ns.outside,
  );
  for (const ip of endpoints) {
    await runIpBatch(
      `endpoint ${ip}`,
      ['link set lo up', 'link set eth0 up', `addr add ${ip}/32 dev eth0`, 'route add default dev eth0'],
      endpointNs(ip),
    );
  }
}
