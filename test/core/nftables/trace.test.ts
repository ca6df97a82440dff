// Packet-flow tables: packets traced through rendered tables (no kernel), as kube-proxy's own
// tests trace them: source, destination, what happens, which endpoints, masqueraded or not.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {parseNftablesJson, parseNftablesScript, ruleText} from '../../../src/core/nftables/parse.ts';
import {renderNftables} from '../../../src/core/nftables/render.ts';
import {traceNftables} from '../../../src/core/nftables/trace.ts';
import type {Packet, TraceResult} from '../../../src/core/trace/types.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

const nodeIP = '10.240.0.11';
const port = (nodePort?: number) => [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, ...(nodePort ? {nodePort} : {})}];
const services = [
  service('web', {clusterIP: '10.96.0.10'}),
  service('empty', {clusterIP: '10.96.0.11'}),
  service('np', {clusterIP: '10.96.0.12', type: 'NodePort', ports: port(30012)}),
  service('np-local', {clusterIP: '10.96.0.13', type: 'NodePort', externalTrafficPolicy: 'Local', ports: port(30013)}),
  service('np-remote', {clusterIP: '10.96.0.14', type: 'NodePort', externalTrafficPolicy: 'Local', ports: port(30014)}),
  service(
    'lb',
    {clusterIP: '10.96.0.15', type: 'LoadBalancer', loadBalancerSourceRanges: ['192.0.2.0/24'], ports: port(30015)},
    {status: {loadBalancer: {ingress: [{ip: '203.0.113.15'}]}}},
  ),
  service('ext', {clusterIP: '10.96.0.16', externalIPs: ['198.51.100.16']}),
  service('sticky', {clusterIP: '10.96.0.17', sessionAffinity: 'ClientIP'}),
  service('dns', {clusterIP: '10.96.0.18', ports: [{name: 'dns', protocol: 'UDP', port: 53, targetPort: 5353}]}),
  // Services that choose among fewer endpoints than they have.
  service('local-split', {clusterIP: '10.96.0.19', type: 'NodePort', externalTrafficPolicy: 'Local', ports: port(30019)}),
  service('not-ready', {clusterIP: '10.96.0.20'}),
  service('terminating', {clusterIP: '10.96.0.21'}),
  service('ready-over-terminating', {clusterIP: '10.96.0.22'}),
];
const servingTerminating = {ready: false, serving: true, terminating: true};
const here = (ip: string) => ({ip, node: 'node-1'});
const there = (ip: string) => ({ip, node: 'node-2'});
const slices = [
  slice('web-1', 'web', [here('10.244.1.5'), there('10.244.2.5'), there('10.244.2.6')]),
  slice('np-1', 'np', [there('10.244.2.12')]),
  slice('np-local-1', 'np-local', [here('10.244.1.13'), there('10.244.2.13')]),
  slice('np-remote-1', 'np-remote', [there('10.244.2.14')]),
  slice('lb-1', 'lb', [here('10.244.1.15')]),
  slice('ext-1', 'ext', [there('10.244.2.16')]),
  slice('sticky-1', 'sticky', [here('10.244.1.17'), there('10.244.2.17')]),
  {...slice('dns-1', 'dns', [there('10.244.2.18')]), ports: [{name: 'dns', protocol: 'UDP', port: 5353}]},
  slice('local-split-1', 'local-split', [here('10.244.1.19'), here('10.244.1.29'), there('10.244.2.19')]),
  slice('not-ready-1', 'not-ready', [here('10.244.1.20'), {...there('10.244.2.20'), ready: false, serving: false}, there('10.244.2.30')]),
  slice('terminating-1', 'terminating', [
    {...here('10.244.1.21'), ...servingTerminating},
    {...there('10.244.2.21'), ready: false, serving: false, terminating: true},
    {...there('10.244.2.31'), ...servingTerminating},
  ]),
  slice('ready-over-terminating-1', 'ready-over-terminating', [
    here('10.244.1.22'),
    {...there('10.244.2.22'), ...servingTerminating},
    {...there('10.244.2.32'), ...servingTerminating},
  ]),
];
const model = buildProxyModel({services, endpointSlices: slices, node: node('node-1')}, {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']});
const table = parseNftablesScript(renderNftables(model, {serviceCIDRs: ['10.96.0.0/16']}));
const context = {localAddresses: [nodeIP, '10.244.1.1', '127.0.0.1']};

interface Row {
  name: string;
  src: string;
  dst: string;
  port: number;
  protocol?: Packet['protocol'];
  origin?: Packet['origin'];
  verdict: TraceResult['verdict'];
  endpoints?: string[];
  masquerade?: boolean;
  servicePort?: string;
}

const rows: Row[] = [
  {
    name: 'pod to ClusterIP',
    src: '10.244.1.9',
    dst: '10.96.0.10',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.5:8080', '10.244.2.5:8080', '10.244.2.6:8080'],
    masquerade: false,
    servicePort: 'default/web:http',
  },
  {
    name: 'off-cluster source to ClusterIP',
    src: '10.240.0.100',
    dst: '10.96.0.10',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.5:8080', '10.244.2.5:8080', '10.244.2.6:8080'],
    masquerade: true,
  },
  {
    name: 'node itself to ClusterIP',
    src: nodeIP,
    dst: '10.96.0.10',
    port: 80,
    origin: 'local',
    verdict: 'DNAT',
    endpoints: ['10.244.1.5:8080', '10.244.2.5:8080', '10.244.2.6:8080'],
    masquerade: true,
  },
  {
    name: 'hairpin',
    src: '10.244.1.5',
    dst: '10.96.0.10',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.5:8080', '10.244.2.5:8080', '10.244.2.6:8080'],
  },
  {name: 'unknown port of a ClusterIP', src: '10.244.1.9', dst: '10.96.0.10', port: 81, verdict: 'REJECT'},
  {name: 'unallocated ClusterIP', src: '10.244.1.9', dst: '10.96.0.200', port: 80, verdict: 'DROP'},
  {name: 'address outside the service CIDR', src: '10.244.1.9', dst: '10.97.0.1', port: 80, verdict: 'ACCEPT'},
  {name: 'no endpoints', src: '10.244.1.9', dst: '10.96.0.11', port: 80, verdict: 'REJECT', servicePort: 'default/empty:http'},
  {
    name: 'NodePort, Cluster policy',
    src: '10.240.0.100',
    dst: nodeIP,
    port: 30012,
    verdict: 'DNAT',
    endpoints: ['10.244.2.12:8080'],
    masquerade: true,
  },
  {name: 'NodePort on a non-primary address', src: '10.240.0.100', dst: '10.244.1.1', port: 30012, verdict: 'ACCEPT'},
  {
    name: 'NodePort, Local policy',
    src: '10.240.0.100',
    dst: nodeIP,
    port: 30013,
    verdict: 'DNAT',
    endpoints: ['10.244.1.13:8080'],
    masquerade: false,
  },
  {
    name: 'NodePort, Local policy, from a pod: short-circuit to all endpoints',
    src: '10.244.1.9',
    dst: nodeIP,
    port: 30013,
    verdict: 'DNAT',
    endpoints: ['10.244.1.13:8080', '10.244.2.13:8080'],
    masquerade: false,
  },
  {name: 'NodePort, Local policy, no local endpoint', src: '10.240.0.100', dst: nodeIP, port: 30014, verdict: 'DROP'},
  {
    name: 'NodePort, Local policy, no local endpoint, from the node',
    src: nodeIP,
    dst: nodeIP,
    port: 30014,
    origin: 'local',
    verdict: 'DNAT',
    endpoints: ['10.244.2.14:8080'],
    masquerade: true,
  },
  {
    name: 'LB IP from an allowed source',
    src: '192.0.2.7',
    dst: '203.0.113.15',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.15:8080'],
    masquerade: true,
  },
  {name: 'LB IP from a blocked source', src: '198.18.0.1', dst: '203.0.113.15', port: 80, verdict: 'DROP'},
  {
    name: 'externalIP',
    src: '10.240.0.100',
    dst: '198.51.100.16',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.2.16:8080'],
    masquerade: true,
  },
  {
    name: 'session affinity, new client',
    src: '10.244.1.9',
    dst: '10.96.0.17',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.17:8080', '10.244.2.17:8080'],
    masquerade: false,
  },
  {
    name: 'UDP',
    src: '10.244.1.9',
    dst: '10.96.0.18',
    port: 53,
    protocol: 'UDP',
    verdict: 'DNAT',
    endpoints: ['10.244.2.18:5353'],
    masquerade: false,
  },
  {
    name: 'NodePort, Local policy, 2 of 3 endpoints local',
    src: '10.240.0.100',
    dst: nodeIP,
    port: 30019,
    verdict: 'DNAT',
    endpoints: ['10.244.1.19:8080', '10.244.1.29:8080'],
    masquerade: false,
  },
  {
    name: 'one of 3 endpoints not ready',
    src: '10.244.1.9',
    dst: '10.96.0.20',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.20:8080', '10.244.2.30:8080'],
    masquerade: false,
  },
  {
    name: 'none ready: the 2 serving terminating endpoints of 3',
    src: '10.244.1.9',
    dst: '10.96.0.21',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.21:8080', '10.244.2.31:8080'],
    masquerade: false,
  },
  {
    name: 'one ready endpoint wins over 2 serving terminating ones',
    src: '10.244.1.9',
    dst: '10.96.0.22',
    port: 80,
    verdict: 'DNAT',
    endpoints: ['10.244.1.22:8080'],
    masquerade: false,
  },
  {name: 'UDP port on a TCP service', src: '10.244.1.9', dst: '10.96.0.10', port: 80, protocol: 'UDP', verdict: 'REJECT'},
];

describe('traceNftables over a rendered table', () => {
  for (const row of rows) {
    it(row.name, () => {
      const packet: Packet = {
        srcIP: row.src,
        dstIP: row.dst,
        dstPort: row.port,
        protocol: row.protocol ?? 'TCP',
        origin: row.origin ?? 'arriving',
      };
      const result = traceNftables(table, packet, context);
      const seen = `${result.verdict} ${result.branches.map((branch) => `${branch.endpoint}/${branch.masquerade}`).join(' ')} via ${result.hops.map((hop) => `${hop.chain}:${hop.target}`).join(' ')}`;
      assert.equal(result.verdict, row.verdict, seen);
      if (row.endpoints) {
        assert.deepEqual(result.branches.map((branch) => branch.endpoint).sort(), row.endpoints, seen);
        const total = result.branches.reduce((sum, branch) => sum + branch.probability, 0);
        assert.ok(Math.abs(total - 1) < 1e-9, seen);
        for (const branch of result.branches) assert.ok(Math.abs(branch.probability - 1 / row.endpoints.length) < 1e-9, seen);
        // An endpoint choice whose modulus counts more endpoints than it chose has paths that find
        // no map element and end elsewhere.
        assert.deepEqual(
          result.warnings.filter((warning) => warning.startsWith('paths end differently')),
          [],
          seen,
        );
      }
      if (row.masquerade !== undefined) for (const branch of result.branches) assert.equal(branch.masquerade, row.masquerade, seen);
      if (row.servicePort) assert.equal(result.servicePort, row.servicePort, seen);
      assert.deepEqual(
        result.warnings.filter((warning) => warning.startsWith('cannot evaluate')),
        [],
      );
    });
  }

  it('hairpin traffic is masqueraded only on the branch back to the sender', () => {
    const result = traceNftables(
      table,
      {srcIP: '10.244.1.5', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
      context,
    );
    const masqueraded = result.branches.filter((branch) => branch.masquerade).map((branch) => branch.endpoint);
    assert.deepEqual(masqueraded, ['10.244.1.5:8080']);
  });

  it('hops name the table, chain, rule and target in order', () => {
    const result = traceNftables(
      table,
      {srcIP: '10.244.1.9', dstIP: '10.96.0.11', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
      context,
    );
    assert.deepEqual(
      result.hops.map((hop) => `${hop.hook} ${hop.table} ${hop.chain} -> ${hop.target}`),
      [
        'PREROUTING ip kube-proxy filter-prerouting -> firewall-check',
        'PREROUTING ip kube-proxy nat-prerouting -> services',
        'FORWARD ip kube-proxy filter-forward -> service-endpoints-check',
        'FORWARD ip kube-proxy service-endpoints-check -> reject-chain',
        'FORWARD ip kube-proxy reject-chain -> REJECT',
      ],
    );
    assert.ok(result.warnings.includes('default/empty:http has no endpoints'));
  });
});

describe("traceNftables over kube-proxy's own layout", () => {
  // The shape kube-proxy's nftables proxier writes: a chain per endpoint, chosen by a numgen vmap.
  const kubeProxy = parseNftablesScript(`
add table ip kube-proxy
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add chain ip kube-proxy endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.0.2/80
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy masquerading meta mark & 0x00004000 == 0x00000000 return
add rule ip kube-proxy masquerading meta mark set meta mark ^ 0x00004000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy mark-for-masquerade meta mark set meta mark | 0x00004000
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80, 1 : goto endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add rule ip kube-proxy endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
`);

  it('splits over the endpoint chains and masquerades the hairpin branch', () => {
    const result = traceNftables(
      kubeProxy,
      {srcIP: '10.180.0.1', dstIP: '172.30.0.41', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
      {localAddresses: ['192.168.0.2']},
    );
    assert.equal(result.verdict, 'DNAT');
    assert.deepEqual(
      result.branches.map((branch) => [branch.endpoint, branch.probability, branch.masquerade]),
      [
        ['10.180.0.1:80', 0.5, true],
        ['10.180.0.2:80', 0.5, false],
      ],
    );
    assert.equal(result.servicePort, 'ns1/svc1:p80');
    // Each branch starts where numgen picks its endpoint chain.
    assert.deepEqual(
      result.branches[0].hops.slice(0, 2).map((hop) => `${hop.chain} -> ${hop.target}`),
      [
        'service-ULMVA6XW-ns1/svc1/tcp/p80 -> endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80',
        'endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 -> mark-for-masquerade',
      ],
    );
  });
});

describe('parseNftablesJson', () => {
  it('reads chains, rules and map elements from nft -j output', () => {
    const json = JSON.stringify({
      nftables: [
        {metainfo: {version: '1.0.6', json_schema_version: 1}},
        {table: {family: 'ip', name: 'kube-proxy', handle: 1}},
        {
          map: {
            family: 'ip',
            name: 'service-ips',
            table: 'kube-proxy',
            type: ['ipv4_addr', 'inet_proto', 'inet_service'],
            handle: 2,
            map: 'verdict',
            elem: [[{concat: ['10.96.0.10', 'tcp', 80]}, {goto: {target: 'service-X-default/web/tcp/http'}}]],
          },
        },
        {
          map: {
            family: 'ip',
            name: 'no-endpoint-services',
            table: 'kube-proxy',
            type: ['ipv4_addr', 'inet_proto', 'inet_service'],
            handle: 3,
            map: 'verdict',
            elem: [[{elem: {val: {concat: ['10.96.0.11', 'udp', 53]}, comment: 'default/dns:dns'}}, {drop: null}]],
          },
        },
        {
          chain: {
            family: 'ip',
            table: 'kube-proxy',
            name: 'nat-prerouting',
            handle: 4,
            type: 'nat',
            hook: 'prerouting',
            prio: -100,
            policy: 'accept',
          },
        },
        {chain: {family: 'ip', table: 'kube-proxy', name: 'masquerading', handle: 5}},
        {
          rule: {
            family: 'ip',
            table: 'kube-proxy',
            chain: 'masquerading',
            handle: 6,
            expr: [{match: {op: '==', left: {'&': [{meta: {key: 'mark'}}, 16384]}, right: 0}}, {return: null}],
          },
        },
        {
          rule: {
            family: 'ip',
            table: 'kube-proxy',
            chain: 'masquerading',
            handle: 7,
            expr: [{mangle: {key: {meta: {key: 'mark'}}, value: {'^': [{meta: {key: 'mark'}}, 16384]}}}],
          },
        },
        {rule: {family: 'ip', table: 'kube-proxy', chain: 'masquerading', handle: 8, expr: [{masquerade: {flags: 'fully-random'}}]}},
        {
          rule: {
            family: 'ip',
            table: 'kube-proxy',
            chain: 'nat-prerouting',
            handle: 9,
            comment: 'why',
            expr: [
              {
                match: {
                  op: '!=',
                  left: {payload: {protocol: 'ip', field: 'saddr'}},
                  right: {set: [{prefix: {addr: '10.0.0.0', len: 8}}, '192.0.2.1']},
                },
              },
              {jump: {target: 'masquerading'}},
            ],
          },
        },
        {table: {family: 'ip', name: 'other', handle: 2}},
        {chain: {family: 'ip', table: 'other', name: 'foreign', handle: 1}},
      ],
    });
    const table = parseNftablesJson(json);
    assert.deepEqual(table.sets.get('service-ips')!.elements, [
      {key: '10.96.0.10 . tcp . 80', value: 'goto service-X-default/web/tcp/http'},
    ]);
    assert.deepEqual(table.sets.get('no-endpoint-services')!.elements, [
      {key: '10.96.0.11 . udp . 53', value: 'drop', comment: 'default/dns:dns'},
    ]);
    assert.deepEqual(
      table.chains.get('masquerading')!.rules.map((rule) => ruleText(rule)),
      ['meta mark & 0x00004000 == 0x00000000 return', 'meta mark set meta mark ^ 0x00004000', 'masquerade fully-random'],
    );
    assert.deepEqual(table.chains.get('nat-prerouting')!.rules, [
      {text: 'ip saddr != { 10.0.0.0/8, 192.0.2.1 } jump masquerading', comment: 'why'},
    ]);
    assert.equal(table.chains.get('nat-prerouting')!.priority, -100);
    assert.equal(table.chains.has('foreign'), false, 'other tables are not ours');
  });

  it('says what is wrong with input that is not nft JSON', () => {
    assert.throws(() => parseNftablesJson('table ip x {}'), /nft JSON: not JSON/);
    assert.throws(() => parseNftablesJson('{"rules": []}'), /no "nftables" list/);
  });
});
