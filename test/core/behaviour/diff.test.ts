// Behaviour diff over rulesets rendered from one small model in two modes: the classes whose fate
// changes are the mode differences kube-proxy documents, and nothing else changes.
// kube-proxy's facts behind the rows: nftables mode defaults nodePortAddresses to the primary node
// IP (pkg/proxy/nftables Backend.Init); localhost NodePorts exist only in iptables mode for IPv4
// (KubeProxyIPTablesConfiguration.localhostNodePorts); nftables mode rejects undefined ports of
// ClusterIPs and drops unallocated service-CIDR addresses (cluster-ips-check); ipvs mode binds
// service addresses to the kube-ipvs0 dummy device; only iptables mode drops conntrack-INVALID
// forwarded packets (kubeproxy_iptables_ct_state_invalid_dropped_packets_total).
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {
  behaviourSide,
  changeSentence,
  diffBehaviour,
  packetClasses,
  sentenceGroups,
  type BehaviourChange,
  type BehaviourDiff,
} from '../../../src/core/behaviour/index.ts';
import {parseIptablesSave, renderIptables} from '../../../src/core/iptables/index.ts';
import {renderIpvs, withJumpRules} from '../../../src/core/ipvs/index.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {parseNftablesScript, renderNftables} from '../../../src/core/nftables/index.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

const primary = '10.240.0.11';
const secondary = '10.0.3.12';
const serviceCIDR = '10.96.0.0/16';
const httpPort = (nodePort: number) => [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort}];
const services = [
  service('web', {clusterIP: '10.96.0.10', type: 'NodePort', ports: httpPort(30080)}),
  service(
    'lb',
    {clusterIP: '10.96.0.15', type: 'LoadBalancer', loadBalancerSourceRanges: ['192.0.2.0/24'], ports: httpPort(30015)},
    {status: {loadBalancer: {ingress: [{ip: '203.0.113.15'}]}}},
  ),
  service('sticky', {clusterIP: '10.96.0.17', sessionAffinity: 'ClientIP'}),
  service('empty', {clusterIP: '10.96.0.18'}),
];
const slices = [
  slice('web-1', 'web', [
    {ip: '10.244.1.5', node: 'node-1'},
    {ip: '10.244.2.5', node: 'node-2'},
  ]),
  slice('lb-1', 'lb', [{ip: '10.244.2.15', node: 'node-2'}]),
  slice('sticky-1', 'sticky', [{ip: '10.244.2.17', node: 'node-2'}]),
];
const model = buildProxyModel(
  {
    services,
    endpointSlices: slices,
    node: node('node-1', {
      addresses: [
        {type: 'InternalIP', address: primary},
        {type: 'InternalIP', address: secondary},
      ],
    }),
  },
  {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
);
const nodeAddresses = [primary, secondary];
const sides = {
  iptables: () => behaviourSide({mode: 'iptables', rules: parseIptablesSave(renderIptables(model, {includeJumps: true}))}, nodeAddresses),
  nftables: () =>
    behaviourSide({mode: 'nftables', rules: parseNftablesScript(renderNftables(model, {serviceCIDRs: [serviceCIDR]}))}, nodeAddresses),
  ipvs: () => behaviourSide({mode: 'ipvs', rules: renderIpvs(model)}, nodeAddresses),
};
const classes = packetClasses(model, {serviceCIDRs: [serviceCIDR]});

function changes(diff: BehaviourDiff): BehaviourChange[] {
  return diff.groups.flatMap((group) => group.changes);
}

/** "entry target source: before -> after", one line per changed class, sorted. */
function rows(diff: BehaviourDiff): string[] {
  const fate = (outcome: BehaviourChange['before']) => (outcome.verdict === 'ACCEPT' ? `ACCEPT(${outcome.deliveredTo})` : outcome.verdict);
  return changes(diff)
    .map(
      (change) =>
        `${change.class.entry} ${change.class.packet.dstIP}:${change.class.packet.dstPort} ${change.class.source}: ${fate(change.before)} -> ${fate(change.after)}`,
    )
    .sort();
}

describe('packetClasses', () => {
  it('lists every entry point of every service port, from every source', () => {
    const web = classes.filter((entry) => entry.servicePort === 'default/web:http');
    const targets = new Set(web.map((entry) => `${entry.entry} ${entry.packet.dstIP}:${entry.packet.dstPort}`));
    assert.deepEqual([...targets].sort(), [
      'cluster-ip 10.96.0.10:80',
      'cluster-ip-undefined-port 10.96.0.10:65535',
      `node-port ${secondary}:30080`,
      `node-port ${primary}:30080`,
      'node-port-loopback 127.0.0.1:30080',
    ]);
    const sources = new Set(web.filter((entry) => entry.entry === 'cluster-ip').map((entry) => entry.source));
    assert.deepEqual([...sources].sort(), ['external', 'node', 'pod-here']);
    const nodePortSources = new Set(web.filter((entry) => entry.entry === 'node-port').map((entry) => entry.source));
    assert.deepEqual([...nodePortSources].sort(), ['external', 'node', 'pod-elsewhere', 'pod-here']);
    const lb = classes.filter((entry) => entry.entry === 'load-balancer').map((entry) => `${entry.source} ${entry.packet.srcIP}`);
    assert.ok(lb.includes('external-allowed 192.0.2.1'), lb.join(', '));
    assert.ok(lb.some((entry) => entry.startsWith('external-denied ')));
    assert.ok(classes.some((entry) => entry.entry === 'service-cidr-unused' && entry.packet.dstIP === '10.96.255.254'));
    assert.ok(classes.some((entry) => entry.entry === 'conntrack-invalid' && entry.packet.conntrack === 'invalid'));
  });

  it('limits the classes to one service', () => {
    const only = packetClasses(model, {serviceCIDRs: [serviceCIDR], service: 'default/lb'});
    assert.ok(only.length > 0);
    assert.deepEqual([...new Set(only.map((entry) => entry.servicePort))], ['default/lb:http']);
  });
});

describe('diffBehaviour', () => {
  it('finds no change between a ruleset and itself', () => {
    const diff = diffBehaviour(classes, sides.iptables(), sides.iptables());
    assert.equal(diff.equal, true);
    assert.equal(diff.summary.changedClasses, 0);
    assert.equal(diff.summary.classes, classes.length);
  });

  it('iptables to nftables: non-primary and loopback NodePorts stop answering; undefined ports, unused service addresses and INVALID packets change', () => {
    const diff = diffBehaviour(classes, sides.iptables(), sides.nftables());
    const expected = [
      ...['web', 'lb'].flatMap((name) => {
        const [clusterIP, nodePort] = name === 'web' ? ['10.96.0.10', 30080] : ['10.96.0.15', 30015];
        return [
          ...['node', 'pod-here'].map((source) => `cluster-ip-undefined-port ${clusterIP}:65535 ${source}: ACCEPT(onward) -> REJECT`),
          ...['external', 'node', 'pod-elsewhere', 'pod-here'].map(
            (source) => `node-port ${secondary}:${nodePort} ${source}: DNAT -> ACCEPT(node)`,
          ),
          `node-port-loopback 127.0.0.1:${nodePort} node: DNAT -> ACCEPT(node)`,
        ];
      }),
      ...['sticky', 'empty'].flatMap((name) =>
        ['node', 'pod-here'].map(
          (source) =>
            `cluster-ip-undefined-port ${name === 'sticky' ? '10.96.0.17' : '10.96.0.18'}:65535 ${source}: ACCEPT(onward) -> REJECT`,
        ),
      ),
      ...['node', 'pod-here'].map((source) => `service-cidr-unused 10.96.255.254:80 ${source}: ACCEPT(onward) -> DROP`),
      'conntrack-invalid 10.244.2.15:8080 pod-here: DROP -> ACCEPT(onward)',
    ].sort();
    assert.deepEqual(rows(diff), expected);
    // Everything else, ClusterIPs, the primary NodePort, load-balancer source ranges, affinity, keeps its fate.
    assert.equal(diff.summary.stopAnswering, 10);
    assert.equal(diff.summary.startAnswering, 0);
    assert.equal(diff.summary.changedServicePorts, 4);
  });

  it('ipvs to nftables: non-primary NodePorts stop answering; undefined ClusterIP ports are refused in both', () => {
    const diff = diffBehaviour(classes, sides.ipvs(), sides.nftables());
    const found = rows(diff);
    // KUBE-IPVS-FILTER (kubernetes#108460) refuses them today; nftables mode's reject after.
    assert.ok(!found.some((row) => row.startsWith('cluster-ip-undefined-port ')), found.join('\n'));
    assert.ok(found.includes(`node-port ${secondary}:30080 external: DNAT -> ACCEPT(node)`), found.join('\n'));
    assert.ok(!found.some((row) => row.startsWith('node-port-loopback')), 'neither mode answers NodePorts on 127.0.0.1');
    assert.ok(!found.some((row) => row.startsWith('cluster-ip ')), 'ClusterIPs behave alike');
  });

  it('ipvs of a kube-proxy without KUBE-IPVS-FILTER to nftables: kube-ipvs0 answers undefined ClusterIP ports today', () => {
    const rendered = renderIpvs(model);
    const withoutFilter = {...rendered, iptables: withJumpRules(rendered.iptables).replace(/^-A INPUT .*-j KUBE-IPVS-FILTER\n/m, '')};
    const found = rows(diffBehaviour(classes, behaviourSide({mode: 'ipvs', rules: withoutFilter}, nodeAddresses), sides.nftables()));
    assert.ok(found.includes('cluster-ip-undefined-port 10.96.0.10:65535 pod-here: ACCEPT(node) -> REJECT'), found.join('\n'));
  });

  it('ipvs to iptables: loopback NodePorts start answering; service addresses leave the node', () => {
    const found = rows(diffBehaviour(classes, sides.ipvs(), sides.iptables()));
    assert.ok(found.includes('node-port-loopback 127.0.0.1:30080 node: ACCEPT(node) -> DNAT'), found.join('\n'));
    assert.ok(found.includes('cluster-ip-undefined-port 10.96.0.10:65535 node: REJECT -> ACCEPT(onward)'), found.join('\n'));
    assert.ok(!found.some((row) => row.startsWith('node-port ')), 'ipvs and iptables both serve NodePorts on every node address');
  });

  it('says each change in a plain sentence, sources of the same change together', () => {
    const diff = diffBehaviour(classes, sides.iptables(), sides.nftables());
    const web = diff.groups.find((group) => group.servicePort === 'default/web:http')!;
    const sentences = sentenceGroups(web).map((group) => changeSentence(group, {before: 'today', after: 'after the switch'}));
    assert.ok(
      sentences.includes(
        `NodePort 30080/TCP on ${secondary}, which is not a primary node IP, from a pod on this node, a pod on another node, the node itself and a client outside the cluster, answers today and would not after the switch: today it is sent to 10.244.1.5:8080 (50%), 10.244.2.5:8080 (50%), masqueraded; after the switch it reaches the node itself untouched, where only a host socket on that address and port would answer.`,
      ),
      sentences.join('\n'),
    );
  });
});

describe('externalTrafficPolicy Local', () => {
  const local = buildProxyModel(
    {
      services: [
        service(
          'local-lb',
          {
            clusterIP: '10.96.0.20',
            type: 'LoadBalancer',
            externalTrafficPolicy: 'Local',
            healthCheckNodePort: 32000,
            ports: httpPort(30020),
          },
          {status: {loadBalancer: {ingress: [{ip: '203.0.113.20'}]}}},
        ),
      ],
      endpointSlices: [slice('local-lb-1', 'local-lb', [{ip: '10.244.2.20', node: 'node-2'}])],
      node: node('node-1', {addresses: [{type: 'InternalIP', address: primary}]}),
    },
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
  );
  const localClasses = packetClasses(local, {serviceCIDRs: [serviceCIDR]});
  const side = (mode: 'iptables' | 'nftables') =>
    mode === 'iptables'
      ? behaviourSide({mode, rules: parseIptablesSave(renderIptables(local, {includeJumps: true}))}, [primary])
      : behaviourSide({mode, rules: parseNftablesScript(renderNftables(local, {serviceCIDRs: [serviceCIDR]}))}, [primary]);

  it('outside clients of a node without a local endpoint are dropped in both modes; the health check port reaches the node', () => {
    const iptables = side('iptables');
    const nftables = side('nftables');
    const health = localClasses.find((entry) => entry.entry === 'health-check-node-port');
    assert.ok(health, 'the health check port is a class');
    assert.equal(health.packet.dstPort, 32000);
    const external = localClasses.find((entry) => entry.entry === 'load-balancer' && entry.source === 'external');
    assert.ok(external);
    for (const ruleset of [iptables, nftables]) {
      assert.equal(ruleset.trace(external.packet).verdict, 'DROP', `${ruleset.label}: no local endpoint, external traffic dropped`);
      assert.equal(ruleset.trace(health.packet).verdict, 'ACCEPT', `${ruleset.label}: health check port left to the node`);
    }
    const changed = rows(diffBehaviour(localClasses, iptables, nftables));
    // The node's own connection to the load-balancer IP is a case apart (short-circuited to the
    // cluster endpoints), left out here.
    const externalRow = (row: string) => row.startsWith('load-balancer ') && !row.includes(' node: ');
    assert.ok(!changed.some((row) => externalRow(row) || row.startsWith('health-check')), changed.join('\n'));
  });
});
