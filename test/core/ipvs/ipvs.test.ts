// ipvs mode without a kernel: what renderIpvs writes for kube-proxy's service shapes, the restore
// formats round-tripping through the parsers, diffs, and packets traced through the state.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {
  diffIpvs,
  formatIpsetRestore,
  formatIpvsadmRestore,
  parseBoundAddresses,
  parseIpsetSave,
  parseIpvsadmSave,
  parseIpvsadmSaveSince,
  patchedServers,
  planIpvsSync,
  renderIpvs,
  sortedIncludes,
  traceIpvs,
  virtualServerLines,
  virtualServerText,
  withJumpRules,
  type IpvsState,
  virtualServerKey,
} from '../../../src/core/ipvs/index.ts';
import {buildProxyModel, type EndpointSliceInput, type ServiceInput} from '../../../src/core/model/index.ts';
import type {Packet} from '../../../src/core/trace/types.ts';

const nodeIP = '192.168.0.10';
const clusterCIDR = '10.244.0.0/16';

function service(name: string, spec: NonNullable<ServiceInput['spec']>, status?: ServiceInput['status']): ServiceInput {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name, namespace: 'default'},
    spec: {type: 'ClusterIP', ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}], ...spec, clusterIPs: [spec.clusterIP!]},
    ...(status ? {status} : {}),
  };
}

function slice(serviceName: string, endpoints: Array<{ip: string; node: string}>): EndpointSliceInput {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name: `${serviceName}-1`, namespace: 'default', labels: {'kubernetes.io/service-name': serviceName}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: 8080}],
    endpoints: endpoints.map((endpoint) => ({addresses: [endpoint.ip], nodeName: endpoint.node, conditions: {ready: true}})),
  };
}

function render(services: ServiceInput[], slices: EndpointSliceInput[], scheduler?: string): IpvsState {
  const model = buildProxyModel(
    {
      services,
      endpointSlices: slices,
      node: {apiVersion: 'v1', kind: 'Node', metadata: {name: 'node-a'}, status: {addresses: [{type: 'InternalIP', address: nodeIP}]}},
    },
    {family: 'IPv4', clusterCIDRs: [clusterCIDR], nodeName: 'node-a'},
  );
  assert.deepEqual(model.problems, []);
  return renderIpvs(model, scheduler ? {scheduler} : {});
}

const cluster = () =>
  render(
    [
      service('web', {clusterIP: '10.96.0.10'}),
      service('sticky', {clusterIP: '10.96.0.11', sessionAffinity: 'ClientIP', sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}}),
      service('empty', {clusterIP: '10.96.0.12'}),
      service('np', {
        type: 'NodePort',
        clusterIP: '10.96.0.13',
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
        externalTrafficPolicy: 'Local',
      }),
      service(
        'lb',
        {
          type: 'LoadBalancer',
          clusterIP: '10.96.0.14',
          ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30081}],
          loadBalancerSourceRanges: ['203.0.113.0/24'],
          externalIPs: ['198.51.100.7'],
        },
        {loadBalancer: {ingress: [{ip: '198.51.100.30'}]}},
      ),
    ],
    [
      slice('web', [
        {ip: '10.244.1.2', node: 'node-a'},
        {ip: '10.244.2.2', node: 'node-b'},
      ]),
      slice('sticky', [{ip: '10.244.1.3', node: 'node-a'}]),
      slice('np', [{ip: '10.244.2.4', node: 'node-b'}]),
      slice('lb', [{ip: '10.244.1.5', node: 'node-a'}]),
    ],
  );

function packet(srcIP: string, dstIP: string, dstPort: number): Packet {
  return {srcIP, dstIP, dstPort, protocol: 'TCP', origin: 'arriving'};
}

describe('renderIpvs', () => {
  it('a loadBalancerSourceRanges entry that is no CIDR: the load-balancer IP is firewalled with no allowed source; the NodePort stays', () => {
    const lb = service(
      'lb',
      {
        type: 'LoadBalancer',
        clusterIP: '10.96.0.14',
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30081}],
        loadBalancerSourceRanges: ['203.0.113.0/24', 'bogus'],
      },
      {loadBalancer: {ingress: [{ip: '198.51.100.30'}]}},
    );
    const model = buildProxyModel(
      {
        services: [lb],
        endpointSlices: [slice('lb', [{ip: '10.244.1.5', node: 'node-a'}])],
        node: {apiVersion: 'v1', kind: 'Node', metadata: {name: 'node-a'}},
      },
      {family: 'IPv4', nodeName: 'node-a'},
    );
    assert.deepEqual(
      model.problems.map((problem) => problem.field),
      ['spec.loadBalancerSourceRanges[1]'],
    );
    const sets = new Map(renderIpvs(model).sets.map((set) => [set.name, set]));
    assert.deepEqual(sets.get('KUBE-LOAD-BALANCER-FW')?.entries, ['198.51.100.30,tcp:80']);
    assert.deepEqual(sets.get('KUBE-LOAD-BALANCER-SOURCE-CIDR')?.entries ?? [], []);
    assert.deepEqual(sets.get('KUBE-NODE-PORT-TCP')?.entries, ['30081']);
  });

  it('writes one virtual server per service address and port, one masqueraded real server per endpoint', () => {
    const restore = formatIpvsadmRestore(cluster().virtualServers);
    assert.match(restore, /^-A -t 10\.96\.0\.10:80 -s rr$/m);
    assert.match(restore, /^-a -t 10\.96\.0\.10:80 -r 10\.244\.1\.2:8080 -m -w 1$/m);
    assert.match(restore, /^-a -t 10\.96\.0\.10:80 -r 10\.244\.2\.2:8080 -m -w 1$/m);
    assert.match(restore, /^-A -t 10\.96\.0\.11:80 -s rr -p 600$/m, 'ClientIP affinity is persistence with its timeout');
    assert.match(restore, /^-A -t 10\.96\.0\.12:80 -s rr$/m, 'a service without endpoints keeps its virtual server');
    assert.doesNotMatch(restore, /-a -t 10\.96\.0\.12:80/);
    assert.match(restore, /^-A -t 192\.168\.0\.10:30080 -s rr$/m, 'NodePorts listen on the node address');
    assert.doesNotMatch(restore, /-a -t 192\.168\.0\.10:30080/, 'eTP Local with no local endpoint: no real server on the NodePort');
    assert.match(
      restore,
      /^-a -t 10\.96\.0\.13:80 -r 10\.244\.2\.4:8080 -m -w 1$/m,
      'the ClusterIP of an eTP Local service uses every endpoint',
    );
    assert.match(restore, /^-A -t 198\.51\.100\.30:80 -s rr$/m);
    assert.match(restore, /^-A -t 198\.51\.100\.7:80 -s rr$/m);
  });

  it('takes the scheduler from the options', () => {
    assert.match(formatIpvsadmRestore(render([service('web', {clusterIP: '10.96.0.10'})], [], 'lc').virtualServers), /-s lc/);
  });

  it('binds service addresses to kube-ipvs0, never node addresses', () => {
    assert.deepEqual(cluster().boundAddresses, [
      '10.96.0.10',
      '10.96.0.11',
      '10.96.0.12',
      '10.96.0.13',
      '10.96.0.14',
      '198.51.100.30',
      '198.51.100.7',
    ]);
  });

  it("fills kube-proxy's ipsets", () => {
    const sets = new Map(cluster().sets.map((set) => [set.name, set]));
    assert.deepEqual(sets.get('KUBE-CLUSTER-IP')?.entries, [
      '10.96.0.10,tcp:80',
      '10.96.0.11,tcp:80',
      '10.96.0.12,tcp:80',
      '10.96.0.13,tcp:80',
      '10.96.0.14,tcp:80',
    ]);
    assert.equal(sets.get('KUBE-CLUSTER-IP')?.type, 'hash:ip,port');
    assert.deepEqual(sets.get('KUBE-NODE-PORT-TCP')?.entries, ['30080', '30081']);
    assert.deepEqual(sets.get('KUBE-NODE-PORT-LOCAL-TCP')?.entries, ['30080']);
    assert.deepEqual(sets.get('KUBE-LOAD-BALANCER')?.entries, ['198.51.100.30,tcp:80']);
    assert.deepEqual(sets.get('KUBE-LOAD-BALANCER-FW')?.entries, ['198.51.100.30,tcp:80']);
    assert.deepEqual(sets.get('KUBE-LOAD-BALANCER-SOURCE-CIDR')?.entries, ['198.51.100.30,tcp:80,203.0.113.0/24']);
    assert.deepEqual(sets.get('KUBE-EXTERNAL-IP')?.entries, ['198.51.100.7,tcp:80']);
    // Only this node's endpoints can reach themselves through its virtual servers: kube-proxy writes no entry for 10.244.2.x.
    assert.deepEqual(sets.get('KUBE-LOOP-BACK')?.entries, [
      '10.244.1.2,tcp:8080,10.244.1.2',
      '10.244.1.3,tcp:8080,10.244.1.3',
      '10.244.1.5,tcp:8080,10.244.1.5',
    ]);
    assert.equal(sets.get('KUBE-IPVS-IPS')?.entries.length, 7);
  });

  it('writes the iptables layer that matches the sets', () => {
    const rules = cluster().iptables;
    assert.match(rules, /^-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10\.244\.0\.0\/16 -j KUBE-MARK-MASQ$/m);
    assert.match(rules, /^-A KUBE-POSTROUTING -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE$/m);
    assert.match(rules, /^-A KUBE-NODE-PORT -p tcp -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN$/m);
    assert.match(rules, /^-A KUBE-SOURCE-RANGES-FIREWALL -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN$/m);
    assert.match(rules, /^-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000$/m);
    assert.ok(
      rules.indexOf('KUBE-NODE-PORT-LOCAL-TCP') < rules.indexOf('--match-set KUBE-NODE-PORT-TCP'),
      'the Local set RETURNs before the masquerade set',
    );
    assert.doesNotMatch(rules, /KUBE-NODE-PORT-UDP/, 'rules for empty sets are left out');
  });

  it('is deterministic', () => {
    assert.deepEqual(cluster(), cluster());
  });
});

describe('ipvs state formats', () => {
  it('ipvsadm -Sn output parses back to the rendered servers', () => {
    const state = cluster();
    const parsed = parseIpvsadmSave(formatIpvsadmRestore(state.virtualServers));
    assert.deepEqual(
      parsed,
      state.virtualServers.map((server) => ({...server, servicePort: ''})),
    );
  });

  it('reads ipset save output of the kernel, keeping only KUBE- sets', () => {
    const text = [
      'create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1a2b3c4d',
      'add KUBE-CLUSTER-IP 10.96.0.12,tcp:80',
      'add KUBE-CLUSTER-IP 10.96.0.10,tcp:80',
      'create other-set hash:ip family inet',
      'add other-set 1.2.3.4',
      'create KUBE-NODE-PORT-TCP bitmap:port range 0-65535',
    ].join('\n');
    assert.deepEqual(parseIpsetSave(text), [
      {name: 'KUBE-CLUSTER-IP', type: 'hash:ip,port', entries: ['10.96.0.10,tcp:80', '10.96.0.12,tcp:80']},
      {name: 'KUBE-NODE-PORT-TCP', type: 'bitmap:port', entries: []},
    ]);
  });

  it('ipset restore text parses back to the rendered sets', () => {
    const state = cluster();
    const restore = formatIpsetRestore(state.sets, 'IPv4')
      .replace(/ -exist/g, '')
      .replace(/^flush .*\n/gm, '');
    assert.deepEqual(parseIpsetSave(restore), state.sets);
  });

  it('reads addresses from ip -j addr, and none when the device is missing', () => {
    const json = JSON.stringify([
      {
        ifname: 'kube-ipvs0',
        addr_info: [
          {family: 'inet', local: '10.96.0.12', prefixlen: 32},
          {family: 'inet', local: '10.96.0.10', prefixlen: 32},
        ],
      },
    ]);
    assert.deepEqual(parseBoundAddresses(json), ['10.96.0.10', '10.96.0.12']);
    assert.deepEqual(parseBoundAddresses(''), []);
  });

  it('a reading since an earlier one parses the servers whose lines changed and keeps the objects of the others', () => {
    // In the kernel's order (a hash's, not sorted), both families.
    const text = [
      '-A -t 10.96.0.12:80 -s rr',
      '-a -t 10.96.0.12:80 -r 10.244.1.3:8080 -m -w 1',
      '-A -t [fd00::10]:80 -s rr',
      '-a -t [fd00::10]:80 -r [fd00:1::2]:8080 -m -w 1',
      '-A -t 10.96.0.10:80 -s rr',
      '-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1',
      '-a -t 10.96.0.10:80 -r 10.244.1.4:8080 -m -w 1',
      '',
    ].join('\n');
    const ipv4 = (server: {address: string}) => !server.address.includes(':');
    const first = parseIpvsadmSaveSince(text, undefined, ipv4);
    assert.deepEqual(first.servers, parseIpvsadmSave(text).filter(ipv4), 'what parseIpvsadmSave reads, of the family kept, sorted');
    const changed = text.replace('-a -t 10.96.0.12:80 -r 10.244.1.3:8080 -m -w 1\n', '');
    const second = parseIpvsadmSaveSince(changed, first.blocks, ipv4);
    assert.deepEqual(second.servers, parseIpvsadmSave(changed).filter(ipv4));
    assert.equal(second.servers[0], first.servers[0], 'the server whose lines are the same is the same object');
    assert.notEqual(second.servers[1], first.servers[1], 'the changed one is read again');
    assert.equal(
      second.blocks.get('-t [fd00::10]:80')?.server.address,
      'fd00::10',
      "the other family's servers are kept for the next reading",
    );
    assert.throws(
      () => parseIpvsadmSaveSince('-a -t 10.96.0.9:80 -r 10.244.1.3:8080 -m -w 1\n', first.blocks, ipv4),
      /real server before its virtual server/,
    );
    // A server line without options is its server's too.
    const bare = '-A -t 10.96.0.9:80\n-a -t 10.96.0.9:80 -r 10.244.1.3:8080 -m -w 1\n';
    assert.deepEqual(parseIpvsadmSaveSince(bare, undefined, ipv4).servers, parseIpvsadmSave(bare));
  });

  it('a reading patched with the servers a look named reads those alone, and keeps the others as the reading had them', () => {
    const text = [
      '-A -t 10.96.0.12:80 -s rr',
      '-a -t 10.96.0.12:80 -r 10.244.1.3:8080 -m -w 1',
      '-A -t [fd00::10]:80 -s rr',
      '-A -t 10.96.0.10:80 -s rr',
      '-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1',
      '',
    ].join('\n');
    const ipv4 = (server: {address: string}) => !server.address.includes(':');
    const reading = parseIpvsadmSave(text).filter(ipv4);
    const now = text
      .replace('-a -t 10.96.0.12:80 -r 10.244.1.3:8080 -m -w 1\n', '-a -t 10.96.0.12:80 -r 10.244.1.3:8080 -m -w 0\n')
      .replace('-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1\n', '')
      .concat('-A -u 10.96.0.105:53 -s rr\n-a -u 10.96.0.105:53 -r 10.244.1.7:53 -m -w 1\n-A -t [fd00::11]:80 -s rr\n');
    const words = new Set(['-t 10.96.0.12:80', '-u 10.96.0.105:53', '-t [fd00::11]:80', '-t 10.96.0.99:80']);
    const patched = patchedServers(reading, now, words, ipv4)!;
    // 10.96.0.10:80 changed too, but no look named it: the reading's object, as it was.
    assert.equal(
      patched.find((server) => server.address === '10.96.0.10'),
      reading[0],
    );
    assert.equal(patched.find((server) => server.address === '10.96.0.10')!.realServers.length, 1);
    assert.deepEqual(
      patched.map((server) => virtualServerText(server)),
      [
        '-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1',
        '-A -t 10.96.0.12:80 -s rr\n-a -t 10.96.0.12:80 -r 10.244.1.3:8080 -m -w 0',
        '-A -u 10.96.0.105:53 -s rr\n-a -u 10.96.0.105:53 -r 10.244.1.7:53 -m -w 1',
      ],
      'named ones read again or added, in key order; a named one without lines is none; the other family left out',
    );
    assert.deepEqual(reading, parseIpvsadmSave(text).filter(ipv4), 'the reading itself is not changed');
    assert.deepEqual(patchedServers(reading, now, new Set(['-t 10.96.0.12:80']), ipv4)!.length, 2);
    assert.equal(patchedServers(reading, '', new Set(['-t 10.96.0.12:80']), ipv4)!.length, 1, 'gone when it has no lines');
    assert.equal(patchedServers(reading, now, new Set(['-t nowhere:80']), ipv4), undefined, 'a name that is no server');
  });

  it("spells each server read from ipvsadm -Sn as formatIpvsadmRestore does, whatever ipvsadm's spelling", () => {
    const printed = ['-A -t 10.96.0.10:80 -s rr', '-a -t 10.96.0.10:80 -r 10.244.1.4:8080 -m -w 1', ''].join('\n');
    // The same kind of server as another ipvsadm could print it: its options in another order.
    const spelledOtherwise = ['-A -t 10.96.0.11:80 -p 600 -s rr', '-a -t 10.96.0.11:80 -r 10.244.1.4:8080 -w 1 -m', ''].join('\n');
    for (const text of [printed, spelledOtherwise, printed.trimEnd()]) {
      const [server] = parseIpvsadmSaveSince(text, undefined, () => true).servers;
      assert.equal(virtualServerText(server), formatIpvsadmRestore([server]).trimEnd(), JSON.stringify(text));
      assert.deepEqual(virtualServerLines(server), formatIpvsadmRestore([server]).trimEnd().split('\n'));
    }
    // Kept from one reading to the next, a server still spells itself so.
    const first = parseIpvsadmSaveSince(spelledOtherwise, undefined, () => true);
    const second = parseIpvsadmSaveSince(spelledOtherwise, first.blocks, () => true);
    assert.equal(second.servers[0], first.servers[0]);
    assert.equal(virtualServerText(second.servers[0]), '-A -t 10.96.0.11:80 -s rr -p 600\n-a -t 10.96.0.11:80 -r 10.244.1.4:8080 -m -w 1');
  });

  it('names the line it cannot read', () => {
    assert.throws(() => parseIpvsadmSave('-A -x 1.2.3.4:80'), /cannot read line: -A -x 1\.2\.3\.4:80/);
    assert.throws(() => parseIpsetSave('destroy X'), /ipset: cannot read line: destroy X/);
  });
});

/** The state as the node's tools would read it back: objects of its own, the iptables layer with its jumps. */
function readBack(desired: IpvsState): IpvsState {
  return {
    ...desired,
    iptables: withJumpRules(desired.iptables),
    virtualServers: parseIpvsadmSave(formatIpvsadmRestore(desired.virtualServers)),
    sets: desired.sets.map((set) => ({...set, entries: [...set.entries]})),
    boundAddresses: [...desired.boundAddresses],
  };
}

describe('diffIpvs', () => {
  it('is equal for the same state and groups changes by service port', () => {
    const desired = cluster();
    const applied = readBack(desired);
    assert.equal(diffIpvs(desired, applied).equal, true, diffIpvs(desired, applied).text);

    const drifted: IpvsState = {
      ...applied,
      virtualServers: applied.virtualServers.map((server) =>
        server.address === '10.96.0.10'
          ? {...server, realServers: server.realServers.filter((real) => real.address !== '10.244.2.2')}
          : server,
      ),
      boundAddresses: [...applied.boundAddresses, '10.96.9.9'],
    };
    const diff = diffIpvs(desired, drifted);
    assert.equal(diff.equal, false);
    const web = diff.groups.find((group) => group.servicePort === 'default/web:http');
    assert.deepEqual(web, {servicePort: 'default/web:http', added: ['-a -t 10.96.0.10:80 -r 10.244.2.2:8080 -m -w 1'], removed: []});
    assert.deepEqual(diff.groups.find((group) => group.servicePort === '')?.removed, ['address 10.96.9.9 dev kube-ipvs0']);
    // As every mode's diff: "-" desired and missing from the kernel, "+" in the kernel and not desired.
    assert.match(diff.text, /^--- desired\n\+\+\+ applied\n/);
    assert.match(diff.text, /^--a -t 10\.96\.0\.10:80 -r 10\.244\.2\.2:8080 -m -w 1$/m);
    assert.match(diff.text, /^\+address 10\.96\.9\.9 dev kube-ipvs0$/m);
  });
});

describe('diffIpvs: checks after checks, as an observer makes them', () => {
  it('finds each change of a followed reading, which keeps the objects of what did not change, whatever earlier checks found', () => {
    const desired = cluster();
    const first = readBack(desired);
    assert.equal(diffIpvs(desired, first).equal, true, diffIpvs(desired, first).text);
    // One real server gone, in a new object for its server; every other server, set and address list as they were.
    const web = first.virtualServers.find((server) => server.address === '10.96.0.10')!;
    const lessWeb = {...web, realServers: web.realServers.slice(1)};
    const second: IpvsState = {...first, virtualServers: first.virtualServers.map((server) => (server === web ? lessWeb : server))};
    assert.deepEqual(
      diffIpvs(desired, second).groups.map((group) => [group.servicePort, group.added, group.removed]),
      [['default/web:http', ['-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1'], []]],
    );
    // Then a set entry gone, in a new entry list; the server back, in yet another object.
    const loopBack = first.sets.find((set) => set.entries.length > 0)!;
    const third: IpvsState = {
      ...second,
      virtualServers: first.virtualServers.map((server) => (server === web ? {...web, realServers: [...web.realServers]} : server)),
      sets: first.sets.map((set) => (set === loopBack ? {...set, entries: set.entries.slice(1)} : set)),
    };
    const diff = diffIpvs(desired, third);
    assert.deepEqual(
      diff.groups.flatMap((group) => [...group.added, ...group.removed]),
      [`add ${loopBack.name} ${loopBack.entries[0]}`],
    );
    // And the first reading, unchanged, still matches.
    assert.equal(diffIpvs(desired, first).equal, true);
  });
});

describe('diffIpvs: the servers that may differ, compared alone', () => {
  it('names the servers whose lines differ, and given those, finds among them what a whole diff finds', () => {
    const desired = cluster();
    const read = readBack(desired);
    const servers = read.virtualServers.filter((server) => server.port === 80);
    assert.ok(servers.length >= 2, 'two servers to change');
    const [lessOne, extraOne] = servers;
    const drifted: IpvsState = {
      ...read,
      virtualServers: read.virtualServers
        .map((server) => (server === lessOne ? {...server, realServers: server.realServers.slice(1)} : server))
        .map((server) =>
          server === extraOne ? {...server, realServers: [...server.realServers, {address: '10.244.9.9', port: 8080, weight: 1}]} : server,
        ),
    };
    const whole = diffIpvs(desired, drifted);
    const keys = [lessOne, extraOne].map(virtualServerKey);
    assert.deepEqual([...whole.differingServers].sort(), [...keys].sort());
    const named = diffIpvs(desired, drifted, {comparedServers: new Set(keys)});
    assert.deepEqual(named.groups, whole.groups);
    assert.equal(named.text, whole.text);
    // A server left out was vouched for by the caller: not compared, whatever it holds.
    const onlyFirst = diffIpvs(desired, drifted, {comparedServers: new Set([keys[0]])});
    assert.deepEqual(
      onlyFirst.groups.flatMap((group) => group.added),
      whole.groups.flatMap((group) => group.added),
    );
    assert.deepEqual([...onlyFirst.differingServers], [keys[0]]);
    // A server one side lacks is found by its key on the other.
    const gone: IpvsState = {...read, virtualServers: read.virtualServers.filter((server) => server !== lessOne)};
    assert.deepEqual(diffIpvs(desired, gone, {comparedServers: new Set([keys[0]])}).groups, diffIpvs(desired, gone).groups);
    assert.equal(diffIpvs(desired, read, {comparedServers: new Set(keys)}).equal, true);
  });
});

describe('diffIpvs: a virtual server that changed in place', () => {
  it("shows each setting and real server that differs, as the server's lines", () => {
    const desired = cluster();
    const copy = () => parseIpvsadmSave(formatIpvsadmRestore(desired.virtualServers));
    const changedWeb = (change: (server: IpvsState['virtualServers'][number]) => void) => {
      const servers = copy();
      change(servers.find((server) => server.address === '10.96.0.10')!);
      const diff = diffIpvs(desired, {...desired, iptables: withJumpRules(desired.iptables), virtualServers: servers});
      return diff.groups.find((group) => group.servicePort === 'default/web:http');
    };
    assert.deepEqual(
      changedWeb((server) => (server.realServers[0].weight = 0)),
      {
        servicePort: 'default/web:http',
        added: ['-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1'],
        removed: ['-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 0'],
      },
    );
    assert.deepEqual(changedWeb((server) => (server.scheduler = 'wrr'))?.removed, ['-A -t 10.96.0.10:80 -s wrr']);
    assert.deepEqual(changedWeb((server) => (server.persistenceTimeout = 60))?.removed, ['-A -t 10.96.0.10:80 -s rr -p 60']);
    assert.deepEqual(changedWeb((server) => (server.realServers[1].port = 9090))?.removed, [
      '-a -t 10.96.0.10:80 -r 10.244.2.2:9090 -m -w 1',
    ]);
    assert.equal(
      changedWeb(() => {}),
      undefined,
      'unchanged',
    );
  });
});

describe('diffIpvs: whose missing set entries and addresses', () => {
  it('gives each to the one service port that claims it, and to none where several do', () => {
    // web and twin share a local endpoint; np's endpoint and NodePort are its own.
    const desired = render(
      [
        service('web', {clusterIP: '10.96.0.10'}),
        service('twin', {clusterIP: '10.96.0.20'}),
        service('np', {
          type: 'NodePort',
          clusterIP: '10.96.0.13',
          ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
        }),
      ],
      [
        slice('web', [{ip: '10.244.1.2', node: 'node-a'}]),
        slice('twin', [{ip: '10.244.1.2', node: 'node-a'}]),
        slice('np', [{ip: '10.244.1.7', node: 'node-a'}]),
      ],
    );
    const applied: IpvsState = {
      ...desired,
      iptables: withJumpRules(desired.iptables),
      virtualServers: parseIpvsadmSave(formatIpvsadmRestore(desired.virtualServers)),
      sets: desired.sets.map((set) => ({...set, entries: []})),
      boundAddresses: [],
    };
    const owner = new Map(diffIpvs(desired, applied).groups.flatMap((group) => group.added.map((line) => [line, group.servicePort])));
    assert.equal(owner.get('add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2'), '', 'an endpoint of two services');
    assert.equal(owner.get('add KUBE-LOOP-BACK 10.244.1.7,tcp:8080,10.244.1.7'), 'default/np:http');
    assert.equal(owner.get('add KUBE-NODE-PORT-TCP 30080'), 'default/np:http');
    assert.equal(owner.get('address 10.96.0.20 dev kube-ipvs0'), 'default/twin:http');
    assert.equal(owner.get('add KUBE-CLUSTER-IP 10.96.0.10,tcp:80'), 'default/web:http');
  });
});

describe('sortedIncludes', () => {
  it('finds what includes() finds in a sorted list, at either end, between entries and past them', () => {
    for (const size of [0, 1, 2, 3, 8, 33]) {
      const sorted = Array.from({length: size}, (_, index) => `10.96.${index}.1,tcp:80`).sort();
      const probes = [...sorted, '', '0', '10.96.0.1,tcp:8', '10.96.0.1,tcp:800', 'zzz'];
      for (const probe of probes) assert.equal(sortedIncludes(sorted, probe), sorted.includes(probe), `${size}: ${probe}`);
    }
  });
});

describe('traceIpvs', () => {
  const context = {localAddresses: [nodeIP, '127.0.0.1']};

  it('a pod reaching a ClusterIP keeps its source; the endpoints share the traffic by weight', () => {
    const result = traceIpvs(cluster(), packet('10.244.1.9', '10.96.0.10', 80), context);
    assert.equal(result.verdict, 'DNAT');
    assert.equal(result.servicePort, 'default/web:http');
    assert.deepEqual(
      result.branches.map((branch) => [branch.endpoint, branch.probability, branch.masquerade]),
      [
        ['10.244.1.2:8080', 0.5, false],
        ['10.244.2.2:8080', 0.5, false],
      ],
    );
  });

  it('a client outside the cluster CIDR is masqueraded', () => {
    const result = traceIpvs(cluster(), packet('192.168.0.50', '10.96.0.10', 80), context);
    assert.ok(result.branches.every((branch) => branch.masquerade));
    assert.ok(result.hops.some((hop) => hop.target === 'KUBE-MARK-MASQ'));
  });

  it('hairpin traffic is masqueraded through KUBE-LOOP-BACK', () => {
    const result = traceIpvs(cluster(), packet('10.244.1.2', '10.96.0.10', 80), context);
    const self = result.branches.find((branch) => branch.endpoint === '10.244.1.2:8080');
    assert.equal(self?.masquerade, true);
    assert.match(self!.masqueradeReason, /KUBE-LOOP-BACK/);
  });

  it('a service without endpoints is refused; eTP Local NodePort without local endpoints too', () => {
    assert.equal(traceIpvs(cluster(), packet('10.244.1.9', '10.96.0.12', 80), context).verdict, 'REJECT');
    assert.equal(traceIpvs(cluster(), packet('192.168.0.50', nodeIP, 30080), context).verdict, 'REJECT');
  });

  it('load balancer source ranges drop other clients, but not the node itself (ipvs takes its packets before INPUT)', () => {
    assert.equal(traceIpvs(cluster(), packet('192.168.0.50', '198.51.100.30', 80), context).verdict, 'DROP');
    const fromNode = traceIpvs(cluster(), {...packet(nodeIP, '198.51.100.30', 80), origin: 'local'}, context);
    assert.equal(fromNode.verdict, 'DNAT');
    const allowed = traceIpvs(cluster(), packet('203.0.113.9', '198.51.100.30', 80), context);
    assert.equal(allowed.verdict, 'DNAT');
    assert.ok(
      allowed.branches.every((branch) => branch.masquerade),
      'eTP Cluster load balancer traffic is masqueraded',
    );
  });

  it('packets to no virtual server pass untouched', () => {
    const result = traceIpvs(cluster(), packet('10.244.1.9', '10.96.7.7', 80), context);
    assert.equal(result.verdict, 'ACCEPT');
    assert.match(result.warnings[0], /no virtual server/);
  });

  it("KUBE-IPVS-FILTER: a service address on a port no service uses is refused, where the node's filter INPUT jumps to it", () => {
    const state = cluster();
    const local = {localAddresses: [nodeIP, ...state.boundAddresses]};
    const refused = traceIpvs(state, packet('10.244.1.9', '10.96.0.10', 22), local);
    assert.equal(refused.verdict, 'REJECT');
    assert.equal(refused.hops[0].chain, 'KUBE-IPVS-FILTER');
    assert.match(refused.hops[0].rule, /^-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT$/);
    assert.equal(traceIpvs(state, packet('10.244.1.9', '198.51.100.30', 22), local).verdict, 'REJECT', 'load-balancer IPs too');
    // A node's dump (built-in chains declared) counts only with the jump kube-proxy ensures.
    const dumped = {...state, iptables: withJumpRules(state.iptables)};
    assert.equal(traceIpvs(dumped, packet('10.244.1.9', '10.96.0.10', 22), local).verdict, 'REJECT');
    // kube-proxy before kubernetes#108460 writes neither: the packet reaches the node's own sockets.
    const older = {...state, iptables: dumped.iptables.replace(/^-A INPUT .*-j KUBE-IPVS-FILTER\n/m, '')};
    const untouched = traceIpvs(older, packet('10.244.1.9', '10.96.0.10', 22), local);
    assert.equal(untouched.verdict, 'ACCEPT');
    assert.match(untouched.warnings[0], /no virtual server for TCP 10\.96\.0\.10:22/);
    // The service's own port is the virtual server's.
    assert.equal(traceIpvs(state, packet('10.244.1.9', '10.96.0.10', 80), local).verdict, 'DNAT');
  });

  it('persistence is explained', () => {
    const result = traceIpvs(cluster(), packet('10.244.1.9', '10.96.0.11', 80), context);
    assert.match(result.hops.at(-1)!.explanation, /600 s \(persistence\)/);
  });
});

describe('planIpvsSync', () => {
  const web = (ips: string[]) =>
    render(
      [service('web', {clusterIP: '10.96.0.10'}), service('gone', {clusterIP: '10.96.0.20'})],
      [
        slice(
          'web',
          ips.map((ip) => ({ip, node: 'node-a'})),
        ),
      ],
    );

  it('plans nothing when the kernel holds the desired state', () => {
    const state = web(['10.244.1.2']);
    assert.equal(planIpvsSync(state, state).changes, 0);
  });

  it('loads everything into an empty node', () => {
    const state = web(['10.244.1.2']);
    const plan = planIpvsSync(state, {family: 'IPv4', virtualServers: [], sets: [], boundAddresses: [], iptables: ''});
    assert.equal(plan.ipvsadm, formatIpvsadmRestore(state.virtualServers));
    assert.deepEqual(plan.bind, ['10.96.0.10', '10.96.0.20']);
    assert.match(plan.ipset, /^create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 4194304 -exist$/m);
    assert.match(plan.ipset, /^add KUBE-CLUSTER-IP 10\.96\.0\.10,tcp:80 -exist$/m);
  });

  it('changes only the real servers and set entries of the changed endpoint, draining the removed one', () => {
    const before = web(['10.244.1.2', '10.244.1.3']);
    const after = web(['10.244.1.2', '10.244.1.4']);
    const plan = planIpvsSync(after, before);
    assert.deepEqual(plan.ipvsadm.trim().split('\n'), [
      '-a -t 10.96.0.10:80 -r 10.244.1.4:8080 -m -w 1',
      '-e -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 0',
    ]);
    assert.deepEqual(plan.draining, ['TCP 10.96.0.10:80 -> 10.244.1.3:8080']);
    assert.deepEqual(plan.ipset.trim().split('\n'), [
      'add KUBE-LOOP-BACK 10.244.1.4,tcp:8080,10.244.1.4 -exist',
      'del KUBE-LOOP-BACK 10.244.1.3,tcp:8080,10.244.1.3 -exist',
    ]);
    assert.deepEqual([plan.bind, plan.unbind], [[], []]);
  });

  it('deletes a drained real server once the caller says its connections are gone', () => {
    const after = web(['10.244.1.2']);
    const draining: IpvsState = {
      ...after,
      virtualServers: after.virtualServers.map((server) =>
        server.address === '10.96.0.10'
          ? {...server, realServers: [...server.realServers, {address: '10.244.1.3', port: 8080, weight: 0}]}
          : server,
      ),
    };
    assert.equal(planIpvsSync(after, draining).ipvsadm, '', 'still draining: nothing to do');
    assert.equal(
      planIpvsSync(after, draining, {drained: new Set(['TCP 10.96.0.10:80 -> 10.244.1.3:8080'])}).ipvsadm,
      '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n',
    );
    assert.equal(
      planIpvsSync(web([]), web(['10.244.1.2']), {gracefulTermination: false}).ipvsadm,
      '-d -t 10.96.0.10:80 -r 10.244.1.2:8080\n',
    );
  });

  it('deletes virtual servers and unbinds addresses of removed services', () => {
    const before = web(['10.244.1.2']);
    const after = render([service('web', {clusterIP: '10.96.0.10'})], [slice('web', [{ip: '10.244.1.2', node: 'node-a'}])]);
    const plan = planIpvsSync(after, before);
    assert.equal(plan.ipvsadm, '-D -t 10.96.0.20:80\n');
    assert.deepEqual(plan.unbind, ['10.96.0.20']);
    assert.match(plan.ipset, /^del KUBE-CLUSTER-IP 10\.96\.0\.20,tcp:80 -exist$/m);
  });
});

describe('renderIpvs for IPv6', () => {
  it('names sets KUBE-6-*, creates them as inet6 and brackets addresses for ipvsadm', () => {
    const model = buildProxyModel(
      {
        services: [
          {
            apiVersion: 'v1',
            kind: 'Service',
            metadata: {name: 'web', namespace: 'default'},
            spec: {
              type: 'ClusterIP',
              clusterIP: 'fd00::10',
              clusterIPs: ['fd00::10'],
              ipFamilies: ['IPv6'],
              ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}],
            },
          },
        ],
        endpointSlices: [
          {
            apiVersion: 'discovery.k8s.io/v1',
            kind: 'EndpointSlice',
            metadata: {name: 'web-1', namespace: 'default', labels: {'kubernetes.io/service-name': 'web'}},
            addressType: 'IPv6',
            ports: [{name: 'http', protocol: 'TCP', port: 8080}],
            endpoints: [{addresses: ['fd01::2'], nodeName: 'node-a', conditions: {ready: true}}],
          },
        ],
        node: {
          apiVersion: 'v1',
          kind: 'Node',
          metadata: {name: 'node-a'},
          status: {addresses: [{type: 'InternalIP', address: 'fd02::10'}]},
        },
      },
      {family: 'IPv6', clusterCIDRs: ['fd01::/64'], nodeName: 'node-a'},
    );
    assert.deepEqual(model.problems, []);
    const state = renderIpvs(model);
    assert.equal(formatIpvsadmRestore(state.virtualServers), '-A -t [fd00::10]:80 -s rr\n-a -t [fd00::10]:80 -r [fd01::2]:8080 -m -w 1\n');
    assert.deepEqual(parseIpvsadmSave(formatIpvsadmRestore(state.virtualServers))[0].realServers, [
      {address: 'fd01::2', port: 8080, weight: 1},
    ]);
    assert.deepEqual(state.sets.find((set) => set.name === 'KUBE-6-CLUSTER-IP')?.entries, ['fd00::10,tcp:80']);
    assert.match(formatIpsetRestore(state.sets, 'IPv6'), /^create KUBE-6-CLUSTER-IP hash:ip,port family inet6 /m);
    assert.match(state.iptables, /^-A KUBE-SERVICES -s ::1\/128 -j RETURN$/m);
    assert.match(state.iptables, /--match-set KUBE-6-CLUSTER-IP dst,dst ! -s fd01::\/64 -j KUBE-MARK-MASQ/);
  });
});
