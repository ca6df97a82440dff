// The three PATCH body types kube-apiserver accepts: JSON merge patch (RFC 7386), JSON patch (RFC 6902),
// and strategic merge patch with the list merge keys of the kinds served here.
import {badField, badRequest, ApiError} from './api-error.ts';

type Json = any;

function isObject(v: unknown): v is Record<string, Json> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function applyMergePatch(target: Json, patch: Json): Json {
  if (!isObject(patch)) return structuredClone(patch);
  const out: Record<string, Json> = isObject(target) ? {...target} : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = applyMergePatch(out[k], v);
  }
  return out;
}

// ---- JSON patch ----

function unescapePointer(token: string): string {
  return token.replace(/~1/g, '/').replace(/~0/g, '~');
}

function parsePointer(path: string): string[] {
  if (path === '') return [];
  if (!path.startsWith('/')) throw badRequest(`json patch: invalid path ${JSON.stringify(path)}`);
  return path.slice(1).split('/').map(unescapePointer);
}

function walk(doc: Json, tokens: string[], path: string): Json {
  let cur = doc;
  for (const t of tokens) {
    if (Array.isArray(cur)) cur = cur[Number(t)];
    else if (isObject(cur)) cur = cur[t];
    else cur = undefined;
    if (cur === undefined) throw jsonPatchError(`doc is missing path: "${path}"`, path);
  }
  return cur;
}

/** The field a JSON pointer names, as field paths are written: /spec/ports/0/port -> spec.ports[0].port. */
function pointerField(path: string): string {
  return path
    .slice(1)
    .split('/')
    .map(unescapePointer)
    .reduce((field, token) => (/^\d+$/.test(token) ? `${field}[${token}]` : field ? `${field}.${token}` : token), '');
}

function jsonPatchError(message: string, path: string): ApiError {
  const text = `the server rejected our request due to an error in our request: ${message}`;
  return new ApiError(422, 'Invalid', text, {causes: [{reason: 'FieldValueInvalid', message, field: pointerField(path)}]});
}

function arrayIndex(token: string, length: number, forAdd: boolean, path: string): number {
  if (forAdd && token === '-') return length;
  if (!/^(0|[1-9][0-9]*)$/.test(token)) throw jsonPatchError(`invalid array index in path: "${path}"`, path);
  const i = Number(token);
  if (i > length || (!forAdd && i === length)) throw jsonPatchError(`index out of range in path: "${path}"`, path);
  return i;
}

function addAt(doc: Json, path: string, value: Json): Json {
  const tokens = parsePointer(path);
  if (tokens.length === 0) return value;
  const parent = walk(doc, tokens.slice(0, -1), path);
  const last = tokens[tokens.length - 1];
  if (Array.isArray(parent)) parent.splice(arrayIndex(last, parent.length, true, path), 0, value);
  else if (isObject(parent)) parent[last] = value;
  else throw jsonPatchError(`doc is missing path: "${path}"`, path);
  return doc;
}

function removeAt(doc: Json, path: string): Json {
  const tokens = parsePointer(path);
  const parent = walk(doc, tokens.slice(0, -1), path);
  const last = tokens[tokens.length - 1];
  if (Array.isArray(parent)) parent.splice(arrayIndex(last, parent.length, false, path), 1);
  else if (isObject(parent) && Object.hasOwn(parent, last)) delete parent[last];
  else throw jsonPatchError(`Unable to remove nonexistent key: ${last}: missing value`, path);
  return doc;
}

function deepEqual(a: Json, b: Json): boolean {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(v: Json): Json {
  if (Array.isArray(v)) return v.map(canonical);
  if (isObject(v))
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, canonical(v[k])]),
    );
  return v;
}

export function applyJsonPatch(target: Json, ops: Json): Json {
  if (!Array.isArray(ops)) throw badRequest('json patch: the patch must be a JSON array of operations');
  let doc = structuredClone(target);
  for (const op of ops) {
    if (!isObject(op) || typeof op.path !== 'string') throw badRequest('json patch: every operation needs "op" and "path"');
    switch (op.op) {
      case 'add':
        doc = addAt(doc, op.path, structuredClone(op.value));
        break;
      case 'remove':
        doc = removeAt(doc, op.path);
        break;
      case 'replace': {
        const tokens = parsePointer(op.path);
        if (tokens.length === 0) doc = structuredClone(op.value);
        else {
          walk(doc, tokens, op.path);
          doc = removeAt(doc, op.path);
          doc = addAt(doc, op.path, structuredClone(op.value));
        }
        break;
      }
      case 'move': {
        const value = walk(doc, parsePointer(op.from), op.from);
        doc = removeAt(doc, op.from);
        doc = addAt(doc, op.path, value);
        break;
      }
      case 'copy':
        doc = addAt(doc, op.path, structuredClone(walk(doc, parsePointer(op.from), op.from)));
        break;
      case 'test':
        if (!deepEqual(walk(doc, parsePointer(op.path), op.path), op.value))
          throw jsonPatchError(`testing value ${op.path} failed: test failed`, op.path);
        break;
      default:
        throw badRequest(`json patch: unexpected operation ${JSON.stringify(op.op)}`);
    }
  }
  return doc;
}

// ---- strategic merge patch ----

/**
 * Merge keys of the lists that merge rather than replace, by kind and field path (list indices left out).
 * A value of "" marks a list of scalars merged as a set (e.g. finalizers).
 */
const mergeKeys: Record<string, Record<string, string>> = {
  '*': {'metadata.ownerReferences': 'uid', 'metadata.finalizers': ''},
  Service: {'spec.ports': 'port', 'status.conditions': 'type'},
  Pod: {
    'spec.containers': 'name',
    'spec.initContainers': 'name',
    'spec.ephemeralContainers': 'name',
    'spec.containers.ports': 'containerPort',
    'spec.initContainers.ports': 'containerPort',
    'spec.containers.env': 'name',
    'spec.initContainers.env': 'name',
    'spec.containers.volumeMounts': 'mountPath',
    'spec.initContainers.volumeMounts': 'mountPath',
    'spec.volumes': 'name',
    'spec.imagePullSecrets': 'name',
    'spec.hostAliases': 'ip',
    'status.conditions': 'type',
    'status.podIPs': 'ip',
  },
  Node: {'status.conditions': 'type', 'status.addresses': 'type', 'spec.podCIDRs': '', 'spec.taints': 'key'},
  Namespace: {'status.conditions': 'type'},
  ServiceAccount: {secrets: 'name', imagePullSecrets: 'name'},
};

// A Deployment's, ReplicaSet's or DaemonSet's pod template merges as a Pod does, under spec.template.
const templateMergeKeys = Object.fromEntries(
  Object.entries(mergeKeys.Pod)
    .filter(([path]) => path.startsWith('spec.'))
    .map(([path, key]) => [`spec.template.${path}`, key]),
);
mergeKeys.Deployment = {...templateMergeKeys, 'status.conditions': 'type'};
mergeKeys.ReplicaSet = {...templateMergeKeys, 'status.conditions': 'type'};
mergeKeys.DaemonSet = {...templateMergeKeys, 'status.conditions': 'type'};

function mergeKeyFor(kind: string, path: string): string | undefined {
  return mergeKeys[kind]?.[path] ?? mergeKeys['*'][path];
}

export function applyStrategicMergePatch(target: Json, patch: Json, kind: string): Json {
  if (!isObject(patch)) throw badRequest('strategic merge patch: the patch must be a JSON object');
  return mergeMap(isObject(target) ? target : {}, patch, kind, '');
}

function childPath(path: string, key: string): string {
  return path ? `${path}.${key}` : key;
}

function mergeMap(original: Record<string, Json>, patch: Record<string, Json>, kind: string, path: string): Record<string, Json> {
  if (patch.$patch === 'replace') {
    const {$patch: _ignored, ...rest} = patch;
    return stripDirectives(rest);
  }
  if (patch.$patch === 'delete') return {};
  const out: Record<string, Json> = {...original};
  const retainKeys: string[] | undefined = Array.isArray(patch.$retainKeys) ? patch.$retainKeys : undefined;
  const elementOrders = new Map<string, Json[]>();
  for (const [key, value] of Object.entries(patch)) {
    if (key === '$patch' || key === '$retainKeys') continue;
    if (key.startsWith('$setElementOrder/')) {
      elementOrders.set(key.slice('$setElementOrder/'.length), value);
      continue;
    }
    if (key.startsWith('$deleteFromPrimitiveList/')) {
      const field = key.slice('$deleteFromPrimitiveList/'.length);
      if (Array.isArray(out[field]) && Array.isArray(value)) out[field] = out[field].filter((v: Json) => !value.includes(v));
      continue;
    }
    const p = childPath(path, key);
    if (value === null) {
      delete out[key];
    } else if (isObject(value)) {
      out[key] = mergeMap(isObject(out[key]) ? out[key] : {}, value, kind, p);
    } else if (Array.isArray(value)) {
      const mergeKey = mergeKeyFor(kind, p);
      out[key] =
        mergeKey === undefined || !Array.isArray(out[key]) ? stripDirectives(value) : mergeList(out[key], value, mergeKey, kind, p);
    } else {
      out[key] = value;
    }
  }
  for (const [field, order] of elementOrders) {
    if (Array.isArray(out[field]) && Array.isArray(order))
      out[field] = reorder(out[field], order, mergeKeyFor(kind, childPath(path, field)));
  }
  if (retainKeys) for (const key of Object.keys(out)) if (!retainKeys.includes(key) && !Object.hasOwn(patch, key)) delete out[key];
  return out;
}

function stripDirectives(value: Json): Json {
  if (Array.isArray(value)) return value.filter((v) => !(isObject(v) && v.$patch === 'delete')).map(stripDirectives);
  if (isObject(value)) {
    const out: Record<string, Json> = {};
    for (const [k, v] of Object.entries(value)) if (!k.startsWith('$')) out[k] = stripDirectives(v);
    return out;
  }
  return value;
}

function mergeList(original: Json[], patch: Json[], mergeKey: string, kind: string, path: string): Json[] {
  if (mergeKey === '') {
    // A set of scalars: union, order of the original first.
    const out = [...original];
    for (const v of patch) if (!out.includes(v)) out.push(v);
    return out;
  }
  if (patch.some((item) => isObject(item) && item.$patch === 'replace')) {
    return stripDirectives(patch.filter((item) => !(isObject(item) && item.$patch === 'replace')));
  }
  const out = [...original];
  for (const item of patch) {
    if (!isObject(item) || !Object.hasOwn(item, mergeKey)) {
      throw badField(path, `map: ${JSON.stringify(item)} does not contain declared merge key: ${mergeKey}`);
    }
    const index = out.findIndex((o) => isObject(o) && o[mergeKey] === item[mergeKey]);
    if (item.$patch === 'delete') {
      if (index >= 0) out.splice(index, 1);
      continue;
    }
    if (index >= 0) out[index] = mergeMap(out[index], item, kind, path);
    else out.push(mergeMap({}, item, kind, path));
  }
  return out;
}

/** `$setElementOrder`: items named in the order come first, in that order; the rest keep theirs. */
function reorder(list: Json[], order: Json[], mergeKey: string | undefined): Json[] {
  const keyOf = (v: Json) => (mergeKey && isObject(v) ? v[mergeKey] : v);
  const wanted = order.map(keyOf);
  const ranked = list.map((item, i) => ({item, rank: wanted.indexOf(keyOf(item)), i}));
  ranked.sort((a, b) => {
    const ra = a.rank < 0 ? Number.MAX_SAFE_INTEGER : a.rank;
    const rb = b.rank < 0 ? Number.MAX_SAFE_INTEGER : b.rank;
    return ra - rb || a.i - b.i;
  });
  return ranked.map((r) => r.item);
}

export const patchTypes = {
  merge: 'application/merge-patch+json',
  strategic: 'application/strategic-merge-patch+json',
  json: 'application/json-patch+json',
  apply: 'application/apply-patch+yaml',
} as const;
