// Builders of Service, EndpointSlice and Node objects for model tests: small defaults, any field
// overridable, so each table row states only what it is about.
import type {EndpointInput, EndpointSliceInput, NodeInput, ServiceInput} from '../../../src/core/model/objects.ts';

type ServiceSpec = NonNullable<ServiceInput['spec']>;

export function service(name: string, spec: Partial<ServiceSpec> = {}, extra: Partial<ServiceInput> = {}): ServiceInput {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name, namespace: 'default', ...extra.metadata},
    spec: {
      type: 'ClusterIP',
      clusterIP: '10.96.0.10',
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}],
      ...spec,
    },
    ...(extra.status ? {status: extra.status} : {}),
  };
}

export interface EndpointSpec {
  ip: string;
  node?: string;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  zone?: string;
  zoneHints?: string[];
  nodeHints?: string[];
  pod?: string;
}

export function endpoint(spec: EndpointSpec): EndpointInput {
  const conditions: EndpointInput['conditions'] = {};
  if (spec.ready !== undefined) conditions.ready = spec.ready;
  if (spec.serving !== undefined) conditions.serving = spec.serving;
  if (spec.terminating !== undefined) conditions.terminating = spec.terminating;
  const out: EndpointInput = {addresses: [spec.ip], conditions};
  if (spec.node) out.nodeName = spec.node;
  if (spec.zone) out.zone = spec.zone;
  if (spec.zoneHints || spec.nodeHints) {
    out.hints = {};
    if (spec.zoneHints) out.hints.forZones = spec.zoneHints.map((zoneName) => ({name: zoneName}));
    if (spec.nodeHints) out.hints.forNodes = spec.nodeHints.map((nodeName) => ({name: nodeName}));
  }
  if (spec.pod) out.targetRef = {kind: 'Pod', name: spec.pod, namespace: 'default'};
  return out;
}

export function slice(
  name: string,
  serviceName: string,
  endpoints: Array<EndpointSpec | EndpointInput>,
  extra: Partial<EndpointSliceInput> = {},
): EndpointSliceInput {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name, namespace: 'default', labels: {'kubernetes.io/service-name': serviceName}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: 8080}],
    endpoints: endpoints.map((entry) => ('ip' in entry ? endpoint(entry) : entry)),
    ...extra,
  };
}

export function node(
  name = 'node-1',
  extra: {zone?: string; addresses?: Array<{type: string; address: string}>; podCIDRs?: string[]} = {},
): NodeInput {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name, labels: extra.zone ? {'topology.kubernetes.io/zone': extra.zone} : {}},
    spec: {podCIDRs: extra.podCIDRs ?? ['10.244.1.0/24', 'fd00:10:244:1::/64']},
    status: {
      addresses: extra.addresses ?? [
        {type: 'InternalIP', address: '10.240.0.11'},
        {type: 'InternalIP', address: 'fd00:10:240::11'},
        {type: 'Hostname', address: name},
      ],
    },
  };
}
