// changedServicePorts: the service ports a partial sync must rewrite.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {buildProxyModel, type ModelObjects, type ModelOptions} from '../../../src/core/model/build.ts';
import {changedServicePorts, portsWithIdentities, servicePortIdentity} from '../../../src/core/model/changes.ts';
import {node, service, slice} from './cluster-objects.ts';

function cluster(change: (objects: ModelObjects) => void = () => {}, options: Partial<ModelOptions> = {}) {
  const objects: ModelObjects = {
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
  change(objects);
  return buildProxyModel(objects, {family: 'IPv4', ...options});
}

const sorted = (set: Set<string>) => [...set].sort();

test('identity is key/protocol', () => {
  assert.equal(servicePortIdentity({key: 'default/dns:dns', protocol: 'UDP'}), 'default/dns:dns/UDP');
});

test('no previous model: everything is new', () => {
  assert.deepEqual(sorted(changedServicePorts(undefined, cluster())), [
    'default/api:http/TCP',
    'default/dns:dns-tcp/TCP',
    'default/dns:dns/UDP',
    'default/web:http/TCP',
  ]);
});

const rows: Array<{name: string; change: (objects: ModelObjects) => void; options?: Partial<ModelOptions>; expected: string[]}> = [
  {name: 'nothing changed', change: () => {}, expected: []},
  {
    name: 'objects rebuilt in another order',
    change: (o) => {
      o.services.reverse();
      o.endpointSlices.reverse();
    },
    expected: [],
  },
  {
    name: 'an endpoint added',
    change: (o) => {
      o.endpointSlices[0] = slice('web-1', 'web', [
        {ip: '10.244.1.5', node: 'node-1'},
        {ip: '10.244.2.5', node: 'node-2'},
        {ip: '10.244.3.5'},
      ]);
    },
    expected: ['default/web:http/TCP'],
  },
  {
    name: 'an endpoint stops being ready',
    change: (o) => {
      o.endpointSlices[0] = slice('web-1', 'web', [
        {ip: '10.244.1.5', node: 'node-1'},
        {ip: '10.244.2.5', node: 'node-2', ready: false},
      ]);
    },
    expected: ['default/web:http/TCP'],
  },
  {
    name: 'a service removed',
    change: (o) => {
      o.services.splice(2, 1);
    },
    expected: ['default/api:http/TCP'],
  },
  {
    name: 'a service replaced by another, as many ports in all',
    change: (o) => {
      o.services.splice(2, 1, service('aaa', {clusterIP: '10.96.0.78'}));
    },
    expected: ['default/aaa:http/TCP', 'default/api:http/TCP'],
  },
  {
    name: 'a service added',
    change: (o) => {
      o.services.push(service('new', {clusterIP: '10.96.0.77'}));
    },
    expected: ['default/new:http/TCP'],
  },
  {
    name: 'a port of a service removed',
    change: (o) => {
      o.services[1] = service('dns', {clusterIP: '10.96.0.53', ports: [{name: 'dns', protocol: 'UDP', port: 53}]});
    },
    expected: ['default/dns:dns-tcp/TCP'],
  },
  {
    name: 'a service field changed',
    change: (o) => {
      o.services[0] = service('web', {clusterIP: '10.96.0.10', sessionAffinity: 'ClientIP'});
    },
    expected: ['default/web:http/TCP'],
  },
  {
    name: 'the shared slice of two ports changed',
    change: (o) => {
      o.endpointSlices[1] = slice('dns-1', 'dns', [{ip: '10.244.1.4'}], {
        ports: [
          {name: 'dns', protocol: 'UDP', port: 53},
          {name: 'dns-tcp', protocol: 'TCP', port: 53},
        ],
      });
    },
    expected: ['default/dns:dns-tcp/TCP', 'default/dns:dns/UDP'],
  },
  {
    name: 'config changed: everything',
    change: () => {},
    options: {config: {masqueradeAll: true}},
    expected: ['default/api:http/TCP', 'default/dns:dns-tcp/TCP', 'default/dns:dns/UDP', 'default/web:http/TCP'],
  },
  {
    name: 'node IPs changed: everything',
    change: () => {},
    options: {nodeIPs: ['10.240.0.99']},
    expected: ['default/api:http/TCP', 'default/dns:dns-tcp/TCP', 'default/dns:dns/UDP', 'default/web:http/TCP'],
  },
];

for (const row of rows) {
  test(`changed: ${row.name}`, () => {
    assert.deepEqual(sorted(changedServicePorts(cluster(), cluster(row.change, row.options))), row.expected);
  });
}

test('a model that went through JSON compares equal to itself', () => {
  const model = cluster();
  const copy = JSON.parse(JSON.stringify(model));
  assert.deepEqual(sorted(changedServicePorts(copy, model)), []);
});

test('portsWithIdentities: the ports of the model with those identities, in model order', () => {
  const model = cluster();
  const wanted = new Set(['default/web:http/TCP', 'default/dns:dns/UDP', 'default/gone:http/TCP']);
  assert.deepEqual(
    portsWithIdentities(model, wanted).map((port) => servicePortIdentity(port)),
    model.servicePorts.map((port) => servicePortIdentity(port)).filter((identity) => wanted.has(identity)),
  );
  assert.deepEqual(portsWithIdentities(model, new Set()), []);
});
