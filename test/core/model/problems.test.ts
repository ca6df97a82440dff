// Bad objects: each is skipped (or the bad part of it is) with a Problem naming object and field,
// and everything else still reaches the model.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {endpointKey} from '../../../src/core/model/endpoint.ts';
import {buildProxyModel} from '../../../src/core/model/build.ts';
import type {Problem, ProxyModel} from '../../../src/core/model/types.ts';
import {endpoint, node, service, slice} from './cluster-objects.ts';

const good = () => service('good', {clusterIP: '10.96.0.20'});
const goodSlice = () => slice('good-1', 'good', [{ip: '10.244.1.20', node: 'node-1'}]);

interface Row {
  name: string;
  services?: unknown[];
  endpointSlices?: unknown[];
  node?: unknown;
  kind: Problem['kind'];
  /** Expected Problem.field. */
  field: string;
  /** The message must match this (it names the object, the field and the cause). */
  message: RegExp;
  /** Service port keys expected in the model besides default/good:http. */
  alsoKept?: string[];
  /** Check on the model beyond "good is intact". */
  check?: (model: ProxyModel) => void;
}

const rows: Row[] = [
  {
    name: 'clusterIP not an address',
    services: [service('bad', {clusterIP: '10.96.0.300'})],
    kind: 'Service',
    field: 'spec.clusterIP',
    message: /^service default\/bad: spec\.clusterIP: "10\.96\.0\.300" is not an IP address; service skipped$/,
  },
  {
    name: 'clusterIP of the wrong family for ipFamilies',
    services: [service('bad', {clusterIP: 'fd00::10', ipFamilies: ['IPv4']})],
    kind: 'Service',
    field: 'spec.clusterIP',
    message: /^service default\/bad: spec\.clusterIP: fd00::10 is not an IPv4 address as spec\.ipFamilies\[0\] says; service skipped$/,
  },
  {
    name: 'clusterIPs of one family twice',
    services: [service('bad', {clusterIP: '10.96.0.30', clusterIPs: ['10.96.0.30', '10.96.0.31']})],
    kind: 'Service',
    field: 'spec.clusterIPs',
    message: /service default\/bad: spec\.clusterIPs: both addresses are IPv4/,
  },
  {
    name: 'clusterIP and clusterIPs disagree',
    services: [service('bad', {clusterIP: '10.96.0.30', clusterIPs: ['10.96.0.31']})],
    kind: 'Service',
    field: 'spec.clusterIP',
    message: /service default\/bad: spec\.clusterIP: "10\.96\.0\.30" differs from spec\.clusterIPs\[0\]/,
  },
  {
    name: 'port 0',
    services: [service('bad', {ports: [{name: 'http', port: 0}]})],
    kind: 'Service',
    field: 'spec.ports[0].port',
    message: /^service default\/bad port http: spec\.ports\[0\]\.port: 0 is not in 1-65535; port skipped$/,
  },
  {
    name: 'port 70000',
    services: [service('bad', {ports: [{name: 'http', port: 70000}]})],
    kind: 'Service',
    field: 'spec.ports[0].port',
    message: /port http: spec\.ports\[0\]\.port: 70000 is not in 1-65535/,
  },
  {
    name: 'port as a string',
    services: [service('bad', {ports: [{name: 'http', port: '80' as unknown as number}]})],
    kind: 'Service',
    field: 'spec.ports[0].port',
    message: /spec\.ports\[0\]\.port: "80" is not in 1-65535/,
  },
  {
    name: 'port missing',
    services: [service('bad', {ports: [{name: 'http'}]})],
    kind: 'Service',
    field: 'spec.ports[0].port',
    message: /spec\.ports\[0\]\.port: missing; port skipped/,
  },
  {
    name: 'nodePort out of range, other port of the service kept',
    services: [
      service('bad', {
        clusterIP: '10.96.0.30',
        type: 'NodePort',
        ports: [
          {name: 'http', port: 80, nodePort: 70000},
          {name: 'https', port: 443, nodePort: 30443},
        ],
      }),
    ],
    kind: 'Service',
    field: 'spec.ports[0].nodePort',
    message: /^service default\/bad port http: spec\.ports\[0\]\.nodePort: 70000 is not in 1-65535; port skipped$/,
    alsoKept: ['default/bad:https'],
  },
  {
    name: 'nodePort on a ClusterIP service',
    services: [service('bad', {clusterIP: '10.96.0.30', ports: [{name: 'http', port: 80, nodePort: 30080}]})],
    kind: 'Service',
    field: 'spec.ports[0].nodePort',
    message: /nodePort 30080 on a ClusterIP service; nodePort ignored/,
    alsoKept: ['default/bad:http'],
    check: (model) => assert.equal(model.servicePorts.find((p) => p.serviceName === 'bad')?.nodePort, 0),
  },
  {
    name: 'unknown protocol',
    services: [service('bad', {ports: [{name: 'ping', protocol: 'ICMP', port: 1}]})],
    kind: 'Service',
    field: 'spec.ports[0].protocol',
    message: /^service default\/bad port ping: spec\.ports\[0\]\.protocol: unknown protocol "ICMP"; port skipped$/,
  },
  {
    name: 'duplicate port names',
    services: [
      service('bad', {
        clusterIP: '10.96.0.30',
        ports: [
          {name: 'http', port: 80},
          {name: 'http', port: 8080},
        ],
      }),
    ],
    kind: 'Service',
    field: 'spec.ports[1].name',
    message: /service default\/bad port http: spec\.ports\[1\]\.name: duplicate port name "http"; port skipped/,
    alsoKept: ['default/bad:http'],
    check: (model) => assert.equal(model.servicePorts.find((p) => p.serviceName === 'bad')?.port, 80),
  },
  {
    name: 'missing name',
    services: [{apiVersion: 'v1', kind: 'Service', metadata: {namespace: 'default'}, spec: {clusterIP: '10.96.0.30', ports: [{port: 80}]}}],
    kind: 'Service',
    field: 'metadata.name',
    message: /^service default\/\(unnamed\): metadata\.name: missing; service skipped$/,
  },
  {
    name: 'not an object',
    services: ['just a string'],
    kind: 'Service',
    field: '',
    message: /^service \(unnamed\): object is "just a string", not a Service; skipped$/,
  },
  {
    name: 'no spec',
    services: [{metadata: {name: 'bad', namespace: 'default'}}],
    kind: 'Service',
    field: 'spec',
    message: /^service default\/bad: spec: missing; service skipped$/,
  },
  {
    name: 'unknown type',
    services: [service('bad', {type: 'Weird'})],
    kind: 'Service',
    field: 'spec.type',
    message: /service default\/bad: spec\.type: unknown type "Weird"/,
  },
  {
    name: 'unknown external policy',
    services: [service('bad', {externalTrafficPolicy: 'Sometimes'})],
    kind: 'Service',
    field: 'spec.externalTrafficPolicy',
    message: /spec\.externalTrafficPolicy: unknown policy "Sometimes"; service skipped/,
  },
  {
    name: 'unknown internal policy',
    services: [service('bad', {internalTrafficPolicy: 'Nearby'})],
    kind: 'Service',
    field: 'spec.internalTrafficPolicy',
    message: /spec\.internalTrafficPolicy: unknown policy "Nearby"/,
  },
  {
    name: 'session affinity timeout out of range',
    services: [service('bad', {sessionAffinity: 'ClientIP', sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}})],
    kind: 'Service',
    field: 'spec.sessionAffinityConfig.clientIP.timeoutSeconds',
    message: /service default\/bad: spec\.sessionAffinityConfig\.clientIP\.timeoutSeconds: 0 is not in 1-86400; service skipped/,
  },
  {
    name: 'unknown session affinity',
    services: [service('bad', {sessionAffinity: 'Cookie'})],
    kind: 'Service',
    field: 'spec.sessionAffinity',
    message: /unknown affinity "Cookie"/,
  },
  {
    name: 'bad source range closes the load-balancer IPs only',
    services: [
      service('bad', {
        type: 'LoadBalancer',
        loadBalancerSourceRanges: ['10.0.0.0/8', 'nope'],
        ports: [{name: 'http', port: 80, nodePort: 30080}],
      }),
    ],
    kind: 'Service',
    field: 'spec.loadBalancerSourceRanges[1]',
    message:
      /^service default\/bad: spec\.loadBalancerSourceRanges\[1\]: "nope" is not a CIDR; load-balancer IPs closed to every client; cluster IP, NodePorts and external IPs kept$/,
    alsoKept: ['default/bad:http'],
    check: (model) => {
      const port = model.servicePorts.find((p) => p.serviceName === 'bad')!;
      assert.deepEqual([port.loadBalancerSourceRanges, port.loadBalancerSourceRangesInvalid, port.nodePort], [[], true, 30080]);
    },
  },
  {
    name: 'bad externalIP is dropped, the service kept',
    services: [service('bad', {clusterIP: '10.96.0.30', externalIPs: ['x.y.z.w', '192.0.2.9']})],
    kind: 'Service',
    field: 'spec.externalIPs[0]',
    message: /^service default\/bad: spec\.externalIPs\[0\]: "x\.y\.z\.w" is not an IP address; address ignored$/,
    alsoKept: ['default/bad:http'],
    check: (model) => assert.deepEqual(model.servicePorts.find((p) => p.serviceName === 'bad')?.externalIPs, ['192.0.2.9']),
  },
  {
    name: 'bad load-balancer ingress IP is dropped, the service kept',
    services: [
      service(
        'bad',
        {clusterIP: '10.96.0.30', type: 'LoadBalancer', ports: [{name: 'http', port: 80, nodePort: 30080}]},
        {status: {loadBalancer: {ingress: [{ip: '1.2.3'}, {ip: '203.0.113.5'}]}}},
      ),
    ],
    kind: 'Service',
    field: 'status.loadBalancer.ingress[0].ip',
    message: /status\.loadBalancer\.ingress\[0\]\.ip: "1\.2\.3" is not an IP address; entry ignored/,
    alsoKept: ['default/bad:http'],
    check: (model) => assert.deepEqual(model.servicePorts.find((p) => p.serviceName === 'bad')?.loadBalancerIPs, ['203.0.113.5']),
  },
  {
    name: 'same service twice',
    services: [good()],
    kind: 'Service',
    field: 'metadata.name',
    message: /^service default\/good: metadata\.name: given twice; second copy skipped$/,
  },
  {
    name: 'endpoint with a bad address; the other endpoints kept',
    endpointSlices: [slice('good-2', 'good', [{ip: '10.244.1.300'}, {ip: '10.244.2.20'}])],
    kind: 'EndpointSlice',
    field: 'endpoints[0].addresses[0]',
    message: /^endpointslice default\/good-2: endpoints\[0\]\.addresses\[0\]: "10\.244\.1\.300" is not an IP address; endpoint skipped$/,
    check: (model) =>
      assert.deepEqual(
        model.servicePorts.find((p) => p.serviceName === 'good')?.endpoints.map((e) => endpointKey(e)),
        ['10.244.1.20:8080', '10.244.2.20:8080'],
      ),
  },
  {
    name: 'endpoint without addresses',
    endpointSlices: [slice('good-2', 'good', [{addresses: [], conditions: {}}])],
    kind: 'EndpointSlice',
    field: 'endpoints[0].addresses',
    message: /endpoints\[0\]\.addresses: empty; endpoint skipped/,
  },
  {
    name: 'IPv6 endpoint in an IPv4 slice',
    endpointSlices: [slice('good-2', 'good', [{ip: 'fd00::5'}])],
    kind: 'EndpointSlice',
    field: 'endpoints[0].addresses[0]',
    message: /fd00::5 is not an IPv4 address; endpoint skipped/,
  },
  {
    name: 'condition that is not a boolean',
    endpointSlices: [slice('good-2', 'good', [{...endpoint({ip: '10.244.2.20'}), conditions: {ready: 'yes' as unknown as boolean}}])],
    kind: 'EndpointSlice',
    field: 'endpoints[0].conditions.ready',
    message: /endpoints\[0\]\.conditions\.ready: "yes" is not true or false; endpoint skipped/,
  },
  {
    name: 'slice port out of range',
    endpointSlices: [slice('good-2', 'good', [{ip: '10.244.2.20'}], {ports: [{name: 'http', protocol: 'TCP', port: 70000}]})],
    kind: 'EndpointSlice',
    field: 'ports[0].port',
    message: /^endpointslice default\/good-2: ports\[0\]\.port: 70000 is not in 1-65535; port skipped$/,
  },
  {
    name: 'slice port without a number',
    endpointSlices: [slice('good-2', 'good', [{ip: '10.244.2.20'}], {ports: [{name: 'http', protocol: 'TCP'}]})],
    kind: 'EndpointSlice',
    field: 'ports[0].port',
    message: /ports\[0\]\.port: missing/,
  },
  {
    name: 'slice port protocol unknown',
    endpointSlices: [slice('good-2', 'good', [{ip: '10.244.2.20'}], {ports: [{name: 'http', protocol: 'QUIC', port: 80}]})],
    kind: 'EndpointSlice',
    field: 'ports[0].protocol',
    message: /ports\[0\]\.protocol: unknown protocol "QUIC"/,
  },
  {
    name: 'slice without service-name label',
    endpointSlices: [{...slice('orphan', 'good', [{ip: '10.244.2.20'}]), metadata: {name: 'orphan', namespace: 'default'}}],
    kind: 'EndpointSlice',
    field: 'metadata.labels[kubernetes.io/service-name]',
    message:
      /^endpointslice default\/orphan: metadata\.labels\[kubernetes\.io\/service-name\]: missing, so the slice belongs to no service; slice skipped$/,
  },
  {
    name: 'unknown addressType',
    endpointSlices: [slice('good-2', 'good', [{ip: '10.244.2.20'}], {addressType: 'IPv5'})],
    kind: 'EndpointSlice',
    field: 'addressType',
    message: /addressType: unknown address type "IPv5"; slice skipped/,
  },
  {
    name: 'hint without a name',
    endpointSlices: [slice('good-2', 'good', [{...endpoint({ip: '10.244.2.20'}), hints: {forZones: [{}]}}])],
    kind: 'EndpointSlice',
    field: 'endpoints[0].hints.forZones[0].name',
    message: /is not a name; endpoint skipped/,
  },
  {
    name: 'node address that is not an IP',
    node: node('node-1', {
      addresses: [
        {type: 'InternalIP', address: '10.240.0.999'},
        {type: 'InternalIP', address: '10.240.0.11'},
      ],
    }),
    kind: 'Node',
    field: 'status.addresses[0].address',
    message: /^node node-1: status\.addresses\[0\]\.address: "10\.240\.0\.999" is not an IP address; address ignored$/,
    check: (model) => assert.deepEqual(model.nodeIPs, ['10.240.0.11']),
  },
  {
    name: 'node pod CIDR that is not a CIDR',
    node: node('node-1', {podCIDRs: ['10.244.1.0']}),
    kind: 'Node',
    field: 'spec.podCIDRs[0]',
    message: /^node node-1: spec\.podCIDRs\[0\]: "10\.244\.1\.0" is not a CIDR; pod CIDR ignored$/,
  },
  {
    name: 'node without a name',
    node: {kind: 'Node', metadata: {}},
    kind: 'Node',
    field: 'metadata.name',
    message: /^node \(unnamed\): metadata\.name: missing; node ignored$/,
  },
];

for (const row of rows) {
  test(`problem: ${row.name}`, () => {
    const model = buildProxyModel(
      {
        services: [good(), ...(row.services ?? [])],
        endpointSlices: [goodSlice(), ...(row.endpointSlices ?? [])],
        node: row.node ?? node(),
      },
      {family: 'IPv4'},
    );
    assert.equal(model.problems.length, 1, `exactly one problem, got: ${model.problems.map((p) => p.message).join(' | ')}`);
    const [problem] = model.problems;
    assert.equal(problem.kind, row.kind);
    assert.equal(problem.field, row.field);
    assert.match(problem.message, row.message);
    assert.ok(problem.message.includes(problem.field), 'the message names the field');

    const keys = model.servicePorts.map((port) => port.key).sort();
    assert.deepEqual(keys, ['default/good:http', ...(row.alsoKept ?? [])].sort());
    const goodPort = model.servicePorts.find((port) => port.key === 'default/good:http');
    assert.ok(
      goodPort?.endpoints.some((e) => endpointKey(e) === '10.244.1.20:8080'),
      'the good service keeps its endpoints',
    );
    row.check?.(model);
  });
}

test('garbage of every shape never throws', () => {
  const shapes: unknown[] = [
    null,
    undefined,
    0,
    'x',
    [],
    [1, 2],
    {},
    {metadata: null, spec: null},
    {metadata: {name: 5}},
    {metadata: {name: 'a', namespace: 7}},
    {metadata: {name: 'a', labels: 'x', annotations: [1]}, spec: {ports: 'x', clusterIP: 5, clusterIPs: [5], ipFamilies: 'IPv4'}},
    {
      metadata: {name: 'a'},
      spec: {clusterIP: '10.96.0.1', ports: [null, 'x', {port: 80, name: 5}], externalIPs: 'x', loadBalancerSourceRanges: {}},
      status: {loadBalancer: {ingress: [null, {ip: 5}, {ip: '1.2.3.4', ipMode: 3}]}},
    },
    {metadata: {name: 's', labels: {'kubernetes.io/service-name': 'a'}}, addressType: 'IPv4', ports: 'x', endpoints: 'y'},
    {
      metadata: {name: 's', labels: {'kubernetes.io/service-name': 'a'}},
      addressType: 'IPv4',
      ports: [null, {port: 'x'}],
      endpoints: [
        null,
        {addresses: 'x'},
        {addresses: [5]},
        {addresses: ['1.2.3.4'], conditions: 'x', hints: 'x'},
        {addresses: ['1.2.3.4'], hints: {forNodes: 'x'}},
        {addresses: ['1.2.3.4'], nodeName: 4, targetRef: 'x'},
      ],
    },
  ];
  for (const family of ['IPv4', 'IPv6'] as const) {
    for (const shape of shapes) {
      assert.doesNotThrow(
        () => buildProxyModel({services: [shape], endpointSlices: [shape], node: shape}, {family}),
        JSON.stringify(shape),
      );
    }
    assert.doesNotThrow(() =>
      buildProxyModel({services: 'x' as unknown as unknown[], endpointSlices: {} as unknown as unknown[]}, {family}),
    );
    assert.doesNotThrow(() =>
      buildProxyModel(
        {services: [], endpointSlices: []},
        {family, nodeIPs: [5 as unknown as string], config: {localDetector: {mode: 'Weird'} as never, masqueradeBit: 'x' as never}},
      ),
    );
  }
});
