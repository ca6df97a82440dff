// Server-side field validation (?fieldValidation=Strict|Warn|Ignore), as kube-apiserver's decoder does
// it: fields a kind does not have are an error (Strict), or dropped with a warning (Warn, the default)
// or silently (Ignore). The fields of each kind are those of its protobuf message (protobuf-messages.ts),
// which lists every field Kubernetes defines; kinds without one are not checked.
import type {ServerResponse} from 'node:http';
import {ApiError, badRequest} from './api-error.ts';
import {jsonFields, messageFields, protobufMessageName, specialMessages} from './protobuf-codec.ts';
import type {ResourceType} from './resources.ts';

export type FieldValidation = 'Strict' | 'Warn' | 'Ignore';

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Collects the unknown fields of `value` into `out`; with `drop`, also deletes them, as Go's decoder never sees them. */
function walk(value: unknown, message: string, path: string, out: string[], drop = false): void {
  if (!isObject(value) || specialMessages[message]) return;
  const byName = jsonFields(message);
  if (!byName) return;
  for (const [key, child] of Object.entries(value)) {
    if (key.startsWith('$')) continue; // strategic merge patch directives
    const field = path ? `${path}.${key}` : key;
    const spec = byName.get(key);
    if (!spec) {
      if (path === '' && (key === 'apiVersion' || key === 'kind')) continue;
      out.push(field);
      if (drop) delete value[key];
      continue;
    }
    if (messageFields(spec.type) === undefined) continue;
    if (spec.map && isObject(child)) for (const [k, v] of Object.entries(child)) walk(v, spec.type, `${field}[${k}]`, out, drop);
    else if (spec.repeated && Array.isArray(child)) child.forEach((item, i) => walk(item, spec.type, `${field}[${i}]`, out, drop));
    else walk(child, spec.type, field, out, drop);
  }
}

/** Paths of the fields `obj` sets that its kind does not have (spec.ports[0].bogus); `drop` removes them from `obj`. */
export function unknownFields(type: ResourceType, obj: unknown, drop = false): string[] {
  const out: string[] = [];
  walk(obj, protobufMessageName(type.group, type.version, type.kind), '', out, drop);
  return out;
}

export function fieldValidationOf(url: URL): FieldValidation {
  const value = url.searchParams.get('fieldValidation') ?? 'Warn';
  if (value !== 'Strict' && value !== 'Warn' && value !== 'Ignore')
    throw badRequest(`fieldValidation parameter unsupported: ${value}. Valid values are Ignore, Warn, and Strict`);
  return value;
}

/**
 * Checks a request body and drops its unknown fields: Strict throws kube-apiserver's 400 (`Service in version "v1" cannot be handled
 * as a Service: strict decoding error: unknown field "spec.bogus"`), Warn adds a Warning header per field.
 */
export function validateFields(type: ResourceType, body: unknown, url: URL, res: ServerResponse): void {
  const mode = fieldValidationOf(url);
  const unknown = unknownFields(type, body, mode !== 'Strict');
  if (unknown.length === 0 || mode === 'Ignore') return;
  const words = unknown.map((field) => `unknown field "${field}"`);
  if (mode === 'Strict') {
    const message = `${type.kind} in version "${type.version}" cannot be handled as a ${type.kind}: strict decoding error: ${words.join(', ')}`;
    throw new ApiError(400, 'BadRequest', message, {
      kind: type.resource,
      ...(type.group ? {group: type.group} : {}),
      causes: unknown.map((field) => ({reason: 'FieldValueInvalid', message: `unknown field "${field}"`, field})),
    });
  }
  res.setHeader(
    'Warning',
    words.map((w) => `299 - ${JSON.stringify(w)}`),
  );
}
