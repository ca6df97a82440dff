// compactObject: the part of a watched object the agent reads, so that the store holds a small
// record per Service and EndpointSlice instead of the API server's whole object (managedFields,
// unrelated labels and annotations, endpoint hostnames and targetRef uids). Values are copied as
// they came, good or bad, so that the model still finds and names every malformed field it
// checks. The Node is kept whole: there is one, and health reads more of it than the model.
import {
  headlessLabel,
  loadBalancerSourceRangesAnnotation,
  serviceNameLabel,
  serviceProxyNameLabel,
  topologyAwareHintsAnnotation,
  topologyModeAnnotation,
} from '../../core/model/objects.ts';
import {lastChangeTriggerTimeAnnotation} from './cluster-objects.ts';
import type {WatchedKind} from './object-store.ts';

const serviceLabels = [serviceProxyNameLabel, headlessLabel];
const serviceAnnotations = [topologyModeAnnotation, topologyAwareHintsAnnotation, loadBalancerSourceRangesAnnotation];
const sliceLabels = [serviceNameLabel, serviceProxyNameLabel, headlessLabel];
const sliceAnnotations = [lastChangeTriggerTimeAnnotation];
const endpointFields = ['addresses', 'conditions', 'nodeName', 'zone', 'hints'];

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** pick copies the named fields that are present. */
function pick(object: Json, fields: readonly string[]): Json {
  const out: Json = {};
  for (const field of fields) if (object[field] !== undefined) out[field] = object[field];
  return out;
}

function compactMetadata(metadata: unknown, labels: readonly string[], annotations: readonly string[]): unknown {
  if (!isObject(metadata)) return metadata;
  const out = pick(metadata, ['name', 'namespace', 'resourceVersion', 'deletionTimestamp']);
  if (metadata.labels !== undefined) out.labels = isObject(metadata.labels) ? pick(metadata.labels, labels) : metadata.labels;
  if (metadata.annotations !== undefined)
    out.annotations = isObject(metadata.annotations) ? pick(metadata.annotations, annotations) : metadata.annotations;
  return out;
}

const conditionNames = new Set(['ready', 'serving', 'terminating']);
/** One object per distinct set of endpoint conditions ({ready: true} and a few others), by its JSON. */
const conditionsByJson = new Map<string, Json>();

/**
 * The shared object equal to `conditions` when it holds only true/false conditions (a handful of
 * combinations, so the map stays small), else `conditions` itself. Records are never changed in
 * place, so endpoints can share one; that saves an object per endpoint.
 */
function sharedConditions(conditions: unknown): unknown {
  if (!isObject(conditions)) return conditions;
  // The key is made by hand, not with JSON.stringify: this runs once per endpoint of every list.
  let key = '';
  for (const name in conditions) {
    const value = conditions[name];
    if (!conditionNames.has(name) || typeof value !== 'boolean') return conditions;
    key += value ? `${name}+` : `${name}-`;
  }
  let known = conditionsByJson.get(key);
  if (known === undefined) conditionsByJson.set(key, (known = conditions));
  return known;
}

/** Node and zone names as first seen, so that the endpoints on one node share one string. */
const placeNames = new Map<string, string>();
/** Past this many names (nodes come and go) the map starts again rather than grow for ever. */
const placeNamesKept = 20_000;

/**
 * The string equal to `name` that an earlier endpoint brought, else `name` itself. A list parses
 * a copy of its node's name for each endpoint (about 50 bytes for a cloud node's name, times
 * every endpoint in the cluster).
 */
function sharedPlaceName(name: unknown): unknown {
  if (typeof name !== 'string') return name;
  const known = placeNames.get(name);
  if (known !== undefined) return known;
  if (placeNames.size >= placeNamesKept) placeNames.clear();
  placeNames.set(name, name);
  return name;
}

function compactEndpoint(endpoint: unknown): unknown {
  if (!isObject(endpoint)) return endpoint;
  const out = pick(endpoint, endpointFields);
  if (out.conditions !== undefined) out.conditions = sharedConditions(out.conditions);
  if (out.nodeName !== undefined) out.nodeName = sharedPlaceName(out.nodeName);
  if (out.zone !== undefined) out.zone = sharedPlaceName(out.zone);
  if (endpoint.targetRef !== undefined)
    out.targetRef = isObject(endpoint.targetRef) ? pick(endpoint.targetRef, ['kind', 'name', 'namespace']) : endpoint.targetRef;
  return out;
}

export function compactObject(kind: WatchedKind, object: unknown): unknown {
  if (!isObject(object) || kind === 'Node') return object;
  if (kind === 'ServiceCIDR') {
    const out: Json = {metadata: compactMetadata(object.metadata, [], [])};
    if (object.spec !== undefined) out.spec = isObject(object.spec) ? pick(object.spec, ['cidrs']) : object.spec;
    return out;
  }
  if (kind === 'Service') {
    const out: Json = {metadata: compactMetadata(object.metadata, serviceLabels, serviceAnnotations)};
    if (isObject(object.spec)) {
      // The selector is the endpoint controller's business; the proxy reads the slices.
      const {selector: _selector, ...spec} = object.spec;
      out.spec = spec;
    } else if (object.spec !== undefined) {
      out.spec = object.spec;
    }
    if (object.status !== undefined) out.status = isObject(object.status) ? pick(object.status, ['loadBalancer']) : object.status;
    return out;
  }
  const out: Json = {metadata: compactMetadata(object.metadata, sliceLabels, sliceAnnotations), ...pick(object, ['addressType', 'ports'])};
  if (object.endpoints !== undefined)
    out.endpoints = Array.isArray(object.endpoints) ? object.endpoints.map(compactEndpoint) : object.endpoints;
  return out;
}
