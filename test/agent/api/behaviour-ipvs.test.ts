// The agent's behaviour method switching to nftables mode: on an ipvs node, and on an iptables node. This kernel has no
// IP_VS, so the node is a recording host holding a kube-proxy ipvs state (older kube-proxy: no
// KUBE-IPVS-FILTER) and listing one sshd on 0.0.0.0:22; the ipvs backend, the diff and the evidence
// are the agent's own. test/agent/host-socket-evidence.test.ts reads real sockets in a namespace.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {answerBehaviour} from '../../../src/agent/api/methods/behaviour.ts';
import {iptablesBackend} from '../../../src/agent/api/rules/iptables.ts';
import {ipvsRulesBackend} from '../../../src/agent/api/rules/ipvs.ts';
import type {RuntimeState} from '../../../src/agent/api/runtime-state.ts';
import {packetClasses} from '../../../src/core/behaviour/index.ts';
import {renderIpvs, withJumpRules} from '../../../src/core/ipvs/index.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {node, service, slice} from '../../core/model/cluster-objects.ts';
import {RecordingHost} from '../recording-host.ts';

const nodeIP = '10.240.0.11';
const model = buildProxyModel(
  {
    services: [
      service('web', {
        clusterIP: '10.96.0.10',
        type: 'NodePort',
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
      }),
      service('lb', {clusterIP: '10.96.0.15', type: 'LoadBalancer'}, {status: {loadBalancer: {ingress: [{ip: '203.0.113.15'}]}}}),
    ],
    endpointSlices: [
      slice('web-1', 'web', [{ip: '10.244.1.5', node: 'node-1'}]),
      slice('lb-1', 'lb', [{ip: '10.244.1.6', node: 'node-1'}]),
    ],
    node: node('node-1', {addresses: [{type: 'InternalIP', address: nodeIP}]}),
  },
  {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
);

test('behaviour --to nftables on an ipvs node: kube-ipvs0 addresses are no node addresses; host sockets and ARP are the evidence', async () => {
  const rendered = renderIpvs(model);
  // As a node of kube-proxy before kubernetes#108460 holds it: the jumps, but no KUBE-IPVS-FILTER.
  const applied = {...rendered, iptables: withJumpRules(rendered.iptables).replace(/^-A INPUT .*-j KUBE-IPVS-FILTER\n/m, '')};
  const host = new RecordingHost();
  host.sockets = 'tcp   LISTEN 0      4096       0.0.0.0:22      0.0.0.0:*    users:(("sshd",pid=812,fd=3))\n';
  host.sysctls.set('net/ipv4/conf/all/arp_ignore', '0');
  host.sysctls.set('net/ipv4/conf/all/arp_announce', '0');
  const state = {
    nodeName: 'node-1',
    families: ['IPv4'],
    host,
    backend: ipvsRulesBackend(),
    models: () => [['IPv4', model]],
    // `ip address show` lists kube-ipvs0's addresses with the node's own.
    localAddresses: async () => [nodeIP, ...applied.boundAddresses],
    readApplied: async () => ({family: 'IPv4', text: '', rules: applied, readAt: 0}),
  } as unknown as RuntimeState;

  const answer = await answerBehaviour(state, {to: 'nftables'}, ['10.96.0.0/16']);
  assert.equal(answer.diff.before, 'ipvs mode (applied)');
  assert.equal(
    answer.diff.summary.classes,
    packetClasses(model, {nodeAddresses: [nodeIP], serviceCIDRs: ['10.96.0.0/16']}).length,
    'no NodePort classes on ClusterIPs or load-balancer IPs',
  );
  const sentences = answer.diff.groups.flatMap((group) => group.changes.map((change) => change.class.target));
  assert.ok(!sentences.some((target) => /NodePort .* on (10\.96|203\.0\.113)\./.test(target)), sentences.join('\n'));
  assert.deepEqual(answer.evidence, [
    'host socket 0.0.0.0:22/TCP (sshd, pid 812) answers on 10.96.0.10, 10.96.0.15, 203.0.113.15 today, only because ipvs mode binds those ' +
      'addresses to kube-ipvs0; after the switch to nftables mode it would not',
    'arp_ignore=0 and arp_announce=0 (no strictARP): the node answers ARP for the 1 load-balancer IPs bound to kube-ipvs0 today, and would not ' +
      'after the switch',
  ]);
  assert.ok(host.calls.includes('ss -l'));
});

test("behaviour --to nftables on an iptables node: kube-proxy's nfacct counters are the evidence", async () => {
  const host = new RecordingHost();
  host.sysctls.set('kernel.osrelease', '6.1.0-40-amd64\n');
  host.nfacctObjects!.set('localhost_nps_accepted_pkts', 7);
  host.nfacctObjects!.set('ct_state_invalid_dropped_pkts', 0);
  const backend = iptablesBackend;
  const state = {
    nodeName: 'node-1',
    families: ['IPv4'],
    host,
    backend,
    models: () => [['IPv4', model]],
    localAddresses: async () => [nodeIP],
    readApplied: async () => ({family: 'IPv4', text: '', rules: backend.parse(backend.render(model)), readAt: 0}),
  } as unknown as RuntimeState;
  const answer = await answerBehaviour(state, {to: 'nftables'}, ['10.96.0.0/16']);
  assert.deepEqual(answer.evidence.slice(0, 2), [
    // nftables mode does not answer NodePorts on 127.0.0.1, which iptables mode does.
    '7 packets reached NodePorts on 127.0.0.1 so far (nfacct localhost_nps_accepted_pkts): something on the node uses them, ' +
      'and they stop answering after the switch',
    '0 packets conntrack marked INVALID were dropped so far (nfacct ct_state_invalid_dropped_pkts)',
  ]);
  // A counter the node does not have gives no evidence, rather than a false 0.
  host.nfacctObjects!.delete('localhost_nps_accepted_pkts');
  const without = await answerBehaviour(state, {to: 'nftables'}, ['10.96.0.0/16']);
  assert.ok(!without.evidence.some((line) => line.includes('localhost_nps_accepted_pkts')));
});
