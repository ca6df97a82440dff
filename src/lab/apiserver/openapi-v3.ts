// OpenAPI v3 (/openapi/v3 and one document per group version), as kube-apiserver publishes it, for
// `kubectl explain` and kubectl's field validation and patch metadata. Component schemas come from the
// lab's schemas: every field of a kind from its protobuf message (protobuf-messages.ts, complete), the
// list semantics (associative list keys, sets) from object-schema.ts. Each kind's patch operation names
// the fieldValidation parameter, which tells kubectl the server validates fields itself. The same schemas,
// written the v2 way, are OpenAPI v2's definitions (openapi-v2.ts).
import {createHash} from 'node:crypto';
import {jsonFields, messageFields, protobufMessageName, specialMessages, type FieldSpec} from './protobuf-codec.ts';
import {resourceSchema, type FieldType, type Struct} from './object-schema.ts';
import {groupVersion, resourceTypes, type ResourceType} from './resources.ts';
import {serverVersion} from './discovery.ts';

type Schema = Record<string, unknown>;

/** io.k8s.api.core.v1.Service, the name kube-apiserver gives the schema of k8s.io.api.core.v1.Service. */
export function schemaName(message: string): string {
  return message.replace(/^k8s\.io\./, 'io.k8s.');
}

/** How a version of OpenAPI refers to a schema and writes the apimachinery types. */
export interface SchemaStyle {
  ref(message: string): Schema;
  specials: Record<string, Schema>;
}

const ref = (message: string): Schema => ({allOf: [{$ref: `#/components/schemas/${schemaName(message)}`}], default: {}});

const scalarSchemas: Record<string, Schema> = {
  string: {type: 'string'},
  bytes: {type: 'string', format: 'byte'},
  bool: {type: 'boolean'},
  int32: {type: 'integer', format: 'int32'},
  int64: {type: 'integer', format: 'int64'},
  uint32: {type: 'integer', format: 'int32'},
  uint64: {type: 'integer', format: 'int64'},
  double: {type: 'number', format: 'double'},
  float: {type: 'number', format: 'double'},
};

const specialSchemas: Record<string, Schema> = {
  time: {type: 'string', format: 'date-time'},
  // One of two types, so no `type`: kubectl explain then names the schema (<IntOrString>), as kube's does.
  intOrString: {oneOf: [{type: 'integer'}, {type: 'string'}], format: 'int-or-string', 'x-kubernetes-int-or-string': true},
  quantity: {oneOf: [{type: 'integer'}, {type: 'string'}], 'x-kubernetes-int-or-string': true},
  duration: {type: 'string'},
  object: {type: 'object'},
};

/** List semantics by message and field, read from object-schema.ts alongside the messages. */
type ListSemantics = Map<string, Map<string, Schema>>;

function collectListSemantics(message: string, struct: Struct, out: ListSemantics, seen = new Set<string>()): void {
  if (seen.has(message)) return;
  seen.add(message);
  const byName = jsonFields(message);
  if (!byName) return;
  for (const [name, type] of Object.entries(struct.fields)) {
    const spec = byName.get(name);
    if (!spec) continue;
    let inner: FieldType = type;
    if (typeof type !== 'string' && 'list' in type) {
      const extras: Schema = {};
      if (type.keys) {
        Object.assign(extras, {'x-kubernetes-list-type': 'map', 'x-kubernetes-list-map-keys': type.keys});
        Object.assign(extras, {'x-kubernetes-patch-merge-key': type.keys[0], 'x-kubernetes-patch-strategy': 'merge'});
      } else if (type.set) Object.assign(extras, {'x-kubernetes-list-type': 'set', 'x-kubernetes-patch-strategy': 'merge'});
      else extras['x-kubernetes-list-type'] = 'atomic';
      if (!out.has(message)) out.set(message, new Map());
      out.get(message)!.set(name, extras);
      inner = type.list;
    } else if (typeof type !== 'string' && 'map' in type) inner = type.map;
    if (typeof inner !== 'string' && 'fields' in inner) collectListSemantics(spec.type, inner, out, seen);
  }
}

const v3Style: SchemaStyle = {ref, specials: specialSchemas};

function fieldSchema(spec: FieldSpec, extras: Schema | undefined, style: SchemaStyle): Schema {
  const value = messageFields(spec.type) ? style.ref(spec.type) : (scalarSchemas[spec.type] ?? {});
  if (spec.map) return {type: 'object', additionalProperties: value};
  if (spec.repeated) return {type: 'array', items: value, ...extras};
  return value;
}

/** The component schemas a message needs: its own and those of every message it holds. */
function addSchemas(message: string, schemas: Record<string, Schema>, semantics: ListSemantics, style: SchemaStyle): void {
  const name = schemaName(message);
  if (schemas[name]) return;
  const special = specialMessages[message];
  if (special) {
    schemas[name] = style.specials[special];
    return;
  }
  const fields = jsonFields(message);
  if (!fields) return;
  const properties: Record<string, Schema> = {};
  schemas[name] = {type: 'object', properties};
  for (const spec of fields.values()) {
    properties[spec.name] = fieldSchema(spec, semantics.get(message)?.get(spec.name), style);
    if (messageFields(spec.type)) addSchemas(spec.type, schemas, semantics, style);
  }
}

let listSemantics: ListSemantics | undefined;

/** Read from every kind's schema at once: messages are shared across groups (a Deployment holds a PodSpec). */
function allListSemantics(): ListSemantics {
  if (!listSemantics) {
    listSemantics = new Map();
    for (const type of resourceTypes)
      collectListSemantics(protobufMessageName(type.group, type.version, type.kind), resourceSchema(type), listSemantics);
  }
  return listSemantics;
}

/** Adds the schema of a kind (and of every message it holds) to `schemas`; returns its message. */
export function kindSchema(type: ResourceType, schemas: Record<string, Schema>, style: SchemaStyle = v3Style): string {
  const message = protobufMessageName(type.group, type.version, type.kind);
  addSchemas(message, schemas, allListSemantics(), style);
  const schema = schemas[schemaName(message)] as Schema & {properties?: Record<string, Schema>};
  schema.description ??= `${type.kind} (${groupVersion(type)}), as the proxyctl lab's API server serves it.`;
  if (schema.properties) {
    schema.properties.apiVersion = {
      type: 'string',
      description: 'APIVersion defines the versioned schema of this representation of an object.',
    };
    schema.properties.kind = {type: 'string', description: 'Kind is a string value representing the REST resource this object represents.'};
  }
  schema['x-kubernetes-group-version-kind'] = [{group: type.group, kind: type.kind, version: type.version}];
  return message;
}

const queryParameter = (name: string, type = 'string'): Schema => ({name, in: 'query', schema: {type, uniqueItems: true}});
const pathParameter = (name: string): Schema => ({name, in: 'path', required: true, schema: {type: 'string', uniqueItems: true}});

function paths(type: ResourceType, message: string): Record<string, Schema> {
  const base = type.group ? `/apis/${type.group}/${type.version}` : `/api/${type.version}`;
  const collection = type.namespaced ? `${base}/namespaces/{namespace}/${type.resource}` : `${base}/${type.resource}`;
  const gvk = {group: type.group, kind: type.kind, version: type.version};
  const body = {content: {'application/json': {schema: ref(message)}, 'application/yaml': {schema: ref(message)}}, required: true};
  const answer = {description: 'OK', content: {'application/json': {schema: ref(message)}}};
  const scope = type.namespaced ? [pathParameter('namespace')] : [];
  const writeParameters = ['dryRun', 'fieldManager', 'fieldValidation'].map((n) => queryParameter(n));
  const operation = (action: string, extra: Schema): Schema => ({
    operationId: `${action}${type.kind}`,
    'x-kubernetes-action': action,
    'x-kubernetes-group-version-kind': gvk,
    responses: {'200': answer},
    ...extra,
  });
  const out: Record<string, Schema> = {
    [collection]: {
      parameters: scope,
      get: operation('list', {}),
      ...(type.verbs.includes('create') ? {post: operation('post', {parameters: writeParameters, requestBody: body})} : {}),
    },
  };
  if (type.verbs.includes('get') || type.verbs.includes('patch'))
    out[`${collection}/{name}`] = {
      parameters: [pathParameter('name'), ...scope],
      get: operation('get', {}),
      put: operation('put', {parameters: writeParameters, requestBody: body}),
      delete: operation('delete', {}),
      patch: operation('patch', {
        parameters: [...writeParameters, queryParameter('force', 'boolean')],
        requestBody: {
          content: Object.fromEntries(
            [
              'application/apply-patch+yaml',
              'application/json-patch+json',
              'application/merge-patch+json',
              'application/strategic-merge-patch+json',
            ].map((t) => [t, {schema: {type: 'object'}}]),
          ),
          required: true,
        },
      }),
    };
  return out;
}

const documents = new Map<string, Record<string, unknown> | undefined>();

/** The OpenAPI v3 document of one group version ("api/v1", "apis/networking.k8s.io/v1"), or undefined. */
export function openApiV3Document(groupVersionPath: string): Record<string, unknown> | undefined {
  if (!documents.has(groupVersionPath)) documents.set(groupVersionPath, buildDocument(groupVersionPath));
  return documents.get(groupVersionPath);
}

function buildDocument(groupVersionPath: string): Record<string, unknown> | undefined {
  const types = resourceTypes.filter((t) => gvPath(t) === groupVersionPath);
  if (types.length === 0) return undefined;
  const schemas: Record<string, Schema> = {};
  const allPaths: Record<string, Schema> = {};
  for (const type of types) {
    const message = kindSchema(type, schemas);
    if (messageFields(message)) Object.assign(allPaths, paths(type, message));
  }
  return {
    openapi: '3.0.0',
    info: {title: 'Kubernetes', version: serverVersion.gitVersion},
    paths: allPaths,
    components: {schemas: Object.fromEntries(Object.entries(schemas).sort(([a], [b]) => a.localeCompare(b)))},
  };
}

function gvPath(type: ResourceType): string {
  return type.group ? `apis/${type.group}/${type.version}` : `api/${type.version}`;
}

const documentHashes = new Map<string, string>();

/** /openapi/v3: each group version's document, with a hash of its content as kube-apiserver links it. */
export function openApiV3Index(): Record<string, unknown> {
  const out: Record<string, {serverRelativeURL: string}> = {};
  for (const path of [...new Set(resourceTypes.map(gvPath))]) {
    let hash = documentHashes.get(path);
    if (!hash) {
      hash = createHash('sha512')
        .update(JSON.stringify(openApiV3Document(path)))
        .digest('hex')
        .slice(0, 128)
        .toUpperCase();
      documentHashes.set(path, hash);
    }
    out[path] = {serverRelativeURL: `/openapi/v3/${path}?hash=${hash}`};
  }
  return {paths: out};
}
