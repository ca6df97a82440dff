// Field ownership (metadata.managedFields) and server-side apply, as kube-apiserver's field manager keeps
// them: every write over HTTP records which manager set which fields (operation Update); an apply
// (application/apply-patch+yaml) merges the applied configuration, owns exactly its fields, removes the
// fields the manager applied before and no longer does, and is refused with a 409 naming each field
// whose value it would change while another manager owns it, unless forced.
// Fields are the FieldsV1 paths: f:NAME for a field or map key, k:{KEYS} for an item of an associative
// list, v:VALUE for a member of a set; lists without keys are owned whole. Kinds the lab has no schema
// for are read as kube reads untyped objects: every list atomic.
import {ApiError} from './api-error.ts';
import type {KubeObject} from './object-log.ts';
import {resourceSchema, type FieldType, type ListType} from './object-schema.ts';
import {groupVersion, type ResourceType} from './resources.ts';

type Json = any;
const sep = '\n';

export interface ManagedFieldsEntry {
  manager: string;
  operation: 'Apply' | 'Update';
  apiVersion: string;
  time?: string;
  fieldsType: 'FieldsV1';
  fieldsV1: Record<string, Json>;
  subresource?: string;
}

export interface FieldManagerRequest {
  manager: string;
  time: string;
  subresource?: string;
}

const isObject = (v: unknown): v is Record<string, Json> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Fields no manager owns: identity and bookkeeping the server writes. */
const unownedMetadata = [
  'name',
  'namespace',
  'uid',
  'resourceVersion',
  'generation',
  'creationTimestamp',
  'selfLink',
  'managedFields',
  'deletionTimestamp',
  'deletionGracePeriodSeconds',
];

function childType(type: FieldType | undefined, key: string): FieldType | undefined {
  if (type === undefined || typeof type === 'string') return undefined;
  if ('map' in type) return type.map;
  if ('fields' in type) return type.fields[key];
  return undefined;
}

function itemToken(list: ListType | undefined, item: Json): string | undefined {
  if (list?.set) return `v:${JSON.stringify(item)}`;
  if (list?.keys && isObject(item)) {
    const keys = Object.fromEntries(
      list.keys
        .filter((k) => item[k] !== undefined)
        .sort()
        .map((k) => [k, item[k]]),
    );
    return `k:${JSON.stringify(keys)}`;
  }
  return undefined;
}

/** The set of fields `value` sets, as paths of FieldsV1 tokens joined by newlines. */
function collect(value: Json, type: FieldType | undefined, path: string, out: Set<string>): void {
  if (isObject(value) && (type === undefined || (typeof type !== 'string' && !('list' in type)))) {
    const entries = Object.entries(value).filter(([, v]) => v !== null && v !== undefined);
    if (entries.length === 0 && path) out.add(path);
    for (const [key, child] of entries) collect(child, childType(type, key), path ? `${path}${sep}f:${key}` : `f:${key}`, out);
    return;
  }
  const list = type !== undefined && typeof type !== 'string' && 'list' in type ? type : undefined;
  if (Array.isArray(value) && (list?.keys || list?.set)) {
    value.forEach((item) => {
      const token = itemToken(list, item)!;
      out.add(`${path}${sep}${token}`);
      if (list.keys && isObject(item)) collect(item, list.list, `${path}${sep}${token}`, out);
    });
    return;
  }
  out.add(path);
}

/** The fields an object sets, less the server's own metadata and (for the main resource) .status. */
export function fieldSet(type: ResourceType, obj: KubeObject, subresource = ''): Set<string> {
  const copy: Json = {...obj, metadata: {...(obj.metadata ?? {})}};
  delete copy.apiVersion;
  delete copy.kind;
  for (const key of unownedMetadata) delete copy.metadata[key];
  if (type.hasStatus) {
    if (subresource === 'status') return statusFields(type, copy.status);
    delete copy.status;
  }
  const out = new Set<string>();
  collect(copy, resourceSchema(type), '', out);
  return out;
}

function statusFields(type: ResourceType, status: Json): Set<string> {
  const out = new Set<string>();
  if (status !== undefined) collect({status}, resourceSchema(type), '', out);
  return out;
}

function tokenValue(container: Json, token: string): {found: boolean; value?: Json; index?: number} {
  if (token.startsWith('f:')) {
    const key = token.slice(2);
    return isObject(container) && Object.hasOwn(container, key) ? {found: true, value: container[key]} : {found: false};
  }
  if (!Array.isArray(container)) return {found: false};
  if (token.startsWith('v:')) {
    const index = container.findIndex((item) => JSON.stringify(item) === token.slice(2));
    return index >= 0 ? {found: true, value: container[index], index} : {found: false};
  }
  const keys = JSON.parse(token.slice(2));
  const index = container.findIndex(
    (item) => isObject(item) && Object.entries(keys).every(([k, v]) => JSON.stringify(item[k]) === JSON.stringify(v)),
  );
  return index >= 0 ? {found: true, value: container[index], index} : {found: false};
}

function valueAt(obj: Json, path: string): {found: boolean; value?: Json} {
  let current: Json = obj;
  for (const token of path.split(sep)) {
    const step = tokenValue(current, token);
    if (!step.found) return {found: false};
    current = step.value;
  }
  return {found: true, value: current};
}

function removeAt(obj: Json, path: string): void {
  const tokens = path.split(sep);
  const parent = tokens.length === 1 ? {found: true, value: obj} : valueAt(obj, tokens.slice(0, -1).join(sep));
  if (!parent.found) return;
  const last = tokens[tokens.length - 1];
  const step = tokenValue(parent.value, last);
  if (!step.found) return;
  if (last.startsWith('f:')) delete parent.value[last.slice(2)];
  else parent.value.splice(step.index, 1);
}

/** FieldsV1: nested objects of tokens; "." marks a list item (or map) that is itself a member. */
export function toFieldsV1(fields: Set<string>): Record<string, Json> {
  const root: Record<string, Json> = {};
  for (const path of [...fields].sort()) {
    let node = root;
    for (const token of path.split(sep)) node = node[token] ??= {};
  }
  const markSelf = (node: Record<string, Json>, path: string) => {
    for (const [token, child] of Object.entries(node)) {
      const childPath = path ? `${path}${sep}${token}` : token;
      if (Object.keys(child).length > 0 && fields.has(childPath)) child['.'] = {};
      markSelf(child, childPath);
    }
  };
  markSelf(root, '');
  return root;
}

export function fromFieldsV1(fieldsV1: Json, path = '', out = new Set<string>()): Set<string> {
  if (!isObject(fieldsV1)) return out;
  for (const [token, child] of Object.entries(fieldsV1)) {
    if (token === '.') {
      if (path) out.add(path);
      continue;
    }
    const childPath = path ? `${path}${sep}${token}` : token;
    if (!isObject(child) || Object.keys(child).length === 0) out.add(childPath);
    else fromFieldsV1(child, childPath, out);
  }
  return out;
}

/** A path as kube prints it: .spec.ports[port=80,protocol="TCP"].targetPort */
export function printPath(path: string): string {
  return path
    .split(sep)
    .map((token) => {
      if (token.startsWith('f:')) return `.${token.slice(2)}`;
      if (token.startsWith('v:')) return `[=${token.slice(2)}]`;
      const keys = JSON.parse(token.slice(2)) as Record<string, Json>;
      return `[${Object.entries(keys)
        .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
        .join(',')}]`;
    })
    .join('');
}

function entryKey(e: Pick<ManagedFieldsEntry, 'manager' | 'operation' | 'subresource' | 'apiVersion'>): string {
  return JSON.stringify([e.manager, e.operation, e.subresource ?? '', e.operation === 'Update' ? e.apiVersion : '']);
}

function entriesOf(obj: KubeObject | undefined): ManagedFieldsEntry[] {
  const list = obj?.metadata?.managedFields;
  return Array.isArray(list) ? (list.filter((e: Json) => isObject(e) && typeof e.manager === 'string') as ManagedFieldsEntry[]) : [];
}

function ownerSets(entries: ManagedFieldsEntry[]): Map<string, {entry: ManagedFieldsEntry; fields: Set<string>}> {
  return new Map(entries.map((entry) => [entryKey(entry), {entry, fields: fromFieldsV1(entry.fieldsV1)}]));
}

function writeEntries(owners: Map<string, {entry: ManagedFieldsEntry; fields: Set<string>}>): ManagedFieldsEntry[] {
  const out: ManagedFieldsEntry[] = [];
  for (const {entry, fields} of owners.values()) {
    if (fields.size === 0) continue;
    out.push({...entry, fieldsType: 'FieldsV1', fieldsV1: toFieldsV1(fields)});
  }
  return out;
}

function sameValue(a: {found: boolean; value?: Json}, b: {found: boolean; value?: Json}): boolean {
  return a.found === b.found && JSON.stringify(a.value) === JSON.stringify(b.value);
}

/**
 * An ordinary write (create, update, patch): the manager owns every field whose value it changed,
 * other managers lose those, and fields the write removed leave every set. Managed fields the client
 * sent changed (kubectl's upgrade from client-side apply rewrites them) are taken as the starting point.
 */
export function recordUpdate(type: ResourceType, old: KubeObject | undefined, next: KubeObject, request: FieldManagerRequest): void {
  const sent = next.metadata.managedFields;
  const sentChanged = sent !== undefined && JSON.stringify(sent) !== JSON.stringify(old?.metadata.managedFields);
  const start = sentChanged ? entriesOf(next) : entriesOf(old);
  const owners = ownerSets(start.filter((e) => Object.keys(e.fieldsV1 ?? {}).length > 0));
  const subresource = request.subresource ?? '';
  const after = fieldSet(type, next, subresource);
  const changed = new Set([...after].filter((path) => !old || !sameValue(valueAt(old, path), valueAt(next, path))));
  let lost = false;
  for (const owner of owners.values()) {
    if ((owner.entry.subresource ?? '') !== subresource) continue;
    for (const path of [...owner.fields]) {
      if (after.has(path) && !changed.has(path)) continue;
      owner.fields.delete(path);
      lost = true;
    }
  }
  if (old && changed.size === 0 && !lost && !sentChanged) {
    // A write that changes nothing leaves the ownership (and its times) as it was.
    if (old.metadata.managedFields !== undefined) next.metadata.managedFields = old.metadata.managedFields;
    else delete next.metadata.managedFields;
    return;
  }
  const entry: ManagedFieldsEntry = {
    manager: request.manager,
    operation: 'Update',
    apiVersion: groupVersion(type),
    time: request.time,
    fieldsType: 'FieldsV1',
    fieldsV1: {},
    ...(subresource ? {subresource} : {}),
  };
  const mine = owners.get(entryKey(entry))?.fields ?? new Set<string>();
  for (const path of changed) mine.add(path);
  if (changed.size > 0) owners.set(entryKey(entry), {entry, fields: mine});
  next.metadata.managedFields = writeEntries(owners);
  if (next.metadata.managedFields.length === 0) delete next.metadata.managedFields;
}

/** Fills the key fields an applied list item leaves to their defaults (a port's protocol), so that it finds its live item. */
function defaultKeys(value: Json, type: FieldType | undefined): void {
  if (isObject(value)) {
    for (const [key, child] of Object.entries(value)) defaultKeys(child, childType(type, key));
    return;
  }
  const list = type !== undefined && typeof type !== 'string' && 'list' in type ? type : undefined;
  if (!Array.isArray(value) || !list) return;
  for (const item of value) {
    if (isObject(item) && list.keyDefaults) for (const [k, v] of Object.entries(list.keyDefaults)) item[k] ??= v;
    defaultKeys(item, list.list);
  }
}

/** Merges an applied configuration into the live object: maps field by field, associative lists item by item, the rest replaced. */
function mergeApplied(live: Json, applied: Json, type: FieldType | undefined): Json {
  if (isObject(applied) && (type === undefined || (typeof type !== 'string' && !('list' in type)))) {
    const out: Record<string, Json> = isObject(live) ? {...live} : {};
    for (const [key, value] of Object.entries(applied)) {
      if (value === null || value === undefined) continue;
      out[key] = mergeApplied(out[key], value, childType(type, key));
    }
    return out;
  }
  const list = type !== undefined && typeof type !== 'string' && 'list' in type ? type : undefined;
  if (Array.isArray(applied) && Array.isArray(live) && (list?.keys || list?.set)) {
    const out = [...live];
    for (const item of applied) {
      const found = tokenValue(out, itemToken(list, item)!);
      if (!found.found) out.push(structuredClone(item));
      else if (list.keys) out[found.index!] = mergeApplied(out[found.index!], item, list.list);
    }
    return out;
  }
  return structuredClone(applied);
}

/**
 * Server-side apply of `applied` by `request.manager` to `live` (undefined: the object is created).
 * Throws kube-apiserver's 409 when another manager owns a field whose value would change and `force` is not set.
 */
export function applyConfiguration(
  type: ResourceType,
  live: KubeObject | undefined,
  applied: KubeObject,
  request: FieldManagerRequest & {force: boolean},
): KubeObject {
  const subresource = request.subresource ?? '';
  defaultKeys(applied, resourceSchema(type));
  const appliedFields = fieldSet(type, applied, subresource);
  const owners = ownerSets(entriesOf(live));
  const entry: ManagedFieldsEntry = {
    manager: request.manager,
    operation: 'Apply',
    apiVersion: groupVersion(type),
    time: request.time,
    fieldsType: 'FieldsV1',
    fieldsV1: {},
    ...(subresource ? {subresource} : {}),
  };
  const key = entryKey(entry);
  const conflicts: Array<{owner: ManagedFieldsEntry; path: string}> = [];
  for (const [ownerKey, owner] of owners) {
    if (ownerKey === key || (owner.entry.subresource ?? '') !== subresource) continue;
    for (const path of appliedFields) {
      // Owning a list item (k:, v:) is owning its existence: only its fields' values can conflict.
      if (!owner.fields.has(path) || !live || /(^|\n)[kv]:[^\n]*$/.test(path)) continue;
      if (!sameValue(valueAt(live, path), valueAt(applied, path))) conflicts.push({owner: owner.entry, path});
    }
  }
  if (conflicts.length > 0 && !request.force) throw applyConflict(conflicts);
  for (const {owner, path} of conflicts) owners.get(entryKey(owner))!.fields.delete(path);

  const previous = owners.get(key)?.fields ?? new Set<string>();
  let merged = mergeApplied(structuredClone(live ?? {}), applied, resourceSchema(type));
  const ownedByOthers = (path: string) => [...owners].some(([k, o]) => k !== key && o.fields.has(path));
  for (const path of [...previous].sort().reverse()) {
    if (!appliedFields.has(path) && !ownedByOthers(path)) removeAt(merged, path);
  }
  owners.set(key, {entry, fields: appliedFields});
  merged = {...merged, metadata: {...merged.metadata, managedFields: writeEntries(owners)}};
  return merged;
}

function printManager(entry: ManagedFieldsEntry): string {
  let text = JSON.stringify(entry.manager);
  if (entry.subresource) text += ` with subresource ${JSON.stringify(entry.subresource)}`;
  if (entry.operation === 'Update') text += ` using ${entry.apiVersion}`;
  return text;
}

/** kube-apiserver's words: "Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using v1: .spec.replicas". */
function applyConflict(conflicts: Array<{owner: ManagedFieldsEntry; path: string}>): ApiError {
  const causes = conflicts.map((c) => ({
    reason: 'FieldManagerConflict',
    message: `conflict with ${printManager(c.owner)}`,
    field: printPath(c.path),
  }));
  let message: string;
  if (conflicts.length === 1)
    message = `Apply failed with 1 conflict: conflict with ${printManager(conflicts[0].owner)}: ${printPath(conflicts[0].path)}`;
  else {
    const byManager = new Map<string, string[]>();
    for (const c of conflicts) byManager.set(printManager(c.owner), [...(byManager.get(printManager(c.owner)) ?? []), printPath(c.path)]);
    const lines = [...byManager.keys()]
      .sort()
      .flatMap((manager) => [`conflicts with ${manager}:`, ...byManager.get(manager)!.map((p) => `- ${p}`)]);
    message = `Apply failed with ${conflicts.length} conflicts: ${lines.join('\n')}`;
  }
  return new ApiError(409, 'Conflict', message, {causes});
}
