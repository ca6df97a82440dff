// traceIptables over a node's iptables-save dump (kube-proxy's rules beside Docker's and flannel's):
// the path, the endpoints and their odds, masquerade, REJECT / DROP / ACCEPT, and what it says.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {test} from 'node:test';
import {parseIptablesSave} from '../../../src/core/iptables/parse.ts';
import {traceIptables} from '../../../src/core/iptables/trace.ts';
import type {Packet, TraceHop, TraceResult} from '../../../src/core/trace/types.ts';

const dump = (name: string) => readFileSync(new URL(`./dumps/${name}`, import.meta.url), 'utf8');

// node-a: 10.0.0.11 on eth0, pods 10.244.1.0/24 behind cni0 (gateway 10.244.1.1), docker0 172.17.0.1.
const nodeA = {legacy: parseIptablesSave(dump('node-a.legacy.txt')), nft: parseIptablesSave(dump('node-a.nft.txt'))};
const localAddresses = ['10.0.0.11', '10.244.1.1', '172.17.0.1'];
const pod = {srcIP: '10.244.1.20', inInterface: 'cni0'};
const outsider = {srcIP: '198.51.100.7', inInterface: 'eth0'};

function trace(packet: Partial<Packet> & Pick<Packet, 'dstIP' | 'dstPort'>, ruleset = nodeA.legacy): TraceResult {
  return traceIptables(ruleset, {srcIP: pod.srcIP, protocol: 'TCP', origin: 'arriving', ...packet}, {localAddresses});
}

const allHops = (result: TraceResult): TraceHop[] => [...result.hops, ...result.branches.flatMap((branch) => branch.hops)];
const path = (hops: TraceHop[]) => hops.map((hop) => `${hop.table} ${hop.chain} -> ${hop.target}`);
const endpoints = (result: TraceResult) =>
  Object.fromEntries(result.branches.map((branch) => [branch.endpoint, Number(branch.probability.toFixed(6))]));

function assertExplained(result: TraceResult): void {
  for (const hop of allHops(result)) {
    assert.match(hop.explanation, /^[A-Za-z0-9].*\.$/, `hop ${hop.table} ${hop.chain} -> ${hop.target}: "${hop.explanation}"`);
    assert.doesNotMatch(hop.explanation, /undefined|NaN|\[object/, hop.explanation);
  }
}

/** The warnings besides those every forwarded packet gets on this node: Docker's `-o docker0` rule, the nf_tables dump's note. */
const warningsBesidesDocker = (result: TraceResult) =>
  result.warnings.filter((warning) => !warning.includes('-o docker0') && !warning.startsWith('the dump says'));

test("pod -> ClusterIP with 3 endpoints: three branches with kube-proxy's odds, source kept", () => {
  for (const [frontEnd, ruleset] of Object.entries(nodeA)) {
    const result = trace({...pod, dstIP: '10.96.0.10', dstPort: 80}, ruleset);
    assert.equal(result.verdict, 'DNAT', frontEnd);
    assert.equal(result.servicePort, 'default/web:http');
    // kube-proxy writes 0.3333333333; the kernel keeps it in 31 bits and iptables-save prints 0.33333333349.
    const first = 0.33333333349;
    assert.deepEqual(
      result.branches.map((branch) => branch.endpoint),
      ['10.244.1.5:8080', '10.244.1.6:8080', '10.244.2.5:8080'],
    );
    assert.deepEqual(
      result.branches.map((branch) => branch.probability),
      [first, (1 - first) * 0.5, (1 - first) * 0.5],
    );
    assert.ok(Math.abs(result.branches.reduce((sum, branch) => sum + branch.probability, 0) - 1) < 1e-12);
    assert.deepEqual(path(result.hops), ['nat PREROUTING -> KUBE-SERVICES', 'nat KUBE-SERVICES -> KUBE-SVC-CDGGSHYLG3RE2FKL']);
    for (const branch of result.branches) {
      assert.equal(branch.masquerade, false);
      assert.match(branch.masqueradeReason, /^not masqueraded: .* the endpoint sees the client's own address 10\.244\.1\.20$/);
      // Each branch starts where the paths split: the service chain's pick of this endpoint.
      assert.equal(branch.hops[0].chain, 'KUBE-SVC-CDGGSHYLG3RE2FKL');
      assert.match(branch.hops[0].target, /^KUBE-SEP-/);
      assert.match(branch.hops[0].explanation, new RegExp(`endpoint ${branch.endpoint.replace(/\./g, '\\.')} of default/web:http`));
      const dnat = branch.hops.find((hop) => hop.target === 'DNAT')!;
      assert.ok(dnat.rule.endsWith(`--to-destination ${branch.endpoint}`), dnat.rule);
      assert.equal(dnat.hook, 'PREROUTING');
      // After DNAT the packet is routed on (FORWARD) and accepted by flannel's rule, then leaves by POSTROUTING.
      assert.ok(
        branch.hops.some((hop) => hop.hook === 'FORWARD' && hop.target === 'ACCEPT'),
        path(branch.hops).join('\n'),
      );
      assert.ok(branch.hops.some((hop) => hop.hook === 'POSTROUTING' && hop.chain === 'KUBE-POSTROUTING' && hop.target === 'RETURN'));
    }
    assert.match(result.branches[0].hops[0].explanation, /random draw .*33\.3% of the connections reaching this rule, 33\.3% of all/);
    assert.match(result.branches[2].hops[0].explanation, /^Every connection that reaches this rule goes to endpoint 10\.244\.2\.5:8080/);
    assert.deepEqual(warningsBesidesDocker(result), []);
    assertExplained(result);
  }
});

test('from outside the cluster CIDR: marked for masquerade, and why', () => {
  const result = trace({...outsider, dstIP: '10.96.0.10', dstPort: 80});
  assert.equal(result.verdict, 'DNAT');
  assert.ok(path(result.hops).includes('nat KUBE-SVC-CDGGSHYLG3RE2FKL -> KUBE-MARK-MASQ'));
  assert.ok(path(result.hops).includes('nat KUBE-MARK-MASQ -> MARK'));
  for (const branch of result.branches) {
    assert.equal(branch.masquerade, true);
    assert.equal(
      branch.masqueradeReason,
      'marked for masquerade by KUBE-MARK-MASQ because the source 198.51.100.7 is outside the cluster CIDR 10.244.0.0/16',
    );
    assert.deepEqual(path(branch.hops.filter((hop) => hop.hook === 'POSTROUTING')), [
      'nat POSTROUTING -> KUBE-POSTROUTING',
      'nat KUBE-POSTROUTING -> MARK',
      'nat KUBE-POSTROUTING -> MASQUERADE',
    ]);
    // The masquerade mark is what KUBE-FORWARD accepts forwarded service traffic by.
    assert.ok(path(branch.hops).includes('filter KUBE-FORWARD -> ACCEPT'));
  }
  assertExplained(result);
});

test('NodePort, externalTrafficPolicy Cluster: masqueraded to an endpoint on another node', () => {
  const result = trace({...outsider, dstIP: '10.0.0.11', dstPort: 30080});
  assert.equal(result.verdict, 'DNAT');
  assert.equal(result.servicePort, 'default/np-cluster:http');
  assert.deepEqual(endpoints(result), {'10.244.2.8:8080': 1});
  assert.ok(path(result.hops).includes('nat KUBE-SERVICES -> KUBE-NODEPORTS'));
  assert.equal(result.branches[0].masquerade, true);
  assert.match(result.branches[0].masqueradeReason, /external address of default\/np-cluster:http .* externalTrafficPolicy is Cluster/);
  assertExplained(result);
});

test("NodePort, externalTrafficPolicy Local: only this node's endpoint, client address kept", () => {
  const result = trace({...outsider, dstIP: '10.0.0.11', dstPort: 30081});
  assert.equal(result.verdict, 'DNAT');
  assert.deepEqual(endpoints(result), {'10.244.1.9:8080': 1});
  assert.ok(
    path(result.hops).some((hop) => /-> KUBE-SVL-/.test(hop)),
    path(result.hops).join('\n'),
  );
  assert.equal(result.branches[0].masquerade, false);
  // A pod using the node port is treated like cluster traffic: every endpoint.
  const fromPod = trace({...pod, dstIP: '10.0.0.11', dstPort: 30081});
  assert.deepEqual(endpoints(fromPod), {'10.244.1.9:8080': 0.5, '10.244.2.9:8080': 0.5});
  assert.ok(fromPod.hops.some((hop) => /^The source 10\.244\.1\.20 is a pod/.test(hop.explanation)));
});

test('externalTrafficPolicy Local without a local endpoint: dropped, with a warning', () => {
  const result = trace({...outsider, dstIP: '10.0.0.11', dstPort: 30082});
  assert.equal(result.verdict, 'DROP');
  assert.deepEqual(result.branches, []);
  assert.equal(result.servicePort, 'default/np-nolocal:http');
  const last = result.hops[result.hops.length - 1];
  assert.deepEqual([last.hook, last.table, last.chain, last.target], ['INPUT', 'filter', 'KUBE-EXTERNAL-SERVICES', 'DROP']);
  assert.match(
    last.explanation,
    /^default\/np-nolocal:http has externalTrafficPolicy Local and no endpoint on this node, so the packet to 10\.0\.0\.11:30082\/TCP is dropped\.$/,
  );
  assert.deepEqual(result.warnings, [
    'default/np-nolocal:http has a Local traffic policy and no endpoint on this node: the traffic that policy covers is dropped here',
  ]);
});

test('a service without endpoints: refused at once, with a warning', () => {
  const result = trace({...pod, dstIP: '10.96.0.12', dstPort: 80});
  assert.equal(result.verdict, 'REJECT');
  assert.equal(result.servicePort, 'default/empty:http');
  assert.deepEqual(path(result.hops), [
    'nat PREROUTING -> KUBE-SERVICES',
    'filter FORWARD -> KUBE-PROXY-FIREWALL',
    'filter FORWARD -> KUBE-FORWARD',
    'filter FORWARD -> KUBE-SERVICES',
    'filter KUBE-SERVICES -> REJECT',
  ]);
  assert.match(
    result.hops[4].explanation,
    /^default\/empty:http has no endpoints, so the connection to 10\.96\.0\.12:80\/TCP is refused at once \(REJECT with icmp-port-unreachable\)\.$/,
  );
  assert.deepEqual(result.warnings, ['default/empty:http has no endpoints: connections to it are refused']);
});

test('externalIPs: traffic from outside reaches the endpoint, masqueraded', () => {
  const result = trace({...outsider, dstIP: '192.0.2.20', dstPort: 80});
  assert.equal(result.verdict, 'DNAT');
  assert.equal(result.servicePort, 'default/ext:http');
  assert.deepEqual(endpoints(result), {'10.244.2.11:8080': 1});
  assert.match(result.hops[1].explanation, /^192\.0\.2\.20:80\/TCP is an external IP of default\/ext:http/);
  assert.equal(result.branches[0].masquerade, true);
});

test('load-balancer IP: a client in loadBalancerSourceRanges gets through, others are dropped', () => {
  const allowed = trace({...outsider, dstIP: '203.0.113.30', dstPort: 80});
  assert.equal(allowed.verdict, 'DNAT');
  assert.deepEqual(endpoints(allowed), {'10.244.1.12:8080': 0.5, '10.244.2.12:8080': 0.5});
  assert.ok(
    allowed.hops.some((hop) => /inside 198\.51\.100\.0\/24, one of the loadBalancerSourceRanges of default\/lb:http/.test(hop.explanation)),
  );
  for (const branch of allowed.branches) assert.equal(branch.masquerade, true);

  const blocked = trace({srcIP: '192.0.2.99', inInterface: 'eth0', dstIP: '203.0.113.30', dstPort: 80});
  assert.equal(blocked.verdict, 'DROP');
  assert.deepEqual(path(blocked.hops), [
    'nat PREROUTING -> KUBE-SERVICES',
    'nat KUBE-SERVICES -> KUBE-FW-JSLCNGWSGB5JPS5Q',
    'nat KUBE-FW-JSLCNGWSGB5JPS5Q -> (none)',
    'filter FORWARD -> KUBE-PROXY-FIREWALL',
    'filter KUBE-PROXY-FIREWALL -> DROP',
  ]);
  assert.match(
    blocked.hops[4].explanation,
    /did not let its source 192\.0\.2\.99 through \(it is not in loadBalancerSourceRanges\), so it is dropped\.$/,
  );
});

test('hairpin: a pod reaching itself through its service is masqueraded', () => {
  const result = trace({srcIP: '10.244.1.13', inInterface: 'cni0', dstIP: '10.96.0.25', dstPort: 80});
  assert.deepEqual(endpoints(result), {'10.244.1.13:8080': 1});
  assert.equal(result.branches[0].masquerade, true);
  assert.equal(
    result.branches[0].masqueradeReason,
    'marked for masquerade by KUBE-MARK-MASQ because the source 10.244.1.13 is the endpoint itself (hairpin: a pod reaching itself through its service)',
  );
});

test('session affinity: a first connection is spread, and the trace says later ones stick', () => {
  const result = trace({...pod, dstIP: '10.96.0.11', dstPort: 80});
  assert.deepEqual(endpoints(result), {'10.244.1.5:8080': 0.5, '10.244.2.5:8080': 0.5});
  const dnat = result.branches[0].hops.find((hop) => hop.target === 'DNAT')!;
  assert.match(
    dnat.explanation,
    /records the client 10\.244\.1\.20 in the list KUBE-SEP-\w+, so its next connections within 600 s go to the same endpoint \(session affinity\)/,
  );
  assert.ok(
    result.warnings.some((warning) =>
      /^default\/sticky:http has session affinity \(ClientIP\): this trace shows a client's first connection/.test(warning),
    ),
    result.warnings.join('\n'),
  );
});

test('UDP and TCP on the same address and port belong to different service ports', () => {
  const udp = trace({...pod, dstIP: '10.96.0.53', dstPort: 53, protocol: 'UDP'});
  assert.equal(udp.servicePort, 'kube-system/kube-dns:dns');
  assert.deepEqual(endpoints(udp), {'10.244.1.7:53': 0.5, '10.244.2.7:53': 0.5});
  const tcp = trace({...pod, dstIP: '10.96.0.53', dstPort: 53, protocol: 'TCP'});
  assert.equal(tcp.servicePort, 'kube-system/kube-dns:dns-tcp');
  assert.equal(tcp.verdict, 'DNAT');
});

test('a packet the node sends itself goes through OUTPUT and is masqueraded', () => {
  const result = trace({srcIP: '10.0.0.11', dstIP: '10.96.0.10', dstPort: 80, origin: 'local', inInterface: undefined});
  assert.equal(result.verdict, 'DNAT');
  assert.deepEqual(path(result.hops).slice(0, 2), ['nat OUTPUT -> KUBE-SERVICES', 'nat KUBE-SERVICES -> KUBE-SVC-CDGGSHYLG3RE2FKL']);
  for (const hop of allHops(result)) assert.ok(hop.hook === 'OUTPUT' || hop.hook === 'POSTROUTING', `${hop.hook} ${hop.chain}`);
  for (const branch of result.branches) {
    assert.equal(branch.masquerade, true);
    assert.match(branch.masqueradeReason, /source 10\.0\.0\.11 is outside the cluster CIDR/);
  }
  // Its own node port with the Local policy: the node may use every endpoint, masqueraded.
  const nodePort = trace({srcIP: '10.0.0.11', dstIP: '10.0.0.11', dstPort: 30081, origin: 'local'});
  assert.deepEqual(endpoints(nodePort), {'10.244.1.9:8080': 0.5, '10.244.2.9:8080': 0.5});
  assert.match(nodePort.branches[0].masqueradeReason, /the node itself sent the packet to an external address of default\/np-local:http/);
});

test('a packet to no service is left alone (ACCEPT) and the trace shows no rewrite', () => {
  const result = trace({...pod, dstIP: '93.184.216.34', dstPort: 443});
  assert.equal(result.verdict, 'ACCEPT');
  assert.equal(result.servicePort, undefined);
  assert.deepEqual(result.branches, []);
  assert.ok(!result.hops.some((hop) => hop.target === 'DNAT' || hop.target === 'MARK'));
  assert.equal(result.hops[0].chain, 'PREROUTING');
  assertExplained(result);
});

test('a foreign rule the tracer cannot evaluate is treated as not matching, with a warning', () => {
  const result = trace({...pod, dstIP: '10.96.0.10', dstPort: 80});
  assert.deepEqual(result.warnings, [
    "filter FORWARD (line 205): the packet's output interface is not known (rule tests -o docker0); the rule was treated as not matching: -A FORWARD -o docker0 -j DOCKER",
  ]);
  const ruleset = parseIptablesSave(
    [
      '*filter',
      ':FORWARD DROP [0:0]',
      '-A FORWARD -m physdev --physdev-is-bridged -j DROP',
      '-A FORWARD -m set --match-set allowed src -j ACCEPT',
      '-A FORWARD -s 10.0.0.0/8 -j ACCEPT',
      'COMMIT',
    ].join('\n'),
  );
  const walked = traceIptables(
    ruleset,
    {srcIP: '10.1.1.1', dstIP: '10.2.2.2', dstPort: 80, protocol: 'TCP', origin: 'arriving', inInterface: 'eth0'},
    {localAddresses: []},
  );
  assert.equal(walked.verdict, 'ACCEPT');
  assert.deepEqual(walked.warnings, [
    'filter FORWARD (line 3): unknown match -m physdev; the rule was treated as not matching: -A FORWARD -m physdev --physdev-is-bridged -j DROP',
    'filter FORWARD (line 4): unknown match -m set; the rule was treated as not matching: -A FORWARD -m set --match-set allowed src -j ACCEPT',
  ]);
});

test("a random rule that drops: the outcomes' probabilities still add up to 1", () => {
  const ruleset = parseIptablesSave(
    [
      '*nat',
      ':KUBE-SERVICES - [0:0]',
      ':KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]',
      ':KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]',
      '-A PREROUTING -j KUBE-SERVICES',
      '-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/flaky:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA',
      '-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "default/flaky:http -> 10.1.0.1:80" -j KUBE-SEP-BBBBBBBBBBBBBBBB',
      '-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.1.0.1:80',
      'COMMIT',
      '*filter',
      '-A FORWARD -m statistic --mode random --probability 0.25 -j DROP',
      'COMMIT',
    ].join('\n'),
  );
  const result = traceIptables(
    ruleset,
    {srcIP: '10.2.0.1', dstIP: '10.96.0.1', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
    {localAddresses: []},
  );
  assert.equal(result.verdict, 'DNAT');
  assert.deepEqual(endpoints(result), {'10.1.0.1:80': 0.75, DROP: 0.25});
  assert.deepEqual(result.warnings, ['25.0% of connections end in DROP in filter FORWARD after DNAT to 10.1.0.1:80, not at an endpoint']);
});

test("goto, RETURN, marks and policies follow the kernel's rules", () => {
  const ruleset = parseIptablesSave(
    [
      '*mangle',
      ':TAG - [0:0]',
      '-A PREROUTING -s 10.0.0.0/8 -g TAG',
      '-A PREROUTING -j MARK --set-xmark 0x1/0xff',
      '-A TAG -j MARK --set-xmark 0x20/0xf0',
      '-A TAG -j RETURN',
      '-A TAG -j MARK --set-xmark 0x40/0xf0',
      'COMMIT',
      '*filter',
      ':FORWARD DROP [0:0]',
      ':CHECK - [0:0]',
      '-A FORWARD -j CHECK',
      '-A FORWARD -m mark --mark 0x1/0xff -j ACCEPT',
      '-A CHECK -m mark --mark 0x20/0xf0 -j RETURN',
      '-A CHECK -j REJECT',
      'COMMIT',
    ].join('\n'),
  );
  const walk = (srcIP: string) =>
    traceIptables(ruleset, {srcIP, dstIP: '192.0.2.1', dstPort: 80, protocol: 'TCP', origin: 'arriving'}, {localAddresses: []});
  // 10.x goes (goto) to TAG, is marked 0x20 and returns past PREROUTING's own MARK rule: CHECK lets it
  // through, and the FORWARD policy DROP drops it since the 0x1 accept rule does not match.
  const tagged = walk('10.1.2.3');
  assert.equal(tagged.verdict, 'DROP');
  assert.deepEqual(path(tagged.hops), [
    'mangle PREROUTING -> TAG',
    'mangle TAG -> MARK',
    'mangle TAG -> RETURN',
    'filter FORWARD -> CHECK',
    'filter CHECK -> RETURN',
    'filter FORWARD -> DROP',
  ]);
  assert.equal(tagged.hops[5].rule, '');
  assert.match(tagged.hops[5].explanation, /policy DROP drops it/);
  // Others get 0x1 in PREROUTING, are refused by CHECK.
  const other = walk('192.168.1.1');
  assert.equal(other.verdict, 'REJECT');
  assert.deepEqual(path(other.hops), ['mangle PREROUTING -> MARK', 'filter FORWARD -> CHECK', 'filter CHECK -> REJECT']);
});

test('IPv6 rules and a packet of the other family', () => {
  const ruleset = parseIptablesSave(
    [
      '*nat',
      ':KUBE-SERVICES - [0:0]',
      ':KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]',
      '-A PREROUTING -j KUBE-SERVICES',
      '-A KUBE-SERVICES -d fd00:96::10/128 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA',
      '-A KUBE-SVC-AAAAAAAAAAAAAAAA -p tcp -m comment --comment "default/web:http -> [fd00:244::5]:8080" -m tcp -j DNAT --to-destination [fd00:244::5]:8080',
      'COMMIT',
    ].join('\n'),
  );
  assert.equal(ruleset.family, 'IPv6');
  const result = traceIptables(
    ruleset,
    {srcIP: 'fd00:244::9', dstIP: 'fd00:96:0::10', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
    {localAddresses: ['fd00::1']},
  );
  assert.deepEqual(endpoints(result), {'[fd00:244::5]:8080': 1});
  const v4 = traceIptables(
    ruleset,
    {srcIP: '10.0.0.1', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
    {localAddresses: []},
  );
  assert.equal(v4.verdict, 'ACCEPT');
  assert.match(v4.warnings[0], /^the packet is IPv4 but the rules are IPv6/);
});

test('a packet that cannot be read is refused with the field it got wrong', () => {
  assert.throws(() => trace({srcIP: 'nope', dstIP: '10.96.0.10', dstPort: 80}), /packet srcIP "nope" is not an IP address/);
  assert.throws(() => trace({dstIP: '10.96.0.10', dstPort: 0}), /packet dstPort 0 is not a port/);
  assert.throws(
    () =>
      traceIptables(
        nodeA.legacy,
        {srcIP: '10.0.0.1', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
        {localAddresses: ['x']},
      ),
    /local address "x"/,
  );
});

test("notes of the dump (legacy tables beside nf_tables ones) reach the trace's warnings", () => {
  const result = trace({...pod, dstIP: '93.184.216.34', dstPort: 443}, nodeA.nft);
  assert.ok(
    result.warnings.includes(
      'the dump says "Warning: iptables-legacy tables present, use iptables-legacy-save to see them": the trace covers only the rules in this dump',
    ),
    result.warnings.join('\n'),
  );
});

test('DNATed and then dropped by a FORWARD policy: DROP, and the branches still show where they were headed', () => {
  // Docker's FORWARD policy DROP without flannel's accept rules: unmarked pod traffic cannot be forwarded.
  const ruleset = parseIptablesSave(dump('node-a.legacy.txt').replace(/^.*flanneld forward.*\n/gm, ''));
  const result = trace({...pod, dstIP: '10.96.0.10', dstPort: 80}, ruleset);
  assert.equal(result.verdict, 'DROP');
  assert.deepEqual(
    result.branches.map((branch) => branch.endpoint),
    ['10.244.1.5:8080', '10.244.1.6:8080', '10.244.2.5:8080'],
  );
  for (const branch of result.branches) {
    const last = branch.hops[branch.hops.length - 1];
    assert.deepEqual([last.table, last.chain, last.rule, last.target], ['filter', 'FORWARD', '', 'DROP']);
    assert.equal(branch.masquerade, false);
  }
  assert.ok(
    result.warnings.includes('33.3% of connections end in DROP in filter FORWARD policy after DNAT to 10.244.1.5:8080, not at an endpoint'),
    result.warnings.join('\n'),
  );
  // A client outside the cluster CIDR is marked for masquerade, which KUBE-FORWARD accepts.
  assert.equal(trace({...outsider, dstIP: '10.96.0.10', dstPort: 80}, ruleset).verdict, 'DNAT');
});

test('a Calico node: foreign chains are walked, ipset and rpfilter matches are reported, routing splits local and forwarded endpoints', () => {
  const ruleset = parseIptablesSave(dump('calico-node.nft.txt'));
  // The API server endpoints: 172.18.0.2 is this node, 172.18.0.3 another one.
  const result = traceIptables(
    ruleset,
    {srcIP: '192.168.1.10', dstIP: '10.96.0.1', dstPort: 443, protocol: 'TCP', origin: 'arriving', inInterface: 'cali1234567890a'},
    {localAddresses: ['172.18.0.2']},
  );
  assert.equal(result.verdict, 'DNAT');
  assert.equal(result.servicePort, 'default/kubernetes:https');
  assert.deepEqual(endpoints(result), {'172.18.0.2:6443': 0.5, '172.18.0.3:6443': 0.5});
  assert.deepEqual(path(result.hops).slice(0, 3), [
    'raw PREROUTING -> cali-PREROUTING',
    'raw cali-PREROUTING -> MARK',
    'raw cali-PREROUTING -> MARK',
  ]);
  const [toThisNode, forwarded] = result.branches;
  // Delivered to the node itself: INPUT, and no POSTROUTING to masquerade in.
  assert.ok(toThisNode.hops.some((hop) => hop.hook === 'INPUT'));
  assert.ok(!toThisNode.hops.some((hop) => hop.hook === 'FORWARD' || hop.hook === 'POSTROUTING'));
  // Forwarded: Calico's workload chain (reached by goto) marks it accepted, its RETURN goes back past the dispatch chain.
  assert.ok(path(forwarded.hops).includes('filter cali-from-wl-dispatch -> cali-fw-cali1234567890a'));
  assert.ok(path(forwarded.hops).includes('filter cali-FORWARD -> cali-to-hep-forward'));
  const accepted = forwarded.hops.find((hop) => hop.chain === 'FORWARD' && hop.target === 'ACCEPT')!;
  assert.match(accepted.rule, /Policy explicitly accepted packet/);
  assert.equal(forwarded.masquerade, false);
  assert.deepEqual(
    result.warnings.map((warning) => warning.replace(/;.*$/, '')),
    [
      'raw cali-PREROUTING (line 32): unknown match -m rpfilter',
      'filter cali-fw-cali1234567890a (line 80): unknown match -m set',
      "filter cali-FORWARD (line 72): the packet's output interface is not known (rule tests -o cali+)",
      'nat cali-nat-outgoing (line 128): unknown match -m set',
    ],
  );
});

test('a chain of many matching rules that let the packet go on is walked without running out of stack', () => {
  const lines = ['*filter', ':COUNT - [0:0]', '-A FORWARD -j COUNT', '-A FORWARD -j ACCEPT'];
  for (let index = 0; index < 20_000; index++)
    lines.push(index % 2 ? '-A COUNT -j LOG --log-prefix "seen "' : '-A COUNT -m comment --comment "counted"');
  lines.push('COMMIT');
  const result = traceIptables(
    parseIptablesSave(lines.join('\n')),
    {srcIP: '10.0.0.1', dstIP: '10.0.0.2', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
    {localAddresses: []},
  );
  assert.equal(result.verdict, 'ACCEPT');
  assert.equal(result.hops.length, 20_002);
  assert.deepEqual(path(result.hops.slice(-2)), ['filter COUNT -> LOG', 'filter FORWARD -> ACCEPT']);
});

test("an older kube-proxy's rules: masquerade rule in KUBE-SERVICES, KUBE-XLB, KUBE-MARK-DROP and kubelet's KUBE-FIREWALL", () => {
  const ruleset = parseIptablesSave(dump('kube-proxy-1.20.legacy.txt'));
  const old = (packet: Partial<Packet> & Pick<Packet, 'dstIP' | 'dstPort'>) =>
    traceIptables(ruleset, {srcIP: outsider.srcIP, inInterface: 'eth0', protocol: 'TCP', origin: 'arriving', ...packet}, {localAddresses});
  const clusterIP = old({dstIP: '10.96.0.10', dstPort: 80});
  assert.equal(clusterIP.verdict, 'DNAT');
  assert.equal(clusterIP.servicePort, 'default/web:http');
  assert.deepEqual(endpoints(clusterIP), {'10.244.1.5:8080': 0.5, '10.244.2.5:8080': 0.5});
  for (const branch of clusterIP.branches)
    assert.equal(
      branch.masqueradeReason,
      'marked for masquerade by KUBE-MARK-MASQ because the source 198.51.100.7 is outside the cluster CIDR 10.244.0.0/16',
    );
  assert.match(clusterIP.branches[0].hops[0].explanation, /endpoint 10\.244\.1\.5:8080 of default\/web:http/);

  // No local endpoint: KUBE-XLB marks the packet with 0x8000, and kubelet's firewall drops it in INPUT.
  const nodePort = old({dstIP: '10.0.0.11', dstPort: 30081});
  assert.equal(nodePort.verdict, 'DROP');
  assert.deepEqual(path(nodePort.hops).slice(-5), [
    'nat KUBE-XLB-EYQ3GTHA5KKORZZK -> KUBE-MARK-DROP',
    'nat KUBE-MARK-DROP -> MARK',
    'filter INPUT -> KUBE-EXTERNAL-SERVICES',
    'filter INPUT -> KUBE-FIREWALL',
    'filter KUBE-FIREWALL -> DROP',
  ]);
  assert.deepEqual(nodePort.warnings, [
    'default/local:http has a Local traffic policy and no endpoint on this node: the traffic that policy covers is dropped here',
  ]);
  // A pod using the node port is sent to the cluster-wide service chain instead.
  assert.deepEqual(endpoints(old({...pod, dstIP: '10.0.0.11', dstPort: 30081})), {'10.244.2.9:8080': 1});
});

test("REDIRECT sends the connection to the node itself (a sidecar proxy's port)", () => {
  const ruleset = parseIptablesSave(
    [
      '*nat',
      ':MESH-REDIRECT - [0:0]',
      '-A PREROUTING -p tcp -j MESH-REDIRECT',
      '-A MESH-REDIRECT -p tcp -j REDIRECT --to-ports 15001',
      'COMMIT',
      '*filter',
      ':INPUT DROP [0:0]',
      '-A INPUT -p tcp --dport 15001 -j ACCEPT',
      'COMMIT',
    ].join('\n'),
  );
  const arriving = traceIptables(
    ruleset,
    {srcIP: '10.244.1.20', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving', inInterface: 'eth0'},
    {localAddresses: ['10.0.0.11']},
  );
  assert.equal(arriving.verdict, 'DNAT');
  assert.deepEqual(endpoints(arriving), {'10.0.0.11:15001': 1});
  assert.deepEqual(path(arriving.branches[0].hops), ['nat MESH-REDIRECT -> REDIRECT', 'filter INPUT -> ACCEPT']);
  assert.equal(arriving.branches[0].hops[1].hook, 'INPUT');
  assert.match(arriving.branches[0].hops[0].explanation, /redirected to 10\.0\.0\.11:15001 on this node \(REDIRECT\)/);
});

test("a NodePort traced without the node's addresses: addrtype LOCAL cannot match, and the trace says so instead of a silent ACCEPT", () => {
  const packet: Packet = {...outsider, dstIP: '10.0.0.11', dstPort: 30080, protocol: 'TCP', origin: 'arriving'};
  const blind = traceIptables(nodeA.legacy, packet, {localAddresses: []});
  assert.equal(blind.servicePort, undefined, 'the NodePort is not recognised');
  assert.ok(
    blind.warnings.some((warning) =>
      /no address of the node was given, so -m addrtype LOCAL matched only loopback: 10\.0\.0\.11 was taken for another host's address/.test(
        warning,
      ),
    ),
    blind.warnings.join('\n'),
  );
  const seeing = traceIptables(nodeA.legacy, packet, {localAddresses});
  assert.equal(seeing.servicePort, 'default/np-cluster:http');
  assert.ok(!seeing.warnings.some((warning) => warning.includes('no address of the node')));
  // With no addrtype question on the way (a cluster IP), there is nothing to warn about.
  const clusterIP = traceIptables(nodeA.legacy, {...packet, ...pod, dstIP: '10.96.0.10', dstPort: 80}, {localAddresses: []});
  assert.ok(!clusterIP.warnings.some((warning) => warning.includes('no address of the node')), clusterIP.warnings.join('\n'));
});
