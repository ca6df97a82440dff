// ProxyModelBuilder: the model it builds as objects change equals buildProxyModel's for the same
// objects, and service ports of services that did not change keep their objects.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {buildProxyModel, ProxyModelBuilder, type ModelObjects, type ModelOptions} from '../../../src/core/model/build.ts';
import {changedServicePorts, portsWithIdentities} from '../../../src/core/model/changes.ts';
import {node, service, slice} from './cluster-objects.ts';

const options: ModelOptions = {family: 'IPv4', nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16']};

/** The starting objects; `withBadService` adds a malformed one, which makes every build read the whole list. */
function start(withBadService = true): ModelObjects {
  return {
    services: [
      service('web', {clusterIP: '10.96.0.10'}),
      service('dns', {
        clusterIP: '10.96.0.53',
        ports: [
          {name: 'dns', protocol: 'UDP', port: 53},
          {name: 'dns-tcp', protocol: 'TCP', port: 53},
        ],
      }),
      service('api', {clusterIP: '10.96.0.1'}),
      ...(withBadService ? [service('bad', {clusterIP: 'not-an-ip'})] : []),
    ],
    endpointSlices: [
      slice('web-1', 'web', [
        {ip: '10.244.1.5', node: 'node-1'},
        {ip: '10.244.2.5', node: 'node-2'},
      ]),
      slice('dns-1', 'dns', [{ip: '10.244.1.3'}], {
        ports: [
          {name: 'dns', protocol: 'UDP', port: 53},
          {name: 'dns-tcp', protocol: 'TCP', port: 53},
        ],
      }),
    ],
    node: node(),
  };
}

// reread: objects replaced by new ones, so their service ports are computed again (equal, not the same objects).
const steps: Array<{name: string; change: (objects: ModelObjects) => void; changed: string[]; reread?: boolean}> = [
  {name: 'nothing', change: () => {}, changed: []},
  {
    name: 'an endpoint added',
    change: (o) =>
      void (o.endpointSlices[0] = slice('web-1', 'web', [
        {ip: '10.244.1.5', node: 'node-1'},
        {ip: '10.244.2.5', node: 'node-2'},
        {ip: '10.244.3.5'},
      ])),
    changed: ['default/web:http/TCP'],
  },
  {
    name: 'a second slice for a service',
    change: (o) => void o.endpointSlices.push(slice('web-0', 'web', [{ip: '10.244.4.5'}])),
    changed: ['default/web:http/TCP'],
  },
  {
    name: 'a service replaced by an equal copy',
    change: (o) => void (o.services[2] = service('api', {clusterIP: '10.96.0.1'})),
    changed: [],
    reread: true,
  },
  {name: 'a service removed', change: (o) => void o.services.splice(2, 1), changed: ['default/api:http/TCP']},
  {
    name: 'a service added',
    change: (o) => void o.services.push(service('zeta', {clusterIP: '10.96.0.99'})),
    changed: ['default/zeta:http/TCP'],
  },
  {
    name: 'a port added to a service',
    change: (o) =>
      void (o.services[0] = service('web', {
        clusterIP: '10.96.0.10',
        ports: [
          {name: 'http', protocol: 'TCP', port: 80},
          {name: 'https', protocol: 'TCP', port: 443},
        ],
      })),
    changed: ['default/web:https/TCP'],
    reread: true,
  },
  {name: 'a slice deleted', change: (o) => void o.endpointSlices.splice(1, 1), changed: ['default/dns:dns-tcp/TCP', 'default/dns:dns/UDP']},
  {
    name: 'the node changes zone',
    change: (o) => void (o.node = node('node-1', {zone: 'zone-b'})),
    changed: ['default/dns:dns-tcp/TCP', 'default/dns:dns/UDP', 'default/web:http/TCP', 'default/web:https/TCP', 'default/zeta:http/TCP'],
    reread: true,
  },
  {name: 'objects in another order', change: (o) => void (o.services.reverse(), o.endpointSlices.reverse()), changed: []},
  {name: 'the same service given twice', change: (o) => void o.services.push(service('web', {clusterIP: '10.96.0.77'})), changed: []},
  {
    name: 'a slice moves to another service',
    change: (o) =>
      void (o.endpointSlices[o.endpointSlices.findIndex((s) => (s as {metadata: {name: string}}).metadata.name === 'web-0')] = slice(
        'web-0',
        'zeta',
        [{ip: '10.244.4.5'}],
      )),
    changed: ['default/web:http/TCP', 'default/zeta:http/TCP'],
    reread: true,
  },
  {name: 'two slices swap places', change: (o) => void o.endpointSlices.reverse(), changed: []},
];

for (const withBadService of [true, false])
  test(`each build equals buildProxyModel of the same objects; unchanged service ports keep their objects${withBadService ? ', a malformed service among them' : ''}`, () => {
    const builder = new ProxyModelBuilder(options);
    const objects = start(withBadService);
    let previous = builder.build(objects);
    assert.deepEqual(previous, buildProxyModel(objects, options));
    for (const step of steps) {
      step.change(objects);
      const model = builder.build({...objects, services: [...objects.services], endpointSlices: [...objects.endpointSlices]});
      assert.deepEqual(model, buildProxyModel(objects, options), step.name);
      assert.deepEqual([...changedServicePorts(previous, model)].sort(), step.changed, step.name);
      const before = new Map(previous.servicePorts.map((port) => [`${port.key}/${port.protocol}`, port]));
      for (const port of model.servicePorts) {
        const identity = `${port.key}/${port.protocol}`;
        if (!step.changed.includes(identity) && before.has(identity) && !step.reread)
          assert.equal(port, before.get(identity), `${step.name}: ${identity} kept`);
      }
      previous = model;
    }
  });

test('a list the caller changes in place after a build is read again', () => {
  const builder = new ProxyModelBuilder(options);
  const objects = start(false);
  builder.build(objects);
  objects.endpointSlices[0] = slice('web-1', 'web', [{ip: '10.244.9.9'}]);
  assert.deepEqual(builder.build(objects), buildProxyModel(objects, options));
  objects.endpointSlices[0] = slice('web-1', 'web', [{ip: '10.244.9.10', node: 'node-1'}], {
    ports: [{name: 'http', protocol: 'TCP', port: 'eighty'}],
  } as never);
  const model = builder.build(objects);
  assert.deepEqual(model, buildProxyModel(objects, options), 'a replacement with a problem');
  assert.ok(model.problems.length > 0);
});

test('a model handed out is not changed by later builds', () => {
  const builder = new ProxyModelBuilder(options);
  const objects = start();
  const first = builder.build(objects);
  const copy = structuredClone(first);
  objects.endpointSlices[0] = slice('web-1', 'web', [{ip: '10.244.9.9'}]);
  builder.build(objects);
  assert.deepEqual(first, copy);
});

test('at a hundred services, builds after a few replaced objects equal buildProxyModel, and portsWithIdentities finds the changed ports in both models', () => {
  const count = 100;
  const objects: ModelObjects = {
    services: Array.from({length: count}, (_, i) => service(`svc-${i}`, {clusterIP: `10.96.1.${i}`})),
    endpointSlices: Array.from({length: count}, (_, i) => slice(`svc-${i}-a`, `svc-${i}`, [{ip: `10.244.1.${i}`, node: 'node-1'}])),
    node: node(),
  };
  const changes: Array<{name: string; change: () => void}> = [
    {name: 'an endpoint replaced', change: () => void (objects.endpointSlices[7] = slice('svc-7-a', 'svc-7', [{ip: '10.244.9.7'}]))},
    {
      name: 'two slices replaced',
      change: () =>
        void ((objects.endpointSlices[3] = slice('svc-3-a', 'svc-3', [])),
        (objects.endpointSlices[90] = slice('svc-90-a', 'svc-90', [{ip: '10.244.9.90'}, {ip: '10.244.8.90'}]))),
    },
    {
      name: 'a slice moves to another service in its place',
      change: () => void (objects.endpointSlices[5] = slice('svc-5-a', 'svc-6', [{ip: '10.244.9.5'}])),
    },
    {
      name: 'a slice of no service replaced',
      change: () => void (objects.endpointSlices[40] = slice('svc-40-a', 'gone', [{ip: '10.244.9.40'}])),
    },
    {
      name: 'a service replaced, its address changed',
      change: () => void (objects.services[11] = service('svc-11', {clusterIP: '10.96.2.11'})),
    },
    {
      name: 'a service and its slice replaced',
      change: () =>
        void ((objects.services[12] = service('svc-12', {clusterIP: '10.96.2.12'})),
        (objects.endpointSlices[12] = slice('svc-12-a', 'svc-12', [{ip: '10.244.9.12'}]))),
    },
    {
      name: 'a port added to a service',
      change: () =>
        void (objects.services[20] = service('svc-20', {
          clusterIP: '10.96.1.20',
          ports: [
            {name: 'http', protocol: 'TCP', port: 80},
            {name: 'https', protocol: 'TCP', port: 443},
          ],
        })),
    },
    {
      name: 'an endpoint replaced after that',
      change: () => void (objects.endpointSlices[21] = slice('svc-21-a', 'svc-21', [{ip: '10.244.9.21'}])),
    },
  ];
  const builder = new ProxyModelBuilder(options);
  let previous = builder.build({...objects, services: [...objects.services], endpointSlices: [...objects.endpointSlices]});
  for (const {name, change} of changes) {
    change();
    const model = builder.build({...objects, services: [...objects.services], endpointSlices: [...objects.endpointSlices]});
    assert.deepEqual(model, buildProxyModel(objects, options), name);
    const changed = changedServicePorts(previous, model);
    assert.ok(changed.size > 0 && changed.size < 4, `${name}: ${[...changed].join(', ')}`);
    for (const [which, of] of [
      ['before', previous],
      ['after', model],
    ] as const) {
      const expected = of.servicePorts.filter((port) => changed.has(`${port.key}/${port.protocol}`));
      assert.deepEqual(portsWithIdentities(of, changed), expected, `${name}: ports ${which}`);
      for (const [index, port] of portsWithIdentities(of, changed).entries())
        assert.equal(port, expected[index], `${name}: the model's own objects ${which}`);
    }
    previous = model;
  }
  // A model's list changed by its holder is searched whole.
  const wanted = new Set([`default/svc-30:http/TCP`, `default/svc-31:http/TCP`]);
  const reordered = {...previous, servicePorts: previous.servicePorts};
  reordered.servicePorts.reverse();
  assert.deepEqual(
    portsWithIdentities(reordered, wanted).map((port) => port.key),
    ['default/svc-31:http', 'default/svc-30:http'],
  );
});
