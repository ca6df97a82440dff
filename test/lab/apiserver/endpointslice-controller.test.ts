// The EndpointSlice controller: pods selected by a service become endpoints with the right conditions.
import {after, before, describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {startApiServer, type ApiServer} from '../../../src/lab/apiserver/server.ts';
import type {KubeObject} from '../../../src/lab/apiserver/object-log.ts';

let server: ApiServer;

function slicesOf(namespace: string, service: string): KubeObject[] {
  return server.store.list('endpointslices', {namespace, labelSelector: `kubernetes.io/service-name=${service}`}).items;
}

function addPod(
  namespace: string,
  name: string,
  opts: {
    labels?: Record<string, string>;
    ip?: string;
    ips?: string[];
    ready?: boolean;
    node?: string;
    httpPort?: number;
    phase?: string;
  } = {},
): KubeObject {
  const ips = opts.ips ?? (opts.ip ? [opts.ip] : []);
  return server.store.create(
    'pods',
    {
      metadata: {name, namespace, labels: opts.labels ?? {app: 'web'}},
      spec: {
        nodeName: opts.node ?? 'node-a',
        containers: [{name: 'app', image: 'app:1', ports: [{name: 'http', containerPort: opts.httpPort ?? 8080}]}],
      },
      status: {
        phase: opts.phase ?? 'Running',
        podIP: ips[0],
        podIPs: ips.map((ip) => ({ip})),
        conditions: [{type: 'Ready', status: opts.ready === false ? 'False' : 'True'}],
      },
    },
    namespace,
    {keepStatus: true},
  );
}

function addService(namespace: string, name: string, spec: Record<string, unknown>, annotations?: Record<string, string>): KubeObject {
  return server.store.create(
    'services',
    {
      metadata: {name, namespace, labels: {team: 'a'}, annotations},
      spec: {selector: {app: 'web'}, ports: [{name: 'http', port: 80, targetPort: 'http'}], ...spec},
    },
    namespace,
  );
}

describe('EndpointSlice controller', () => {
  before(async () => {
    server = await startApiServer({port: 0});
    for (const [name, zone] of [
      ['node-a', 'zone-1'],
      ['node-b', 'zone-2'],
    ]) {
      server.store.create(
        'nodes',
        {
          metadata: {name, labels: {'topology.kubernetes.io/zone': zone}},
          status: {addresses: [{type: 'InternalIP', address: '192.0.2.1'}]},
        },
        undefined,
        {keepStatus: true},
      );
    }
  });
  after(async () => {
    await server.stop();
  });

  it('builds a slice from the selected pods, resolving named target ports', async () => {
    server.store.create('namespaces', {metadata: {name: 'basic'}});
    const svc = addService('basic', 'web', {});
    addPod('basic', 'web-1', {ip: '10.244.0.11', node: 'node-a'});
    addPod('basic', 'web-2', {ip: '10.244.1.12', node: 'node-b', ready: false});
    addPod('basic', 'other', {ip: '10.244.1.13', labels: {app: 'other'}});
    addPod('basic', 'no-ip', {});
    addPod('basic', 'done', {ip: '10.244.1.14', phase: 'Succeeded'});
    await server.settle();

    const slices = slicesOf('basic', 'web');
    assert.equal(slices.length, 1);
    const slice = slices[0];
    assert.match(slice.metadata.name, /^web-[a-z0-9]{5}$/);
    assert.equal(slice.addressType, 'IPv4');
    assert.deepEqual(slice.ports, [{name: 'http', port: 8080, protocol: 'TCP'}]);
    assert.deepEqual(slice.metadata.labels, {
      team: 'a',
      'kubernetes.io/service-name': 'web',
      'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io',
    });
    assert.match(
      slice.metadata.annotations?.['endpoints.kubernetes.io/last-change-trigger-time'] ?? '',
      /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/,
    );
    assert.deepEqual(slice.metadata.ownerReferences, [
      {apiVersion: 'v1', kind: 'Service', name: 'web', uid: svc.metadata.uid, controller: true, blockOwnerDeletion: true},
    ]);
    const byIP = Object.fromEntries(slice.endpoints.map((e: any) => [e.addresses[0], e]));
    assert.deepEqual(Object.keys(byIP).sort(), ['10.244.0.11', '10.244.1.12']);
    assert.deepEqual(byIP['10.244.0.11'].conditions, {ready: true, serving: true, terminating: false});
    assert.deepEqual(byIP['10.244.1.12'].conditions, {ready: false, serving: false, terminating: false});
    assert.equal(byIP['10.244.0.11'].nodeName, 'node-a');
    assert.equal(byIP['10.244.0.11'].zone, 'zone-1');
    assert.equal(byIP['10.244.1.12'].zone, 'zone-2');
    assert.equal(byIP['10.244.0.11'].hints, undefined);
    assert.deepEqual(byIP['10.244.0.11'].targetRef, {
      kind: 'Pod',
      namespace: 'basic',
      name: 'web-1',
      uid: server.store.get('pods', 'basic', 'web-1').metadata.uid,
    });
  });

  it('follows readiness changes and marks terminating pods', async () => {
    server.store.create('namespaces', {metadata: {name: 'term'}});
    addService('term', 'web', {});
    addPod('term', 'web-1', {ip: '10.244.0.21'});
    addPod('term', 'web-2', {ip: '10.244.0.22', ready: false});
    await server.settle();
    server.store.mutate(
      'pods',
      'term',
      'web-2',
      (p) => {
        p.status.conditions = [{type: 'Ready', status: 'True'}];
      },
      {subresource: 'status'},
    );
    await server.settle();
    let endpoints = slicesOf('term', 'web')[0].endpoints;
    assert.deepEqual(
      endpoints.map((e: any) => e.conditions.ready),
      [true, true],
    );

    const {object} = server.store.delete('pods', 'term', 'web-1', {gracePeriodSeconds: 30});
    assert.ok(object.metadata.deletionTimestamp);
    await server.settle();
    endpoints = slicesOf('term', 'web')[0].endpoints;
    const web1 = endpoints.find((e: any) => e.targetRef.name === 'web-1');
    assert.deepEqual(web1.conditions, {ready: false, serving: true, terminating: true});

    server.store.delete('pods', 'term', 'web-1', {gracePeriodSeconds: 0});
    await server.settle();
    endpoints = slicesOf('term', 'web')[0].endpoints;
    assert.deepEqual(
      endpoints.map((e: any) => e.targetRef.name),
      ['web-2'],
    );
  });

  it('splits more than 100 endpoints across slices and merges them back', async () => {
    server.store.create('namespaces', {metadata: {name: 'big'}});
    addService('big', 'web', {});
    for (let i = 0; i < 250; i++)
      addPod('big', `web-${String(i).padStart(3, '0')}`, {ip: `10.245.${Math.floor(i / 200)}.${(i % 200) + 1}`});
    await server.settle();
    let slices = slicesOf('big', 'web');
    assert.deepEqual(
      slices.map((s) => s.endpoints.length).sort((a, b) => b - a),
      [100, 100, 50],
    );
    const all = slices.flatMap((s) => s.endpoints.map((e: any) => e.addresses[0]));
    assert.equal(new Set(all).size, 250);

    for (let i = 60; i < 250; i++) server.store.delete('pods', 'big', `web-${String(i).padStart(3, '0')}`, {gracePeriodSeconds: 0});
    await server.settle();
    slices = slicesOf('big', 'web');
    assert.deepEqual(
      slices.map((s) => s.endpoints.length),
      [60],
    );
  });

  it('groups pods whose named port resolves to different numbers', async () => {
    server.store.create('namespaces', {metadata: {name: 'ports'}});
    addService('ports', 'web', {});
    addPod('ports', 'old', {ip: '10.244.0.31', httpPort: 8080});
    addPod('ports', 'new', {ip: '10.244.0.32', httpPort: 9090});
    await server.settle();
    const slices = slicesOf('ports', 'web');
    assert.deepEqual(slices.map((s) => `${s.ports[0].port}:${s.endpoints[0].targetRef.name}`).sort(), ['8080:old', '9090:new']);
  });

  it('adds zone hints when the service asks for topology-aware routing', async () => {
    server.store.create('namespaces', {metadata: {name: 'zones'}});
    addService('zones', 'web', {}, {'service.kubernetes.io/topology-mode': 'Auto'});
    addService('zones', 'close', {trafficDistribution: 'PreferClose'});
    addPod('zones', 'a', {ip: '10.244.0.41', node: 'node-a'});
    addPod('zones', 'b', {ip: '10.244.1.42', node: 'node-b'});
    await server.settle();
    for (const svc of ['web', 'close']) {
      const hints = Object.fromEntries(slicesOf('zones', svc)[0].endpoints.map((e: any) => [e.targetRef.name, e.hints]));
      assert.deepEqual(hints, {a: {forZones: [{name: 'zone-1'}]}, b: {forZones: [{name: 'zone-2'}]}}, svc);
    }
  });

  it('keeps a placeholder slice for a service without endpoints and removes slices with the service', async () => {
    server.store.create('namespaces', {metadata: {name: 'empty'}});
    addService('empty', 'web', {});
    server.store.create('services', {metadata: {name: 'manual', namespace: 'empty'}, spec: {ports: [{port: 80}]}}, 'empty');
    await server.settle();
    const slices = slicesOf('empty', 'web');
    assert.equal(slices.length, 1);
    assert.deepEqual(slices[0].endpoints, []);
    assert.equal(slicesOf('empty', 'manual').length, 0, 'services without a selector are not managed');

    server.store.delete('services', 'empty', 'web');
    await server.settle();
    assert.equal(slicesOf('empty', 'web').length, 0);
  });

  it('puts back a managed slice that someone deletes', async () => {
    server.store.create('namespaces', {metadata: {name: 'heal'}});
    addService('heal', 'web', {});
    addPod('heal', 'web-1', {ip: '10.244.0.51'});
    await server.settle();
    const [slice] = slicesOf('heal', 'web');
    server.store.delete('endpointslices', 'heal', slice.metadata.name);
    await server.settle();
    const again = slicesOf('heal', 'web');
    assert.equal(again.length, 1);
    assert.equal(again[0].endpoints[0].addresses[0], '10.244.0.51');
  });

  it('builds one slice per family for a dual-stack service', async () => {
    const dual = await startApiServer({port: 0, serviceCIDR: '10.96.0.0/16,fd00:10:96::/112'});
    try {
      dual.store.create('namespaces', {metadata: {name: 'ds'}});
      const svc = dual.store.create(
        'services',
        {metadata: {name: 'web', namespace: 'ds'}, spec: {ipFamilyPolicy: 'PreferDualStack', selector: {app: 'web'}, ports: [{port: 80}]}},
        'ds',
      );
      assert.deepEqual(svc.spec.ipFamilies, ['IPv4', 'IPv6']);
      assert.equal(svc.spec.clusterIPs.length, 2);
      assert.match(svc.spec.clusterIPs[1], /^fd00:10:96::/);
      dual.store.create(
        'pods',
        {
          metadata: {name: 'p', namespace: 'ds', labels: {app: 'web'}},
          spec: {nodeName: 'n', containers: [{name: 'c', image: 'i'}]},
          status: {phase: 'Running', podIPs: [{ip: '10.244.0.9'}, {ip: 'fd00:244::9'}], conditions: [{type: 'Ready', status: 'True'}]},
        },
        'ds',
        {keepStatus: true},
      );
      await dual.settle();
      const slices = dual.store.list('endpointslices', {namespace: 'ds'}).items;
      assert.deepEqual(slices.map((s) => `${s.addressType} ${s.endpoints[0].addresses[0]} ${s.ports[0].port}`).sort(), [
        'IPv4 10.244.0.9 80',
        'IPv6 fd00:244::9 80',
      ]);
    } finally {
      await dual.stop();
    }
  });
});
