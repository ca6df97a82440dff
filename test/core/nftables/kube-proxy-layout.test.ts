// nftablesLayout 'kube-proxy' against kube-proxy itself: for the Services and EndpointSlices of
// kube-proxy's own tests, the rendered table is the one kube-proxy's tests say it writes, through
// full and partial syncs; kube-proxy's table parses the same from a script, `nft list` and
// `nft -j list`; diff and trace read it.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {changedServicePorts, type ProxyModel} from '../../../src/core/model/index.ts';
import {diffNftables} from '../../../src/core/nftables/diff.ts';
import {parseNftablesListing} from '../../../src/core/nftables/parse-listing.ts';
import {listSpelling, type NftRuleset, parseNftablesJson, parseNftablesScript, ruleText} from '../../../src/core/nftables/parse.ts';
import {deleteStaleChains, type NftablesState, renderNftables, renderNftablesSync} from '../../../src/core/nftables/render.ts';
import {traceNftables} from '../../../src/core/nftables/trace.ts';
import type {Packet} from '../../../src/core/trace/types.ts';
import {
  fakeProxierNode,
  fakeProxierRenderOptions,
  fixtureModel,
  fixtureObjects,
  fixtureText,
  kubeProxyTable,
  sectionOf,
  tableLines,
} from './kube-proxy-fixtures.ts';

/** assertSameTable: the same commands (order-insensitive) and the same table (rule order inside chains kept). */
function assertSameTable(rendered: string, kubeProxy: string, label: string): void {
  const want = tableLines(kubeProxy);
  const got = tableLines(rendered);
  const missing = want.filter((line) => !got.includes(line));
  const extra = got.filter((line) => !want.includes(line));
  assert.deepEqual({missing, extra}, {missing: [], extra: []}, `${label}: lines differ from kube-proxy's`);
  assert.equal(diffNftables(parseNftablesScript(kubeProxy), parseNftablesScript(rendered)).text, '', `${label}: tables differ`);
}

describe("kube-proxy's nftables layout: render", () => {
  it("writes TestOverallNFTablesRules' expected table for its objects", () => {
    const model = fixtureModel(fixtureObjects('overall.yaml'));
    assertSameTable(renderNftables(model, fakeProxierRenderOptions), kubeProxyTable('overall.nft'), 'overall');
  });

  const cases = [
    {namespace: 'ns1', section: 'svc1', about: 'ClusterIP service, one endpoint'},
    {namespace: 'ns2', section: 'svc2', about: 'LoadBalancer with externalTrafficPolicy Local, no local endpoint'},
    {namespace: 'ns3', section: 'svc3', about: 'NodePort service'},
    {namespace: 'ns4', section: 'svc4', about: 'externalIPs and two endpoints'},
    {namespace: 'ns5', section: 'svc5', about: 'session affinity and loadBalancerSourceRanges'},
    {namespace: 'ns6', section: 'svc6', about: 'no endpoints'},
  ];
  for (const row of cases) {
    it(`writes kube-proxy's rules for one service alone: ${row.about}`, () => {
      const model = fixtureModel(fixtureObjects('overall.yaml', row.namespace));
      const kubeProxy = `${fixtureText('base.nft')}\n${sectionOf('overall.nft', row.section)}`;
      assertSameTable(renderNftables(model, fakeProxierRenderOptions), kubeProxy, row.section);
    });
  }

  it("kube-proxy-1.33: the base chains and ClusterIP masquerade rules of kube-proxy before 1.34, the rest as 1.34's", () => {
    const objects = fixtureObjects('overall.yaml');
    const model = fixtureModel(objects);
    const older = renderNftables({...model, config: {...model.config, nftablesLayout: 'kube-proxy-1.33'}}, fakeProxierRenderOptions);
    const current = tableLines(kubeProxyTable('overall.nft'));
    const got = tableLines(older);
    // From kube-proxy's proxier.go before kubernetes#132456 (base chains) and #131492 (the port match).
    const t = 'add chain ip kube-proxy';
    const r = 'add rule ip kube-proxy';
    assert.deepEqual(
      got.filter((line) => !current.includes(line)),
      [
        `${t} filter-forward { type filter hook forward priority -110 ; }`,
        `${t} filter-input { type filter hook input priority -110 ; }`,
        `${t} filter-output { type filter hook output priority -110 ; }`,
        `${t} filter-output-post-dnat { type filter hook output priority -90 ; }`,
        `${t} filter-prerouting { type filter hook prerouting priority -110 ; }`,
        `${r} filter-output ct state new jump firewall-check`,
        `${r} filter-output-post-dnat ct state new jump cluster-ips-check`,
        `${r} filter-prerouting ct state new jump firewall-check`,
        ...['ULMVA6XW-ns1/svc1', '42NFTM6N-ns2/svc2', '4AT6LBPK-ns3/svc3', 'LAUZTJTB-ns4/svc4', 'HVFWP5L3-ns5/svc5'].map(
          (name, index) =>
            `${r} service-${name}/tcp/p80 ip daddr 172.30.0.4${index + 1} tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade`,
        ),
      ].sort(),
    );
    assert.deepEqual(
      current.filter((line) => !got.includes(line)).map((line) => line.split(' ').slice(0, 5).join(' ')),
      [
        `${t} filter-forward`,
        `${t} filter-input`,
        `${t} filter-output`,
        `${t} filter-output-pre-dnat`,
        `${t} filter-prerouting-pre-dnat`,
        `${r} filter-output`,
        `${r} filter-output-pre-dnat`,
        `${r} filter-prerouting-pre-dnat`,
        `${r} service-42NFTM6N-ns2/svc2/tcp/p80`,
        `${r} service-4AT6LBPK-ns3/svc3/tcp/p80`,
        `${r} service-HVFWP5L3-ns5/svc5/tcp/p80`,
        `${r} service-LAUZTJTB-ns4/svc4/tcp/p80`,
        `${r} service-ULMVA6XW-ns1/svc1/tcp/p80`,
      ],
    );
  });

  it("follows TestSyncProxyRulesRepeated's syncs with partial transactions, stale chains deleted a sync later", () => {
    let applied: NftRuleset | undefined;
    let state: NftablesState | undefined;
    let previous: ProxyModel | undefined;
    let now = 1_000_000;
    for (let step = 1; step <= 8; step++) {
      const model = fixtureModel(fixtureObjects(`repeated-${step}.yaml`));
      // kube-proxy deletes chains gone stale for a second at the start of a sync; the tests age them
      // before syncs 4 and 8.
      if (state && (step === 4 || step === 8)) {
        now += 2000;
        const stale = deleteStaleChains(state, now);
        if (stale) {
          applied = parseNftablesScript(stale.script, applied);
          state = stale.state;
        }
      }
      const sync = renderNftablesSync(model, {
        ...fakeProxierRenderOptions,
        ...(state && previous ? {existing: state, changedServicePorts: changedServicePorts(previous, model)} : {}),
        now,
      });
      assert.equal(sync.kind, step === 1 ? 'full' : 'partial', `sync ${step}`);
      applied = parseNftablesScript(sync.script, applied);
      state = sync.state;
      previous = model;
      const kubeProxy = parseNftablesScript(kubeProxyTable(`repeated-${step}.nft`));
      assert.equal(diffNftables(kubeProxy, applied).text, '', `sync ${step}`);
      // diff forgives emptied chains waiting for deletion; kube-proxy's table has exactly these chains.
      assert.deepEqual([...applied.chains.keys()].sort(), [...kubeProxy.chains.keys()].sort(), `chains after sync ${step}`);
    }
  });
});

describe("kube-proxy's nftables layout: parse and diff", () => {
  const script = parseNftablesScript(kubeProxyTable('overall.nft'));

  it("reads kube-proxy's table from nft's listing and JSON as from its script", () => {
    // The two listings are what nft 1.0.6 printed after loading base.nft and overall.nft.
    const listing = parseNftablesListing(fixtureText('overall.nft-list.txt'));
    const json = parseNftablesJson(fixtureText('overall.nft-list.json'));
    assert.equal(diffNftables(script, listing).text, '');
    assert.equal(diffNftables(script, json).text, '');
    assert.equal(listing.chains.get('filter-prerouting-pre-dnat')?.priority, -110);
    assert.equal(listing.chains.get('nat-postrouting')?.priority, 100);
    assert.equal(listing.sets.get('affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80')?.timeoutSeconds, 10800);
    assert.equal(listing.sets.get('service-ips')?.elements.length, 9);
  });

  it("spells kube-proxy's script as nft lists it", () => {
    assert.equal(listSpelling('mark set mark or 0x4000'), 'meta mark set meta mark | 0x00004000');
    assert.equal(listSpelling('mark and 0x4000 == 0 return'), 'meta mark & 0x00004000 == 0x00000000 return');
    assert.equal(listSpelling('mark set mark xor 0x4000'), 'meta mark set meta mark ^ 0x00004000');
    assert.equal(listSpelling('ip saddr != { 203.0.113.0/25 } drop'), 'ip saddr != 203.0.113.0/25 drop');
    assert.equal(
      listSpelling('numgen random mod 2 vmap { 0 : goto a , 1 : goto b }'),
      'numgen random mod 2 vmap { 0 : goto a, 1 : goto b }',
    );
    assert.equal(listSpelling('update @affinity-x { ip saddr }'), 'update @affinity-x { ip saddr }');
    // Anonymous sets of addresses: nft lists them in address order, joined by ", ".
    assert.equal(
      listSpelling('ip saddr != { 203.0.113.0/25 , 192.168.0.0/24 , 5.6.7.8 } drop'),
      'ip saddr != { 5.6.7.8, 192.168.0.0/24, 203.0.113.0/25 } drop',
    );
    assert.equal(listSpelling('ip daddr { 172.30.0.0/16,10.100.0.0/16 } drop'), 'ip daddr { 10.100.0.0/16, 172.30.0.0/16 } drop');
    assert.equal(listSpelling('ip6 saddr != { fd00::2 , 2001:db8::/64 } drop'), 'ip6 saddr != { 2001:db8::/64, fd00::2 } drop');
    // loadBalancerSourceRanges of one host: kube-proxy writes the prefix, nft lists the address.
    assert.equal(listSpelling('ip saddr != { 203.0.113.7/32 } drop'), 'ip saddr != 203.0.113.7 drop');
    assert.equal(
      listSpelling('numgen random mod 1 vmap { 0 : goto endpoint-X-a/b/tcp/p__10.0.0.1/32 }'),
      'numgen random mod 1 vmap { 0 : goto endpoint-X-a/b/tcp/p__10.0.0.1/32 }',
    );
    assert.equal(
      listSpelling('ip6 saddr != { 2001:db8::7/128, 2001:db8:1::/64 } drop'),
      'ip6 saddr != { 2001:db8::7, 2001:db8:1::/64 } drop',
    );
  });

  it('takes counters, element order and chain order as no difference, and names the service of a missing element', () => {
    const text = fixtureText('overall.nft-list.txt');
    const counted = text.replace(/^(\s+)(ip daddr 172\.30\.0\.41 .*)$/m, '$1$2 counter packets 12 bytes 720');
    const desired = parseNftablesScript(
      kubeProxyTable('overall.nft').replace(/(ns1\/svc1\/tcp\/p80 ip daddr 172\.30\.0\.41 .*)$/m, '$1 counter'),
    );
    assert.equal(diffNftables(desired, parseNftablesListing(counted)).text, '');

    const listed = parseNftablesListing(text);
    const reordered: NftRuleset = {
      ...listed,
      chains: new Map([...listed.chains].reverse()),
      sets: new Map([...listed.sets].reverse().map(([name, set]) => [name, {...set, elements: [...set.elements].reverse()}])),
    };
    assert.equal(diffNftables(script, reordered).text, '');

    const tampered = parseNftablesListing(
      text.replace(/,\n\s+172\.30\.0\.44 \. tcp \. 80 : goto service-LAUZTJTB-ns4\/svc4\/tcp\/p80/, ''),
    );
    const difference = diffNftables(script, tampered);
    assert.deepEqual(
      difference.groups.map((group) => [group.servicePort, group.added, group.removed]),
      [['ns4/svc4:p80', ['element service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }'], []]],
    );
    // As every mode's diff text: "-" is desired and missing from the kernel.
    assert.equal(
      difference.text,
      '# ns4/svc4:p80\n- element service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }\n',
    );
  });

  it("finds kube-proxy's table in `nft list ruleset` among other software's tables", () => {
    // What nft 1.0.6 lists for a table of another firewall, with named counter and quota objects.
    const otherTable = [
      'table inet filter {',
      '\tcounter accepted {',
      '\t\tpackets 0 bytes 0',
      '\t}',
      '',
      '\tquota q {',
      '\t\tover 100 mbytes',
      '\t}',
      '',
      '\tchain input {',
      '\t\ttype filter hook input priority filter; policy drop;',
      '\t\tct state established,related accept',
      '\t\tcounter name "accepted"',
      '\t}',
      '}',
    ].join('\n');
    const ruleset = `${otherTable}\n${fixtureText('overall.nft-list.txt')}`;
    assert.equal(diffNftables(script, parseNftablesListing(ruleset)).text, '');
    const other = parseNftablesListing(ruleset, 'filter');
    assert.deepEqual([other.family, other.table, other.chains.get('input')?.policy], ['inet', 'filter', 'drop']);
    assert.deepEqual(
      other.chains.get('input')?.rules.map((rule) => ruleText(rule)),
      ['ct state established,related accept', 'counter name "accepted"'],
    );
  });

  it("reads a large node's map, its elements listed one per line, each of them", () => {
    // 100,000 services' worth of service-ips, as nft lists a map whose elements do not fit a line.
    const count = 100_000;
    const address = (index: number) => `172.${16 + (index >> 16)}.${(index >> 8) & 255}.${index & 255}`;
    const elements = Array.from({length: count}, (_, index) => `${address(index)} . tcp . 80 : goto service-${index}`);
    const listing = [
      'table ip kube-proxy {',
      '\tmap service-ips {',
      '\t\ttype ipv4_addr . inet_proto . inet_service : verdict',
      '\t\tcomment "ClusterIP, ExternalIP and LoadBalancer IP traffic"',
      `\t\telements = { ${elements.join(',\n\t\t\t     ')} }`,
      '\t}',
      '}',
      '',
    ].join('\n');
    const map = parseNftablesListing(listing).sets.get('service-ips')!;
    assert.equal(map.elements.length, count);
    assert.deepEqual(map.elements.at(-1), {key: `${address(count - 1)} . tcp . 80`, value: `goto service-${count - 1}`});
  });

  it('refuses a listing it cannot read, naming the line', () => {
    assert.throws(() => parseNftablesListing('table ip kube-proxy {\n\tchain x {\n'), /chain x is not closed/);
    assert.throws(() => parseNftablesListing('hello\n'), /nft listing line 1: cannot read "hello" outside a table/);
    assert.throws(() => parseNftablesListing(''), /no table/);
  });
});

describe("kube-proxy's nftables layout: trace over kube-proxy's own table", () => {
  const table = parseNftablesListing(fixtureText('overall.nft-list.txt'));
  const context = {localAddresses: fakeProxierNode.localAddresses};
  const trace = (src: string, dst: string, port: number, origin: Packet['origin'] = 'arriving', ruleset = table) =>
    traceNftables(ruleset, {srcIP: src, dstIP: dst, dstPort: port, protocol: 'TCP', origin}, context);

  // Sources as kube-proxy's tests name them: pods 10.0.0.0/8, external client 203.0.113.2,
  // blocked external client 203.0.113.130.
  const rows = [
    {name: 'pod to ClusterIP', src: '10.0.0.2', dst: '172.30.0.41', port: 80, verdict: 'DNAT', endpoints: ['10.180.0.1:80'], masq: false},
    {name: 'hairpin', src: '10.180.0.1', dst: '172.30.0.41', port: 80, verdict: 'DNAT', endpoints: ['10.180.0.1:80'], masq: true},
    {
      name: 'two endpoints, by numgen',
      src: '10.0.0.2',
      dst: '172.30.0.44',
      port: 80,
      verdict: 'DNAT',
      endpoints: ['10.180.0.4:80', '10.180.0.5:80'],
      masq: false,
    },
    {
      name: 'external to externalIP',
      src: '203.0.113.2',
      dst: '192.168.99.33',
      port: 80,
      verdict: 'DNAT',
      endpoints: ['10.180.0.4:80', '10.180.0.5:80'],
      masq: true,
    },
    {
      name: 'allowed source to LoadBalancer IP',
      src: '203.0.113.2',
      dst: '5.6.7.8',
      port: 80,
      verdict: 'DNAT',
      endpoints: ['10.180.0.3:80'],
      masq: true,
    },
    {name: 'blocked source to LoadBalancer IP', src: '203.0.113.130', dst: '5.6.7.8', port: 80, verdict: 'DROP'},
    {
      name: 'external to NodePort',
      src: '203.0.113.2',
      dst: '192.168.0.2',
      port: 3003,
      verdict: 'DNAT',
      endpoints: ['10.180.0.3:80'],
      masq: true,
    },
    {name: 'NodePort, Local policy, no local endpoint', src: '203.0.113.2', dst: '192.168.0.2', port: 3001, verdict: 'DROP'},
    {
      name: 'pod to Local-policy LoadBalancer IP: short-circuit to the cluster chain',
      src: '10.0.0.2',
      dst: '1.2.3.4',
      port: 80,
      verdict: 'DNAT',
      endpoints: ['10.180.0.2:80'],
      masq: false,
    },
    {name: 'no endpoints', src: '10.0.0.2', dst: '172.30.0.46', port: 80, verdict: 'REJECT'},
    {name: 'unknown port of a ClusterIP', src: '10.0.0.2', dst: '172.30.0.41', port: 81, verdict: 'REJECT'},
    {name: 'unallocated ClusterIP', src: '10.0.0.2', dst: '172.30.0.50', port: 80, verdict: 'DROP'},
  ] as const;
  for (const row of rows) {
    it(row.name, () => {
      const result = trace(row.src, row.dst, row.port);
      assert.equal(result.verdict, row.verdict, JSON.stringify(result.hops.map((hop) => `${hop.chain}: ${hop.rule}`)));
      if ('endpoints' in row) {
        assert.deepEqual(result.branches.map((branch) => branch.endpoint).sort(), [...row.endpoints].sort());
        for (const branch of result.branches) {
          assert.equal(branch.probability, 1 / row.endpoints.length);
          assert.equal(branch.masquerade, row.masq, branch.masqueradeReason);
        }
      }
    });
  }

  it('follows session affinity: a client in the affinity set goes to its endpoint before numgen', () => {
    const withClient = parseNftablesListing(
      fixtureText('overall.nft-list.txt').replace(
        /(set affinity-GTK6MW7G[^{]*\{[^}]*timeout 3h)/,
        '$1\n\t\telements = { 10.0.0.2 timeout 3h expires 2h59m }',
      ),
    );
    const result = trace('10.0.0.2', '172.30.0.45', 80, 'arriving', withClient);
    assert.deepEqual(
      result.branches.map((branch) => branch.endpoint),
      ['10.180.0.3:80'],
    );
    assert.ok(
      [...result.hops, ...result.branches[0].hops].some((hop) => hop.rule.startsWith('ip saddr @affinity-GTK6MW7G')),
      'the affinity rule matched',
    );
  });
});

describe("kube-proxy's packet flow tests, traced over the rendered kube-proxy layout", () => {
  interface Flow {
    name: string;
    src: string;
    dst: string;
    port: number;
    /** kube-proxy's expected output: endpoints, "REJECT" or "DROP". */
    output: string;
    masq?: boolean;
  }
  /** runFlows: kube-proxy's runPacketFlowTests over our render; a node address as source starts in OUTPUT. */
  const runFlows = (fixture: string, flows: Flow[]) => {
    const table = parseNftablesScript(renderNftables(fixtureModel(fixtureObjects(fixture)), fakeProxierRenderOptions));
    for (const flow of flows) {
      it(`${fixture}: ${flow.name}`, () => {
        const origin = fakeProxierNode.localAddresses.includes(flow.src) ? 'local' : 'arriving';
        const result = traceNftables(
          table,
          {srcIP: flow.src, dstIP: flow.dst, dstPort: flow.port, protocol: 'TCP', origin},
          {localAddresses: fakeProxierNode.localAddresses},
        );
        const hops = JSON.stringify(result.hops.map((hop) => `${hop.chain}: ${hop.rule}`));
        if (flow.output === 'REJECT' || flow.output === 'DROP') {
          assert.equal(result.verdict, flow.output, hops);
          return;
        }
        assert.equal(result.verdict, 'DNAT', hops);
        assert.deepEqual(result.branches.map((branch) => branch.endpoint).sort(), flow.output.split(', ').sort());
        for (const branch of result.branches) assert.equal(branch.masquerade, flow.masq, branch.masqueradeReason);
      });
    }
  };

  it('loadbalancer.yaml: writes the firewall chain as proxier.go builds it, the LB IPs allowed when the ranges hold the node IP', () => {
    // No published expectation for this rule: proxier.go joins the sources with "," words.
    const script = renderNftables(fixtureModel(fixtureObjects('loadbalancer.yaml')), fakeProxierRenderOptions);
    assert.ok(
      script.includes(
        'add rule ip kube-proxy firewall-ULMVA6XW-ns1/svc1/tcp/p80 ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 5.6.7.8 } drop',
      ),
    );
  });

  // TestLoadBalancer's flows (external client 203.0.113.2, blocked client 203.0.113.130).
  const endpoint = '10.180.0.1:80';
  runFlows('loadbalancer.yaml', [
    {name: 'pod to cluster IP', src: '10.0.0.2', dst: '172.30.0.41', port: 80, output: endpoint, masq: false},
    {name: 'external to nodePort', src: '203.0.113.2', dst: '192.168.0.2', port: 3001, output: endpoint, masq: true},
    {
      name: 'nodePort bypasses LoadBalancerSourceRanges',
      src: '203.0.113.130',
      dst: '192.168.0.2',
      port: 3001,
      output: endpoint,
      masq: true,
    },
    {name: 'accepted external to LB1', src: '203.0.113.2', dst: '1.2.3.4', port: 80, output: endpoint, masq: true},
    {name: 'accepted external to LB2', src: '203.0.113.2', dst: '5.6.7.8', port: 80, output: endpoint, masq: true},
    {name: 'blocked external to LB1', src: '203.0.113.130', dst: '1.2.3.4', port: 80, output: 'DROP'},
    {name: 'blocked external to LB2', src: '203.0.113.130', dst: '5.6.7.8', port: 80, output: 'DROP'},
    {name: 'pod to LB1 (blocked by LoadBalancerSourceRanges)', src: '10.0.0.2', dst: '1.2.3.4', port: 80, output: 'DROP'},
    {name: 'pod to LB2 (blocked by LoadBalancerSourceRanges)', src: '10.0.0.2', dst: '5.6.7.8', port: 80, output: 'DROP'},
    {name: 'node to LB1 (allowed by LoadBalancerSourceRanges)', src: '192.168.0.2', dst: '1.2.3.4', port: 80, output: endpoint, masq: true},
    {name: 'node to LB2 (allowed by LoadBalancerSourceRanges)', src: '192.168.0.2', dst: '5.6.7.8', port: 80, output: endpoint, masq: true},
    {name: 'same node to LB1, SNATted to LB1 (implicitly allowed)', src: '1.2.3.4', dst: '1.2.3.4', port: 80, output: endpoint, masq: true},
    {name: 'same node to LB2, SNATted to LB2 (implicitly allowed)', src: '5.6.7.8', dst: '5.6.7.8', port: 80, output: endpoint, masq: true},
  ]);

  // TestNoEndpointsReject's flows.
  runFlows('no-endpoints.yaml', [
    {name: 'pod to cluster IP with no endpoints', src: '10.0.0.2', dst: '172.30.0.41', port: 80, output: 'REJECT'},
    {name: 'external to external IP with no endpoints', src: '203.0.113.2', dst: '192.168.99.11', port: 80, output: 'REJECT'},
    {name: 'pod to NodePort with no endpoints', src: '10.0.0.2', dst: '192.168.0.2', port: 3001, output: 'REJECT'},
    {name: 'external to NodePort with no endpoints', src: '203.0.113.2', dst: '192.168.0.2', port: 3001, output: 'REJECT'},
    {name: 'pod to LoadBalancer IP with no endpoints', src: '10.0.0.2', dst: '1.2.3.4', port: 80, output: 'REJECT'},
    {name: 'external to LoadBalancer IP with no endpoints', src: '203.0.113.2', dst: '1.2.3.4', port: 80, output: 'REJECT'},
  ]);
});
