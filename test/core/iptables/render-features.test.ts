// Table-driven checks of every kube-proxy feature the iptables renderer writes: each case builds
// a model from Service / EndpointSlice objects and states the exact rules of the chains it is
// about, as kube-proxy's iptables proxier writes them for the same objects.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {buildProxyModel, type ModelOptions, type ProxyModel} from '../../../src/core/model/index.ts';
import {
  endpointChainName,
  renderIptables,
  serviceExternalChainName,
  serviceFirewallChainName,
  serviceLocalChainName,
  servicePortChainName,
} from '../../../src/core/iptables/index.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

type Objects = {services: unknown[]; slices: unknown[]};

function modelOf(objects: Objects, options: Partial<ModelOptions> = {}): ProxyModel {
  const model = buildProxyModel(
    {services: objects.services, endpointSlices: objects.slices, node: node('node-1')},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16'], ...options},
  );
  assert.deepEqual(model.problems, [], 'fixture objects are valid');
  return model;
}

function render(objects: Objects, options: Partial<ModelOptions> = {}): string {
  return renderIptables(modelOf(objects, options));
}

/** The rules of one chain of one table, in order, as written. */
function chain(text: string, table: 'filter' | 'nat', name: string): string[] {
  const out: string[] = [];
  let current = '';
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) current = line.slice(1);
    else if (current === table && line.startsWith(`-A ${name} `)) out.push(line);
  }
  return out;
}

function declared(text: string, table: 'filter' | 'nat'): string[] {
  const out: string[] = [];
  let current = '';
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) current = line.slice(1);
    else if (current === table && line.startsWith(':')) out.push(line.slice(1).split(' ')[0]);
  }
  return out;
}

const web = {key: 'default/web:http', protocol: 'TCP'} as const;
const SVC = servicePortChainName(web);
const SVL = serviceLocalChainName(web);
const EXT = serviceExternalChainName(web);
const FW = serviceFirewallChainName(web);
const SEP = (ipPort: string): string => endpointChainName(web, ipPort);

/** web: 10.244.1.5 on this node, 10.244.2.5 and 10.244.2.6 elsewhere, all ready. */
const threeEndpoints = [
  {ip: '10.244.1.5', node: 'node-1'},
  {ip: '10.244.2.5', node: 'node-2'},
  {ip: '10.244.2.6', node: 'node-2'},
];

describe('cluster IP', () => {
  it('spreads over the endpoints with kube-proxy probabilities and marks hairpin traffic', () => {
    const text = render({services: [service('web')], slices: [slice('web-1', 'web', threeEndpoints)]});
    assert.deepEqual(chain(text, 'nat', 'KUBE-SERVICES'), [
      `-A KUBE-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j ${SVC}`,
      '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    ]);
    assert.deepEqual(chain(text, 'nat', SVC), [
      `-A ${SVC} -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.3333333333 -j ${SEP('10.244.1.5:8080')}`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.2.5:8080" -m statistic --mode random --probability 0.5000000000 -j ${SEP('10.244.2.5:8080')}`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.2.6:8080" -j ${SEP('10.244.2.6:8080')}`,
    ]);
    assert.deepEqual(chain(text, 'nat', SEP('10.244.2.5:8080')), [
      `-A ${SEP('10.244.2.5:8080')} -m comment --comment default/web:http -s 10.244.2.5 -j KUBE-MARK-MASQ`,
      `-A ${SEP('10.244.2.5:8080')} -m comment --comment default/web:http -m tcp -p tcp -j DNAT --to-destination 10.244.2.5:8080`,
    ]);
    assert.deepEqual(declared(text, 'nat'), [
      'KUBE-SERVICES',
      'KUBE-NODEPORTS',
      'KUBE-POSTROUTING',
      'KUBE-MARK-MASQ',
      SVC,
      SEP('10.244.1.5:8080'),
      SEP('10.244.2.5:8080'),
      SEP('10.244.2.6:8080'),
    ]);
    assert.deepEqual(chain(text, 'filter', 'KUBE-SERVICES'), []);
  });

  it('names an unnamed port by its service alone and matches UDP and SCTP by protocol', () => {
    const services = [
      service('dns', {clusterIP: '10.96.0.53', ports: [{protocol: 'UDP', port: 53, targetPort: 53}]}),
      service('sig', {clusterIP: '10.96.0.60', ports: [{protocol: 'SCTP', port: 9000, targetPort: 9000}]}),
    ];
    const slices = [
      slice('dns-1', 'dns', [{ip: '10.244.1.3'}], {ports: [{protocol: 'UDP', port: 53}]}),
      slice('sig-1', 'sig', [{ip: '10.244.1.4'}], {ports: [{protocol: 'SCTP', port: 9000}]}),
    ];
    const text = render({services, slices});
    const dns = {key: 'default/dns', protocol: 'UDP'} as const;
    const sig = {key: 'default/sig', protocol: 'SCTP'} as const;
    assert.deepEqual(chain(text, 'nat', 'KUBE-SERVICES').slice(0, 2), [
      `-A KUBE-SERVICES -m comment --comment "default/dns cluster IP" -m udp -p udp -d 10.96.0.53 --dport 53 -j ${servicePortChainName(dns)}`,
      `-A KUBE-SERVICES -m comment --comment "default/sig cluster IP" -m sctp -p sctp -d 10.96.0.60 --dport 9000 -j ${servicePortChainName(sig)}`,
    ]);
    assert.deepEqual(chain(text, 'nat', endpointChainName(dns, '10.244.1.3:53')), [
      `-A ${endpointChainName(dns, '10.244.1.3:53')} -m comment --comment default/dns -s 10.244.1.3 -j KUBE-MARK-MASQ`,
      `-A ${endpointChainName(dns, '10.244.1.3:53')} -m comment --comment default/dns -m udp -p udp -j DNAT --to-destination 10.244.1.3:53`,
    ]);
  });

  it('uses serving terminating endpoints only when none is ready', () => {
    const terminating = [
      {ip: '10.244.1.5', node: 'node-1', ready: false, serving: true, terminating: true},
      {ip: '10.244.2.5', node: 'node-2', ready: false, serving: true, terminating: true},
    ];
    const fallback = render({services: [service('web')], slices: [slice('web-1', 'web', terminating)]});
    assert.deepEqual(chain(fallback, 'nat', SVC).slice(1), [
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.5000000000 -j ${SEP('10.244.1.5:8080')}`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.2.5:8080" -j ${SEP('10.244.2.5:8080')}`,
    ]);
    const mixed = render({
      services: [service('web')],
      slices: [slice('web-1', 'web', [...terminating, {ip: '10.244.2.6', node: 'node-2'}])],
    });
    assert.deepEqual(chain(mixed, 'nat', SVC).slice(1), [
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.2.6:8080" -j ${SEP('10.244.2.6:8080')}`,
    ]);
    assert.ok(!declared(mixed, 'nat').includes(SEP('10.244.1.5:8080')), 'no chain for an endpoint nobody jumps to');
  });

  it('rejects traffic to a service without endpoints in the filter table and writes no nat chain for it', () => {
    const text = render({services: [service('web')], slices: [slice('web-1', 'web', [])]});
    assert.deepEqual(chain(text, 'filter', 'KUBE-SERVICES'), [
      '-A KUBE-SERVICES -m comment --comment "default/web:http has no endpoints" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j REJECT',
    ]);
    assert.equal(chain(text, 'nat', 'KUBE-SERVICES').length, 1, 'only the final KUBE-NODEPORTS jump');
    assert.deepEqual(declared(text, 'nat'), ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ']);
  });

  it('treats endpoints that are neither ready nor serving as no endpoints', () => {
    const text = render({services: [service('web')], slices: [slice('web-1', 'web', [{ip: '10.244.1.5', ready: false, serving: false}])]});
    assert.match(chain(text, 'filter', 'KUBE-SERVICES')[0], /has no endpoints".* -j REJECT$/);
  });
});

describe('local traffic detection', () => {
  const eTPLocalNodePort = service('web', {
    type: 'NodePort',
    externalTrafficPolicy: 'Local',
    ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
  });
  const cases: Array<{name: string; options: Partial<ModelOptions>; notLocal?: string; local?: string}> = [
    {
      name: 'cluster CIDR (first of the family only)',
      options: {clusterCIDRs: ['10.244.0.0/16', '10.245.0.0/16', 'fd00:10:244::/56']},
      notLocal: '! -s 10.244.0.0/16',
      local: '-s 10.244.0.0/16',
    },
    {
      name: 'node CIDR from the Node',
      options: {clusterCIDRs: [], detectLocalMode: 'NodeCIDR'},
      notLocal: '! -s 10.244.1.0/24',
      local: '-s 10.244.1.0/24',
    },
    {
      name: 'bridge interface',
      options: {config: {localDetector: {mode: 'BridgeInterface', interfaceName: 'cbr0'}}},
      notLocal: '! -i cbr0',
      local: '-i cbr0',
    },
    {
      name: 'interface name prefix',
      options: {config: {localDetector: {mode: 'InterfaceNamePrefix', interfacePrefix: 'veth'}}},
      notLocal: '! -i veth+',
      local: '-i veth+',
    },
    {name: 'none', options: {clusterCIDRs: []}},
  ];
  for (const testCase of cases) {
    it(`marks off-cluster traffic to the cluster IP and short-circuits pod traffic: ${testCase.name}`, () => {
      const text = render({services: [eTPLocalNodePort], slices: [slice('web-1', 'web', threeEndpoints)]}, testCase.options);
      const clusterIPRule = `-A ${SVC} -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80`;
      const masquerade = chain(text, 'nat', SVC).filter((rule) => rule.endsWith('-j KUBE-MARK-MASQ'));
      assert.deepEqual(masquerade, testCase.notLocal ? [`${clusterIPRule} ${testCase.notLocal} -j KUBE-MARK-MASQ`] : []);
      const pod = testCase.local
        ? [`-A ${EXT} -m comment --comment "pod traffic for default/web:http external destinations" ${testCase.local} -j ${SVC}`]
        : [];
      assert.deepEqual(chain(text, 'nat', EXT), [
        ...pod,
        `-A ${EXT} -m comment --comment "masquerade LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
        `-A ${EXT} -m comment --comment "route LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j ${SVC}`,
        `-A ${EXT} -j ${SVL}`,
      ]);
    });
  }

  it('masquerades all cluster IP traffic with masqueradeAll, whatever the detector', () => {
    const text = render({services: [service('web')], slices: [slice('web-1', 'web', threeEndpoints)]}, {config: {masqueradeAll: true}});
    assert.equal(
      chain(text, 'nat', SVC)[0],
      `-A ${SVC} -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-MARK-MASQ`,
    );
  });
});

describe('masquerade mark and fixed chains', () => {
  it('writes KUBE-POSTROUTING, KUBE-MARK-MASQ and KUBE-FORWARD with the default bit 14', () => {
    const text = render({services: [], slices: []});
    assert.deepEqual(chain(text, 'nat', 'KUBE-POSTROUTING'), [
      '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN',
      '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000',
      '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
    ]);
    assert.deepEqual(chain(text, 'nat', 'KUBE-MARK-MASQ'), ['-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000']);
    assert.deepEqual(chain(text, 'filter', 'KUBE-FORWARD'), [
      '-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP',
      '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT',
      '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
    ]);
    assert.deepEqual(declared(text, 'filter'), [
      'KUBE-SERVICES',
      'KUBE-EXTERNAL-SERVICES',
      'KUBE-FORWARD',
      'KUBE-NODEPORTS',
      'KUBE-PROXY-FIREWALL',
      'KUBE-FIREWALL',
    ]);
  });

  it('uses the configured bit everywhere the mark appears', () => {
    const text = render({services: [], slices: []}, {config: {masqueradeBit: 5}});
    assert.equal(chain(text, 'nat', 'KUBE-POSTROUTING')[0], '-A KUBE-POSTROUTING -m mark ! --mark 0x20/0x20 -j RETURN');
    assert.equal(chain(text, 'nat', 'KUBE-POSTROUTING')[1], '-A KUBE-POSTROUTING -j MARK --xor-mark 0x20');
    assert.deepEqual(chain(text, 'nat', 'KUBE-MARK-MASQ'), ['-A KUBE-MARK-MASQ -j MARK --or-mark 0x20']);
    assert.match(chain(text, 'filter', 'KUBE-FORWARD')[1], /--mark 0x20\/0x20 -j ACCEPT$/);
    assert.doesNotMatch(text, /0x4000/);
  });
});

describe('NodePorts', () => {
  const nodePortService = service('web', {
    type: 'NodePort',
    ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
  });
  const objects = {services: [nodePortService], slices: [slice('web-1', 'web', threeEndpoints)]};
  const last = (destination: string): string =>
    `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" ${destination} -j KUBE-NODEPORTS`;

  it('sends NodePort traffic through the EXT chain, masqueraded under the Cluster policy', () => {
    const text = render(objects);
    assert.deepEqual(chain(text, 'nat', 'KUBE-NODEPORTS'), [
      `-A KUBE-NODEPORTS -m comment --comment default/web:http -m tcp -p tcp --dport 30080 -j ${EXT}`,
    ]);
    assert.deepEqual(chain(text, 'nat', EXT), [
      `-A ${EXT} -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ`,
      `-A ${EXT} -j ${SVC}`,
    ]);
    assert.ok(!declared(text, 'nat').includes(SVL), 'no local chain without a Local policy');
  });

  const cases: Array<{name: string; config: Record<string, unknown>; nodeports: string[]; kubeletFirewall: boolean}> = [
    {name: 'every local address, localhost included', config: {}, nodeports: [last('-m addrtype --dst-type LOCAL')], kubeletFirewall: true},
    {
      name: 'every local address but 127/8',
      config: {localhostNodePorts: false},
      nodeports: [last('-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8')],
      kubeletFirewall: false,
    },
    {
      name: 'a zero CIDR counts as every address',
      config: {nodePortAddresses: ['0.0.0.0/0']},
      nodeports: [last('-m addrtype --dst-type LOCAL')],
      kubeletFirewall: true,
    },
    {
      name: 'CIDRs of the other family only count as every address',
      config: {nodePortAddresses: ['fd00:10:240::/64']},
      nodeports: [last('-m addrtype --dst-type LOCAL')],
      kubeletFirewall: true,
    },
    {name: 'a node CIDR', config: {nodePortAddresses: ['10.240.0.0/24']}, nodeports: [last('-d 10.240.0.11')], kubeletFirewall: false},
    {name: 'the primary node IP', config: {nodePortAddresses: ['primary']}, nodeports: [last('-d 10.240.0.11')], kubeletFirewall: false},
    {
      name: 'a node CIDR and loopback',
      config: {nodePortAddresses: ['10.240.0.0/24', '127.0.0.0/8']},
      nodeports: [last('-d 127.0.0.1'), last('-d 10.240.0.11')],
      kubeletFirewall: true,
    },
    {
      name: 'loopback listed but localhost NodePorts off',
      config: {nodePortAddresses: ['10.240.0.0/24', '127.0.0.0/8'], localhostNodePorts: false},
      nodeports: [last('-d 10.240.0.11')],
      kubeletFirewall: false,
    },
    {name: 'a CIDR holding no node address', config: {nodePortAddresses: ['192.0.2.0/24']}, nodeports: [], kubeletFirewall: false},
  ];
  for (const testCase of cases) {
    it(`ends KUBE-SERVICES with the KUBE-NODEPORTS jump: ${testCase.name}`, () => {
      const text = render(objects, {config: testCase.config});
      const rules = chain(text, 'nat', 'KUBE-SERVICES');
      assert.deepEqual(rules.slice(1), testCase.nodeports);
      assert.equal(declared(text, 'filter').includes('KUBE-FIREWALL'), testCase.kubeletFirewall);
      if (testCase.kubeletFirewall) {
        assert.deepEqual(chain(text, 'filter', 'KUBE-FIREWALL'), [
          '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
        ]);
      }
    });
  }

  it('rejects NodePort traffic on local addresses when there is no endpoint', () => {
    const text = render({services: [nodePortService], slices: [slice('web-1', 'web', [])]});
    assert.deepEqual(chain(text, 'filter', 'KUBE-EXTERNAL-SERVICES'), [
      '-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT',
    ]);
    assert.deepEqual(chain(text, 'nat', 'KUBE-NODEPORTS'), []);
  });
});

describe('external IPs and load balancers', () => {
  const lb = (spec: Record<string, unknown> = {}, ingress = [{ip: '192.0.2.10'}]) =>
    service(
      'web',
      {
        type: 'LoadBalancer',
        externalIPs: ['198.51.100.7'],
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
        ...spec,
      },
      {status: {loadBalancer: {ingress}}},
    );

  it('captures external IPs and load-balancer IPs into the EXT chain', () => {
    const text = render({services: [lb()], slices: [slice('web-1', 'web', threeEndpoints)]});
    assert.deepEqual(chain(text, 'nat', 'KUBE-SERVICES').slice(0, 3), [
      `-A KUBE-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j ${SVC}`,
      `-A KUBE-SERVICES -m comment --comment "default/web:http external IP" -m tcp -p tcp -d 198.51.100.7 --dport 80 -j ${EXT}`,
      `-A KUBE-SERVICES -m comment --comment "default/web:http loadbalancer IP" -m tcp -p tcp -d 192.0.2.10 --dport 80 -j ${EXT}`,
    ]);
    assert.deepEqual(chain(text, 'filter', 'KUBE-PROXY-FIREWALL'), []);
    assert.ok(!declared(text, 'nat').includes(FW), 'no firewall chain without source ranges');
  });

  it('rejects every address of a load balancer without endpoints', () => {
    const text = render({services: [lb()], slices: [slice('web-1', 'web', [])]});
    const comment = '-m comment --comment "default/web:http has no endpoints"';
    assert.deepEqual(chain(text, 'filter', 'KUBE-SERVICES'), [
      `-A KUBE-SERVICES ${comment} -m tcp -p tcp -d 10.96.0.10 --dport 80 -j REJECT`,
    ]);
    assert.deepEqual(chain(text, 'filter', 'KUBE-EXTERNAL-SERVICES'), [
      `-A KUBE-EXTERNAL-SERVICES ${comment} -m tcp -p tcp -d 198.51.100.7 --dport 80 -j REJECT`,
      `-A KUBE-EXTERNAL-SERVICES ${comment} -m tcp -p tcp -d 192.0.2.10 --dport 80 -j REJECT`,
      `-A KUBE-EXTERNAL-SERVICES ${comment} -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT`,
    ]);
    assert.deepEqual(chain(text, 'nat', 'KUBE-SERVICES').length, 1);
  });

  it('checks loadBalancerSourceRanges in a KUBE-FW chain, with a DROP for what it does not accept', () => {
    const text = render({
      services: [lb({loadBalancerSourceRanges: ['203.0.113.0/25', '198.18.0.0/15']}, [{ip: '192.0.2.10'}, {ip: '192.0.2.11'}])],
      slices: [slice('web-1', 'web', threeEndpoints)],
    });
    assert.deepEqual(chain(text, 'nat', 'KUBE-SERVICES').slice(2, 4), [
      `-A KUBE-SERVICES -m comment --comment "default/web:http loadbalancer IP" -m tcp -p tcp -d 192.0.2.10 --dport 80 -j ${FW}`,
      `-A KUBE-SERVICES -m comment --comment "default/web:http loadbalancer IP" -m tcp -p tcp -d 192.0.2.11 --dport 80 -j ${FW}`,
    ]);
    assert.deepEqual(chain(text, 'nat', FW), [
      `-A ${FW} -m comment --comment "default/web:http loadbalancer IP" -s 203.0.113.0/25 -j ${EXT}`,
      `-A ${FW} -m comment --comment "default/web:http loadbalancer IP" -s 198.18.0.0/15 -j ${EXT}`,
      `-A ${FW} -m comment --comment "other traffic to default/web:http will be dropped by KUBE-PROXY-FIREWALL"`,
    ]);
    assert.deepEqual(chain(text, 'filter', 'KUBE-PROXY-FIREWALL'), [
      `-A KUBE-PROXY-FIREWALL -m comment --comment "default/web:http traffic not accepted by ${FW}" -m tcp -p tcp -d 192.0.2.10 --dport 80 -j DROP`,
      `-A KUBE-PROXY-FIREWALL -m comment --comment "default/web:http traffic not accepted by ${FW}" -m tcp -p tcp -d 192.0.2.11 --dport 80 -j DROP`,
    ]);
    // External IPs and NodePorts are not subject to the source ranges.
    assert.match(chain(text, 'nat', 'KUBE-SERVICES')[1], new RegExp(`-d 198\\.51\\.100\\.7 --dport 80 -j ${EXT}$`));
    assert.match(chain(text, 'nat', 'KUBE-NODEPORTS')[0], new RegExp(`-j ${EXT}$`));
  });

  it('lets the node itself through, also from the load-balancer IPs, when a source range holds the node IP', () => {
    const text = render({
      services: [lb({loadBalancerSourceRanges: ['10.240.0.0/24']}, [{ip: '192.0.2.10'}, {ip: '192.0.2.11'}])],
      slices: [slice('web-1', 'web', threeEndpoints)],
    });
    assert.deepEqual(chain(text, 'nat', FW), [
      `-A ${FW} -m comment --comment "default/web:http loadbalancer IP" -s 10.240.0.0/24 -j ${EXT}`,
      `-A ${FW} -m comment --comment "default/web:http loadbalancer IP" -s 192.0.2.10 -j ${EXT}`,
      `-A ${FW} -m comment --comment "default/web:http loadbalancer IP" -s 192.0.2.11 -j ${EXT}`,
      `-A ${FW} -m comment --comment "other traffic to default/web:http will be dropped by KUBE-PROXY-FIREWALL"`,
    ]);
  });

  it('writes no firewall for source ranges when the service has no endpoints (REJECT comes first)', () => {
    const text = render({services: [lb({loadBalancerSourceRanges: ['203.0.113.0/25']})], slices: [slice('web-1', 'web', [])]});
    assert.deepEqual(chain(text, 'filter', 'KUBE-PROXY-FIREWALL'), []);
    assert.ok(!declared(text, 'nat').includes(FW));
  });
});

describe('externalTrafficPolicy Local', () => {
  const local = service(
    'web',
    {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: 32000,
      externalIPs: ['198.51.100.7'],
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
    },
    {status: {loadBalancer: {ingress: [{ip: '192.0.2.10'}]}}},
  );

  it('sends outside traffic to the local endpoints only and keeps cluster traffic on all of them', () => {
    const text = render({services: [local], slices: [slice('web-1', 'web', threeEndpoints)]});
    assert.deepEqual(chain(text, 'nat', EXT), [
      `-A ${EXT} -m comment --comment "pod traffic for default/web:http external destinations" -s 10.244.0.0/16 -j ${SVC}`,
      `-A ${EXT} -m comment --comment "masquerade LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
      `-A ${EXT} -m comment --comment "route LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j ${SVC}`,
      `-A ${EXT} -j ${SVL}`,
    ]);
    assert.deepEqual(chain(text, 'nat', SVL), [
      `-A ${SVL} -m comment --comment "default/web:http -> 10.244.1.5:8080" -j ${SEP('10.244.1.5:8080')}`,
    ]);
    assert.equal(chain(text, 'nat', SVC).length, 4, 'masquerade rule and three endpoints');
    assert.deepEqual(chain(text, 'filter', 'KUBE-NODEPORTS'), [
      '-A KUBE-NODEPORTS -m comment --comment "default/web:http health check node port" -m tcp -p tcp --dport 32000 -j ACCEPT',
    ]);
    assert.deepEqual(chain(text, 'filter', 'KUBE-EXTERNAL-SERVICES'), []);
    assert.deepEqual(
      declared(text, 'nat').filter((name) => name.startsWith('KUBE-SEP-')),
      ['10.244.1.5:8080', '10.244.2.5:8080', '10.244.2.6:8080'].map(SEP),
    );
  });

  it('drops outside traffic when no endpoint is local, but still serves pods and the node', () => {
    const remote = threeEndpoints.slice(1);
    const text = render({services: [local], slices: [slice('web-1', 'web', remote)]});
    const comment = '-m comment --comment "default/web:http has no local endpoints"';
    assert.deepEqual(chain(text, 'filter', 'KUBE-EXTERNAL-SERVICES'), [
      `-A KUBE-EXTERNAL-SERVICES ${comment} -m tcp -p tcp -d 198.51.100.7 --dport 80 -j DROP`,
      `-A KUBE-EXTERNAL-SERVICES ${comment} -m tcp -p tcp -d 192.0.2.10 --dport 80 -j DROP`,
      `-A KUBE-EXTERNAL-SERVICES ${comment} -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP`,
    ]);
    assert.deepEqual(chain(text, 'filter', 'KUBE-SERVICES'), [], 'the cluster IP still works');
    assert.deepEqual(chain(text, 'nat', EXT), [
      `-A ${EXT} -m comment --comment "pod traffic for default/web:http external destinations" -s 10.244.0.0/16 -j ${SVC}`,
      `-A ${EXT} -m comment --comment "masquerade LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
      `-A ${EXT} -m comment --comment "route LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j ${SVC}`,
    ]);
    assert.ok(!declared(text, 'nat').includes(SVL));
    assert.equal(chain(text, 'filter', 'KUBE-NODEPORTS').length, 1, 'the health check port stays open');
  });
});

describe('internalTrafficPolicy Local', () => {
  const local = service('web', {internalTrafficPolicy: 'Local'});

  it('sends cluster IP traffic to the local endpoints through KUBE-SVL', () => {
    const text = render({services: [local], slices: [slice('web-1', 'web', threeEndpoints)]});
    assert.equal(
      chain(text, 'nat', 'KUBE-SERVICES')[0],
      `-A KUBE-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j ${SVL}`,
    );
    assert.deepEqual(chain(text, 'nat', SVL), [
      `-A ${SVL} -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ`,
      `-A ${SVL} -m comment --comment "default/web:http -> 10.244.1.5:8080" -j ${SEP('10.244.1.5:8080')}`,
    ]);
    assert.deepEqual(declared(text, 'nat').slice(4), [SVL, SEP('10.244.1.5:8080')]);
  });

  it('drops cluster IP traffic when no endpoint is local', () => {
    const text = render({services: [local], slices: [slice('web-1', 'web', threeEndpoints.slice(1))]});
    assert.deepEqual(chain(text, 'filter', 'KUBE-SERVICES'), [
      '-A KUBE-SERVICES -m comment --comment "default/web:http has no local endpoints" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j DROP',
    ]);
    assert.deepEqual(declared(text, 'nat'), ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ']);
  });
});

describe('session affinity', () => {
  it('checks the recent list of each endpoint before the random spread and records the choice', () => {
    const sticky = service('web', {sessionAffinity: 'ClientIP', sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}});
    const text = render({services: [sticky], slices: [slice('web-1', 'web', threeEndpoints.slice(0, 2))]});
    const [a, b] = [SEP('10.244.1.5:8080'), SEP('10.244.2.5:8080')];
    assert.deepEqual(chain(text, 'nat', SVC).slice(1), [
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.1.5:8080" -m recent --name ${a} --rcheck --seconds 600 --reap -j ${a}`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.2.5:8080" -m recent --name ${b} --rcheck --seconds 600 --reap -j ${b}`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.5000000000 -j ${a}`,
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.2.5:8080" -j ${b}`,
    ]);
    assert.deepEqual(chain(text, 'nat', a), [
      `-A ${a} -m comment --comment default/web:http -s 10.244.1.5 -j KUBE-MARK-MASQ`,
      `-A ${a} -m comment --comment default/web:http -m recent --name ${a} --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.5:8080`,
    ]);
  });

  it('uses kube-proxy default timeout of 10800 seconds', () => {
    const text = render({
      services: [service('web', {sessionAffinity: 'ClientIP'})],
      slices: [slice('web-1', 'web', threeEndpoints.slice(0, 1))],
    });
    assert.match(chain(text, 'nat', SVC)[1], /--rcheck --seconds 10800 --reap/);
  });
});

describe('large clusters', () => {
  function endpoints(count: number): Array<{ip: string}> {
    return Array.from({length: count}, (_, index) => ({ip: `10.244.${4 + Math.floor(index / 250)}.${(index % 250) + 1}`}));
  }

  it('keeps endpoint comments up to 1000 endpoints and drops them above, as kube-proxy does', () => {
    const at = render({services: [service('web')], slices: [slice('web-1', 'web', endpoints(1000))]});
    // Endpoints sort as "ip:port" strings, so 10.244.4.100 comes before 10.244.4.1.
    assert.equal(
      chain(at, 'nat', SVC)[1],
      `-A ${SVC} -m comment --comment "default/web:http -> 10.244.4.100:8080" -m statistic --mode random --probability 0.0010000000 -j ${SEP('10.244.4.100:8080')}`,
    );

    const above = render({services: [service('web')], slices: [slice('web-1', 'web', endpoints(1001))]});
    const first = SEP('10.244.4.100:8080');
    assert.equal(chain(above, 'nat', SVC)[1], `-A ${SVC} -m statistic --mode random --probability 0.0009990010 -j ${first}`);
    assert.deepEqual(chain(above, 'nat', first), [
      `-A ${first} -s 10.244.4.100 -j KUBE-MARK-MASQ`,
      `-A ${first} -m tcp -p tcp -j DNAT --to-destination 10.244.4.100:8080`,
    ]);
    // Service-level rules keep their comments.
    assert.match(chain(above, 'nat', SVC)[0], /--comment "default\/web:http cluster IP"/);
  });
});

describe('service ordering', () => {
  it('writes service ports sorted by name and protocol', () => {
    const services = [service('zeta', {clusterIP: '10.96.0.30'}), service('alpha', {clusterIP: '10.96.0.20'})];
    const slices = [slice('zeta-1', 'zeta', [{ip: '10.244.1.7'}]), slice('alpha-1', 'alpha', [{ip: '10.244.1.8'}])];
    const comments = chain(render({services, slices}), 'nat', 'KUBE-SERVICES').map((rule) => /--comment "([^"]+)"/.exec(rule)?.[1]);
    assert.deepEqual(comments, [
      'default/alpha:http cluster IP',
      'default/zeta:http cluster IP',
      'kubernetes service nodeports; NOTE: this must be the last rule in this chain',
    ]);
  });
});

describe('node features (nfacct counters, --random-fully, nf_conntrack_tcp_be_liberal)', () => {
  const nodePortService = service('web', {
    type: 'NodePort',
    ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
  });
  const objects = {services: [nodePortService], slices: [slice('web-1', 'web', threeEndpoints)]};
  const counters = ['ct_state_invalid_dropped_pkts', 'localhost_nps_accepted_pkts'];
  const withFeatures = (features: Record<string, unknown>, config: Record<string, unknown> = {}): string =>
    render(objects, {
      config: {...config, iptablesFeatures: {nfacctCounters: [], randomFully: true, conntrackTCPLiberal: false, ...features}},
    });

  it('counts INVALID drops and localhost NodePorts into the nfacct objects the node has, as kube-proxy writes them', () => {
    const text = withFeatures({nfacctCounters: counters});
    assert.equal(
      chain(text, 'filter', 'KUBE-FORWARD')[0],
      '-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP',
    );
    assert.deepEqual(chain(text, 'nat', 'KUBE-NODEPORTS'), [
      `-A KUBE-NODEPORTS -m comment --comment default/web:http -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j ${EXT}`,
      `-A KUBE-NODEPORTS -m comment --comment default/web:http -m tcp -p tcp --dport 30080 -j ${EXT}`,
    ]);
  });

  it('writes no counting rule without the nfacct objects, and no localhost one when NodePorts do not answer on 127.0.0.1', () => {
    const none = withFeatures({});
    assert.equal(chain(none, 'filter', 'KUBE-FORWARD')[0], '-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP');
    assert.doesNotMatch(none, /nfacct/);
    const noLocalhost = withFeatures({nfacctCounters: counters}, {localhostNodePorts: false});
    assert.deepEqual(chain(noLocalhost, 'nat', 'KUBE-NODEPORTS'), [
      `-A KUBE-NODEPORTS -m comment --comment default/web:http -m tcp -p tcp --dport 30080 -j ${EXT}`,
    ]);
    const elsewhere = withFeatures({nfacctCounters: counters}, {nodePortAddresses: ['10.0.0.0/8']});
    assert.doesNotMatch(chain(elsewhere, 'nat', 'KUBE-NODEPORTS').join('\n'), /nfacct/);
  });

  it('leaves out --random-fully where iptables lacks it, and the INVALID drop where conntrack is liberal', () => {
    const old = withFeatures({randomFully: false});
    assert.deepEqual(
      chain(old, 'nat', 'KUBE-POSTROUTING').at(-1),
      '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
    );
    const liberal = withFeatures({nfacctCounters: counters, conntrackTCPLiberal: true});
    assert.doesNotMatch(chain(liberal, 'filter', 'KUBE-FORWARD').join('\n'), /INVALID/);
  });

  it('reports malformed features by name and falls back to the defaults', () => {
    const model = buildProxyModel(
      {services: [], endpointSlices: [], node: node('node-1')},
      {
        family: 'IPv4',
        config: {iptablesFeatures: {nfacctCounters: ['bad name!'], randomFully: 'yes', conntrackTCPLiberal: false} as never},
      },
    );
    assert.deepEqual(model.problems.map((problem) => problem.field).sort(), [
      'iptablesFeatures.nfacctCounters',
      'iptablesFeatures.randomFully',
    ]);
    assert.deepEqual(model.config.iptablesFeatures, {nfacctCounters: [], randomFully: true, conntrackTCPLiberal: false});
  });
});
