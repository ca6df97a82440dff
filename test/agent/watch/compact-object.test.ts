// compactObject keeps what the model reads: the model of compact records equals the model of the
// API server's objects, bad values included, and the rest (managedFields, other annotations) goes.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import type {EndpointInput} from '../../../src/core/model/objects.ts';
import {compactObject} from '../../../src/agent/watch/compact-object.ts';
import {node, service, slice} from '../../core/model/cluster-objects.ts';

const managedFields = [{manager: 'kube-controller-manager', operation: 'Update', fieldsV1: {'f:metadata': {'f:labels': {}}}}];

function withNoise<T extends object>(object: T): T {
  const copy = structuredClone(object) as T & {metadata: Record<string, unknown>};
  copy.metadata = {
    ...copy.metadata,
    uid: 'u-1',
    resourceVersion: '42',
    managedFields,
    annotations: {...(copy.metadata.annotations as object), 'kubectl.kubernetes.io/last-applied-configuration': 'x'.repeat(500)},
  };
  return copy;
}

test('the model of compact records equals the model of the whole objects', () => {
  const services = [
    withNoise(
      service(
        'web',
        {
          clusterIP: '10.96.0.10',
          selector: {app: 'web'},
          type: 'LoadBalancer',
          externalTrafficPolicy: 'Local',
          healthCheckNodePort: 30001,
          ports: [{name: 'http', protocol: 'TCP', port: 80, nodePort: 30080}],
        },
        {status: {loadBalancer: {ingress: [{ip: '192.0.2.10'}]}}},
      ),
    ),
    withNoise(
      service(
        'hinted',
        {clusterIP: '10.96.0.11'},
        {metadata: {name: 'hinted', namespace: 'default', annotations: {'service.kubernetes.io/topology-mode': 'Auto'}}},
      ),
    ),
    withNoise(service('bad', {clusterIP: '10.96.0.12', ports: [{name: 'http', protocol: 'TCP', port: 70000}]})),
    withNoise(
      service(
        'other',
        {clusterIP: '10.96.0.13'},
        {metadata: {name: 'other', namespace: 'default', labels: {'service.kubernetes.io/service-proxy-name': 'someone-else', team: 'a'}}},
      ),
    ),
  ];
  const slices = [
    withNoise(
      slice(
        'web-1',
        'web',
        [
          {ip: '10.244.1.5', node: 'node-1', zone: 'a', zoneHints: ['a'], pod: 'web-1'},
          {ip: '10.244.2.5', node: 'node-2', ready: false, serving: true, terminating: true},
        ],
        {ports: [{name: 'http', protocol: 'TCP', port: 8080}]},
      ),
    ),
    withNoise(
      slice('hinted-1', 'hinted', [{ip: 'not-an-ip'}, {ip: '10.244.3.3', nodeHints: ['node-1']}], {
        ports: [{name: 'http', protocol: 'TCP', port: 8080}],
      }),
    ),
    // Malformed conditions, as an API server that does not validate could hand them out.
    withNoise(
      slice('web-2', 'web', [
        {addresses: ['10.244.4.4'], conditions: {ready: 'yes'}},
        {addresses: ['10.244.4.5'], conditions: {ready: true, serving: null}},
      ] as unknown as EndpointInput[]),
    ),
  ];
  const options = {family: 'IPv4' as const, nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16']};
  const whole = buildProxyModel({services, endpointSlices: slices, node: node('node-1', {zone: 'a'})}, options);
  const compact = buildProxyModel(
    {
      services: services.map((object) => compactObject('Service', object)),
      endpointSlices: slices.map((object) => compactObject('EndpointSlice', object)),
      node: node('node-1', {zone: 'a'}),
    },
    options,
  );
  assert.deepEqual(compact, whole);
  assert.ok(whole.problems.length >= 2, 'the bad port and the bad endpoint address are named');
});

test('a compact record drops what the proxy does not read, and keeps resourceVersion and the trigger time', () => {
  const object = withNoise(slice('web-1', 'web', [{ip: '10.244.1.5', pod: 'web-1'}]));
  (object.metadata!.annotations as Record<string, string>)['endpoints.kubernetes.io/last-change-trigger-time'] = '2026-01-01T00:00:00Z';
  const compact = compactObject('EndpointSlice', object) as {metadata: Record<string, unknown>; endpoints: Array<{targetRef: object}>};
  assert.equal(compact.metadata.managedFields, undefined);
  assert.equal(compact.metadata.uid, undefined);
  assert.equal(compact.metadata.resourceVersion, '42');
  assert.deepEqual(compact.metadata.annotations, {'endpoints.kubernetes.io/last-change-trigger-time': '2026-01-01T00:00:00Z'});
  assert.deepEqual(compact.endpoints[0].targetRef, {kind: 'Pod', name: 'web-1', namespace: 'default'});
  assert.ok(JSON.stringify(compact).length < JSON.stringify(object).length - 500, 'the last-applied annotation and managedFields are gone');
  const nodeObject = withNoise(node());
  assert.equal(compactObject('Node', nodeObject), nodeObject, 'the Node is kept whole');
});

test('endpoints with the same true/false conditions share one conditions object; other values are kept as they came', () => {
  const endpoints = [
    {addresses: ['10.244.1.1'], conditions: {ready: true}},
    {addresses: ['10.244.1.2'], conditions: {ready: true}},
    {addresses: ['10.244.1.3'], conditions: {ready: false, serving: true, terminating: true}},
    {addresses: ['10.244.1.4'], conditions: {ready: 'yes'}},
    {addresses: ['10.244.1.5'], conditions: {ready: true, hot: true}},
  ] as unknown as EndpointInput[];
  const first = compactObject('EndpointSlice', slice('web-1', 'web', endpoints)) as {endpoints: Array<{conditions: object}>};
  const second = compactObject('EndpointSlice', slice('web-2', 'web', structuredClone(endpoints))) as typeof first;
  assert.deepEqual(
    first.endpoints.map((endpoint) => endpoint.conditions),
    endpoints.map((endpoint) => endpoint.conditions),
  );
  assert.equal(first.endpoints[0].conditions, first.endpoints[1].conditions);
  assert.equal(second.endpoints[0].conditions, first.endpoints[0].conditions, 'shared across slices');
  assert.equal(second.endpoints[2].conditions, first.endpoints[2].conditions);
  assert.notEqual(second.endpoints[3].conditions, first.endpoints[3].conditions, 'a bad value is not shared');
  assert.notEqual(second.endpoints[4].conditions, first.endpoints[4].conditions, 'nor an unknown condition');
});

test('a ServiceCIDR keeps its name, resourceVersion and spec.cidrs, bad values included', () => {
  const kept = compactObject(
    'ServiceCIDR',
    withNoise({
      apiVersion: 'networking.k8s.io/v1',
      kind: 'ServiceCIDR',
      metadata: {name: 'kubernetes'},
      spec: {cidrs: ['10.96.0.0/12', 5]},
      status: {conditions: [{type: 'Ready', status: 'True'}]},
    }),
  );
  assert.deepEqual(kept, {metadata: {name: 'kubernetes', resourceVersion: '42', annotations: {}}, spec: {cidrs: ['10.96.0.0/12', 5]}});
});
