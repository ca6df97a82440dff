// Host sockets on service addresses: ss's listing read, the sockets that answer on kube-ipvs0's
// addresses today picked under the node's own rules (virtual servers, KUBE-IPVS-FILTER or its
// absence), and the sentences migrate-check prints for them.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {hostSocketSentences, parseListeningSockets, socketsOnServiceAddresses} from '../../../src/core/behaviour/index.ts';
import {renderIpvs, withJumpRules} from '../../../src/core/ipvs/index.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

// As iproute2 6.1 prints `ss -H -l -n -t -u -p` (columns padded with spaces).
const listing = [
  'udp   UNCONN 0      0         127.0.0.53%lo:53        0.0.0.0:*    users:(("systemd-resolve",pid=501,fd=13))',
  'udp   UNCONN 0      0               0.0.0.0:5353      0.0.0.0:*    users:(("avahi-daemon",pid=610,fd=12))',
  'tcp   LISTEN 0      4096            0.0.0.0:22        0.0.0.0:*    users:(("sshd",pid=812,fd=3),("systemd",pid=1,fd=50))',
  'tcp   LISTEN 0      4096               [::]:22           [::]:*    users:(("sshd",pid=812,fd=4))',
  'tcp   LISTEN 0      511                   *:8080            *:*    users:(("node",pid=900,fd=22))',
  'tcp   LISTEN 0      128           127.0.0.1:10248     0.0.0.0:*    users:(("kubelet",pid=700,fd=20))',
  'tcp   LISTEN 0      128          10.96.0.10:9100      0.0.0.0:*',
  'tcp   LISTEN 0      128    [::ffff:10.96.0.15]:9200         *:*',
  'tcp   LISTEN 0      128             0.0.0.0:80        0.0.0.0:*    users:(("nginx",pid=1200,fd=6))',
  'tcp   LISTEN 0      128      0.0.0.0%eth0:2222        0.0.0.0:*',
].join('\n');

const model = buildProxyModel(
  {
    services: [
      service('web', {clusterIP: '10.96.0.10'}),
      service('lb', {clusterIP: '10.96.0.15', type: 'LoadBalancer'}, {status: {loadBalancer: {ingress: [{ip: '203.0.113.15'}]}}}),
    ],
    endpointSlices: [
      slice('web-1', 'web', [{ip: '10.244.1.5', node: 'node-1'}]),
      slice('lb-1', 'lb', [{ip: '10.244.1.6', node: 'node-1'}]),
    ],
    node: node('node-1'),
  },
  {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
);

describe('parseListeningSockets', () => {
  it('reads address, port, protocol, bound device and the first process of each line', () => {
    const sockets = parseListeningSockets(listing);
    assert.deepEqual(
      sockets.map((socket) => [socket.protocol, socket.address, socket.port, socket.device ?? '', socket.process ?? '']),
      [
        ['UDP', '127.0.0.53', 53, 'lo', 'systemd-resolve, pid 501'],
        ['UDP', '0.0.0.0', 5353, '', 'avahi-daemon, pid 610'],
        ['TCP', '0.0.0.0', 22, '', 'sshd, pid 812'],
        ['TCP', '::', 22, '', 'sshd, pid 812'],
        ['TCP', '*', 8080, '', 'node, pid 900'],
        ['TCP', '127.0.0.1', 10248, '', 'kubelet, pid 700'],
        ['TCP', '10.96.0.10', 9100, '', ''],
        ['TCP', '10.96.0.15', 9200, '', ''],
        ['TCP', '0.0.0.0', 80, '', 'nginx, pid 1200'],
        ['TCP', '0.0.0.0', 2222, 'eth0', ''],
      ],
    );
    assert.deepEqual(parseListeningSockets('State Recv-Q\nnot a socket line\n'), []);
  });
});

describe('socketsOnServiceAddresses', () => {
  const sockets = parseListeningSockets(listing);
  const rendered = renderIpvs(model);
  // A node of kube-proxy before kubernetes#108460: no KUBE-IPVS-FILTER, and no jump to it.
  const older = {...rendered, iptables: withJumpRules(rendered.iptables).replace(/^-A INPUT .*-j KUBE-IPVS-FILTER\n/m, '')};

  it('without KUBE-IPVS-FILTER: wildcard sockets answer on every service address, except where a virtual server takes the port', () => {
    assert.deepEqual(older.boundAddresses, ['10.96.0.10', '10.96.0.15', '203.0.113.15']);
    const found = socketsOnServiceAddresses([older], sockets);
    assert.deepEqual(
      found.answering.map(({socket, addresses}) => [`${socket.address}:${socket.port}/${socket.protocol}`, addresses]),
      [
        ['0.0.0.0:5353/UDP', ['10.96.0.10', '10.96.0.15', '203.0.113.15']],
        ['0.0.0.0:22/TCP', ['10.96.0.10', '10.96.0.15', '203.0.113.15']],
        ['*:8080/TCP', ['10.96.0.10', '10.96.0.15', '203.0.113.15']],
        ['10.96.0.10:9100/TCP', ['10.96.0.10']],
        ['10.96.0.15:9200/TCP', ['10.96.0.15']],
      ],
      // Not: 127.0.0.x (no service address), [::]:22 (IPv6 only), 0.0.0.0:80 (every service's port 80 is a virtual server), %eth0.
    );
    assert.equal(found.filtered, false);
    assert.deepEqual(
      found.deviceBound.map((socket) => socket.port),
      [53, 2222],
    );
    const sentences = hostSocketSentences(found, older.boundAddresses.length, 'nftables');
    assert.equal(
      sentences[1],
      'host socket 0.0.0.0:22/TCP (sshd, pid 812) answers on 10.96.0.10, 10.96.0.15, 203.0.113.15 today, only because ipvs mode binds those ' +
        'addresses to kube-ipvs0; after the switch to nftables mode it would not',
    );
    assert.equal(
      sentences[3],
      'host socket 10.96.0.10:9100/TCP answers on 10.96.0.10 today, only because ipvs mode binds that address to kube-ipvs0; after the switch to ' +
        'nftables mode it would not',
    );
  });

  it("with the node's KUBE-IPVS-FILTER: none answers, and the sentence says why", () => {
    const found = socketsOnServiceAddresses([rendered], sockets);
    assert.deepEqual(found.answering, []);
    assert.equal(found.filtered, true);
    assert.deepEqual(hostSocketSentences(found, 3, 'iptables'), [
      "no host socket answers on the 3 service addresses bound to kube-ipvs0 (the node's KUBE-IPVS-FILTER refuses new connections on ports no " +
        'service uses): nothing that answers there today stops answering after the switch',
    ]);
  });

  it('many addresses are counted, not listed', () => {
    const many = {...older, boundAddresses: ['10.96.0.1', '10.96.0.2', '10.96.0.3', '10.96.0.4', '10.96.0.5']};
    const [sentence] = hostSocketSentences(socketsOnServiceAddresses([many], parseListeningSockets(listing.split('\n')[2])), 5, 'nftables');
    assert.match(sentence, /answers on 10\.96\.0\.1, 10\.96\.0\.2, 10\.96\.0\.3 and 2 more service addresses today/);
  });
});
