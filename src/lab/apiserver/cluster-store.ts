// The object API behind the HTTP layer: create/get/list/update/patch/delete with kube-apiserver's semantics
// (uids, generations, optimistic concurrency, defaults, validation, allocation, graceful pod deletion).
import {randomUUID, randomInt} from 'node:crypto';
import {
  ApiError,
  alreadyExists,
  badField,
  badRequest,
  conflict,
  forbidden,
  invalid,
  notFound,
  unsupportedMediaType,
  type FieldError,
} from './api-error.ts';
import {defaultEndpointSlice, validateEndpointSlice} from './endpointslice-rules.ts';
import {ObjectLog, type KubeObject} from './object-log.ts';
import {applyJsonPatch, applyMergePatch, applyStrategicMergePatch, patchTypes} from './patch.ts';
import {defaultPod, validatePod, validatePodUpdate} from './pod-rules.ts';
import {groupVersion, isReview, resolveResourceName, resourceTypes, storageType, type ResourceType} from './resources.ts';
import {matchesFields, matchesLabels, parseFieldSelector, parseLabelSelector} from './selectors.ts';
import {
  allocateServiceAddresses,
  defaultService,
  releaseServiceAddresses,
  validateService,
  validateServiceStatus,
  type ServiceNetwork,
} from './service-rules.ts';
import {validateObjectMeta, type NameRule} from './name-rules.ts';
import {checkFieldTypes} from './object-schema.ts';
import {applyConfiguration, recordUpdate, type FieldManagerRequest} from './field-manager.ts';
import {readyServiceCIDRStatus, validateServiceCIDR} from './servicecidr-rules.ts';
import {canonicalJson} from './sorted-json.ts';
import {defaultWorkload, emptyDaemonSetStatus, setTemplateGeneration, validateWorkload} from './workload-rules.ts';

export interface WriteOptions {
  dryRun?: boolean;
  /** "status" writes only .status; "" (the default) writes everything but .status. */
  subresource?: '' | 'status';
  /** Programmatic creates may keep .status (the HTTP API resets it for pods and services, as kube-apiserver does). */
  keepStatus?: boolean;
  /**
   * The write is the endpoint reconciler's (the `kubernetes` service's slice): the lab's API server
   * listens on loopback, an endpoint address refused to every other writer.
   */
  apiServerEndpoints?: boolean;
  /** The field manager of a write over HTTP: it is recorded in metadata.managedFields (operation Update). */
  fieldManager?: string;
}

export interface DeleteOptions {
  gracePeriodSeconds?: number;
  propagationPolicy?: string;
  preconditions?: {uid?: string; resourceVersion?: string};
  dryRun?: boolean;
}

export interface ListOptions {
  namespace?: string;
  labelSelector?: string;
  fieldSelector?: string;
  limit?: number;
  continue?: string;
}

export interface ListResult {
  items: KubeObject[];
  resourceVersion: string;
  continue?: string;
  remainingItemCount?: number;
}

type ResourceRef = ResourceType | string;

const nameRules: Record<string, NameRule> = {
  namespaces: 'dns1123-label',
  services: 'dns1035-label',
  configmaps: 'dns1123-subdomain',
  events: 'any',
};

const generateNameAlphabet = 'bcdfghjklmnpqrstvwxz2456789';

/** kube-apiserver's answer to a body that names its object other than the URL does. */
function nameMismatch(bodyName: string | undefined, urlName: string): ApiError {
  return badField('metadata.name', `the name of the object (${bodyName ?? ''}) does not match the name on the URL (${urlName})`);
}

/** The optimistic-concurrency precondition: a resourceVersion in the body must be the stored object's. */
function checkPrecondition(type: ResourceType, body: KubeObject, stored: KubeObject): void {
  const wanted = body.metadata.resourceVersion;
  if (wanted && wanted !== stored.metadata.resourceVersion) throw conflict(type.resource, type.group, stored.metadata.name);
}

/** The object a PATCH of `contentType` makes of `base` (a copy: patches may change it). */
function patchedObject(type: ResourceType, base: KubeObject, contentType: string, patch: unknown): KubeObject {
  let patched: KubeObject;
  const mediaType = contentType.split(';')[0].trim();
  if (mediaType === patchTypes.merge) patched = applyMergePatch(base, patch);
  else if (mediaType === patchTypes.strategic) patched = applyStrategicMergePatch(base, patch, type.kind);
  else if (mediaType === patchTypes.json) patched = applyJsonPatch(base, patch);
  else throw unsupportedMediaType(contentType);
  if (!patched || typeof patched !== 'object' || Array.isArray(patched))
    throw badRequest('the patch made the object something other than a JSON object');
  checkFieldTypes(type, patched);
  if (!patched.metadata) throw badField('metadata', "the patch removed the object's metadata");
  return patched;
}

/** The fields DeleteOptions.preconditions may name, each with kube-apiserver's word for it in a conflict. */
const deletePreconditions = [
  ['uid', 'UID'],
  ['resourceVersion', 'ResourceVersion'],
] as const;

/** Each precondition a DELETE gives must be the stored object's, as kube-apiserver checks them. */
function checkDeletePreconditions(type: ResourceType, stored: KubeObject, given: DeleteOptions['preconditions']): void {
  for (const [field, word] of deletePreconditions) {
    const wanted = given?.[field];
    const found = stored.metadata[field];
    if (wanted && wanted !== found) {
      const message = `Precondition failed: ${word} in precondition: ${wanted}, ${word} in object meta: ${found}`;
      throw conflict(type.resource, type.group, stored.metadata.name, message);
    }
  }
}

function nowRfc3339(clock: () => number): string {
  return new Date(Math.floor(clock() / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

function withoutResourceVersion(obj: KubeObject): string {
  return canonicalJson({...obj, metadata: {...obj.metadata, resourceVersion: undefined}});
}

export class ClusterStore {
  readonly log: ObjectLog;
  readonly network: ServiceNetwork;
  private readonly clock: () => number;
  private readonly podDeletions = new Map<string, NodeJS.Timeout>();
  /** propagationPolicy of deletes that asked for one, by uid, until the garbage collector reads it. */
  private readonly propagationPolicies = new Map<string, string>();

  constructor(log: ObjectLog, network: ServiceNetwork, clock: () => number = Date.now) {
    this.log = log;
    this.network = network;
    this.clock = clock;
  }

  type(ref: ResourceRef): ResourceType {
    return typeof ref === 'string' ? resolveResourceName(ref) : ref;
  }

  get(ref: ResourceRef, namespace: string | undefined, name: string): KubeObject {
    const type = this.type(ref);
    const obj = this.log.get(type.storageKey, type.namespaced ? namespace : undefined, name);
    if (!obj) throw notFound(type.resource, type.group, name);
    return obj;
  }

  tryGet(ref: ResourceRef, namespace: string | undefined, name: string): KubeObject | undefined {
    const type = this.type(ref);
    return this.log.get(type.storageKey, type.namespaced ? namespace : undefined, name);
  }

  list(ref: ResourceRef, options: ListOptions = {}): ListResult {
    const type = this.type(ref);
    const labels = options.labelSelector ? parseLabelSelector(options.labelSelector) : [];
    const fields = options.fieldSelector ? parseFieldSelector(options.fieldSelector, type.resource) : [];
    let revision = this.log.currentRevision;
    let after: string | undefined;
    if (options.continue) {
      try {
        const token = JSON.parse(Buffer.from(options.continue, 'base64url').toString('utf8'));
        revision = Number(token.rv);
        after = String(token.start);
      } catch {
        throw badRequest('continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)');
      }
    }
    const all = this.log.list(type.storageKey, type.namespaced ? options.namespace : undefined);
    const matching: KubeObject[] = [];
    for (const obj of all) {
      if (after !== undefined && keyOf(obj) <= after) continue;
      if (labels.length > 0 && !matchesLabels(labels, obj.metadata.labels)) continue;
      if (fields.length > 0 && !matchesFields(fields, obj)) continue;
      matching.push(obj);
    }
    const limit = options.limit && options.limit > 0 ? options.limit : undefined;
    if (limit === undefined || matching.length <= limit) return {items: matching, resourceVersion: String(revision)};
    const items = matching.slice(0, limit);
    const token = Buffer.from(JSON.stringify({v: 'meta.k8s.io/v1', rv: revision, start: keyOf(items[items.length - 1])})).toString(
      'base64url',
    );
    return {items, resourceVersion: String(revision), continue: token, remainingItemCount: matching.length - limit};
  }

  create(ref: ResourceRef, body: KubeObject, namespace?: string, options: WriteOptions = {}): KubeObject {
    const type = this.type(ref);
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw badRequest('the body of the request must be a JSON object');
    const obj: KubeObject = structuredClone(body);
    checkFieldTypes(type, obj);
    obj.metadata = (obj.metadata && typeof obj.metadata === 'object' ? obj.metadata : {}) as KubeObject['metadata'];
    this.stampKind(type, obj);
    const meta = obj.metadata;
    if (type.namespaced) {
      const ns = namespace ?? meta.namespace ?? 'default';
      if (meta.namespace && meta.namespace !== ns)
        throw badField('metadata.namespace', 'the namespace of the provided object does not match the namespace sent on the request');
      meta.namespace = ns;
      const nsObj = this.log.get('namespaces', undefined, ns);
      if (!nsObj) throw notFound('namespaces', '', ns);
      if (nsObj.metadata.deletionTimestamp || nsObj.status?.phase === 'Terminating') {
        throw forbidden(
          type.resource,
          type.group,
          meta.name ?? '',
          `unable to create new content in namespace ${ns} because it is being terminated`,
        );
      }
    } else delete meta.namespace;
    if (!meta.name && meta.generateName) {
      let suffix = '';
      for (let i = 0; i < 5; i++) suffix += generateNameAlphabet[randomInt(generateNameAlphabet.length)];
      meta.name = `${meta.generateName}${suffix}`;
    }
    meta.uid = randomUUID();
    meta.creationTimestamp = nowRfc3339(this.clock);
    delete meta.resourceVersion;
    delete meta.deletionTimestamp;
    delete meta.deletionGracePeriodSeconds;
    if ('spec' in obj || type.resource === 'pods' || type.resource === 'services') meta.generation = 1;
    else delete meta.generation;

    this.prepareForCreate(type, obj, options);
    const errors = this.validate(type, obj, undefined, options);
    if (errors.length > 0) throw invalid(type.kind, type.group, meta.name ?? '', errors);
    if (this.log.get(type.storageKey, meta.namespace, meta.name)) throw alreadyExists(type.resource, type.group, meta.name);
    // Before allocation, as kube-apiserver's field manager runs before its registry allocates addresses.
    if (options.fieldManager !== undefined) recordUpdate(type, undefined, obj, this.managerRequest(options));
    if (type.resource === 'services') {
      const failure = allocateServiceAddresses(obj, undefined, this.network);
      if (failure) throw failure;
      if (options.dryRun) releaseServiceAddresses(obj, this.network);
    }
    if (options.dryRun) return obj;
    const stored = this.log.write(type.storageKey, 'ADDED', obj);
    if (type.resource === 'namespaces') this.afterNamespaceCreated(stored);
    return stored;
  }

  update(ref: ResourceRef, body: KubeObject, namespace?: string, options: WriteOptions = {}, expectedName?: string): KubeObject {
    const type = this.type(ref);
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw badRequest('the body of the request must be a JSON object');
    body = structuredClone(body);
    checkFieldTypes(type, body);
    if (!body.metadata) throw nameMismatch(undefined, expectedName ?? '');
    const name = body.metadata.name;
    if (expectedName !== undefined && name !== expectedName) {
      throw nameMismatch(name, expectedName);
    }
    if (type.namespaced && body.metadata.namespace && namespace && body.metadata.namespace !== namespace) {
      throw badField('metadata.namespace', 'the namespace of the provided object does not match the namespace sent on the request');
    }
    const ns = type.namespaced ? (namespace ?? body.metadata.namespace ?? 'default') : undefined;
    const old = this.get(type, ns, name);
    checkPrecondition(type, body, old);
    return this.replace(type, old, body, options);
  }

  /** Get, change a copy (`change` sees the stored object too), update: how PATCH, the lab and the controllers change objects. */
  mutate(
    ref: ResourceRef,
    namespace: string | undefined,
    name: string,
    change: (obj: KubeObject, stored: Readonly<KubeObject>) => KubeObject | void,
    options: WriteOptions = {},
  ): KubeObject {
    const type = this.type(ref);
    const old = this.get(type, namespace, name);
    const copy = structuredClone(old);
    const changed = change(copy, old) ?? copy;
    return this.replace(type, old, changed, options);
  }

  patch(
    ref: ResourceRef,
    namespace: string | undefined,
    name: string,
    contentType: string,
    patch: unknown,
    options: WriteOptions = {},
  ): KubeObject {
    const type = this.type(ref);
    const patchOne = (base: KubeObject, stored: Readonly<KubeObject>): KubeObject => {
      const patched = patchedObject(type, base, contentType, patch);
      if (patched.metadata.name !== name) throw nameMismatch(patched.metadata.name, name);
      checkPrecondition(type, patched, stored);
      return patched;
    };
    return this.mutate(type, namespace, name, patchOne, options);
  }

  /**
   * Server-side apply (PATCH application/apply-patch+yaml) by `manager`: creates the object when there
   * is none, else merges the applied configuration (see field-manager.ts). A 409 lists the conflicts.
   */
  apply(
    ref: ResourceRef,
    namespace: string | undefined,
    name: string,
    applied: unknown,
    request: {manager: string; force: boolean},
    options: WriteOptions = {},
  ): {object: KubeObject; created: boolean} {
    const type = this.type(ref);
    if (!applied || typeof applied !== 'object' || Array.isArray(applied)) throw badRequest('the applied configuration must be an object');
    const config = structuredClone(applied) as KubeObject;
    checkFieldTypes(type, config);
    if (!config.metadata || config.metadata.name !== name) throw nameMismatch(config.metadata?.name, name);
    const live = this.tryGet(type, namespace, name);
    const fieldRequest = {...this.managerRequest({...options, fieldManager: request.manager}), force: request.force};
    const writeOptions = {...options, fieldManager: undefined};
    if (!live) {
      const object = applyConfiguration(type, undefined, config, fieldRequest);
      return {object: this.create(type, object, namespace, writeOptions), created: true};
    }
    checkPrecondition(type, config, live);
    const merged = applyConfiguration(type, live, config, fieldRequest);
    const unchanged = withoutManagedFields(merged) === withoutManagedFields(live);
    if (unchanged && sameOwnership(merged, live)) return {object: live, created: false};
    return {object: this.replace(type, live, merged, writeOptions), created: false};
  }

  private managerRequest(options: WriteOptions): FieldManagerRequest {
    return {manager: options.fieldManager ?? '', time: nowRfc3339(this.clock), subresource: options.subresource || undefined};
  }

  private replace(type: ResourceType, old: KubeObject, next: KubeObject, options: WriteOptions): KubeObject {
    // update and patch have checked already; mutate's callers get the same rules.
    checkFieldTypes(type, next);
    next.metadata ??= {} as KubeObject['metadata'];
    this.stampKind(type, next);
    const meta = next.metadata;
    meta.name = old.metadata.name;
    if (type.namespaced) meta.namespace = old.metadata.namespace;
    else delete meta.namespace;
    meta.uid = old.metadata.uid;
    meta.creationTimestamp = old.metadata.creationTimestamp;
    if (old.metadata.deletionTimestamp) {
      meta.deletionTimestamp = old.metadata.deletionTimestamp;
      meta.deletionGracePeriodSeconds = old.metadata.deletionGracePeriodSeconds;
    } else {
      delete meta.deletionTimestamp;
      delete meta.deletionGracePeriodSeconds;
    }
    meta.resourceVersion = old.metadata.resourceVersion;
    if (type.hasStatus) {
      if (options.subresource === 'status') {
        // A status write changes .status only (metadata labels/annotations too, as kube-apiserver allows;
        // and the field ownership an apply to /status computed).
        const status = next.status;
        const {labels, annotations, managedFields} = meta;
        next = {...structuredClone(old), status};
        if (managedFields !== undefined) next.metadata.managedFields = managedFields;
        next.metadata.labels = labels;
        next.metadata.annotations = annotations;
        if (labels === undefined) delete next.metadata.labels;
        if (annotations === undefined) delete next.metadata.annotations;
      } else if (old.status !== undefined) next.status = old.status;
      else delete next.status;
    }
    const specChanged = canonicalJson(next.spec) !== canonicalJson(old.spec);
    if (type.resource === 'services') defaultService(next, old, this.network);
    if (type.resource === 'pods') defaultPod(next);
    if (type.storageKey === 'discovery.k8s.io/endpointslices') defaultEndpointSlice(next);
    if (type.group === 'apps') defaultWorkload(next);
    if (type.storageKey === 'apps/daemonsets') setTemplateGeneration(next, old);
    if (old.metadata.generation !== undefined) {
      // Workloads compare their specs defaulted, as kube-apiserver's strategies see them: an apply that
      // leaves a defaulted field out changes nothing (and starts no rollout).
      const changed = type.group === 'apps' ? canonicalJson(next.spec) !== canonicalJson(old.spec) : specChanged;
      next.metadata.generation = changed ? old.metadata.generation + 1 : old.metadata.generation;
    }
    const errors =
      options.subresource !== 'status'
        ? this.validate(type, next, old)
        : type.resource === 'services'
          ? validateServiceStatus(next)
          : validateObjectMeta(next, 'any');
    if (errors.length > 0) throw invalid(type.kind, type.group, meta.name, errors);

    if (options.fieldManager !== undefined) recordUpdate(type, old, next, this.managerRequest(options));
    else if (next.metadata.managedFields === undefined && old.metadata.managedFields !== undefined)
      next.metadata.managedFields = old.metadata.managedFields;
    if (withoutResourceVersion(next) === withoutResourceVersion(old)) return old; // no-op writes keep the revision
    if (type.resource === 'services' && options.subresource !== 'status') {
      const failure = allocateServiceAddresses(next, old, this.network);
      if (failure) throw failure;
    }
    if (options.dryRun) return next;
    if (next.metadata.deletionTimestamp && !next.metadata.finalizers?.length && type.resource !== 'pods') {
      return this.remove(type, next);
    }
    if (type.resource === 'pods' && next.metadata.deletionTimestamp && !next.metadata.finalizers?.length && isTerminal(next)) {
      return this.remove(type, next);
    }
    return this.log.write(type.storageKey, 'MODIFIED', next);
  }

  /** DELETE: pods terminate gracefully, objects with finalizers wait for them, the rest go at once. */
  delete(ref: ResourceRef, namespace: string | undefined, name: string, options: DeleteOptions = {}): {object: KubeObject; gone: boolean} {
    const type = this.type(ref);
    const old = this.get(type, namespace, name);
    checkDeletePreconditions(type, old, options.preconditions);
    if (options.gracePeriodSeconds !== undefined && (!Number.isInteger(options.gracePeriodSeconds) || options.gracePeriodSeconds < 0)) {
      throw invalid('DeleteOptions', 'meta.k8s.io', '', [
        {type: 'FieldValueInvalid', field: 'gracePeriodSeconds', message: `Invalid value: ${options.gracePeriodSeconds}: must be >= 0`},
      ]);
    }
    if (options.dryRun) return {object: old, gone: true};
    if (options.propagationPolicy && old.metadata.uid) this.propagationPolicies.set(old.metadata.uid, options.propagationPolicy);

    if (type.resource === 'pods') {
      const grace = options.gracePeriodSeconds ?? old.spec?.terminationGracePeriodSeconds ?? 30;
      const immediate = grace === 0 || !old.spec?.nodeName || isTerminal(old);
      if (!immediate || old.metadata.finalizers?.length) {
        const deadline = this.clock() + grace * 1000;
        const current = old.metadata.deletionTimestamp ? Date.parse(old.metadata.deletionTimestamp) : Infinity;
        if (deadline >= current && !old.metadata.finalizers?.length) return {object: old, gone: false};
        const next = structuredClone(old);
        next.metadata.deletionTimestamp = nowRfc3339(() => deadline);
        next.metadata.deletionGracePeriodSeconds = grace;
        const written = this.log.write(type.storageKey, 'MODIFIED', next);
        if (!old.metadata.finalizers?.length) this.schedulePodRemoval(written, grace === 0 ? 0 : deadline - this.clock());
        return {object: written, gone: false};
      }
    } else if (old.metadata.finalizers?.length) {
      if (old.metadata.deletionTimestamp) return {object: old, gone: false};
      const next = structuredClone(old);
      next.metadata.deletionTimestamp = nowRfc3339(this.clock);
      next.metadata.deletionGracePeriodSeconds = 0;
      return {object: this.log.write(type.storageKey, 'MODIFIED', next), gone: false};
    }
    if (type.resource === 'namespaces') this.emptyNamespace(old);
    return {object: this.remove(type, old), gone: true};
  }

  deleteCollection(ref: ResourceRef, options: ListOptions, deleteOptions: DeleteOptions = {}): KubeObject[] {
    const type = this.type(ref);
    const {items} = this.list(type, {...options, limit: undefined, continue: undefined});
    return items.map((obj) => this.delete(type, obj.metadata.namespace, obj.metadata.name, deleteOptions).object);
  }

  /** takePropagationPolicy: the propagationPolicy the delete of uid asked for (read once, by the garbage collector). */
  takePropagationPolicy(uid: string): string | undefined {
    const policy = this.propagationPolicies.get(uid);
    this.propagationPolicies.delete(uid);
    return policy;
  }

  /** pods/binding: sets spec.nodeName once, as the scheduler does. */
  bind(namespace: string, name: string, nodeName: string): KubeObject {
    const old = this.get('pods', namespace, name);
    if (old.spec?.nodeName) throw conflict('pods', '', name, `pod ${name} is already assigned to node "${old.spec.nodeName}"`);
    const next = structuredClone(old);
    next.spec.nodeName = nodeName;
    return this.log.write('pods', 'MODIFIED', next);
  }

  /** Cancels pending pod removals. */
  stop(): void {
    for (const timer of this.podDeletions.values()) clearTimeout(timer);
    this.podDeletions.clear();
  }

  private remove(type: ResourceType, obj: KubeObject): KubeObject {
    const final: KubeObject = {...obj, metadata: {...obj.metadata}};
    const key = `${obj.metadata.namespace}/${obj.metadata.name}`;
    if (type.resource === 'pods') {
      clearTimeout(this.podDeletions.get(key));
      this.podDeletions.delete(key);
    }
    if (type.resource === 'services') releaseServiceAddresses(obj, this.network);
    return this.log.write(type.storageKey, 'DELETED', final);
  }

  private schedulePodRemoval(pod: KubeObject, delayMs: number): void {
    const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
    clearTimeout(this.podDeletions.get(key));
    const uid = pod.metadata.uid;
    const timer = setTimeout(
      () => {
        this.podDeletions.delete(key);
        const current = this.log.get('pods', pod.metadata.namespace, pod.metadata.name);
        if (current && current.metadata.uid === uid && !current.metadata.finalizers?.length) this.remove(this.type('pods'), current);
      },
      Math.max(0, delayMs),
    );
    timer.unref();
    this.podDeletions.set(key, timer);
  }

  private emptyNamespace(ns: KubeObject): void {
    const name = ns.metadata.name;
    const terminating = structuredClone(ns);
    terminating.metadata.deletionTimestamp = nowRfc3339(this.clock);
    terminating.status = {...(terminating.status ?? {}), phase: 'Terminating'};
    this.log.write('namespaces', 'MODIFIED', terminating);
    for (const storageKey of namespacedStorageKeys()) {
      const type = this.type(storageKey);
      for (const obj of this.log.list(storageKey, name)) this.remove(type, obj);
    }
  }

  private afterNamespaceCreated(ns: KubeObject): void {
    // The service account controller's job: every namespace has a "default" service account.
    const name = ns.metadata.name;
    if (!this.log.get('serviceaccounts', name, 'default')) {
      this.create('serviceaccounts', {apiVersion: 'v1', kind: 'ServiceAccount', metadata: {name: 'default', namespace: name}}, name);
    }
  }

  private stampKind(type: ResourceType, obj: KubeObject): void {
    const {apiVersion: _a, kind: _k, ...rest} = obj;
    for (const key of Object.keys(obj)) delete obj[key];
    // Stored in the storage version, whichever served version the request named.
    Object.assign(obj, {apiVersion: groupVersion(storageType(type.storageKey)), kind: type.kind}, rest);
  }

  private prepareForCreate(type: ResourceType, obj: KubeObject, options: WriteOptions): void {
    switch (type.resource) {
      case 'pods':
        defaultPod(obj);
        if (!options.keepStatus || !obj.status) obj.status = {phase: 'Pending', qosClass: 'BestEffort'};
        break;
      case 'services':
        defaultService(obj, undefined, this.network);
        if (!options.keepStatus || !obj.status) obj.status = {loadBalancer: {}};
        break;
      case 'namespaces':
        obj.spec ??= {finalizers: ['kubernetes']};
        obj.status = {phase: 'Active'};
        obj.metadata.labels = {...(obj.metadata.labels ?? {}), 'kubernetes.io/metadata.name': obj.metadata.name};
        break;
      case 'endpointslices':
        defaultEndpointSlice(obj);
        break;
      case 'deployments':
      case 'replicasets':
        defaultWorkload(obj);
        if (!options.keepStatus) obj.status = {};
        break;
      case 'daemonsets':
        defaultWorkload(obj);
        setTemplateGeneration(obj, undefined);
        if (!options.keepStatus) obj.status = emptyDaemonSetStatus();
        break;
      case 'servicecidrs':
        // kube-apiserver's ServiceCIDR controller marks a new range Ready; here that happens at once.
        if (!options.keepStatus || !obj.status) obj.status = readyServiceCIDRStatus(nowRfc3339(this.clock));
        break;
    }
  }

  private validate(type: ResourceType, obj: KubeObject, old: KubeObject | undefined, options: WriteOptions = {}): FieldError[] {
    switch (type.storageKey) {
      case 'services':
        return validateService(obj, old, this.network);
      case 'pods':
        return old ? validatePodUpdate(obj, old) : validatePod(obj);
      case 'discovery.k8s.io/endpointslices':
        return validateEndpointSlice(obj, {allowSpecialAddresses: options.apiServerEndpoints});
      case 'networking.k8s.io/servicecidrs':
        return validateServiceCIDR(obj, old);
      case 'apps/deployments':
      case 'apps/replicasets':
      case 'apps/daemonsets':
      case 'apps/controllerrevisions':
        return validateWorkload(obj, old);
      default:
        return validateObjectMeta(obj, nameRules[type.resource] ?? (type.group.startsWith('rbac') ? 'any' : 'dns1123-subdomain'));
    }
  }
}

function withoutManagedFields(obj: KubeObject): string {
  return canonicalJson({...obj, metadata: {...obj.metadata, managedFields: undefined}});
}

/** The same managers own the same fields (times aside): a no-op apply keeps the object as it is. */
function sameOwnership(a: KubeObject, b: KubeObject): boolean {
  const owners = (o: KubeObject) => canonicalJson((o.metadata.managedFields ?? []).map((e: any) => ({...e, time: undefined})));
  return owners(a) === owners(b);
}

function keyOf(obj: KubeObject): string {
  return obj.metadata.namespace ? `${obj.metadata.namespace}/${obj.metadata.name}` : obj.metadata.name;
}

function isTerminal(pod: KubeObject): boolean {
  return pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed';
}

function namespacedStorageKeys(): string[] {
  return [...new Set(resourceTypes.filter((type) => type.namespaced && !isReview(type)).map((type) => type.storageKey))];
}

export {ApiError};
