// The create (and pods/binding), update and patch verbs; the status subresource is the same verbs
// with WriteOptions.subresource "status", which the store's rules tell apart.
import {fieldError, invalid, methodNotAllowed, unsupportedMediaType} from '../api-error.ts';
import {ClusterStore, type WriteOptions} from '../cluster-store.ts';
import {endpointSliceFromV1beta1} from '../endpointslice-rules.ts';
import {ObjectLog, type KubeObject} from '../object-log.ts';
import type {ResourceType} from '../resources.ts';
import type {ResourceHandler, ResourceRequest} from './context.ts';
import {patchTypes} from '../patch.ts';
import {validateFields} from '../field-validation.ts';
import type {ServerResponse} from 'node:http';
import {readBody} from './request-body.ts';
import {sendJson, sendObject} from './response.ts';
import type {Route} from './routing.ts';
import {accept, checkKind, isV1beta1Slice, present} from './served-version.ts';

export const createObject: ResourceHandler = async ({store}, {req, res, url, route, writeOptions}) => {
  const {type} = route;
  if (route.name && route.subresource === 'binding') {
    const body = await readBody(req);
    const target = body?.target?.name;
    if (!target) throw invalid('Binding', '', route.name, [fieldError.required('target.name')]);
    store.bind(route.namespace!, route.name, target);
    sendJson(res, 201, {kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', code: 201});
    return;
  }
  if (route.name || (type.namespaced && !route.namespace)) throw methodNotAllowed();
  const body = accept(type, validatedBody(type, await readBody(req), url, res));
  checkKind(type, body);
  const created = store.create(type, body, route.namespace, writeOptions);
  sendObject(req, res, url, type, 201, created);
};

export const updateObject: ResourceHandler = async ({store}, {req, res, url, route, writeOptions}) => {
  const {type} = route;
  if (!route.name) throw methodNotAllowed();
  const body = accept(type, validatedBody(type, await readBody(req), url, res));
  checkKind(type, body);
  const updated = store.update(type, body, route.namespace, writeOptions, route.name);
  sendObject(req, res, url, type, 200, updated);
};

export const patchObject: ResourceHandler = async ({store}, {req, res, url, route, writeOptions}) => {
  const {type} = route;
  if (!route.name) throw methodNotAllowed();
  const contentType = req.headers['content-type'] ?? '';
  if (contentType.startsWith(patchTypes.apply)) {
    await applyObject(store, {req, res, url, route, writeOptions});
    return;
  }
  const patch = await readBody(req);
  if (!contentType.startsWith(patchTypes.json)) validateFields(type, patch, url, res);
  const patched = isV1beta1Slice(type)
    ? patchThroughV1beta1(store, type, route, contentType, patch, writeOptions)
    : store.patch(type, route.namespace, route.name, contentType, patch, writeOptions);
  sendObject(req, res, url, type, 200, patched);
};

function validatedBody(type: ResourceType, body: unknown, url: URL, res: ServerResponse): any {
  validateFields(type, body, url, res);
  return body;
}

/** Server-side apply: PATCH application/apply-patch+yaml with ?fieldManager= (required) and ?force=true. */
async function applyObject(
  store: ClusterStore,
  {req, res, url, route, writeOptions}: Pick<ResourceRequest, 'req' | 'res' | 'url' | 'route' | 'writeOptions'>,
) {
  const {type} = route;
  const manager = url.searchParams.get('fieldManager') ?? '';
  if (!manager) throw invalid('PatchOptions', 'meta.k8s.io', '', [fieldError.required('fieldManager', 'is required for apply patch')]);
  if (isV1beta1Slice(type)) throw unsupportedMediaType(req.headers['content-type'] ?? '');
  const body = accept(type, validatedBody(type, await readBody(req), url, res));
  checkKind(type, body);
  const force = url.searchParams.get('force') === 'true';
  const {object, created} = store.apply(type, route.namespace, route.name!, body, {manager, force}, writeOptions);
  sendObject(req, res, url, type, created ? 201 : 200, object);
}

function patchThroughV1beta1(
  store: ClusterStore,
  type: ResourceType,
  route: Route,
  contentType: string,
  patch: unknown,
  writeOptions: WriteOptions,
): KubeObject {
  // Patch the v1beta1 form, then store it converted back.
  const current = present(type, store.get(type, route.namespace, route.name!));
  const scratch = new ClusterStore(new ObjectLog(2), store.network);
  scratch.log.write('namespaces', 'ADDED', {metadata: {name: route.namespace!}});
  scratch.log.write(type.storageKey, 'ADDED', structuredClone(current));
  const patched = scratch.patch(type, route.namespace, route.name!, contentType, patch, {dryRun: true});
  const body = endpointSliceFromV1beta1(patched);
  body.metadata.resourceVersion = undefined;
  return store.update(type, body, route.namespace, writeOptions, route.name);
}
