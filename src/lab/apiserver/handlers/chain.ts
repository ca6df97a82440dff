// The handler chain every request goes through, as kube-apiserver's: health checks (for everyone),
// authentication, non-resource documents, routing, authorization, then the handler of the verb.
import type {IncomingMessage, ServerResponse} from 'node:http';
import {badRequest, methodNotAllowed, pathNotFound} from '../api-error.ts';
import type {WriteOptions} from '../cluster-store.ts';
import {isReview} from '../resources.ts';
import {authenticate} from './authentication.ts';
import {authorize} from './authorization.ts';
import type {ResourceHandler, ServerContext} from './context.ts';
import {deleteCollection, deleteObject} from './delete.ts';
import {healthPaths, nonResourceDocument, sendDocument, sendHealth} from './non-resource.ts';
import {getObject, listObjects} from './read.ts';
import {readBody} from './request-body.ts';
import {checkAccept, sendJson} from './response.ts';
import {answerReview} from './review.ts';
import {podLog} from './pod-log.ts';
import {parseRoute, verbOf} from './routing.ts';
import {scaleSubresource} from './scale.ts';
import {watchObjects} from './watch.ts';
import {createObject, patchObject, updateObject} from './write.ts';

/** The router: one handler per verb. */
const resourceHandlers: Record<string, ResourceHandler> = {
  get: getObject,
  list: listObjects,
  watch: watchObjects,
  create: createObject,
  update: updateObject,
  patch: patchObject,
  delete: deleteObject,
  deletecollection: deleteCollection,
};

/** Verbs a subresource (status, binding) takes even where its resource's verbs lack them. */
const subresourceVerbs = ['get', 'update', 'patch', 'create'];

/** The manager a write's fields are recorded under: ?fieldManager=, else the User-Agent's product, as kube-apiserver. */
function fieldManagerOf(req: IncomingMessage, url: URL): string {
  return url.searchParams.get('fieldManager') || (req.headers['user-agent'] ?? '').split('/')[0].slice(0, 128);
}

export async function handleRequest(context: ServerContext, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://apiserver');
  const pathname = url.pathname.length > 1 ? url.pathname.replace(/\/+$/, '') : url.pathname;
  const method = req.method ?? 'GET';
  // Health checks answer everyone, even a wrong token, as probes need.
  if (healthPaths.has(pathname)) {
    sendHealth(res);
    return;
  }
  const user = authenticate(context, req);
  const nonResource = nonResourceDocument(pathname, req, context.hostPort);
  if (nonResource !== undefined) {
    authorize(context.access, {user, verb: method.toLowerCase() === 'get' ? 'get' : method.toLowerCase(), path: pathname});
    if (method !== 'GET' && method !== 'HEAD') throw methodNotAllowed();
    sendDocument(res, nonResource);
    return;
  }

  const route = parseRoute(pathname, url.searchParams);
  if (!route) throw pathNotFound();
  const {type} = route;
  const verb = verbOf(method, route);
  if (route.subresource === 'portforward') throw badRequest('Upgrade request required');
  authorize(context.access, {
    user,
    verb,
    group: type.group,
    resource: type.resource,
    subresource: route.subresource,
    namespace: route.namespace,
    name: route.name,
  });
  if (!type.verbs.includes(verb) && !(route.subresource && subresourceVerbs.includes(verb))) throw methodNotAllowed();
  const dryRun = url.searchParams.getAll('dryRun').includes('All');
  const writeOptions: WriteOptions = {
    dryRun,
    subresource: route.subresource === 'status' ? 'status' : '',
    fieldManager: fieldManagerOf(req, url),
  };

  checkAccept(req);
  if (isReview(type)) {
    if (method !== 'POST' || route.name) throw methodNotAllowed();
    sendJson(res, 201, answerReview(context.access, type, await readBody(req), user, route.namespace));
    return;
  }

  const handler = route.subresource === 'log' ? podLog : route.subresource === 'scale' ? scaleSubresource : resourceHandlers[verb];
  if (!handler) throw methodNotAllowed();
  await handler(context, {req, res, url, route, user, dryRun, writeOptions});
}
