// buildProxyModel: what each kind of Service, EndpointSlice and Node turns into, per IP family.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {endpointKey} from '../../../src/core/model/endpoint.ts';
import {buildProxyModel, type ModelObjects, type ModelOptions} from '../../../src/core/model/build.ts';
import {defaultProxyConfig} from '../../../src/core/model/config.ts';
import type {ServiceInput} from '../../../src/core/model/objects.ts';
import type {ProxyModel, ServicePort} from '../../../src/core/model/types.ts';
import {node, service, slice} from './cluster-objects.ts';

function build(objects: Partial<ModelObjects>, options: Partial<ModelOptions> = {}): ProxyModel {
  return buildProxyModel(
    {services: objects.services ?? [], endpointSlices: objects.endpointSlices ?? [], node: 'node' in objects ? objects.node : node()},
    {family: 'IPv4', ...options},
  );
}

function only(model: ProxyModel): ServicePort {
  assert.deepEqual(model.problems, []);
  assert.equal(model.servicePorts.length, 1, `one service port, got ${model.servicePorts.map((p) => p.key).join(', ')}`);
  return model.servicePorts[0];
}

const keys = (model: ProxyModel) => model.servicePorts.map((port) => `${port.key}/${port.protocol}`);

test('ClusterIP service: one service port with kube-proxy key, address and defaults', () => {
  const port = only(build({services: [service('web')]}));
  assert.equal(port.key, 'default/web:http');
  assert.equal(port.namespace, 'default');
  assert.equal(port.serviceName, 'web');
  assert.equal(port.portName, 'http');
  assert.equal(port.protocol, 'TCP');
  assert.equal(port.clusterIP, '10.96.0.10');
  assert.equal(port.port, 80);
  assert.equal(port.nodePort, 0);
  assert.deepEqual(port.externalIPs, []);
  assert.deepEqual(port.loadBalancerIPs, []);
  assert.deepEqual(port.loadBalancerSourceRanges, []);
  assert.equal(port.externalPolicyLocal, false);
  assert.equal(port.internalPolicyLocal, false);
  assert.equal(port.healthCheckNodePort, 0);
  assert.equal(port.sessionAffinity, undefined);
  assert.equal(port.externallyAccessible, false);
  assert.deepEqual(port.endpoints, []);
  assert.equal(port.hasAnyEndpoints, false);
});

test('an unnamed single port gets the key namespace/name', () => {
  const port = only(build({services: [service('web', {ports: [{port: 80}]})]}));
  assert.equal(port.key, 'default/web');
  assert.equal(port.portName, '');
  assert.equal(port.protocol, 'TCP', 'protocol defaults to TCP');
});

test('NodePort service keeps its nodePort and is externally accessible', () => {
  const port = only(build({services: [service('web', {type: 'NodePort', ports: [{name: 'http', port: 80, nodePort: 30080}]})]}));
  assert.equal(port.nodePort, 30080);
  assert.equal(port.externallyAccessible, true);
});

test('LoadBalancer: VIP-mode and unset ingress IPs of the family, health check port with Local policy', () => {
  const model = build({
    services: [
      service(
        'lb',
        {
          type: 'LoadBalancer',
          externalTrafficPolicy: 'Local',
          healthCheckNodePort: 32000,
          ports: [{name: 'http', port: 80, nodePort: 30080}],
          loadBalancerSourceRanges: [' 192.168.0.0/16 ', '10.1.2.3/8', '2001:db8::/32'],
        },
        {
          status: {
            loadBalancer: {
              ingress: [
                {ip: '203.0.113.10'},
                {ip: '203.0.113.11', ipMode: 'VIP'},
                {ip: '203.0.113.12', ipMode: 'Proxy'},
                {hostname: 'lb.example.com'},
                {ip: '2001:db8::10'},
              ],
            },
          },
        },
      ),
    ],
  });
  const port = only(model);
  assert.deepEqual(port.loadBalancerIPs, ['203.0.113.10', '203.0.113.11']);
  assert.deepEqual(port.loadBalancerSourceRanges, ['192.168.0.0/16', '10.0.0.0/8'], 'trimmed, masked, IPv4 only');
  assert.equal(port.externalPolicyLocal, true);
  assert.equal(port.healthCheckNodePort, 32000);
  assert.equal(port.usesLocalEndpoints, true);
  assert.equal(port.usesClusterEndpoints, true, 'Cluster endpoints still serve short-circuited internal traffic');
});

test('healthCheckNodePort only counts on a LoadBalancer with externalTrafficPolicy Local', () => {
  const port = only(
    build({
      services: [service('lb', {type: 'LoadBalancer', healthCheckNodePort: 32000, ports: [{name: 'http', port: 80, nodePort: 30080}]})],
    }),
  );
  assert.equal(port.healthCheckNodePort, 0);
  assert.equal(port.externalPolicyLocal, false);
});

test('the source-ranges annotation is read only when asked and the field is empty', () => {
  const annotated = service(
    'lb',
    {type: 'LoadBalancer', ports: [{name: 'http', port: 80, nodePort: 30080}]},
    {
      metadata: {
        name: 'lb',
        namespace: 'default',
        annotations: {'service.beta.kubernetes.io/load-balancer-source-ranges': '192.168.0.0/24, 2001:db8::/64'},
      },
    },
  );
  assert.deepEqual(only(build({services: [annotated]})).loadBalancerSourceRanges, []);
  assert.deepEqual(only(build({services: [annotated]}, {sourceRangesFromAnnotation: true})).loadBalancerSourceRanges, ['192.168.0.0/24']);
  const withField = structuredClone(annotated);
  withField.spec!.loadBalancerSourceRanges = ['172.16.0.0/12'];
  assert.deepEqual(only(build({services: [withField]}, {sourceRangesFromAnnotation: true})).loadBalancerSourceRanges, ['172.16.0.0/12']);
});

test('externalIPs are filtered to the family and make the service externally accessible', () => {
  const model = build({services: [service('web', {externalIPs: ['192.0.2.1', '2001:db8::1', '192.0.2.1']})]});
  const port = only(model);
  assert.deepEqual(port.externalIPs, ['192.0.2.1']);
  assert.equal(port.externallyAccessible, true);
  const v6 = build(
    {services: [service('web', {clusterIP: 'fd00:10:96::10', externalIPs: ['192.0.2.1', '2001:DB8:0::1']})]},
    {family: 'IPv6'},
  );
  assert.deepEqual(only(v6).externalIPs, ['2001:db8::1']);
});

test('externalTrafficPolicy Local without external access is not externalPolicyLocal', () => {
  const port = only(build({services: [service('web', {externalTrafficPolicy: 'Local'})]}));
  assert.equal(port.externalPolicyLocal, false);
  assert.equal(port.usesLocalEndpoints, false);
  const otherFamilyOnly = only(build({services: [service('web', {externalTrafficPolicy: 'Local', externalIPs: ['2001:db8::1']})]}));
  assert.equal(otherFamilyOnly.externalPolicyLocal, false, 'no externalIP of this family: not reachable from outside here');
});

test('externalTrafficPolicy Local on a ClusterIP service with externalIPs counts', () => {
  const port = only(build({services: [service('web', {externalTrafficPolicy: 'Local', externalIPs: ['192.0.2.1']})]}));
  assert.equal(port.externalPolicyLocal, true);
  assert.equal(port.usesLocalEndpoints, true);
  assert.equal(port.healthCheckNodePort, 0, 'only LoadBalancers get a health check port');
});

const skippedQuietly: Array<{name: string; object: ServiceInput; options?: Partial<ModelOptions>}> = [
  {name: 'ExternalName', object: service('ext', {type: 'ExternalName', externalName: 'example.com', clusterIP: undefined})},
  {name: 'headless (clusterIP None)', object: service('headless', {clusterIP: 'None'})},
  {name: 'headless (clusterIPs [None])', object: service('headless', {clusterIP: undefined, clusterIPs: ['None']})},
  {name: 'no clusterIP', object: service('pending', {clusterIP: ''})},
  {name: 'single-stack IPv6 in the IPv4 model', object: service('v6', {clusterIP: 'fd00:10:96::10', ipFamilies: ['IPv6']})},
  {
    name: "another proxy's service",
    object: service(
      'other',
      {},
      {metadata: {name: 'other', namespace: 'default', labels: {'service.kubernetes.io/service-proxy-name': 'cilium'}}},
    ),
  },
  {
    name: "another proxy's service while we have a name",
    object: service(
      'other',
      {},
      {metadata: {name: 'other', namespace: 'default', labels: {'service.kubernetes.io/service-proxy-name': 'cilium'}}},
    ),
    options: {serviceProxyName: 'proxyctl'},
  },
  {
    name: 'service labelled headless',
    object: service('h', {}, {metadata: {name: 'h', namespace: 'default', labels: {'service.kubernetes.io/headless': ''}}}),
  },
];

for (const row of skippedQuietly) {
  test(`skipped without a problem: ${row.name}`, () => {
    const model = build({services: [row.object, service('good', {clusterIP: '10.96.0.20'})]}, row.options);
    assert.deepEqual(model.problems, []);
    assert.deepEqual(keys(model), ['default/good:http/TCP']);
  });
}

test('a service labelled with our own proxy name is ours', () => {
  const ours = service(
    'mine',
    {},
    {metadata: {name: 'mine', namespace: 'default', labels: {'service.kubernetes.io/service-proxy-name': 'proxyctl'}}},
  );
  assert.deepEqual(keys(build({services: [ours]}, {serviceProxyName: 'proxyctl'})), ['default/mine:http/TCP']);
});

test('dual-stack service: each family gets its own clusterIP, externalIPs and endpoints', () => {
  const objects: Partial<ModelObjects> = {
    services: [
      service('web', {
        clusterIP: '10.96.0.10',
        clusterIPs: ['10.96.0.10', 'FD00:10:96:0::10'],
        ipFamilies: ['IPv4', 'IPv6'],
        ipFamilyPolicy: 'RequireDualStack',
        externalIPs: ['192.0.2.1', '2001:db8::1'],
      }),
    ],
    endpointSlices: [
      slice('web-v4', 'web', [{ip: '10.244.1.5', node: 'node-1'}]),
      slice('web-v6', 'web', [{ip: 'fd00:10:244:1::5', node: 'node-1'}], {addressType: 'IPv6'}),
      slice('web-fqdn', 'web', [], {addressType: 'FQDN'}),
    ],
  };
  const v4 = only(build(objects, {family: 'IPv4'}));
  const v6 = only(build(objects, {family: 'IPv6'}));
  assert.equal(v4.clusterIP, '10.96.0.10');
  assert.equal(v6.clusterIP, 'fd00:10:96::10');
  assert.deepEqual(v4.externalIPs, ['192.0.2.1']);
  assert.deepEqual(v6.externalIPs, ['2001:db8::1']);
  assert.deepEqual(
    v4.endpoints.map((e) => endpointKey(e)),
    ['10.244.1.5:8080'],
  );
  assert.deepEqual(
    v6.endpoints.map((e) => endpointKey(e)),
    ['[fd00:10:244:1::5]:8080'],
  );
  assert.equal(v6.endpoints[0].isLocal, true);
});

test('IPv6 model: node IPs and pod CIDRs of the family', () => {
  const model = build({services: []}, {family: 'IPv6', detectLocalMode: 'NodeCIDR'});
  assert.deepEqual(model.nodeIPs, ['fd00:10:240::11']);
  assert.deepEqual(model.config.localDetector, {mode: 'NodeCIDR', cidrs: ['fd00:10:244:1::/64']});
});

test('several ports: targetPort comes from the slice port of the same name and protocol', () => {
  const model = build({
    services: [
      service('dns', {
        clusterIP: '10.96.0.53',
        ports: [
          {name: 'dns', protocol: 'UDP', port: 53},
          {name: 'dns-tcp', protocol: 'TCP', port: 53},
          {name: 'metrics', protocol: 'TCP', port: 9153},
        ],
      }),
    ],
    endpointSlices: [
      slice('dns-a', 'dns', [{ip: '10.244.1.3', node: 'node-1'}], {
        ports: [
          {name: 'dns', protocol: 'UDP', port: 5353},
          {name: 'dns-tcp', protocol: 'TCP', port: 5354},
          {name: 'metrics', protocol: 'UDP', port: 9999},
        ],
      }),
    ],
  });
  assert.deepEqual(model.problems, []);
  assert.deepEqual(keys(model), ['default/dns:dns/UDP', 'default/dns:dns-tcp/TCP', 'default/dns:metrics/TCP']);
  const byName = Object.fromEntries(model.servicePorts.map((port) => [port.portName, port]));
  assert.deepEqual(
    byName.dns.endpoints.map((e) => endpointKey(e)),
    ['10.244.1.3:5353'],
  );
  assert.deepEqual(
    byName['dns-tcp'].endpoints.map((e) => endpointKey(e)),
    ['10.244.1.3:5354'],
  );
  assert.deepEqual(byName.metrics.endpoints, [], 'a slice port of another protocol does not match');
});

test('slices are merged, linked by service-name label within the namespace, and sorted by key', () => {
  const model = build({
    services: [service('web')],
    endpointSlices: [
      slice('web-b', 'web', [{ip: '10.244.2.10'}, {ip: '10.244.1.2'}]),
      slice('web-a', 'web', [{ip: '10.244.1.10'}]),
      slice('other', 'not-web', [{ip: '10.244.9.9'}]),
      {
        ...slice('elsewhere', 'web', [{ip: '10.244.8.8'}]),
        metadata: {name: 'elsewhere', namespace: 'prod', labels: {'kubernetes.io/service-name': 'web'}},
      },
    ],
  });
  // Plain string order, as kube-proxy sorts: "10.244.1.10" before "10.244.1.2".
  assert.deepEqual(
    only(model).endpoints.map((e) => endpointKey(e)),
    ['10.244.1.10:8080', '10.244.1.2:8080', '10.244.2.10:8080'],
  );
});

test('an endpoint in two slices appears once; a running copy beats a terminating one', () => {
  const model = build({
    services: [service('web')],
    endpointSlices: [
      slice('web-a', 'web', [{ip: '10.244.1.5', ready: false, serving: true, terminating: true, pod: 'old'}]),
      slice('web-b', 'web', [
        {ip: '10.244.1.5', ready: true, pod: 'new'},
        {ip: '10.244.1.6', pod: 'first'},
      ]),
      slice('web-c', 'web', [{ip: '10.244.1.6', ready: false, serving: true, terminating: true, pod: 'second'}]),
    ],
  });
  const endpoints = only(model).endpoints;
  assert.deepEqual(
    endpoints.map((e) => [endpointKey(e), e.podName]),
    [
      ['10.244.1.5:8080', 'new'],
      ['10.244.1.6:8080', 'first'],
    ],
  );
});

test("endpoint conditions take kube-proxy's defaults", () => {
  const model = build({
    services: [service('web')],
    endpointSlices: [
      slice('web-a', 'web', [
        {ip: '10.244.1.1'},
        {ip: '10.244.1.2', ready: false},
        {ip: '10.244.1.3', ready: false, serving: false, terminating: true},
      ]),
    ],
  });
  const conditions = only(model).endpoints.map((e) => [e.ip, e.ready, e.serving, e.terminating]);
  assert.deepEqual(conditions, [
    ['10.244.1.1', true, true, false],
    ['10.244.1.2', false, true, false],
    ['10.244.1.3', false, false, true],
  ]);
});

test('endpoint details: locality, zone, hints and pod are carried', () => {
  const model = build({
    services: [service('web')],
    endpointSlices: [
      slice('web-a', 'web', [
        {ip: '10.244.1.1', node: 'node-1', zone: 'zone-a', zoneHints: ['zone-a'], nodeHints: ['node-1'], pod: 'web-1'},
        {ip: '10.244.2.1', node: 'node-2'},
      ]),
    ],
  });
  const [mine, theirs] = only(model).endpoints;
  assert.deepEqual(mine, {
    ip: '10.244.1.1',
    port: 8080,
    ready: true,
    serving: true,
    terminating: false,
    isLocal: true,
    nodeName: 'node-1',
    zone: 'zone-a',
    zoneHints: ['zone-a'],
    nodeHints: ['node-1'],
    podName: 'web-1',
    podNamespace: 'default',
  });
  assert.equal(theirs.isLocal, false);
});

test('without a node name no endpoint is local', () => {
  const model = build({
    services: [service('web')],
    endpointSlices: [slice('web-a', 'web', [{ip: '10.244.1.1', node: 'node-1'}])],
    node: undefined,
  });
  assert.equal(model.nodeName, '');
  assert.equal(only(model).endpoints[0].isLocal, false);
});

test('session affinity ClientIP: default and explicit timeout', () => {
  assert.deepEqual(only(build({services: [service('web', {sessionAffinity: 'ClientIP'})]})).sessionAffinity, {timeoutSeconds: 10800});
  const explicit = service('web', {sessionAffinity: 'ClientIP', sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}});
  assert.deepEqual(only(build({services: [explicit]})).sessionAffinity, {timeoutSeconds: 60});
  assert.equal(only(build({services: [service('web', {sessionAffinity: 'None'})]})).sessionAffinity, undefined);
});

test('internalTrafficPolicy Local', () => {
  const port = only(build({services: [service('web', {internalTrafficPolicy: 'Local'})]}));
  assert.equal(port.internalPolicyLocal, true);
  assert.equal(port.usesClusterEndpoints, false);
  assert.equal(port.usesLocalEndpoints, true);
});

test('node facts: name, zone, InternalIPs then ExternalIPs of the family', () => {
  const model = build({
    node: node('node-7', {
      zone: 'zone-z',
      addresses: [
        {type: 'ExternalIP', address: '198.51.100.7'},
        {type: 'InternalIP', address: '10.240.0.17'},
        {type: 'InternalIP', address: 'fd00::17'},
        {type: 'Hostname', address: 'node-7'},
      ],
    }),
  });
  assert.equal(model.nodeName, 'node-7');
  assert.equal(model.nodeZone, 'zone-z');
  assert.deepEqual(model.nodeIPs, ['10.240.0.17', '198.51.100.7']);
  assert.deepEqual(model.problems, []);
});

test('nodeIPs and nodeName options override the Node', () => {
  const model = build({}, {nodeName: 'node-1', nodeIPs: ['10.0.0.1', 'fd00::1', '10.0.0.1']});
  assert.deepEqual(model.nodeIPs, ['10.0.0.1']);
  assert.equal(model.nodeName, 'node-1');
});

test("a Node that is not this proxy's node is ignored with a problem", () => {
  const model = build({}, {nodeName: 'node-9'});
  assert.equal(model.nodeName, 'node-9');
  assert.deepEqual(model.nodeIPs, []);
  assert.equal(model.problems.length, 1);
  assert.equal(model.problems[0].kind, 'Node');
  assert.match(model.problems[0].message, /^node node-1: metadata.name: not this proxy's node "node-9"/);
});

test('config: defaults and local detectors', () => {
  assert.deepEqual(defaultProxyConfig(), {
    masqueradeAll: false,
    masqueradeBit: 14,
    localDetector: {mode: 'None'},
    nodePortAddresses: [],
    localhostNodePorts: true,
    iptablesFeatures: {nfacctCounters: [], randomFully: true, conntrackTCPLiberal: false},
    nftablesLayout: 'proxyctl',
  });
  assert.deepEqual(build({}).config, defaultProxyConfig());
  const cases: Array<{options: Partial<ModelOptions>; family?: 'IPv4' | 'IPv6'; detector: unknown}> = [
    {options: {clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56']}, detector: {mode: 'ClusterCIDR', cidrs: ['10.244.0.0/16']}},
    {
      options: {clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56']},
      family: 'IPv6',
      detector: {mode: 'ClusterCIDR', cidrs: ['fd00:10:244::/56']},
    },
    {options: {clusterCIDRs: ['10.244.0.0/16']}, family: 'IPv6', detector: {mode: 'None'}},
    {options: {detectLocalMode: 'NodeCIDR'}, detector: {mode: 'NodeCIDR', cidrs: ['10.244.1.0/24']}},
    {options: {detectLocalMode: 'None', clusterCIDRs: ['10.244.0.0/16']}, detector: {mode: 'None'}},
    {
      options: {config: {localDetector: {mode: 'BridgeInterface', interfaceName: 'cbr0'}}},
      detector: {mode: 'BridgeInterface', interfaceName: 'cbr0'},
    },
    {
      options: {config: {localDetector: {mode: 'InterfaceNamePrefix', interfacePrefix: 'veth'}}},
      detector: {mode: 'InterfaceNamePrefix', interfacePrefix: 'veth'},
    },
    {
      options: {config: {localDetector: {mode: 'NodeCIDR', cidrs: ['10.244.7.0/24']}}},
      detector: {mode: 'NodeCIDR', cidrs: ['10.244.7.0/24']},
    },
  ];
  for (const row of cases) {
    const model = build({}, {...row.options, family: row.family ?? 'IPv4'});
    assert.deepEqual(model.config.localDetector, row.detector, JSON.stringify(row.options));
    assert.deepEqual(model.problems, []);
  }
  const iptablesFeatures = {nfacctCounters: ['ct_state_invalid_dropped_pkts'], randomFully: false, conntrackTCPLiberal: true};
  const given = build(
    {},
    {
      config: {
        masqueradeAll: true,
        masqueradeBit: 10,
        nodePortAddresses: ['primary', '10.240.0.0/24'],
        localhostNodePorts: false,
        iptablesFeatures,
        nftablesLayout: 'kube-proxy',
      },
    },
  );
  assert.deepEqual(
    {...given.config, localDetector: undefined},
    {
      masqueradeAll: true,
      masqueradeBit: 10,
      localDetector: undefined,
      nodePortAddresses: ['primary', '10.240.0.0/24'],
      localhostNodePorts: false,
      iptablesFeatures,
      nftablesLayout: 'kube-proxy',
    },
  );
});

test("config: an unknown nftables layout falls back to proxyctl's, with a problem naming it", () => {
  const model = build({}, {config: {nftablesLayout: 'kube' as never}});
  assert.equal(model.config.nftablesLayout, 'proxyctl');
  assert.equal(model.problems.length, 1);
  assert.match(model.problems[0].message, /nftablesLayout: "kube" is not one of proxyctl, kube-proxy, kube-proxy-1.33/);
});

test('config: NodeCIDR without a pod CIDR of the family turns detection off, with a problem', () => {
  const model = build({node: node('node-1', {podCIDRs: ['fd00:10:244:1::/64']})}, {detectLocalMode: 'NodeCIDR'});
  assert.deepEqual(model.config.localDetector, {mode: 'None'});
  assert.equal(model.problems.length, 1);
  assert.match(model.problems[0].message, /^node node-1: spec.podCIDRs: no IPv4 pod CIDR/);
});

test('config: bad values fall back to defaults with a problem naming the setting', () => {
  const model = build({}, {config: {masqueradeBit: 40, nodePortAddresses: ['nonsense', '10.0.0.0/8']}, nodeIPs: ['bogus']});
  assert.equal(model.config.masqueradeBit, 14);
  assert.deepEqual(model.config.nodePortAddresses, ['10.0.0.0/8']);
  const fields = model.problems.map((p) => [p.kind, p.field]);
  assert.deepEqual(fields, [
    ['Config', 'nodeIPs[0]'],
    ['Config', 'masqueradeBit'],
    ['Config', 'nodePortAddresses[0]'],
  ]);
  assert.match(model.problems[1].message, /^proxy config: masqueradeBit: 40 is not in 0-31; default 14 used$/);
});

test('service ports are sorted by key then protocol whatever the input order', () => {
  const services = [
    service('b', {clusterIP: '10.96.0.2'}),
    service('a', {
      clusterIP: '10.96.0.1',
      ports: [
        {name: 'x', protocol: 'UDP', port: 1},
        {name: 'x-tcp', protocol: 'TCP', port: 1},
      ],
    }),
    {...service('c', {clusterIP: '10.96.0.3'}), metadata: {name: 'c', namespace: 'alpha'}},
  ];
  const model = build({services});
  assert.deepEqual(keys(model), ['alpha/c:http/TCP', 'default/a:x/UDP', 'default/a:x-tcp/TCP', 'default/b:http/TCP']);
  const reversed = build({services: [...services].reverse()});
  assert.deepEqual(reversed, model);
});

test('the same model whatever order slices and endpoints arrive in', () => {
  const slices = [
    slice('web-a', 'web', [
      {ip: '10.244.1.5', node: 'node-1'},
      {ip: '10.244.2.5', node: 'node-2', ready: false},
    ]),
    slice('web-b', 'web', [{ip: '10.244.3.5', node: 'node-3'}]),
    slice('bad', 'web', [{ip: 'not-an-ip'}]),
  ];
  const first = build({services: [service('web')], endpointSlices: slices});
  const second = build({services: [service('web')], endpointSlices: [...slices].reverse()});
  assert.deepEqual(second, first);
});

test('a model survives a JSON round trip unchanged (no undefined fields, plain data)', () => {
  const model = build({
    services: [service('web', {sessionAffinity: 'ClientIP'})],
    endpointSlices: [slice('web-a', 'web', [{ip: '10.244.1.5', node: 'node-1'}])],
  });
  assert.deepEqual(JSON.parse(JSON.stringify(model)), model);
});
