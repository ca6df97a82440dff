// Golden output of the bundled example cluster, kube-proxy's chain-name hashes and number
// formats, the jump rules, rule counting, and determinism of the iptables renderer.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {describe, it} from 'node:test';
import {buildProxyModel, parseManifests, type ProxyModel} from '../../../src/core/model/index.ts';
import {
  countRules,
  endpointChainName,
  masqueradeMark,
  probabilityText,
  renderIptables,
  renderIptablesChunks,
  renderJumpRules,
  serviceExternalChainName,
  serviceFirewallChainName,
  serviceLocalChainName,
  servicePortChainName,
} from '../../../src/core/iptables/index.ts';

const root = new URL('../../../', import.meta.url);
const golden = (name: string): string => readFileSync(new URL(`test/core/iptables/golden/${name}`, root), 'utf8');

function exampleObjects(): {services: unknown[]; endpointSlices: unknown[]; node: unknown} {
  const parsed = parseManifests(readFileSync(new URL('examples/cluster.yaml', root), 'utf8'), 'examples/cluster.yaml');
  assert.deepEqual(parsed.problems, []);
  return {services: parsed.services, endpointSlices: parsed.endpointSlices, node: parsed.nodes[0]};
}

function exampleModel(): ProxyModel {
  return buildProxyModel(exampleObjects(), {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']});
}

describe('renderIptables on examples/cluster.yaml', () => {
  it('writes the reviewed ruleset for --noflush (no built-in chains)', () => {
    assert.equal(renderIptables(exampleModel()), golden('cluster-ipv4.rules'));
  });

  it('writes the reviewed self-contained ruleset with the jump rules', () => {
    assert.equal(renderIptables(exampleModel(), {includeJumps: true}), golden('cluster-ipv4-with-jumps.rules'));
  });

  it('adds only built-in chain declarations and jump rules when includeJumps is set', () => {
    const plain = renderIptables(exampleModel()).split('\n');
    const withJumps = renderIptables(exampleModel(), {includeJumps: true}).split('\n');
    const builtin = /^(:(INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) ACCEPT|-A (INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) )/;
    assert.deepEqual(
      withJumps.filter((line) => !builtin.test(line)),
      plain,
    );
    assert.equal(withJumps.filter((line) => line.startsWith('-A ') && builtin.test(line)).length, renderJumpRules(exampleModel()).length);
  });

  it('gives the same text for the same objects in any order, run after run', () => {
    const objects = exampleObjects();
    const first = renderIptables(buildProxyModel(objects, {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']}));
    const shuffled = {
      services: [...objects.services].reverse(),
      endpointSlices: [...objects.endpointSlices].reverse(),
      node: objects.node,
    };
    for (let run = 0; run < 3; run++) {
      assert.equal(renderIptables(buildProxyModel(shuffled, {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']})), first);
    }
  });
});

describe('renderIptables on golden/features.yaml (one service per feature, dual-stack)', () => {
  function featureModel(family: 'IPv4' | 'IPv6'): ProxyModel {
    const parsed = parseManifests(golden('features.yaml'), 'features.yaml');
    assert.deepEqual(parsed.problems, []);
    const model = buildProxyModel(
      {services: parsed.services, endpointSlices: parsed.endpointSlices, node: parsed.nodes[0]},
      {family, clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56']},
    );
    assert.deepEqual(model.problems, []);
    return model;
  }

  it('writes the reviewed IPv4 ruleset', () => {
    assert.equal(renderIptables(featureModel('IPv4')), golden('features-ipv4.rules'));
  });

  it('writes the reviewed IPv6 ruleset', () => {
    assert.equal(renderIptables(featureModel('IPv6')), golden('features-ipv6.rules'));
  });

  it('names the same chains in both families (the hash does not see addresses of services)', () => {
    const serviceChains = (text: string): string[] => text.split('\n').filter((line) => /^:KUBE-(SVC|SVL|EXT|FW)-/.test(line));
    assert.deepEqual(serviceChains(golden('features-ipv6.rules')), serviceChains(golden('features-ipv4.rules')));
  });
});

describe('chain names', () => {
  // Names that kube-proxy's own tests expect for these service ports and endpoints.
  it('hashes service ports as kube-proxy does', () => {
    assert.equal(servicePortChainName({key: 'ns1/svc1:p80', protocol: 'TCP'}), 'KUBE-SVC-XPGD46QRK7WJZT7O');
    assert.equal(serviceFirewallChainName({key: 'ns5/svc5:p80', protocol: 'TCP'}), 'KUBE-FW-NUKIZ6OKUXPJNT4C');
    assert.equal(serviceExternalChainName({key: 'ns2/svc2:p80', protocol: 'TCP'}), 'KUBE-EXT-GNZBNJ2PO5MGZ6GT');
    assert.equal(serviceLocalChainName({key: 'ns2/svc2:p80', protocol: 'TCP'}), 'KUBE-SVL-GNZBNJ2PO5MGZ6GT');
  });

  it('hashes endpoints with the service port, lower-case protocol and ip:port', () => {
    assert.equal(endpointChainName({key: 'ns1/svc1:p80', protocol: 'TCP'}, '10.180.0.1:80'), 'KUBE-SEP-SXIVWICOYRO3J4NJ');
    assert.equal(endpointChainName({key: 'ns5/svc5:p80', protocol: 'TCP'}, {ip: '10.180.0.3', port: 80}), 'KUBE-SEP-I77PXRDZVX7PMWMN');
  });

  it('gives each protocol of the same port its own chain', () => {
    const tcp = servicePortChainName({key: 'kube-system/dns:dns', protocol: 'TCP'});
    const udp = servicePortChainName({key: 'kube-system/dns:dns', protocol: 'UDP'});
    assert.notEqual(tcp, udp);
    for (const name of [tcp, udp]) assert.match(name, /^KUBE-SVC-[A-Z2-7]{16}$/);
  });
});

describe('number formats', () => {
  it('writes 1/n with ten digits as Go formats it', () => {
    assert.equal(probabilityText(2), '0.5000000000');
    assert.equal(probabilityText(3), '0.3333333333');
    assert.equal(probabilityText(6), '0.1666666667');
    assert.equal(probabilityText(7), '0.1428571429');
    assert.equal(probabilityText(1000), '0.0010000000');
    // 1/2048 = 0.00048828125 exactly: a tie, which Go rounds to even.
    assert.equal(probabilityText(2048), '0.0004882812');
    assert.equal(probabilityText(1), '1.0000000000');
  });

  it('derives the masquerade mark from its bit', () => {
    assert.equal(masqueradeMark(14), '0x4000');
    assert.equal(masqueradeMark(0), '0x1');
    assert.equal(masqueradeMark(31), '0x80000000');
  });
});

describe('renderJumpRules', () => {
  it('lists kube-proxy jump rules with their comments, in the order kube-proxy ensures them', () => {
    const lines = renderJumpRules(exampleModel()).map((jump) => `${jump.table} ${jump.chain} ${jump.position}: ${jump.rule.join(' ')}`);
    assert.deepEqual(lines, [
      'filter INPUT prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES',
      'filter FORWARD prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES',
      'filter INPUT prepend: -m comment --comment kubernetes health check service ports -j KUBE-NODEPORTS',
      'filter FORWARD prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES',
      'filter OUTPUT prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES',
      'filter FORWARD prepend: -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD',
      'filter INPUT prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL',
      'filter OUTPUT prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL',
      'filter FORWARD prepend: -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL',
      'nat OUTPUT prepend: -m comment --comment kubernetes service portals -j KUBE-SERVICES',
      'nat PREROUTING prepend: -m comment --comment kubernetes service portals -j KUBE-SERVICES',
      'nat POSTROUTING prepend: -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING',
      'filter INPUT prepend: -j KUBE-FIREWALL',
      'filter OUTPUT prepend: -j KUBE-FIREWALL',
    ]);
  });

  it('keeps the comment as one argv word', () => {
    const jump = renderJumpRules(exampleModel()).find((rule) => rule.table === 'nat' && rule.chain === 'PREROUTING');
    assert.deepEqual(jump?.rule, ['-m', 'comment', '--comment', 'kubernetes service portals', '-j', 'KUBE-SERVICES']);
  });

  it('leaves out the KUBE-FIREWALL jumps when localhost NodePorts are off (the chain is not written then)', () => {
    const model = buildProxyModel(exampleObjects(), {family: 'IPv4', config: {localhostNodePorts: false}});
    assert.equal(renderJumpRules(model).filter((jump) => jump.rule.includes('KUBE-FIREWALL')).length, 0);
    assert.doesNotMatch(renderIptables(model, {includeJumps: true}), /KUBE-FIREWALL/);
  });
});

describe('countRules', () => {
  it('counts rules per table, not chain declarations or deletions', () => {
    const text = [
      '*filter',
      ':KUBE-SERVICES - [0:0]',
      '-A KUBE-SERVICES -j REJECT',
      'COMMIT',
      '*nat',
      ':KUBE-SEP-X - [0:0]',
      '-A KUBE-SERVICES -j KUBE-SVC-X',
      '[3:180] -A KUBE-SVC-X -j KUBE-SEP-X',
      '-X KUBE-SEP-X',
      'COMMIT',
      '',
    ].join('\n');
    assert.deepEqual(countRules(text), {filter: 1, nat: 2});
  });

  it('agrees with the example ruleset', () => {
    const text = renderIptables(exampleModel());
    const lines = text.split('\n');
    const natStart = lines.indexOf('*nat');
    const rulesIn = (part: string[]): number => part.filter((line) => line.startsWith('-A ')).length;
    assert.deepEqual(countRules(text), {filter: rulesIn(lines.slice(0, natStart)), nat: rulesIn(lines.slice(natStart))});
    // nat: 4 fixed + demoapp 11 + nginx 14 + dns 8 + dns-tcp 8 + the final KUBE-NODEPORTS jump.
    assert.deepEqual(countRules(text), {filter: 5, nat: 46});
  });
});

describe('renderIptablesChunks', () => {
  /** `count` ClusterIP services with three endpoints each: enough nat rules for several pieces. */
  function manyServices(count: number): ProxyModel {
    const services: unknown[] = [];
    const endpointSlices: unknown[] = [];
    for (let i = 0; i < count; i++) {
      const name = `svc-${i}`;
      services.push({
        kind: 'Service',
        metadata: {name, namespace: 'many'},
        spec: {clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}]},
      });
      endpointSlices.push({
        kind: 'EndpointSlice',
        metadata: {name: `${name}-a`, namespace: 'many', labels: {'kubernetes.io/service-name': name}},
        addressType: 'IPv4',
        ports: [{name: 'http', protocol: 'TCP', port: 8080}],
        endpoints: [1, 2, 3].map((n) => ({addresses: [`10.244.${i >> 6}.${((i & 63) << 2) + n}`], conditions: {ready: true}})),
      });
    }
    return buildProxyModel({services, endpointSlices}, {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']});
  }

  it('hands out the filter table and every nat chain declared first, then the nat rules in pieces: together, the whole render', () => {
    const model = manyServices(3000);
    assert.equal(model.servicePorts.length, 3000);
    const whole = renderIptables(model);
    const pieces = [...renderIptablesChunks(model)].map((piece) => piece.toString('utf8'));
    assert.equal(pieces.join(''), whole);
    assert.ok(pieces.length > 3, `${pieces.length} pieces`);
    // iptables-restore reads the first piece while the rest is rendered; it refuses a jump to a
    // chain not declared yet, so every nat chain is declared in it, and no nat rule is.
    const [filterPart, natHead] = pieces[0].split('COMMIT\n*nat\n');
    assert.match(filterPart, /^\*filter\n/);
    assert.doesNotMatch(natHead, /^-A /m);
    const natChainsDeclared = (text: string): string[] => text.match(/^:\S+/gm) ?? [];
    assert.deepEqual(natChainsDeclared(natHead), natChainsDeclared(whole.slice(whole.indexOf('*nat\n'))));
  });

  it('puts the caller\'s lines right after "*table" and right before COMMIT', () => {
    const text = renderIptables(exampleModel(), {
      extraLines: {nat: {start: ['-Z'], end: ['-I PREROUTING -j KUBE-SERVICES']}, filter: {end: ['-I INPUT -j KUBE-NODEPORTS']}},
    });
    assert.match(text, /^\*filter\n:KUBE-/);
    assert.match(text, /\n-I INPUT -j KUBE-NODEPORTS\nCOMMIT\n\*nat\n-Z\n:KUBE-/);
    assert.match(text, /\n-I PREROUTING -j KUBE-SERVICES\nCOMMIT\n$/);
    assert.equal(text.replace('-Z\n', '').replace(/^-I .*\n/gm, ''), renderIptables(exampleModel()));
  });
});
