// Endpoint categorisation, row for row after kube-proxy's TestCategorizeEndpoints
// (pkg/proxy/topology_test.go), fed through Services and EndpointSlices as the agent would.
// Rows about feature gates that are now always on (hints, terminating endpoints) keep the "on" side.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {endpointKey} from '../../../src/core/model/endpoint.ts';
import type {Endpoint} from '../../../src/core/model/types.ts';
import {buildProxyModel, type ModelOptions} from '../../../src/core/model/build.ts';
import type {ServiceInput} from '../../../src/core/model/objects.ts';
import {node, service, slice, type EndpointSpec} from './cluster-objects.ts';

type Policies = {
  itp?: 'Local';
  etp?: 'Local';
  nodePort?: boolean;
  annotation?: string;
  trafficDistribution?: string;
  lbWithoutNodePorts?: boolean;
};

interface Row {
  name: string;
  service?: Policies;
  zone?: string;
  options?: Partial<ModelOptions>;
  endpoints: EndpointSpec[];
  /** null: the service never uses that set. */
  cluster: string[] | null;
  local: string[] | null;
  all?: string[];
  hasAny?: boolean;
  mode?: '' | 'PreferSameZone' | 'PreferSameNode';
}

const local = 'node-1';
const remote = 'node-2';
const ready = (ip: string, more: Partial<EndpointSpec> = {}): EndpointSpec => ({ip, ready: true, node: remote, ...more});
const notReady = (ip: string, more: Partial<EndpointSpec> = {}): EndpointSpec => ({
  ip,
  ready: false,
  serving: false,
  node: remote,
  ...more,
});
const servingTerminating = (ip: string, more: Partial<EndpointSpec> = {}): EndpointSpec => ({
  ip,
  ready: false,
  serving: true,
  terminating: true,
  node: remote,
  ...more,
});
const zoneEndpoints = (zones: string[]) => zones.map((zone, index) => ready(`10.1.2.${index + 3}`, {zoneHints: [zone]}));

const rows: Row[] = [
  {
    name: 'zone hints filter cluster endpoints to this zone',
    zone: 'zone-a',
    endpoints: zoneEndpoints(['zone-a', 'zone-b', 'zone-c', 'zone-a']),
    cluster: ['10.1.2.3:80', '10.1.2.6:80'],
    local: null,
    mode: 'PreferSameZone',
  },
  {
    name: 'opt-in required, annotation disabled: hints ignored',
    options: {topologyNeedsServiceOptIn: true},
    service: {annotation: 'disabled'},
    zone: 'zone-a',
    endpoints: zoneEndpoints(['zone-a', 'zone-b', 'zone-c', 'zone-a']),
    cluster: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.5:80', '10.1.2.6:80'],
    local: null,
    mode: '',
  },
  {
    name: 'opt-in required, no annotation: hints ignored',
    options: {topologyNeedsServiceOptIn: true},
    zone: 'zone-a',
    endpoints: zoneEndpoints(['zone-a', 'zone-b', 'zone-c', 'zone-a']),
    cluster: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.5:80', '10.1.2.6:80'],
    local: null,
    mode: '',
  },
  {
    name: 'opt-in required, topology-mode Auto: hints used',
    options: {topologyNeedsServiceOptIn: true},
    service: {annotation: 'Auto'},
    zone: 'zone-a',
    endpoints: zoneEndpoints(['zone-a', 'zone-b', 'zone-c', 'zone-a']),
    cluster: ['10.1.2.3:80', '10.1.2.6:80'],
    local: null,
    mode: 'PreferSameZone',
  },
  {
    name: 'opt-in required, trafficDistribution PreferClose: hints used',
    options: {topologyNeedsServiceOptIn: true},
    service: {trafficDistribution: 'PreferClose'},
    zone: 'zone-a',
    endpoints: zoneEndpoints(['zone-a', 'zone-b', 'zone-c', 'zone-a']),
    cluster: ['10.1.2.3:80', '10.1.2.6:80'],
    local: null,
    mode: 'PreferSameZone',
  },
  {
    name: 'externalTrafficPolicy Local: topology ignored for local endpoints',
    service: {etp: 'Local', nodePort: true},
    zone: 'zone-a',
    endpoints: [
      ready('10.1.2.3', {zoneHints: ['zone-a'], node: local}),
      ready('10.1.2.4', {zoneHints: ['zone-b'], node: local}),
      ready('10.1.2.5', {zoneHints: ['zone-c']}),
      ready('10.1.2.6', {zoneHints: ['zone-a']}),
    ],
    cluster: ['10.1.2.3:80', '10.1.2.6:80'],
    local: ['10.1.2.3:80', '10.1.2.4:80'],
    all: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.6:80'],
  },
  {
    name: 'internalTrafficPolicy Local: topology ignored for local endpoints',
    service: {itp: 'Local', nodePort: true},
    zone: 'zone-a',
    endpoints: [
      ready('10.1.2.3', {zoneHints: ['zone-a'], node: local}),
      ready('10.1.2.4', {zoneHints: ['zone-b'], node: local}),
      ready('10.1.2.5', {zoneHints: ['zone-c']}),
      ready('10.1.2.6', {zoneHints: ['zone-a']}),
    ],
    cluster: ['10.1.2.3:80', '10.1.2.6:80'],
    local: ['10.1.2.3:80', '10.1.2.4:80'],
    all: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.6:80'],
  },
  {
    name: 'node without zone label: no filtering',
    endpoints: [ready('10.1.2.3', {zoneHints: ['zone-a']})],
    cluster: ['10.1.2.3:80'],
    local: null,
    mode: '',
  },
  {
    name: 'node in a zone no hint names: no filtering',
    zone: 'zone-b',
    endpoints: [ready('10.1.2.3', {zoneHints: ['zone-a']})],
    cluster: ['10.1.2.3:80'],
    local: null,
    mode: '',
  },
  {
    name: 'unready endpoint left out of the zone',
    zone: 'zone-a',
    endpoints: [
      ready('10.1.2.3', {zoneHints: ['zone-a']}),
      ready('10.1.2.4', {zoneHints: ['zone-b']}),
      ready('10.1.2.5', {zoneHints: ['zone-c']}),
      notReady('10.1.2.6', {zoneHints: ['zone-a']}),
    ],
    cluster: ['10.1.2.3:80'],
    local: null,
  },
  {
    name: 'only unready endpoints in this zone: no filtering',
    zone: 'zone-a',
    endpoints: [
      notReady('10.1.2.3', {zoneHints: ['zone-a']}),
      ready('10.1.2.4', {zoneHints: ['zone-b']}),
      ready('10.1.2.5', {zoneHints: ['zone-c']}),
      notReady('10.1.2.6', {zoneHints: ['zone-a']}),
    ],
    cluster: ['10.1.2.4:80', '10.1.2.5:80'],
    local: null,
    mode: '',
  },
  {
    name: 'a ready endpoint without hints: no filtering',
    zone: 'zone-a',
    endpoints: [
      ready('10.1.2.3', {zoneHints: ['zone-a']}),
      ready('10.1.2.4', {zoneHints: ['zone-b']}),
      ready('10.1.2.5'),
      ready('10.1.2.6', {zoneHints: ['zone-a']}),
    ],
    cluster: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.5:80', '10.1.2.6:80'],
    local: null,
    mode: '',
  },
  {
    name: 'several hints per endpoint: any naming this zone counts',
    zone: 'zone-c',
    endpoints: [
      ready('10.1.2.3', {zoneHints: ['zone-a', 'zone-b', 'zone-c']}),
      ready('10.1.2.4', {zoneHints: ['zone-b', 'zone-c']}),
      ready('10.1.2.5', {zoneHints: ['zone-b', 'zone-d']}),
      ready('10.1.2.6', {zoneHints: ['zone-c']}),
    ],
    cluster: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.6:80'],
    local: null,
  },
  {
    name: 'topology and localness disagree: all reachable is the union',
    service: {etp: 'Local', nodePort: true},
    zone: 'zone-a',
    endpoints: [
      ready('10.0.0.0', {zoneHints: ['zone-a'], node: local}),
      ready('10.0.0.1', {zoneHints: ['zone-b'], node: local}),
      ready('10.0.0.2', {zoneHints: ['zone-a']}),
      ready('10.0.0.3', {zoneHints: ['zone-b']}),
    ],
    cluster: ['10.0.0.0:80', '10.0.0.2:80'],
    local: ['10.0.0.0:80', '10.0.0.1:80'],
    all: ['10.0.0.0:80', '10.0.0.1:80', '10.0.0.2:80'],
  },
  {name: 'internalTrafficPolicy Local, no endpoints', service: {itp: 'Local'}, endpoints: [], cluster: null, local: [], hasAny: false},
  {
    name: 'internalTrafficPolicy Local, all endpoints remote',
    service: {itp: 'Local'},
    endpoints: [ready('10.0.0.0'), ready('10.0.0.1')],
    cluster: null,
    local: [],
    hasAny: true,
  },
  {
    name: 'internalTrafficPolicy Local, all endpoints local',
    service: {itp: 'Local'},
    endpoints: [ready('10.0.0.0', {node: local}), ready('10.0.0.1', {node: local})],
    cluster: null,
    local: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'internalTrafficPolicy Local, some endpoints local',
    service: {itp: 'Local'},
    endpoints: [ready('10.0.0.0', {node: local}), ready('10.0.0.1')],
    cluster: null,
    local: ['10.0.0.0:80'],
  },
  {
    name: 'Cluster policy, no endpoint ready',
    endpoints: [notReady('10.0.0.0'), notReady('10.0.0.1')],
    cluster: [],
    local: null,
    hasAny: false,
  },
  {
    name: 'Cluster policy, some endpoints ready',
    endpoints: [notReady('10.0.0.0'), ready('10.0.0.1')],
    cluster: ['10.0.0.1:80'],
    local: null,
  },
  {
    name: 'Cluster policy, all terminating: serving ones used',
    endpoints: [servingTerminating('10.0.0.0', {node: local}), servingTerminating('10.0.0.1')],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: null,
  },
  {
    name: 'terminating but no longer serving: not used',
    endpoints: [{ip: '10.0.0.0', ready: false, serving: false, terminating: true, node: remote}],
    cluster: [],
    local: null,
    hasAny: false,
  },
  {
    name: 'iTP Local, eTP Cluster, some local',
    service: {itp: 'Local', nodePort: true},
    endpoints: [ready('10.0.0.0', {node: local}), ready('10.0.0.1')],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: ['10.0.0.0:80'],
    all: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP Cluster, eTP Local, some local',
    service: {etp: 'Local', nodePort: true},
    endpoints: [ready('10.0.0.0', {node: local}), ready('10.0.0.1')],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: ['10.0.0.0:80'],
    all: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP Local, eTP Local, some local',
    service: {itp: 'Local', etp: 'Local', nodePort: true},
    endpoints: [ready('10.0.0.0', {node: local}), ready('10.0.0.1')],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: ['10.0.0.0:80'],
    all: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP Local, eTP Local, all remote',
    service: {itp: 'Local', etp: 'Local', nodePort: true},
    endpoints: [ready('10.0.0.0'), ready('10.0.0.1')],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: [],
    all: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP Local, eTP Local, all remote and terminating',
    service: {itp: 'Local', etp: 'Local', nodePort: true},
    endpoints: [servingTerminating('10.0.0.0'), servingTerminating('10.0.0.1')],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: [],
    all: ['10.0.0.0:80', '10.0.0.1:80'],
    hasAny: true,
  },
  {
    name: 'iTP Cluster, eTP Local, local side falls back to terminating',
    service: {etp: 'Local', nodePort: true},
    endpoints: [
      ready('10.0.0.0'),
      notReady('10.0.0.1', {node: local}),
      servingTerminating('10.0.0.2', {node: local}),
      servingTerminating('10.0.0.3'),
    ],
    cluster: ['10.0.0.0:80'],
    local: ['10.0.0.2:80'],
    all: ['10.0.0.0:80', '10.0.0.2:80'],
  },
  {
    name: 'eTP Local ignored when not externally accessible',
    service: {etp: 'Local', lbWithoutNodePorts: true},
    endpoints: [ready('10.0.0.0'), ready('10.0.0.1', {node: local})],
    cluster: ['10.0.0.0:80', '10.0.0.1:80'],
    local: null,
  },
  {
    name: 'iTP Local internal-only service: no cluster endpoints',
    service: {itp: 'Local'},
    endpoints: [ready('10.0.0.0'), ready('10.0.0.1', {node: local})],
    cluster: null,
    local: ['10.0.0.1:80'],
  },
  {
    name: 'PreferSameNode: node hints naming this node win',
    zone: 'zone-a',
    endpoints: [
      ready('10.0.0.1', {nodeHints: [local], zoneHints: ['zone-a'], node: local}),
      ready('10.0.0.2', {nodeHints: [remote], zoneHints: ['zone-a']}),
      ready('10.0.0.3', {nodeHints: ['node-3'], zoneHints: ['zone-b']}),
    ],
    cluster: ['10.0.0.1:80'],
    local: null,
    mode: 'PreferSameNode',
  },
  {
    name: 'node hints name other nodes only: zone hints used',
    zone: 'zone-a',
    endpoints: [
      ready('10.0.0.2', {nodeHints: [remote], zoneHints: ['zone-a']}),
      ready('10.0.0.3', {nodeHints: ['node-3'], zoneHints: ['zone-b']}),
    ],
    cluster: ['10.0.0.2:80'],
    local: null,
    mode: 'PreferSameZone',
  },
  {
    name: 'a ready endpoint without node hints: zone hints used',
    zone: 'zone-b',
    endpoints: [ready('10.0.0.1', {nodeHints: [local], zoneHints: ['zone-a'], node: local}), ready('10.0.0.3', {zoneHints: ['zone-b']})],
    cluster: ['10.0.0.3:80'],
    local: null,
    mode: 'PreferSameZone',
  },
];

function serviceFor(policies: Policies = {}): ServiceInput {
  const externallyReachable = policies.nodePort === true;
  const type = policies.lbWithoutNodePorts ? 'LoadBalancer' : externallyReachable ? 'NodePort' : 'ClusterIP';
  const annotations: Record<string, string> = policies.annotation ? {'service.kubernetes.io/topology-mode': policies.annotation} : {};
  return service(
    'web',
    {
      type,
      ports: [{name: 'http', protocol: 'TCP', port: 80, ...(externallyReachable ? {nodePort: 30080} : {})}],
      ...(policies.lbWithoutNodePorts ? {allocateLoadBalancerNodePorts: false} : {}),
      ...(policies.itp ? {internalTrafficPolicy: policies.itp} : {}),
      ...(policies.etp ? {externalTrafficPolicy: policies.etp} : {}),
      ...(policies.trafficDistribution ? {trafficDistribution: policies.trafficDistribution} : {}),
    },
    {metadata: {name: 'web', namespace: 'default', annotations}},
  );
}

const keysOf = (endpoints: Endpoint[]) => endpoints.map(endpointKey).sort();

for (const row of rows) {
  test(`categorize: ${row.name}`, () => {
    const model = buildProxyModel(
      {
        services: [serviceFor(row.service)],
        endpointSlices: [slice('web-1', 'web', row.endpoints, {ports: [{name: 'http', protocol: 'TCP', port: 80}]})],
        node: node('node-1', row.zone ? {zone: row.zone} : {}),
      },
      {family: 'IPv4', ...row.options},
    );
    assert.deepEqual(model.problems, []);
    assert.equal(model.servicePorts.length, 1);
    const [port] = model.servicePorts;

    assert.equal(port.usesClusterEndpoints, row.cluster !== null, 'usesClusterEndpoints');
    assert.deepEqual(keysOf(port.clusterEndpoints), [...(row.cluster ?? [])].sort(), 'clusterEndpoints');
    assert.equal(port.usesLocalEndpoints, row.local !== null, 'usesLocalEndpoints');
    assert.deepEqual(keysOf(port.localEndpoints), [...(row.local ?? [])].sort(), 'localEndpoints');
    const all = row.all ?? (row.cluster !== null && row.local === null ? row.cluster : (row.local ?? []));
    assert.deepEqual(keysOf(port.allReachableEndpoints), [...all].sort(), 'allReachableEndpoints');
    assert.equal(port.hasAnyEndpoints, row.hasAny ?? all.length > 0, 'hasAnyEndpoints');
    if (row.mode !== undefined) {
      assert.equal(port.topologyMode, row.mode, 'topologyMode');
      assert.equal(port.topologyApplied, row.mode !== '');
    }
  });
}
