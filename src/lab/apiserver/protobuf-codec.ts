// Kubernetes' protobuf encoding (application/vnd.kubernetes.protobuf), read side: the "k8s\0" magic, a
// runtime.Unknown envelope naming apiVersion and kind, and the object's message, decoded into the JSON
// object the same request would have sent as application/json. kubectl 1.34 sends the bodies of its
// typed commands (`create service`, `create deployment`, `auth can-i`) this way and does not fall back
// to JSON, so the lab reads it; answers stay JSON, which every client accepts.
import {badRequest, ApiError} from './api-error.ts';
import {protobufMessages} from './protobuf-messages.ts';
import {readFields, readPackedVarints, ProtobufError, type WireField} from './protobuf-wire.ts';

export const protobufMediaType = 'application/vnd.kubernetes.protobuf';
const magic = Buffer.from('k8s\0', 'latin1');

/** The message of a kind: its group's first label names the package (core for the legacy group). */
export function protobufMessageName(group: string, version: string, kind: string): string {
  return `k8s.io.api.${group.split('.')[0] || 'core'}.${version}.${kind}`;
}

export interface FieldSpec {
  name: string;
  type: string;
  repeated: boolean;
  map: boolean;
}

const parsed = new Map<string, Map<number, FieldSpec>>();

/** The fields of a message by number; undefined for a message the table does not hold. */
export function messageFields(message: string): Map<number, FieldSpec> | undefined {
  const cached = parsed.get(message);
  if (cached) return cached;
  const line = protobufMessages[message];
  if (line === undefined) return undefined;
  const fields = new Map<number, FieldSpec>();
  for (const part of line.split(' ').filter(Boolean)) {
    const m = /^([^=]+)=(\d+)(?::(map:)?([^*]+))?(\*)?$/.exec(part)!;
    fields.set(Number(m[2]), {name: m[1], type: m[4] ?? 'string', repeated: m[5] === '*', map: m[3] !== undefined});
  }
  parsed.set(message, fields);
  return fields;
}

/**
 * Embedded Go structs that JSON writes inline (`json:",inline"`), by the name protobuf gives the
 * embedding and its message: a Probe's httpGet, a Volume's emptyDir, a ConfigMapKeySelector's name
 * are fields of the outer object in JSON.
 */
const inlineEmbeddings: Record<string, string> = {
  handler: 'k8s.io.api.core.v1.ProbeHandler',
  volumeSource: 'k8s.io.api.core.v1.VolumeSource',
  ephemeralContainerCommon: 'k8s.io.api.core.v1.EphemeralContainerCommon',
  localObjectReference: 'k8s.io.api.core.v1.LocalObjectReference',
};

function isInline(spec: FieldSpec): boolean {
  return inlineEmbeddings[spec.name] === spec.type && !spec.repeated && !spec.map;
}

const jsonParsed = new Map<string, Map<string, FieldSpec>>();

/** The fields of a message as its JSON has them, by name: an inline embedding's fields stand for it. */
export function jsonFields(message: string): Map<string, FieldSpec> | undefined {
  const cached = jsonParsed.get(message);
  if (cached) return cached;
  const fields = messageFields(message);
  if (!fields) return undefined;
  const byName = new Map<string, FieldSpec>();
  for (const spec of fields.values()) {
    if (isInline(spec)) for (const [name, inner] of jsonFields(spec.type) ?? []) byName.set(name, inner);
    else byName.set(spec.name, spec);
  }
  jsonParsed.set(message, byName);
  return byName;
}

/**
 * Fields whose zero value JSON keeps: pointers whose zero means something (replicas: 0, ready: false),
 * and the few non-pointer fields without omitempty (DaemonSetStatus counts). Every other zero is
 * dropped: Go's generated code writes non-pointer fields even when empty, and their JSON leaves them out.
 */
const meaningfulZeros = new Set([
  'DeploymentSpec.replicas',
  'ReplicaSetSpec.replicas',
  'DeploymentSpec.revisionHistoryLimit',
  'DeploymentSpec.progressDeadlineSeconds',
  'DaemonSetSpec.revisionHistoryLimit',
  // Rolling-update bounds are pointers: `maxSurge: 0` is said, not left out (and so not defaulted).
  'RollingUpdateDeployment.maxSurge',
  'RollingUpdateDeployment.maxUnavailable',
  'RollingUpdateDaemonSet.maxSurge',
  'RollingUpdateDaemonSet.maxUnavailable',
  // DaemonSetStatus counts without omitempty: Go's JSON writes them even when 0.
  'DaemonSetStatus.currentNumberScheduled',
  'DaemonSetStatus.numberMisscheduled',
  'DaemonSetStatus.desiredNumberScheduled',
  'DaemonSetStatus.numberReady',
  'ControllerRevision.revision',
  'EndpointConditions.ready',
  'EndpointConditions.serving',
  'EndpointConditions.terminating',
  'ServiceSpec.allocateLoadBalancerNodePorts',
  'PodSpec.terminationGracePeriodSeconds',
  'PodSpec.automountServiceAccountToken',
  'ServiceAccount.automountServiceAccountToken',
  'ObjectMeta.deletionGracePeriodSeconds',
  'OwnerReference.controller',
  'OwnerReference.blockOwnerDeletion',
  'DeleteOptions.gracePeriodSeconds',
  'Probe.terminationGracePeriodSeconds',
  'SecurityContext.runAsUser',
  'SecurityContext.runAsGroup',
  'SecurityContext.privileged',
  'SecurityContext.runAsNonRoot',
  'SecurityContext.allowPrivilegeEscalation',
  'SecurityContext.readOnlyRootFilesystem',
  'PodSecurityContext.runAsUser',
  'PodSecurityContext.runAsGroup',
  'PodSecurityContext.fsGroup',
  'PodSecurityContext.runAsNonRoot',
]);

function isZero(value: unknown): boolean {
  return value === '' || value === 0 || value === false;
}

function rfc3339(seconds: number, nanos: number, fraction: number): string {
  const iso = new Date(seconds * 1000).toISOString().replace(/\.\d{3}Z$/, '');
  if (fraction === 0 || nanos === 0) return `${iso}Z`;
  return `${iso}.${String(nanos).padStart(9, '0').slice(0, fraction)}Z`;
}

/** apimachinery types whose JSON is a string or free-form object rather than their message's fields. */
export const specialMessages: Record<string, 'time' | 'intOrString' | 'quantity' | 'duration' | 'object'> = {
  'k8s.io.apimachinery.pkg.apis.meta.v1.Time': 'time',
  'k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime': 'time',
  'k8s.io.apimachinery.pkg.util.intstr.IntOrString': 'intOrString',
  'k8s.io.apimachinery.pkg.api.resource.Quantity': 'quantity',
  'k8s.io.apimachinery.pkg.apis.meta.v1.Duration': 'duration',
  'k8s.io.apimachinery.pkg.runtime.RawExtension': 'object',
  'k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1': 'object',
};

/** The well-known apimachinery types have JSON forms of their own. */
function decodeSpecial(message: string, fields: WireField[]): {value: unknown} | undefined {
  const get = (n: number) => fields.findLast((f) => f.number === n)?.value;
  const num = (n: number) => Number(BigInt.asIntN(64, (get(n) as bigint | undefined) ?? 0n));
  const str = (n: number) => ((get(n) as Buffer | undefined) ?? Buffer.alloc(0)).toString('utf8');
  switch (message) {
    case 'k8s.io.apimachinery.pkg.apis.meta.v1.Time':
      return {value: fields.length === 0 ? undefined : rfc3339(num(1), num(2), 0)};
    case 'k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime':
      return {value: fields.length === 0 ? undefined : rfc3339(num(1), num(2), 6)};
    case 'k8s.io.apimachinery.pkg.util.intstr.IntOrString':
      return {value: num(1) === 1 ? str(3) : num(2)};
    case 'k8s.io.apimachinery.pkg.api.resource.Quantity':
      return {value: str(1)};
    case 'k8s.io.apimachinery.pkg.apis.meta.v1.Duration':
      return {value: `${num(1) / 1e9}s`};
    case 'k8s.io.apimachinery.pkg.runtime.RawExtension':
    case 'k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1': {
      const raw = str(1);
      return {value: raw === '' ? undefined : JSON.parse(raw)};
    }
  }
  return undefined;
}

function decodeScalar(type: string, field: WireField): unknown {
  const {value} = field;
  switch (type) {
    case 'string':
      return (value as Buffer).toString('utf8');
    case 'bytes':
      return (value as Buffer).toString('base64');
    case 'bool':
      return value !== 0n;
    case 'int32':
      return Number(BigInt.asIntN(32, value as bigint));
    case 'int64':
      return Number(BigInt.asIntN(64, value as bigint));
    case 'uint32':
    case 'uint64':
      return Number(value as bigint);
    case 'double':
      return (value as Buffer).readDoubleLE(0);
    case 'float':
      return (value as Buffer).readFloatLE(0);
  }
  throw new ProtobufError(`field type ${type} is not supported`);
}

function decodeValue(type: string, field: WireField): unknown {
  if (protobufMessages[type] !== undefined) return decodeMessage(type, field.value as Buffer);
  return decodeScalar(type, field);
}

function decodeMessage(message: string, body: Buffer): unknown {
  const wire = readFields(body);
  const special = decodeSpecial(message, wire);
  if (special) return special.value;
  const specs = messageFields(message);
  if (!specs) throw new ProtobufError(`message ${message} is not known`);
  const shortName = message.slice(message.lastIndexOf('.') + 1);
  const out: Record<string, any> = {};
  for (const field of wire) {
    const spec = specs.get(field.number);
    if (!spec) continue; // a field newer than this table: Go's decoder skips unknown fields too
    if (isInline(spec)) Object.assign(out, decodeMessage(spec.type, field.value as Buffer));
    else if (spec.map) {
      const entry = readFields(field.value as Buffer);
      const key = entry.find((e) => e.number === 1);
      const value = entry.find((e) => e.number === 2);
      out[spec.name] ??= {};
      out[spec.name][key ? (decodeScalar('string', key) as string) : ''] = value
        ? decodeValue(spec.type, value)
        : spec.type === 'string'
          ? ''
          : {};
    } else if (spec.repeated) {
      out[spec.name] ??= [];
      if (field.wireType === 2 && protobufMessages[spec.type] === undefined && !['string', 'bytes'].includes(spec.type))
        out[spec.name].push(
          ...readPackedVarints(field.value as Buffer).map((v) => decodeScalar(spec.type, {...field, wireType: 0, value: v})),
        );
      else out[spec.name].push(decodeValue(spec.type, field));
    } else {
      const value = decodeValue(spec.type, field);
      if (value === undefined || (isZero(value) && !meaningfulZeros.has(`${shortName}.${spec.name}`))) delete out[spec.name];
      else out[spec.name] = value;
    }
  }
  return out;
}

/**
 * The JSON object of a protobuf request body. A body that is not a Kubernetes protobuf object, or names
 * a kind the lab has no message for, is a 415 as kube-apiserver answers a type it cannot decode; a
 * damaged message is a 400.
 */
export function decodeProtobufObject(body: Buffer): Record<string, unknown> {
  if (!body.subarray(0, 4).equals(magic)) throw unsupported('the body does not start with the "k8s\\0" protobuf magic');
  try {
    const envelope = readFields(body.subarray(4));
    const typeMeta = envelope.find((f) => f.number === 1);
    const raw = envelope.find((f) => f.number === 2);
    const meta = typeMeta ? readFields(typeMeta.value as Buffer) : [];
    const apiVersion = (meta.find((f) => f.number === 1)?.value as Buffer | undefined)?.toString('utf8') ?? '';
    const kind = (meta.find((f) => f.number === 2)?.value as Buffer | undefined)?.toString('utf8') ?? '';
    const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
    const message =
      kind === 'DeleteOptions' ? 'k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions' : protobufMessageName(group, version, kind);
    if (protobufMessages[message] === undefined)
      throw unsupported(`no protobuf message is known for ${kind} in ${apiVersion || 'no version'}`);
    const object = decodeMessage(message, (raw?.value as Buffer | undefined) ?? Buffer.alloc(0)) as Record<string, unknown>;
    return {apiVersion, kind, ...object};
  } catch (err) {
    if (err instanceof ProtobufError) throw badRequest(`unable to decode the protobuf body: ${err.message}`);
    throw err;
  }
}

function unsupported(cause: string): ApiError {
  return new ApiError(
    415,
    'UnsupportedMediaType',
    `the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, ${protobufMediaType} (${cause})`,
  );
}
