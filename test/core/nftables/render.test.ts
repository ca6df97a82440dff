// render: what the nft script holds for each feature, and what a partial transaction touches.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {buildProxyModel, changedServicePorts, type ProxyModel} from '../../../src/core/model/index.ts';
import {endpointMapShard, endpointNameBase, servicePortNameBase} from '../../../src/core/nftables/names.ts';
import {diffNftables} from '../../../src/core/nftables/diff.ts';
import {parseNftablesScript, ruleComment, ruleText} from '../../../src/core/nftables/parse.ts';
import {
  deleteStaleChains,
  endpointTargetsMap,
  masqueradeMark,
  renderNftables,
  renderNftablesSync,
} from '../../../src/core/nftables/render.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

function model(services: unknown[], slices: unknown[], options: Partial<Parameters<typeof buildProxyModel>[1]> = {}): ProxyModel {
  const built = buildProxyModel(
    {services, endpointSlices: slices, node: node('node-1')},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16'], ...options},
  );
  assert.deepEqual(built.problems, []);
  return built;
}

const web = service('web', {clusterIP: '10.96.0.10'});
const webSlice = slice('web-1', 'web', [
  {ip: '10.244.1.5', node: 'node-1'},
  {ip: '10.244.2.5', node: 'node-2'},
]);

/** targetsOf: the endpoint-targets map a per-service chain picks from. */
function targetsOf(chain: string, protocol = 'tcp'): string {
  return endpointTargetsMap(protocol, endpointMapShard(chain));
}

function rules(script: string, chainPrefix: string): string[] {
  const table = parseNftablesScript(script);
  return [...table.chains.values()]
    .filter((chain) => chain.name.startsWith(chainPrefix) && chain.name.includes('/'))
    .flatMap((chain) => chain.rules.map((rule) => ruleText(rule)));
}

describe('nftables names', () => {
  it('hash service and endpoint chain names as kube-proxy does', () => {
    // kube-proxy's own test expectations (pkg/proxy/nftables/proxier_test.go).
    assert.equal(
      servicePortNameBase({namespace: 'ns1', serviceName: 'svc1', portName: 'p80', protocol: 'TCP'}),
      'ULMVA6XW-ns1/svc1/tcp/p80',
    );
    assert.match(
      endpointNameBase({namespace: 'ns1', serviceName: 'svc1', portName: 'p80', protocol: 'TCP'}, {ip: '10.180.0.1', port: 80}),
      /^[A-Z2-7]{8}-ns1\/svc1\/tcp\/p80__10\.180\.0\.1\/80$/,
    );
    assert.match(
      endpointNameBase({namespace: 'ns1', serviceName: 'svc1', portName: 'p80', protocol: 'TCP'}, {ip: 'fd00::1', port: 80}),
      /__fd00\.\.1\/80$/,
    );
  });

  it('writes the masquerade mark as nft lists it', () => {
    assert.equal(masqueradeMark(14), '0x00004000');
    assert.equal(masqueradeMark(31), '0x80000000');
  });
});

describe('renderNftables', () => {
  it('writes the table, base chains with their priorities and the fixed maps', () => {
    const script = renderNftables(model([web], [webSlice]));
    const table = parseNftablesScript(script);
    assert.equal(table.family, 'ip');
    assert.equal(table.table, 'kube-proxy');
    const base = Object.fromEntries(
      [...table.chains.values()].filter((chain) => chain.hook).map((chain) => [chain.name, `${chain.hook} ${chain.priority}`]),
    );
    assert.deepEqual(base, {
      'filter-prerouting': 'prerouting -110',
      'filter-input': 'input -110',
      'filter-forward': 'forward -110',
      'filter-output': 'output -110',
      'filter-output-post-dnat': 'output -90',
      'nat-prerouting': 'prerouting -100',
      'nat-output': 'output -100',
      'nat-postrouting': 'postrouting 100',
    });
    for (const name of [
      'service-ips',
      'service-nodeports',
      'cluster-ips',
      'no-endpoint-services',
      'no-endpoint-nodeports',
      'firewall-ips',
      'nodeport-ips',
    ])
      assert.ok(table.sets.has(name), name);
    assert.deepEqual(
      table.sets.get('nodeport-ips')!.elements.map((element) => element.key),
      ['10.240.0.11'],
      'NodePorts on the primary IP only',
    );
    assert.deepEqual(
      table.chains.get('services')!.rules.map((rule) => ruleText(rule)),
      ['ip daddr . meta l4proto . th dport vmap @service-ips', 'ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports'],
    );
    assert.deepEqual(
      table.chains.get('masquerading')!.rules.map((rule) => ruleText(rule)),
      [
        'ct status dnat ip saddr . ip daddr @hairpin-endpoints jump mark-for-masquerade',
        'meta mark & 0x00004000 == 0x00000000 return',
        'meta mark set meta mark ^ 0x00004000',
        'masquerade fully-random',
      ],
    );
  });

  it('sends a ClusterIP to its service chain, masquerades off-cluster sources, picks endpoints with numgen', () => {
    const script = renderNftables(model([web], [webSlice]));
    const table = parseNftablesScript(script);
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web', portName: 'http', protocol: 'TCP'})}`;
    assert.deepEqual(table.sets.get('service-ips')!.elements, [{key: '10.96.0.10 . tcp . 80', value: `goto ${chain}`}]);
    assert.deepEqual(table.sets.get('cluster-ips')!.elements, [{key: '10.96.0.10'}]);
    assert.deepEqual(
      table.chains.get(chain)!.rules.map((rule) => ruleText(rule)),
      [
        'ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade',
        `meta l4proto tcp dnat ip to numgen random mod 2 map @${targetsOf(chain)}`,
      ],
    );
    assert.deepEqual(table.sets.get(targetsOf(chain))!.elements, [
      {key: '0', value: '10.244.1.5 . 8080'},
      {key: '1', value: '10.244.2.5 . 8080'},
    ]);
    assert.deepEqual(
      table.sets.get('hairpin-endpoints')!.elements.map((element) => element.key),
      ['10.244.1.5 . 10.244.1.5', '10.244.2.5 . 10.244.2.5'],
    );
  });

  it('rejects a service without endpoints and drops Local traffic without local endpoints', () => {
    const empty = service('empty', {
      clusterIP: '10.96.0.20',
      type: 'NodePort',
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30020}],
    });
    const local = service('local', {
      clusterIP: '10.96.0.21',
      type: 'NodePort',
      externalTrafficPolicy: 'Local',
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30021}],
    });
    const table = parseNftablesScript(
      renderNftables(model([empty, local], [slice('local-1', 'local', [{ip: '10.244.2.7', node: 'node-2'}])])),
    );
    assert.deepEqual(table.sets.get('no-endpoint-services')!.elements, [
      {key: '10.96.0.20 . tcp . 80', value: 'goto reject-chain', comment: 'default/empty:http'},
    ]);
    assert.deepEqual(table.sets.get('no-endpoint-nodeports')!.elements, [
      {key: 'tcp . 30020', value: 'goto reject-chain', comment: 'default/empty:http'},
      {key: 'tcp . 30021', value: 'drop', comment: 'default/local:http'},
    ]);
    const external = `external-${servicePortNameBase({namespace: 'default', serviceName: 'local', portName: 'http', protocol: 'TCP'})}`;
    const cluster = `service-${servicePortNameBase({namespace: 'default', serviceName: 'local', portName: 'http', protocol: 'TCP'})}`;
    assert.deepEqual(
      table.chains
        .get(external)!
        .rules.map((rule) => (ruleComment(rule) ? `${ruleText(rule)} comment "${ruleComment(rule)}"` : ruleText(rule))),
      [
        `ip saddr 10.244.0.0/16 goto ${cluster} comment "short-circuit pod traffic"`,
        'fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"',
        `fib saddr type local goto ${cluster} comment "short-circuit local traffic"`,
      ],
    );
  });

  it('firewalls load-balancer IPs with loadBalancerSourceRanges before DNAT', () => {
    const lb = service(
      'lb',
      {
        clusterIP: '10.96.0.30',
        type: 'LoadBalancer',
        loadBalancerSourceRanges: ['192.0.2.0/24', '198.51.100.7/32'],
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30030}],
      },
      {status: {loadBalancer: {ingress: [{ip: '203.0.113.9'}]}}},
    );
    const table = parseNftablesScript(renderNftables(model([lb], [slice('lb-1', 'lb', [{ip: '10.244.1.9', node: 'node-1'}])])));
    const firewall = `firewall-${servicePortNameBase({namespace: 'default', serviceName: 'lb', portName: 'http', protocol: 'TCP'})}`;
    assert.deepEqual(table.sets.get('firewall-ips')!.elements, [{key: '203.0.113.9 . tcp . 80', value: `goto ${firewall}`}]);
    assert.deepEqual(
      table.chains.get(firewall)!.rules.map((rule) => ruleText(rule)),
      ['ip saddr != { 192.0.2.0/24, 198.51.100.7 } drop'],
    );
  });

  it('closes the load-balancer IP to every client when a loadBalancerSourceRanges entry is no CIDR, and keeps the NodePort', () => {
    const lb = service(
      'lb',
      {
        clusterIP: '10.96.0.30',
        type: 'LoadBalancer',
        loadBalancerSourceRanges: ['192.0.2.0/24', 'bogus'],
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30030}],
      },
      {status: {loadBalancer: {ingress: [{ip: '203.0.113.9'}]}}},
    );
    const built = buildProxyModel(
      {services: [lb], endpointSlices: [slice('lb-1', 'lb', [{ip: '10.244.1.9', node: 'node-1'}])], node: node('node-1')},
      {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
    );
    assert.deepEqual(
      built.problems.map((problem) => problem.field),
      ['spec.loadBalancerSourceRanges[1]'],
    );
    const table = parseNftablesScript(renderNftables(built));
    const firewall = `firewall-${servicePortNameBase({namespace: 'default', serviceName: 'lb', portName: 'http', protocol: 'TCP'})}`;
    assert.deepEqual(table.sets.get('firewall-ips')!.elements, [{key: '203.0.113.9 . tcp . 80', value: `goto ${firewall}`}]);
    assert.deepEqual(
      table.chains.get(firewall)!.rules.map((rule) => ruleText(rule)),
      ['drop'],
    );
    assert.equal(table.sets.get('service-nodeports')!.elements.length, 1);
  });

  it('keeps endpoint chains and affinity sets with the timeout for session affinity', () => {
    const sticky = service('sticky', {
      clusterIP: '10.96.0.40',
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}},
    });
    const script = renderNftables(
      model(
        [sticky],
        [
          slice('sticky-1', 'sticky', [
            {ip: '10.244.1.5', node: 'node-1'},
            {ip: '10.244.2.5', node: 'node-2'},
          ]),
        ],
      ),
    );
    const table = parseNftablesScript(script);
    const affinity = [...table.sets.values()].filter((set) => set.name.startsWith('affinity-'));
    assert.equal(affinity.length, 2);
    for (const set of affinity) assert.deepEqual([set.flags, set.timeoutSeconds], [['dynamic', 'timeout'], 600]);
    const endpointRules = rules(script, 'endpoint-');
    assert.ok(endpointRules.includes('ip saddr 10.244.1.5 jump mark-for-masquerade'));
    assert.ok(endpointRules.some((rule) => /^update @affinity-\S+__10\.244\.1\.5\/8080 \{ ip saddr \}$/.test(rule)));
    assert.ok(endpointRules.includes('meta l4proto tcp dnat to 10.244.1.5:8080'));
    const service_ = rules(script, 'service-');
    assert.match(service_[1], /^ip saddr @affinity-\S+ goto endpoint-/);
    assert.match(service_[3], /^numgen random mod 2 vmap \{ 0 : goto endpoint-\S+, 1 : goto endpoint-\S+ \}$/);
  });

  it('drops unallocated addresses of the service CIDRs and rejects unknown ports of ClusterIPs', () => {
    const table = parseNftablesScript(renderNftables(model([web], [webSlice]), {serviceCIDRs: ['10.96.0.0/16', 'fd00::/108']}));
    assert.deepEqual(
      table.chains.get('cluster-ips-check')!.rules.map((rule) => ruleText(rule)),
      ['ip daddr @cluster-ips reject', 'ip daddr 10.96.0.0/16 drop'],
    );
    const without = parseNftablesScript(renderNftables(model([web], [webSlice])));
    assert.deepEqual(
      without.chains.get('cluster-ips-check')!.rules.map((rule) => ruleText(rule)),
      ['ip daddr @cluster-ips reject'],
    );
  });

  it('accepts NodePorts on every local address but loopback when nodePortAddresses covers everything', () => {
    const table = parseNftablesScript(renderNftables(model([web], [webSlice], {config: {nodePortAddresses: ['0.0.0.0/0']}})));
    assert.equal(table.sets.has('nodeport-ips'), false);
    assert.equal(
      ruleText(table.chains.get('services')!.rules[1]),
      'fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports',
    );
  });

  it('writes an ip6 table for IPv6', () => {
    const v6 = service('web6', {clusterIP: 'fd00::10', ipFamilies: ['IPv6']});
    const v6Slice = {...slice('web6-1', 'web6', [{ip: 'fd00:10:244:1::5', node: 'node-1'}]), addressType: 'IPv6'};
    const built = buildProxyModel({services: [v6], endpointSlices: [v6Slice], node: node('node-1')}, {family: 'IPv6'});
    const table = parseNftablesScript(renderNftables(built));
    assert.equal(table.family, 'ip6');
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web6', portName: 'http', protocol: 'TCP'})}`;
    assert.deepEqual(table.sets.get(targetsOf(chain))!.elements, [{key: '0', value: 'fd00:10:244:1::5 . 8080'}]);
    assert.deepEqual(
      table.sets.get('nodeport-ips')!.elements.map((element) => element.key),
      ['fd00:10:240::11'],
    );
  });
});

describe('partial transactions', () => {
  const other = service('other', {clusterIP: '10.96.0.11'});
  const otherSlice = slice('other-1', 'other', [{ip: '10.244.1.6', node: 'node-1'}]);

  it('touch only the changed service port, and leave the same table as a full render', () => {
    const before = model([web, other], [webSlice, otherSlice]);
    const full = renderNftablesSync(before);
    const after = model(
      [web, other],
      [
        slice('web-1', 'web', [
          {ip: '10.244.1.5', node: 'node-1'},
          {ip: '10.244.2.5', node: 'node-2'},
          {ip: '10.244.2.8', node: 'node-2'},
        ]),
        otherSlice,
      ],
    );
    const changed = changedServicePorts(before, after);
    const fullScript = full.script;
    const partial = renderNftablesSync(after, {existing: full.state, changedServicePorts: changed, now: 1000});
    assert.equal(partial.kind, 'partial');
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web', portName: 'http', protocol: 'TCP'})}`;
    assert.equal(
      partial.script,
      [
        `add chain ip kube-proxy ${chain}`,
        `flush chain ip kube-proxy ${chain}`,
        // "other" sorts first and holds key 0; web held 1 and 2 and gets a new block at the end.
        `delete element ip kube-proxy ${targetsOf(chain)} { 1, 2 }`,
        `add element ip kube-proxy ${targetsOf(chain)} { 3 : 10.244.1.5 . 8080, 4 : 10.244.2.5 . 8080, 5 : 10.244.2.8 . 8080 }`,
        'add element ip kube-proxy hairpin-endpoints { 10.244.2.8 . 10.244.2.8 }',
        `add rule ip kube-proxy ${chain} ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade`,
        `add rule ip kube-proxy ${chain} meta l4proto tcp dnat ip to numgen random mod 3 offset 3 map @${targetsOf(chain)}`,
        '',
      ].join('\n'),
    );
    const replayed = parseNftablesScript(partial.script, parseNftablesScript(fullScript));
    assert.equal(diffNftables(parseNftablesScript(renderNftables(after)), replayed).text, '');
  });

  it('replace an endpoint in place: the same keys with new values, no chain rewritten', () => {
    const before = model([web, other], [webSlice, otherSlice]);
    const full = renderNftablesSync(before);
    // web's endpoints were 10.244.1.5 and 10.244.2.5 (keys 1 and 2); the second one is replaced.
    const after = model(
      [web, other],
      [
        slice('web-1', 'web', [
          {ip: '10.244.1.5', node: 'node-1'},
          {ip: '10.244.2.9', node: 'node-2'},
        ]),
        otherSlice,
      ],
    );
    const partial = renderNftablesSync(after, {existing: full.state, changedServicePorts: changedServicePorts(before, after), now: 1000});
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web', portName: 'http', protocol: 'TCP'})}`;
    assert.equal(
      partial.script,
      [
        `delete element ip kube-proxy ${targetsOf(chain)} { 2 }`,
        'delete element ip kube-proxy hairpin-endpoints { 10.244.2.5 . 10.244.2.5 }',
        `add element ip kube-proxy ${targetsOf(chain)} { 2 : 10.244.2.9 . 8080 }`,
        'add element ip kube-proxy hairpin-endpoints { 10.244.2.9 . 10.244.2.9 }',
        '',
      ].join('\n'),
    );
    const replayed = parseNftablesScript(partial.script, parseNftablesScript(full.script));
    assert.equal(diffNftables(parseNftablesScript(renderNftables(after)), replayed).text, '');
    // The next change starts from the state this one left: the chain still reads keys 1 and 2.
    const again = model(
      [web, other],
      [
        slice('web-1', 'web', [
          {ip: '10.244.1.7', node: 'node-1'},
          {ip: '10.244.2.9', node: 'node-2'},
        ]),
        otherSlice,
      ],
    );
    const next = renderNftablesSync(again, {existing: partial.state, changedServicePorts: changedServicePorts(after, again), now: 2000});
    assert.ok(!next.script.includes('chain'), next.script);
    assert.equal(diffNftables(parseNftablesScript(renderNftables(again)), parseNftablesScript(next.script, replayed)).text, '');
  });

  it('flush the chains of a removed service, delete them later, and keep shared elements', () => {
    const before = model([web, other], [webSlice, {...otherSlice, endpoints: [{addresses: ['10.244.1.5'], nodeName: 'node-1'}]}]);
    const full = renderNftablesSync(before);
    const after = model([other], [{...otherSlice, endpoints: [{addresses: ['10.244.1.5'], nodeName: 'node-1'}]}]);
    const partial = renderNftablesSync(after, {existing: full.state, changedServicePorts: changedServicePorts(before, after), now: 5000});
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web', portName: 'http', protocol: 'TCP'})}`;
    const lines = partial.script.trim().split('\n');
    assert.ok(lines.includes(`flush chain ip kube-proxy ${chain}`));
    assert.ok(lines.includes('delete element ip kube-proxy cluster-ips { 10.96.0.10 }'));
    assert.ok(lines.includes('delete element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 }'));
    // 10.244.1.5 is still an endpoint of "other": its hairpin element stays.
    assert.ok(lines.includes('delete element ip kube-proxy hairpin-endpoints { 10.244.2.5 . 10.244.2.5 }'));
    assert.ok(!partial.script.includes('10.244.1.5 . 10.244.1.5'));
    assert.equal(deleteStaleChains(partial.state, 5500), undefined, 'not before a second has passed');
    const stale = deleteStaleChains(partial.state, 6000)!;
    assert.equal(stale.script, `delete chain ip kube-proxy ${chain}\n`);
    assert.equal(stale.state.staleChains.size, 0);
  });

  it('fall back to a full sync when node-wide settings change', () => {
    const before = model([web], [webSlice]);
    const full = renderNftablesSync(before);
    const after = model([web], [webSlice], {config: {masqueradeAll: true}});
    assert.equal(renderNftablesSync(after, {existing: full.state, changedServicePorts: new Set()}).kind, 'full');
  });
});

describe('local traffic detection', () => {
  it('puts several cluster CIDRs in one named set instead of a set per rule', () => {
    const table = parseNftablesScript(renderNftables(model([web], [webSlice], {clusterCIDRs: ['10.244.0.0/16', '10.245.0.0/16']})));
    assert.deepEqual(
      table.sets.get('local-cidrs')!.elements.map((element) => element.key),
      ['10.244.0.0/16', '10.245.0.0/16'],
    );
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web', portName: 'http', protocol: 'TCP'})}`;
    assert.equal(
      ruleText(table.chains.get(chain)!.rules[0]),
      'ip daddr 10.96.0.10 tcp dport 80 ip saddr != @local-cidrs jump mark-for-masquerade',
    );
  });
});

describe('local traffic detection with nested CIDRs', () => {
  it('keeps only the outermost CIDR, which the kernel can hold without overlap', () => {
    const table = parseNftablesScript(
      renderNftables(model([web], [webSlice], {clusterCIDRs: ['10.128.0.0/9', '10.244.0.0/16', '10.128.0.0/9']})),
    );
    assert.equal(table.sets.has('local-cidrs'), false);
    const chain = `service-${servicePortNameBase({namespace: 'default', serviceName: 'web', portName: 'http', protocol: 'TCP'})}`;
    assert.equal(
      ruleText(table.chains.get(chain)!.rules[0]),
      'ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.128.0.0/9 jump mark-for-masquerade',
    );
  });
});
