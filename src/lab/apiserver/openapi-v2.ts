// OpenAPI v2 (/openapi/v2), as JSON or as the protobuf kubectl 1.20 asks for (gnostic's openapi.v2.Document).
// Its definitions are the same schemas as OpenAPI v3's (openapi-v3.ts: every field of every served kind,
// with list semantics and patch merge keys), written the v2 way, so kubectl 1.20 explains kinds, validates
// manifests and takes its strategic-merge-patch metadata from them.
import {stringify as toYaml} from 'yaml';
import {serverVersion} from './discovery.ts';
import {kindSchema, schemaName, type SchemaStyle} from './openapi-v3.ts';
import {resourceTypes} from './resources.ts';

type Schema = Record<string, any>;

const v2Style: SchemaStyle = {
  ref: (message) => ({$ref: `#/definitions/${schemaName(message)}`}),
  specials: {
    time: {type: 'string', format: 'date-time'},
    intOrString: {type: 'string', format: 'int-or-string'},
    quantity: {type: 'string'},
    duration: {type: 'string'},
    object: {type: 'object'},
  },
};

let document: Record<string, unknown> | undefined;

export function openApiV2(): Record<string, unknown> {
  if (document) return document;
  const definitions: Record<string, Schema> = {};
  for (const type of resourceTypes) kindSchema(type, definitions, v2Style);
  const sorted = Object.fromEntries(Object.entries(definitions).sort(([a], [b]) => a.localeCompare(b)));
  document = {swagger: '2.0', info: {title: 'Kubernetes', version: serverVersion.gitVersion}, paths: {}, definitions: sorted};
  return document;
}

// ---- gnostic's openapi.v2.Document in protobuf (field numbers from gnostic's OpenAPIv2.proto) ----

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return Buffer.from(out);
}

const field = (number: number, body: Buffer | string): Buffer => {
  const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
  return Buffer.concat([varint((number << 3) | 2), varint(bytes.length), bytes]);
};
const bool = (number: number, value: boolean): Buffer => Buffer.from([number << 3, value ? 1 : 0]);

/** Schema: _ref 1, format 2, description 4, additional_properties 21, type 22, items 23, properties 25, vendor_extension 31. */
function encodeSchema(schema: Schema): Buffer {
  const parts: Buffer[] = [];
  if (schema.$ref) parts.push(field(1, schema.$ref));
  if (schema.format) parts.push(field(2, schema.format));
  if (schema.description) parts.push(field(4, schema.description));
  if (schema.additionalProperties !== undefined)
    parts.push(
      field(
        21,
        typeof schema.additionalProperties === 'boolean'
          ? bool(2, schema.additionalProperties)
          : field(1, encodeSchema(schema.additionalProperties)),
      ),
    );
  if (schema.type) parts.push(field(22, field(1, schema.type)));
  if (schema.items) parts.push(field(23, field(1, encodeSchema(schema.items))));
  if (schema.properties)
    parts.push(
      field(
        25,
        Buffer.concat(
          Object.entries(schema.properties).map(([name, value]) =>
            field(1, Buffer.concat([field(1, name), field(2, encodeSchema(value as Schema))])),
          ),
        ),
      ),
    );
  for (const [name, value] of Object.entries(schema)) {
    if (!name.startsWith('x-')) continue;
    // NamedAny {name 1, value 2: Any {yaml 2}}
    parts.push(field(31, Buffer.concat([field(1, name), field(2, field(2, toYaml(value)))])));
  }
  return Buffer.concat(parts);
}

let protobufDocument: Buffer | undefined;

/** Document: swagger 1, info 2 (title 1, version 2), definitions 9 (NamedSchema 1: name 1, value 2). */
export function openApiV2Protobuf(): Buffer {
  if (protobufDocument) return protobufDocument;
  const doc = openApiV2() as {definitions: Record<string, Schema>};
  const definitions = Object.entries(doc.definitions).map(([name, schema]) =>
    field(1, Buffer.concat([field(1, name), field(2, encodeSchema(schema))])),
  );
  protobufDocument = Buffer.concat([
    field(1, '2.0'),
    field(2, Buffer.concat([field(1, 'Kubernetes'), field(2, serverVersion.gitVersion)])),
    field(9, Buffer.concat(definitions)),
  ]);
  return protobufDocument;
}
