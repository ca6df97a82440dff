// The JSON types of the fields the lab's resources hold, and the check kube-apiserver's decoder
// makes before any defaulting or validation: a value of the wrong JSON type anywhere in an object
// is a 400 naming the field, worded as Go's encoding/json words it ("json: cannot unmarshal string
// into Go struct field ServiceSpec.spec.externalIPs of type []string"). null is read as Go reads
// it: an absent field, or the zero value of a list element. Fields not listed here are kept
// unchecked, as the server keeps unknown fields.
import {ApiError} from './api-error.ts';
import type {KubeObject} from './object-log.ts';
import type {ResourceType} from './resources.ts';

type Scalar = 'string' | 'bool' | 'int32' | 'int64' | 'intOrString' | 'time';
interface Struct {
  struct: string;
  fields: Record<string, FieldType>;
}
/**
 * A list is atomic unless it names `keys` (an associative list, kube's x-kubernetes-list-map-keys: items
 * merge and are owned one by one) or is a `set` of scalars; server-side apply and OpenAPI read this.
 */
export interface ListType {
  list: FieldType;
  keys?: string[];
  /** Values of key fields an item may leave out (defaulted before apply matches items). */
  keyDefaults?: Record<string, string>;
  set?: boolean;
}
export type FieldType = Scalar | ListType | {map: FieldType} | Struct;
export type {Scalar, Struct};

const list = (of: FieldType): FieldType => ({list: of});
const keyedList = (of: FieldType, ...keys: string[]): FieldType => ({list: of, keys});
// Ports are keyed by port and protocol, which defaults to TCP.
const portList = (of: FieldType, portField: string): FieldType => ({
  list: of,
  keys: [portField, 'protocol'],
  keyDefaults: {protocol: 'TCP'},
});
const setList = (of: FieldType): FieldType => ({list: of, set: true});
const map = (of: FieldType): FieldType => ({map: of});
const struct = (name: string, fields: Record<string, FieldType>): Struct => ({struct: name, fields});
const strings = (...names: string[]): Record<string, FieldType> => Object.fromEntries(names.map((name) => [name, 'string']));

const objectMeta = struct('ObjectMeta', {
  ...strings('name', 'generateName', 'namespace', 'uid', 'resourceVersion', 'selfLink'),
  generation: 'int64',
  creationTimestamp: 'time',
  deletionTimestamp: 'time',
  deletionGracePeriodSeconds: 'int64',
  labels: map('string'),
  annotations: map('string'),
  finalizers: setList('string'),
  ownerReferences: keyedList(
    struct('OwnerReference', {...strings('apiVersion', 'kind', 'name', 'uid'), controller: 'bool', blockOwnerDeletion: 'bool'}),
    'uid',
  ),
});

const condition = struct('Condition', {
  ...strings('type', 'status', 'reason', 'message'),
  observedGeneration: 'int64',
  lastTransitionTime: 'time',
  lastProbeTime: 'time',
  lastHeartbeatTime: 'time',
});
const objectReference = struct(
  'ObjectReference',
  strings('kind', 'namespace', 'name', 'uid', 'apiVersion', 'resourceVersion', 'fieldPath'),
);

const serviceSpec = struct('ServiceSpec', {
  ports: portList(
    struct('ServicePort', {...strings('name', 'protocol', 'appProtocol'), port: 'int32', targetPort: 'intOrString', nodePort: 'int32'}),
    'port',
  ),
  selector: map('string'),
  ...strings(
    'clusterIP',
    'type',
    'sessionAffinity',
    'loadBalancerIP',
    'externalName',
    'externalTrafficPolicy',
    'ipFamilyPolicy',
    'loadBalancerClass',
    'internalTrafficPolicy',
    'trafficDistribution',
  ),
  clusterIPs: list('string'),
  externalIPs: list('string'),
  loadBalancerSourceRanges: list('string'),
  healthCheckNodePort: 'int32',
  publishNotReadyAddresses: 'bool',
  sessionAffinityConfig: struct('SessionAffinityConfig', {clientIP: struct('ClientIPConfig', {timeoutSeconds: 'int32'})}),
  ipFamilies: list('string'),
  allocateLoadBalancerNodePorts: 'bool',
});

const loadBalancerStatus = struct('LoadBalancerStatus', {
  ingress: list(
    struct('LoadBalancerIngress', {
      ...strings('ip', 'hostname', 'ipMode'),
      ports: list(struct('PortStatus', {port: 'int32', ...strings('protocol', 'error')})),
    }),
  ),
});

const service = struct('Service', {
  metadata: objectMeta,
  spec: serviceSpec,
  status: struct('ServiceStatus', {loadBalancer: loadBalancerStatus, conditions: keyedList(condition, 'type')}),
});

const endpointSlice = struct('EndpointSlice', {
  metadata: objectMeta,
  addressType: 'string',
  endpoints: list(
    struct('Endpoint', {
      addresses: list('string'),
      conditions: struct('EndpointConditions', {ready: 'bool', serving: 'bool', terminating: 'bool'}),
      ...strings('hostname', 'nodeName', 'zone'),
      targetRef: objectReference,
      deprecatedTopology: map('string'),
      hints: struct('EndpointHints', {
        forZones: list(struct('ForZone', strings('name'))),
        forNodes: list(struct('ForNode', strings('name'))),
      }),
    }),
  ),
  ports: list(struct('EndpointPort', {...strings('name', 'protocol', 'appProtocol'), port: 'int32'})),
});

const probe = struct('Probe', {
  ...Object.fromEntries(
    ['initialDelaySeconds', 'timeoutSeconds', 'periodSeconds', 'successThreshold', 'failureThreshold'].map((name) => [
      name,
      'int32' as FieldType,
    ]),
  ),
  terminationGracePeriodSeconds: 'int64',
  httpGet: struct('HTTPGetAction', {...strings('path', 'host', 'scheme'), port: 'intOrString'}),
  tcpSocket: struct('TCPSocketAction', {host: 'string', port: 'intOrString'}),
  exec: struct('ExecAction', {command: list('string')}),
});

const container = struct('Container', {
  ...strings('name', 'image', 'imagePullPolicy', 'workingDir'),
  command: list('string'),
  args: list('string'),
  ports: portList(
    struct('ContainerPort', {...strings('name', 'protocol', 'hostIP'), containerPort: 'int32', hostPort: 'int32'}),
    'containerPort',
  ),
  env: keyedList(struct('EnvVar', strings('name', 'value')), 'name'),
  readinessProbe: probe,
  livenessProbe: probe,
  startupProbe: probe,
});

const pod = struct('Pod', {
  metadata: objectMeta,
  spec: struct('PodSpec', {
    ...strings('nodeName', 'restartPolicy', 'schedulerName', 'serviceAccountName', 'hostname', 'subdomain', 'dnsPolicy'),
    containers: keyedList(container, 'name'),
    initContainers: keyedList(container, 'name'),
    terminationGracePeriodSeconds: 'int64',
    hostNetwork: 'bool',
    nodeSelector: map('string'),
  }),
  status: struct('PodStatus', {
    ...strings('phase', 'podIP', 'hostIP', 'qosClass', 'reason', 'message'),
    podIPs: keyedList(struct('PodIP', strings('ip')), 'ip'),
    hostIPs: list(struct('HostIP', strings('ip'))),
    conditions: keyedList(condition, 'type'),
    startTime: 'time',
    containerStatuses: list(
      struct('ContainerStatus', {
        ...strings('name', 'image', 'imageID', 'containerID'),
        ready: 'bool',
        started: 'bool',
        restartCount: 'int32',
      }),
    ),
  }),
});

const node = struct('Node', {
  metadata: objectMeta,
  spec: struct('NodeSpec', {
    ...strings('podCIDR', 'providerID'),
    podCIDRs: list('string'),
    unschedulable: 'bool',
    taints: list(struct('Taint', {...strings('key', 'value', 'effect'), timeAdded: 'time'})),
  }),
  status: struct('NodeStatus', {
    addresses: list(struct('NodeAddress', strings('type', 'address'))),
    conditions: keyedList(condition, 'type'),
    nodeInfo: map('string'),
  }),
});

const serviceCIDR = struct('ServiceCIDR', {
  metadata: objectMeta,
  spec: struct('ServiceCIDRSpec', {cidrs: list('string')}),
  status: struct('ServiceCIDRStatus', {conditions: keyedList(condition, 'type')}),
});

/** The schema of a resource: its own fields, or ObjectMeta only for kinds the lab does not describe. */
export function resourceSchema(type: ResourceType): Struct {
  const schema = schemas[type.storageKey] ?? struct(type.kind, {metadata: objectMeta});
  return struct(schema.struct, {apiVersion: 'string', kind: 'string', ...schema.fields});
}

const schemas: Record<string, Struct> = {
  services: service,
  'discovery.k8s.io/endpointslices': endpointSlice,
  pods: pod,
  nodes: node,
  'networking.k8s.io/servicecidrs': serviceCIDR,
};

/** Go's name of a field type, as its decoder prints it. */
function goTypeName(type: FieldType): string {
  if (typeof type === 'string')
    return ({string: 'string', bool: 'bool', int32: 'int32', int64: 'int64', intOrString: 'intstr.IntOrString', time: 'v1.Time'} as const)[
      type
    ];
  if ('list' in type) return `[]${goTypeName(type.list)}`;
  if ('map' in type) return `map[string]${goTypeName(type.map)}`;
  return `v1.${type.struct}`;
}

/** The JSON type of a value as Go's decoder names it; a number that no integer field holds carries its value ("number 1.5"). */
function jsonTypeName(value: unknown, type: FieldType): string {
  if (typeof value === 'boolean') return 'bool';
  if (typeof value === 'number') return type === 'int32' || type === 'int64' || type === 'intOrString' ? `number ${value}` : 'number';
  if (Array.isArray(value)) return 'array';
  return typeof value === 'object' ? 'object' : typeof value;
}

function zeroValue(type: FieldType): unknown {
  if (typeof type === 'string')
    return type === 'bool' ? false : type === 'int32' || type === 'int64' ? 0 : type === 'time' ? undefined : '';
  return 'list' in type ? [] : {};
}

const intRange = {int32: [-(2 ** 31), 2 ** 31 - 1], int64: [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER]} as const;

function fitsScalar(type: Scalar, value: unknown): boolean {
  switch (type) {
    case 'string':
      return typeof value === 'string';
    case 'time':
      return typeof value === 'string' && !Number.isNaN(Date.parse(value));
    case 'bool':
      return typeof value === 'boolean';
    case 'intOrString':
      return (
        typeof value === 'string' ||
        (typeof value === 'number' && Number.isInteger(value) && value >= intRange.int32[0] && value <= intRange.int32[1])
      );
    default:
      return typeof value === 'number' && Number.isInteger(value) && value >= intRange[type][0] && value <= intRange[type][1];
  }
}

interface Mismatch {
  /** The path with indexes and keys: spec.ports[0].port. */
  field: string;
  /** Go's message for it. */
  message: string;
}

/**
 * Walks `value` against `type`; the first mismatch is returned. Nulls are replaced as Go decodes
 * them: object fields dropped, list elements and map values made zero values.
 */
function walk(value: unknown, type: FieldType, path: {field: string; goPath: string; owner: string}): Mismatch | undefined {
  const mismatch = (): Mismatch => ({
    field: path.field,
    message: `json: cannot unmarshal ${jsonTypeName(value, type)} into Go struct field ${path.owner}.${path.goPath} of type ${goTypeName(type)}`,
  });
  if (typeof type === 'string') return fitsScalar(type, value) ? undefined : mismatch();
  if ('list' in type) {
    if (!Array.isArray(value)) return mismatch();
    for (let index = 0; index < value.length; index++) {
      if (value[index] === null) value[index] = zeroValue(type.list);
      if (value[index] === undefined) continue;
      const found = walk(value[index], type.list, {...path, field: `${path.field}[${index}]`});
      if (found) return found;
    }
    return undefined;
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return mismatch();
  const record = value as Record<string, unknown>;
  if ('map' in type) {
    for (const key of Object.keys(record)) {
      if (record[key] === null) record[key] = zeroValue(type.map);
      const found = walk(record[key], type.map, {...path, field: `${path.field}[${key}]`});
      if (found) return found;
    }
    return undefined;
  }
  for (const [name, fieldType] of Object.entries(type.fields)) {
    if (record[name] === null) delete record[name];
    if (record[name] === undefined) continue;
    const child = {
      field: path.field ? `${path.field}.${name}` : name,
      goPath: path.goPath ? `${path.goPath}.${name}` : name,
      owner: type.struct,
    };
    const found = walk(record[name], fieldType, child);
    if (found) return found;
  }
  return undefined;
}

/**
 * checkFieldTypes: 400 BadRequest when a field of `obj` has the wrong JSON type, as kube-apiserver
 * answers ("Service in version "v1" cannot be handled as a Service: json: cannot unmarshal ..."),
 * with the field in details.causes. Changes nulls in place as Go's decoder reads them.
 */
export function checkFieldTypes(type: ResourceType, obj: KubeObject): void {
  const root = resourceSchema(type);
  const found = walk(obj, root, {field: '', goPath: '', owner: root.struct});
  if (!found) return;
  const message = `${type.kind} in version "${type.version}" cannot be handled as a ${type.kind}: ${found.message}`;
  throw new ApiError(400, 'BadRequest', message, {
    kind: type.resource,
    ...(type.group ? {group: type.group} : {}),
    causes: [{reason: 'FieldValueInvalid', message: found.message, field: found.field}],
  });
}
