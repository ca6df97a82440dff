// The embedded Kubernetes API server: HTTP on loopback, kube-apiserver's REST protocol over the in-memory store.
import {randomBytes} from 'node:crypto';
import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http';
import type {AddressInfo, Socket} from 'node:net';
import type {Duplex} from 'node:stream';
import {writeFile} from 'node:fs/promises';
import {stringify as toYaml, parse as parseYaml} from 'yaml';
import {AccessControl, anonymousUser, forbiddenReason, type Attributes, type Grant, type UserEntry, type UserInfo} from './access-control.ts';
import {ApiError, badField, badRequest, fieldError, forbidden, invalid, methodNotAllowed, pathNotFound, unauthorized, unsupportedMediaType} from './api-error.ts';
import {ClusterStore, type DeleteOptions, type WriteOptions} from './cluster-store.ts';
import {coreVersions, group, groupList, openApiV2, openApiV2Protobuf, resourceList, serverVersion} from './discovery.ts';
import {EndpointSliceController} from './endpointslice-controller.ts';
import {endpointSliceFromV1beta1, endpointSliceToV1beta1} from './endpointslice-rules.ts';
import {Cidr, ClusterIPAllocator, NodePortAllocator, PortRange} from './ip-allocator.ts';
import {ObjectLog, type KubeObject, type StoredEvent} from './object-log.ts';
import {podIPResolver, requestedPorts, type PodAddressResolver} from './portforward-target.ts';
import {WebSocketPortForwarder} from './portforward-websocket.ts';
import {listenPlainAndTls} from './tls-listener.ts';
import {SpdyPortForwarder} from './portforward-spdy.ts';
import {defaultServiceCIDR} from './servicecidr-rules.ts';
import {findResource, groupVersion, isReview, type ResourceType} from './resources.ts';
import {matchesFields, matchesLabels, parseFieldSelector, parseLabelSelector} from './selectors.ts';
import {toTable, type IncludeObject} from './table-printer.ts';

export interface ApiServerOptions {
  /** 0 (the default) picks a free port. */
  port?: number;
  /** Only loopback addresses are accepted. */
  host?: string;
  /** One CIDR, or two separated by a comma for dual-stack. */
  serviceCIDR?: string;
  nodePortRange?: string;
  /** How many changes are kept for watches resuming from an older resourceVersion (older ones get 410 Gone). */
  watchWindow?: number;
  /** Seconds between BOOKMARK events for watches that allow them. */
  bookmarkIntervalSeconds?: number;
  /** A watch without timeoutSeconds ends after this long, as kube-apiserver's --min-request-timeout does. */
  maxWatchSeconds?: number;
  /** Where pods/portforward streams go; the pod IP by default. */
  resolvePodAddress?: PodAddressResolver;
  /** Users besides "admin" (who is in system:masters). */
  users?: UserEntry[];
  grants?: Grant[];
  /** The admin token; random by default. */
  adminToken?: string;
  maxEndpointsPerSlice?: number;
  /**
   * Who a request without credentials is. "anonymous" (the default, as kube-apiserver's
   * --anonymous-auth): system:anonymous, through RBAC, which grants it only the health checks and
   * /version (system:public-info-viewer), so anything else is a 403. "reject": 401, as
   * --anonymous-auth=false. "admin": an administrator, as kube-apiserver's old insecure port was.
   */
  unauthenticated?: 'anonymous' | 'reject' | 'admin';
  /** The address the `kubernetes` service's EndpointSlice names; defaults to host. */
  advertiseAddress?: string;
  /**
   * The kubeconfig's cluster name, and the suffix of its user and context names ("admin@NAME");
   * distinct per server so that kubeconfigs of several servers can be merged. Default "proxyctl-lab".
   */
  clusterName?: string;
}

export interface KubeconfigOptions {
  user?: string;
  token?: string;
  namespace?: string;
}

export interface ApiServer {
  /** http://host:port, for programmatic clients on loopback (they send their token over it). */
  url: string;
  /** https://host:port, the same server over TLS: what the kubeconfig names, for kubectl. */
  secureUrl: string;
  host: string;
  port: number;
  store: ClusterStore;
  access: AccessControl;
  endpointSlices: EndpointSliceController;
  adminToken: string;
  kubeconfig(options?: KubeconfigOptions): string;
  writeKubeconfig(path: string, options?: KubeconfigOptions): Promise<void>;
  /** Resolves when the controllers have caught up with every change so far. */
  settle(): Promise<void>;
  stop(): Promise<void>;
}

interface Route {
  type: ResourceType;
  namespace?: string;
  name?: string;
  subresource?: string;
  watch: boolean;
}

const healthPaths = new Set(['/healthz', '/livez', '/readyz']);
const localAdmin: UserInfo = {username: 'system:admin', groups: ['system:masters', 'system:authenticated']};
const maxBodyBytes = 16 * 1024 * 1024;
const slowWatcherBytes = 64 * 1024 * 1024;
// kube-apiserver names the type application/com.github.proto-openapi.spec.v2@v1.0+protobuf, which Go's
// mime parser (and so client-go 1.20) rejects; a generic binary type decodes the same.
const protobufOpenApi = 'application/octet-stream';

function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

export async function startApiServer(options: ApiServerOptions = {}): Promise<ApiServer> {
  const host = options.host ?? '127.0.0.1';
  if (!isLoopback(host)) throw new Error(`api server host ${host}: only loopback addresses are allowed`);
  const cidrs = (options.serviceCIDR ?? '10.96.0.0/12').split(',').map((c) => new Cidr(c));
  const network = {clusterIPs: cidrs.map((c) => new ClusterIPAllocator(c)), nodePorts: new NodePortAllocator(new PortRange(options.nodePortRange ?? '30000-32767'))};
  const log = new ObjectLog(options.watchWindow ?? 10000);
  const store = new ClusterStore(log, network);
  const adminToken = options.adminToken ?? randomBytes(24).toString('hex');
  const access = new AccessControl(log, [{name: 'admin', token: adminToken, groups: ['system:masters']}, ...(options.users ?? [])], options.grants ?? []);
  const controller = new EndpointSliceController(store, {maxEndpointsPerSlice: options.maxEndpointsPerSlice});
  const resolver = options.resolvePodAddress ?? podIPResolver;
  const wsForwarder = new WebSocketPortForwarder(resolver);
  const spdyForwarder = new SpdyPortForwarder(resolver);
  const bookmarkMs = (options.bookmarkIntervalSeconds ?? 60) * 1000;
  const maxWatchMs = (options.maxWatchSeconds ?? 1800) * 1000;
  const watchTimers = new Set<() => void>();
  let hostPort = '';

  for (const name of ['default', 'kube-system', 'kube-public', 'kube-node-lease']) store.create('namespaces', {metadata: {name}});

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((err) => sendError(res, err));
  });
  server.keepAliveTimeout = 30_000;
  const sockets = new Set<Socket>();
  const track = (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  };
  server.on('upgrade', (req, socket, head) => {
    handleUpgrade(req, socket, head).catch((err) => rejectUpgrade(socket, err));
  });

  function authenticate(req: IncomingMessage): UserInfo {
    const header = req.headers.authorization;
    if (!header) {
      if (options.unauthenticated === 'reject') throw unauthorized();
      return options.unauthenticated === 'admin' ? localAdmin : anonymousUser;
    }
    const m = header.match(/^Bearer\s+(.+)$/i);
    if (!m) throw unauthorized();
    const user = access.authenticate(m[1].trim());
    if (!user) throw unauthorized();
    return user;
  }

  function authorize(attrs: Attributes): void {
    if (access.authorize(attrs).allowed) return;
    if (attrs.path !== undefined) throw new ApiError(403, 'Forbidden', `forbidden: ${forbiddenReason(attrs)}`);
    throw forbidden(attrs.resource ?? '', attrs.group ?? '', attrs.name ?? '', forbiddenReason(attrs));
  }

  function parseRoute(pathname: string, search: URLSearchParams): Route | undefined {
    const parts = pathname.split('/').filter(Boolean);
    let groupName = '';
    let version: string;
    let rest: string[];
    if (parts[0] === 'api' && parts.length >= 3) {
      version = parts[1];
      rest = parts.slice(2);
    } else if (parts[0] === 'apis' && parts.length >= 4) {
      groupName = parts[1];
      version = parts[2];
      rest = parts.slice(3);
    } else return undefined;
    let watch = search.get('watch') === '1' || search.get('watch') === 'true';
    if (rest[0] === 'watch') {
      watch = true;
      rest = rest.slice(1);
    }
    let namespace: string | undefined;
    if (rest[0] === 'namespaces' && rest.length >= 3) {
      const inner = findResource(groupName, version, rest[2]);
      if (inner?.namespaced) {
        namespace = decodeURIComponent(rest[1]);
        rest = rest.slice(2);
      }
    }
    const type = findResource(groupName, version, rest[0] ?? '');
    if (!type || rest.length > 3) return undefined;
    const name = rest[1] !== undefined ? decodeURIComponent(rest[1]) : undefined;
    const subresource = rest[2];
    if (subresource !== undefined && !type.subresources.includes(subresource)) return undefined;
    return {type, namespace, name, subresource, watch};
  }

  function verbOf(method: string, route: Route): string {
    switch (method) {
      case 'GET':
      case 'HEAD':
        return route.watch ? 'watch' : route.name ? 'get' : 'list';
      case 'POST':
        return 'create';
      case 'PUT':
        return 'update';
      case 'PATCH':
        return 'patch';
      case 'DELETE':
        return route.name ? 'delete' : 'deletecollection';
      default:
        throw methodNotAllowed();
    }
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://apiserver');
    const pathname = url.pathname.length > 1 ? url.pathname.replace(/\/+$/, '') : url.pathname;
    const method = req.method ?? 'GET';
    // Health checks answer everyone, even a wrong token, as probes need.
    if (healthPaths.has(pathname)) {
      res.writeHead(200, {'content-type': 'text/plain; charset=utf-8', 'content-length': 2});
      res.end('ok');
      return;
    }
    const user = authenticate(req);
    const nonResource = nonResourceDocument(pathname, req);
    if (nonResource !== undefined) {
      authorize({user, verb: method.toLowerCase() === 'get' ? 'get' : method.toLowerCase(), path: pathname});
      if (method !== 'GET' && method !== 'HEAD') throw methodNotAllowed();
      if (Buffer.isBuffer(nonResource)) {
        res.writeHead(200, {'content-type': protobufOpenApi, 'content-length': nonResource.length});
        res.end(nonResource);
      } else sendJson(res, 200, nonResource);
      return;
    }

    const route = parseRoute(pathname, url.searchParams);
    if (!route) throw pathNotFound();
    const {type} = route;
    const verb = verbOf(method, route);
    if (route.subresource === 'portforward') throw badRequest('Upgrade request required');
    authorize({user, verb, group: type.group, resource: type.resource, subresource: route.subresource, namespace: route.namespace, name: route.name});
    if (!type.verbs.includes(verb) && !(route.subresource && ['get', 'update', 'patch', 'create'].includes(verb))) throw methodNotAllowed();
    const dryRun = url.searchParams.getAll('dryRun').includes('All');
    const writeOptions: WriteOptions = {dryRun, subresource: route.subresource === 'status' ? 'status' : ''};

    if (isReview(type)) {
      if (method !== 'POST' || route.name) throw methodNotAllowed();
      sendJson(res, 201, review(type, await readBody(req), user, route.namespace));
      return;
    }

    switch (verb) {
      case 'get': {
        const obj = store.get(type, route.namespace, route.name!);
        sendObject(req, res, url, type, 200, obj);
        return;
      }
      case 'list': {
        const result = store.list(type, {
          namespace: route.namespace,
          labelSelector: url.searchParams.get('labelSelector') ?? undefined,
          fieldSelector: url.searchParams.get('fieldSelector') ?? undefined,
          limit: url.searchParams.has('limit') ? Number(url.searchParams.get('limit')) : undefined,
          continue: url.searchParams.get('continue') ?? undefined,
        });
        const meta: Record<string, unknown> = {resourceVersion: result.resourceVersion};
        if (result.continue) {
          meta.continue = result.continue;
          meta.remainingItemCount = result.remainingItemCount;
        }
        const table = tableRequest(req, url);
        if (table) {
          sendJson(res, 200, toTable(type.kind, result.items.map((o) => present(type, o)), result.resourceVersion, table, Date.now(), result.continue ? {continue: result.continue} : {}));
          return;
        }
        sendText(res, 200, listJson(type, result.items, meta));
        return;
      }
      case 'watch':
        serveWatch(req, res, url, route);
        return;
      case 'create': {
        if (route.name && route.subresource === 'binding') {
          const body = await readBody(req);
          const target = body?.target?.name;
          if (!target) throw invalid('Binding', '', route.name, [fieldError.required('target.name')]);
          store.bind(route.namespace!, route.name, target);
          sendJson(res, 201, {kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', code: 201});
          return;
        }
        if (route.name || (type.namespaced && !route.namespace)) throw methodNotAllowed();
        const body = accept(type, await readBody(req));
        checkKind(type, body);
        const created = store.create(type, body, route.namespace, writeOptions);
        sendObject(req, res, url, type, 201, created);
        return;
      }
      case 'update': {
        if (!route.name) throw methodNotAllowed();
        const body = accept(type, await readBody(req));
        checkKind(type, body);
        const updated = store.update(type, body, route.namespace, writeOptions, route.name);
        sendObject(req, res, url, type, 200, updated);
        return;
      }
      case 'patch': {
        if (!route.name) throw methodNotAllowed();
        const contentType = req.headers['content-type'] ?? '';
        if (contentType.startsWith('application/apply-patch')) throw unsupportedMediaType(contentType);
        const patch = await readBody(req);
        const patched =
          type.version === 'v1beta1' && type.group === 'discovery.k8s.io'
            ? patchThroughV1beta1(type, route, contentType, patch, writeOptions)
            : store.patch(type, route.namespace, route.name, contentType, patch, writeOptions);
        sendObject(req, res, url, type, 200, patched);
        return;
      }
      case 'delete': {
        const deleteOptions = await deleteOptionsOf(req, url);
        const {object, gone} = store.delete(type, route.namespace, route.name!, {...deleteOptions, dryRun});
        if (type.deleteReturnsObject || !gone) sendObject(req, res, url, type, 200, object);
        else sendJson(res, 200, successStatus(type, object));
        return;
      }
      case 'deletecollection': {
        const deleteOptions = await deleteOptionsOf(req, url);
        const deleted = store.deleteCollection(
          type,
          {namespace: route.namespace, labelSelector: url.searchParams.get('labelSelector') ?? undefined, fieldSelector: url.searchParams.get('fieldSelector') ?? undefined},
          {...deleteOptions, dryRun},
        );
        sendText(res, 200, listJson(type, deleted, {resourceVersion: String(log.currentRevision)}));
        return;
      }
      default:
        throw methodNotAllowed();
    }
  }

  function nonResourceDocument(pathname: string, req: IncomingMessage): Record<string, unknown> | Buffer | undefined {
    switch (pathname) {
      case '/version':
        return serverVersion;
      case '/api':
        return coreVersions(hostPort);
      case '/apis':
        return groupList();
      case '/api/v1':
        return resourceList('', 'v1');
      case '/openapi/v2':
        return (req.headers.accept ?? '').includes('protobuf') ? openApiV2Protobuf() : openApiV2();
    }
    const m = pathname.match(/^\/apis\/([^/]+)(?:\/([^/]+))?$/);
    if (m) {
      const doc = m[2] ? resourceList(m[1], m[2]) : group(m[1]);
      if (!doc) throw pathNotFound();
      return doc;
    }
    return undefined;
  }

  function checkKind(type: ResourceType, body: KubeObject): void {
    if (body.kind !== undefined && body.kind !== type.kind) {
      throw badField('kind', `the object provided is unrecognized (must be of type ${type.kind}): ${body.kind} is not ${type.kind}`);
    }
    if (body.apiVersion !== undefined && body.apiVersion !== groupVersion(type)) {
      throw badField('apiVersion', `the API version in the data (${body.apiVersion}) does not match the expected API version (${groupVersion(type)})`);
    }
  }

  /** Incoming objects in a served version that is not the storage version are converted. */
  function accept(type: ResourceType, body: any): KubeObject {
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw badRequest('the body of the request must be a JSON object');
    if (type.group === 'discovery.k8s.io' && type.version === 'v1beta1') {
      const converted = endpointSliceFromV1beta1(body);
      converted.apiVersion = body.apiVersion;
      return converted;
    }
    return body;
  }

  function present(type: ResourceType, obj: KubeObject): KubeObject {
    if (type.group === 'discovery.k8s.io' && type.version === 'v1beta1') return endpointSliceToV1beta1(obj);
    return obj;
  }

  function patchThroughV1beta1(type: ResourceType, route: Route, contentType: string, patch: unknown, writeOptions: WriteOptions): KubeObject {
    // Patch the v1beta1 form, then store it converted back.
    const current = present(type, store.get(type, route.namespace, route.name!));
    const scratch = new ClusterStore(new ObjectLog(2), network);
    scratch.log.write('namespaces', 'ADDED', {metadata: {name: route.namespace!}});
    scratch.log.write(type.storageKey, 'ADDED', structuredClone(current));
    const patched = scratch.patch(type, route.namespace, route.name!, contentType, patch, {dryRun: true});
    const body = endpointSliceFromV1beta1(patched);
    body.metadata.resourceVersion = undefined;
    return store.update(type, body, route.namespace, writeOptions, route.name);
  }

  function tableRequest(req: IncomingMessage, url: URL): IncludeObject | undefined {
    const acceptHeader = req.headers.accept ?? '';
    const first = acceptHeader.split(',')[0];
    if (!first.includes('as=Table')) return undefined;
    const include = url.searchParams.get('includeObject');
    return include === 'None' || include === 'Object' ? include : 'Metadata';
  }

  function sendObject(req: IncomingMessage, res: ServerResponse, url: URL, type: ResourceType, code: number, obj: KubeObject): void {
    const table = tableRequest(req, url);
    const shown = present(type, obj);
    if (table) sendJson(res, code, toTable(type.kind, [shown], obj.metadata.resourceVersion ?? '', table));
    else sendJson(res, code, shown);
  }

  function listJson(type: ResourceType, items: KubeObject[], meta: Record<string, unknown>): string {
    const parts = items.map((o) => JSON.stringify(present(type, o)));
    return `{"kind":${JSON.stringify(`${type.kind}List`)},"apiVersion":${JSON.stringify(groupVersion(type))},"metadata":${JSON.stringify(meta)},"items":[${parts.join(',')}]}`;
  }

  function serveWatch(req: IncomingMessage, res: ServerResponse, url: URL, route: Route): void {
    const {type} = route;
    const search = url.searchParams;
    const labels = search.get('labelSelector') ? parseLabelSelector(search.get('labelSelector')!) : [];
    let fieldText = search.get('fieldSelector') ?? '';
    if (route.name) fieldText = fieldText ? `${fieldText},metadata.name=${route.name}` : `metadata.name=${route.name}`;
    const fields = fieldText ? parseFieldSelector(fieldText, type.resource) : [];
    const namespace = route.namespace;
    const visible = (o: KubeObject) =>
      (!namespace || o.metadata.namespace === namespace) && (labels.length === 0 || matchesLabels(labels, o.metadata.labels)) && (fields.length === 0 || matchesFields(fields, o));
    const table = tableRequest(req, url);
    const formatKey = `${type.version}|${table ?? 'json'}`;
    const encode = (obj: KubeObject) => JSON.stringify(table ? toTable(type.kind, [present(type, obj)], obj.metadata.resourceVersion ?? '', table) : present(type, obj));
    const encodedEvent = (event: StoredEvent) => {
      let text = event.encoded.get(formatKey);
      if (text === undefined) {
        text = encode(event.object);
        event.encoded.set(formatKey, text);
      }
      return text;
    };
    const rvParam = search.get('resourceVersion') ?? '';
    const allowBookmarks = search.get('allowWatchBookmarks') === 'true' || search.get('allowWatchBookmarks') === '1';
    const timeoutSeconds = search.has('timeoutSeconds') ? Number(search.get('timeoutSeconds')) : undefined;

    res.writeHead(200, {'content-type': 'application/json', 'cache-control': 'no-cache, private', 'transfer-encoding': 'chunked'});
    res.flushHeaders();
    let finished = false;
    const write = (line: string) => {
      if (finished) return;
      res.write(line);
      if (res.writableLength > slowWatcherBytes) finish(true);
    };
    const bookmark = () => {
      const obj = {kind: type.kind, apiVersion: groupVersion(type), metadata: {resourceVersion: String(log.currentRevision)}};
      write(`{"type":"BOOKMARK","object":${JSON.stringify(obj)}}\n`);
    };

    let startRevision: number;
    if (rvParam === '' || rvParam === '0') {
      for (const obj of store.list(type, {namespace}).items) if (visible(obj)) write(`{"type":"ADDED","object":${encode(obj)}}\n`);
      startRevision = log.currentRevision;
    } else {
      startRevision = Number(rvParam);
      if (!Number.isInteger(startRevision) || startRevision < 0) {
        const status = badRequest(`invalid resource version: strconv.ParseUint: parsing ${JSON.stringify(rvParam)}: invalid syntax`).toStatus();
        write(`{"type":"ERROR","object":${JSON.stringify(status)}}\n`);
        res.end();
        return;
      }
    }
    const deliver = (event: StoredEvent) => {
      if (event.revision <= startRevision) return;
      const now = visible(event.object);
      const before = event.previous !== undefined && event.type === 'MODIFIED' && visible(event.previous);
      let t: string | undefined;
      if (event.type === 'ADDED') t = now ? 'ADDED' : undefined;
      else if (event.type === 'DELETED') t = now ? 'DELETED' : undefined;
      else if (now) t = before ? 'MODIFIED' : 'ADDED';
      else if (before) t = 'DELETED';
      if (t) write(`{"type":"${t}","object":${encodedEvent(event)}}\n`);
    };
    let backlog: StoredEvent[];
    try {
      backlog = log.eventsSince(type.storageKey, startRevision);
    } catch (err) {
      const status = err instanceof ApiError ? err.toStatus() : badRequest(String(err)).toStatus();
      write(`{"type":"ERROR","object":${JSON.stringify(status)}}\n`);
      finished = true;
      res.end();
      return;
    }
    for (const event of backlog) deliver(event);
    const unsubscribe = log.subscribe(type.storageKey, deliver);
    const bookmarkTimer = allowBookmarks ? setInterval(bookmark, bookmarkMs) : undefined;
    const limitMs = timeoutSeconds !== undefined && timeoutSeconds >= 0 ? timeoutSeconds * 1000 : maxWatchMs;
    const endTimer = setTimeout(() => {
      if (allowBookmarks) bookmark();
      finish(false);
    }, limitMs);
    function finish(abort: boolean): void {
      if (finished) return;
      finished = true;
      unsubscribe();
      clearInterval(bookmarkTimer);
      clearTimeout(endTimer);
      watchTimers.delete(stopWatch);
      if (abort) res.destroy();
      else res.end();
    }
    const stopWatch = () => finish(false);
    watchTimers.add(stopWatch);
    req.on('close', () => finish(true));
    res.on('close', () => finish(true));
  }

  function review(type: ResourceType, body: any, requester: UserInfo, namespace?: string): Record<string, unknown> {
    if (!body || typeof body !== 'object') throw badRequest('the body of the request must be a JSON object');
    const base = {kind: type.kind, apiVersion: groupVersion(type), metadata: {...(body.metadata ?? {}), creationTimestamp: null}, spec: body.spec ?? {}};
    if (type.resource === 'tokenreviews') {
      const token = body.spec?.token;
      if (!token) throw invalid('TokenReview', type.group, '', [fieldError.required('spec.token')]);
      const user = access.authenticate(token);
      return {...base, status: user ? {authenticated: true, user: {username: user.username, uid: user.uid, groups: user.groups}, audiences: body.spec?.audiences} : {authenticated: false, user: {}, error: 'invalid bearer token'}};
    }
    const spec = body.spec ?? {};
    let subject: UserInfo;
    if (type.resource === 'selfsubjectaccessreviews') subject = requester;
    else {
      if (!spec.user && !(spec.groups?.length)) {
        throw invalid(type.kind, type.group, '', [fieldError.invalid('spec.user', '', 'at least one of user or group must be specified')]);
      }
      subject = {username: spec.user ?? '', uid: spec.uid, groups: spec.groups ?? []};
    }
    const ra = spec.resourceAttributes;
    const nra = spec.nonResourceAttributes;
    if (!ra && !nra) throw invalid(type.kind, type.group, '', [fieldError.required('spec.resourceAttributes', 'exactly one of nonResourceAttributes or resourceAttributes must be specified')]);
    if (type.resource === 'localsubjectaccessreviews' && ra?.namespace !== namespace) {
      throw invalid(type.kind, type.group, '', [fieldError.invalid('spec.resourceAttributes.namespace', ra?.namespace ?? '', 'must match metadata.namespace')]);
    }
    const attrs: Attributes = ra
      ? {user: subject, verb: ra.verb ?? '', group: ra.group ?? '', resource: ra.resource ?? '', subresource: ra.subresource || undefined, namespace: ra.namespace || undefined, name: ra.name || undefined}
      : {user: subject, verb: nra.verb ?? '', path: nra.path ?? ''};
    const decision = access.authorize(attrs);
    return {...base, status: decision.allowed ? {allowed: true, reason: decision.reason} : {allowed: false}};
  }

  async function handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://apiserver');
    const route = parseRoute(url.pathname, url.searchParams);
    if (!route || route.subresource !== 'portforward' || !route.name) throw pathNotFound();
    const user = authenticate(req);
    const {type} = route;
    // Both the WebSocket GET and the SPDY POST need "create" on pods/portforward.
    authorize({user, verb: 'create', group: type.group, resource: type.resource, subresource: 'portforward', namespace: route.namespace, name: route.name});
    const pod = store.get(type, route.namespace, route.name);
    if (pod.status?.phase !== 'Running' && pod.status?.phase !== undefined && pod.status.phase !== 'Pending') {
      throw badRequest(`pod ${route.name} is not running (phase ${pod.status.phase})`);
    }
    const ports = requestedPorts(url.searchParams);
    const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
    if (upgrade === 'websocket') {
      if (ports.length === 0 || ports.some((p) => !Number.isInteger(p) || p < 1 || p > 65535)) throw badRequest('query parameter "port" is required');
      wsForwarder.handle(req, socket, head, pod, ports);
      return;
    }
    if (upgrade.startsWith('spdy/')) {
      spdyForwarder.handle(req, socket, head, pod);
      return;
    }
    throw badRequest(`unsupported upgrade protocol ${req.headers.upgrade}`);
  }

  function rejectUpgrade(socket: Duplex, err: unknown): void {
    const status = err instanceof ApiError ? err.toStatus() : new ApiError(500, 'InternalError', String(err)).toStatus();
    const body = JSON.stringify(status);
    socket.end(`HTTP/1.1 ${status.code} ${status.reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  }

  const listener = await listenPlainAndTls(server, host, options.port ?? 0, track);
  const port = (listener.address() as AddressInfo).port;
  const urlHost = host.includes(':') ? `[${host}]` : host;
  hostPort = `${urlHost}:${port}`;
  const url = `http://${hostPort}`;
  const secureUrl = `https://${hostPort}`;

  createKubernetesService(store, options.advertiseAddress ?? host, port);
  store.create('servicecidrs', defaultServiceCIDR(cidrs.map((cidr) => cidr.text)));
  controller.start();

  const clusterName = options.clusterName ?? 'proxyctl-lab';
  const kubeconfig = (opts: KubeconfigOptions = {}) => {
    const userName = opts.user ?? 'admin';
    const token = opts.token ?? access.userByName(userName)?.token;
    if (!token) throw new Error(`kubeconfig for user ${userName}: no token known; pass one`);
    // Merging kubeconfigs keeps the first entry of each name: users are named per server too.
    const entryName = `${userName}@${clusterName}`;
    return toYaml({
      apiVersion: 'v1',
      kind: 'Config',
      // https: kubectl sends the token only over TLS. The certificate is self-signed for loopback.
      clusters: [{name: clusterName, cluster: {server: secureUrl, 'insecure-skip-tls-verify': true}}],
      users: [{name: entryName, user: {token}}],
      contexts: [{name: entryName, context: {cluster: clusterName, user: entryName, namespace: opts.namespace ?? 'default'}}],
      'current-context': entryName,
      preferences: {},
    });
  };

  return {
    url,
    secureUrl,
    host,
    port,
    store,
    access,
    endpointSlices: controller,
    adminToken,
    kubeconfig,
    writeKubeconfig: (path, opts) => writeFile(path, kubeconfig(opts), {mode: 0o600}),
    settle: async () => {
      await new Promise((r) => setImmediate(r));
      await controller.whenIdle();
    },
    stop: async () => {
      controller.stop();
      store.stop();
      for (const stopWatch of [...watchTimers]) stopWatch();
      wsForwarder.close();
      spdyForwarder.close();
      const closed = new Promise<void>((resolve) => listener.close(() => resolve()));
      server.closeAllConnections();
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}

/** The `kubernetes` service in default, pointing at this server, as kube-apiserver's endpoint reconciler keeps it. */
function createKubernetesService(store: ClusterStore, address: string, port: number): void {
  store.create('services', {
    metadata: {name: 'kubernetes', namespace: 'default', labels: {component: 'apiserver', provider: 'kubernetes'}},
    spec: {type: 'ClusterIP', ports: [{name: 'https', port: 443, protocol: 'TCP', targetPort: port}], sessionAffinity: 'None'},
  });
  store.create('endpointslices', {
    metadata: {name: 'kubernetes', namespace: 'default', labels: {'kubernetes.io/service-name': 'kubernetes'}},
    addressType: address.includes(':') ? 'IPv6' : 'IPv4',
    endpoints: [{addresses: [address === 'localhost' ? '127.0.0.1' : address], conditions: {ready: true, serving: true, terminating: false}}],
    ports: [{name: 'https', port, protocol: 'TCP'}],
  }, undefined, {apiServerEndpoints: true});
}

async function readBody(req: IncomingMessage): Promise<any> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > maxBodyBytes) throw new ApiError(413, 'RequestEntityTooLarge', 'Request entity too large: limit is 3145728');
    chunks.push(chunk);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  if (text.trim() === '') return undefined;
  const contentType = req.headers['content-type'] ?? 'application/json';
  try {
    if (contentType.includes('yaml')) return parseYaml(text);
    return JSON.parse(text);
  } catch (err) {
    throw badRequest(`couldn't get version/kind; json parse error: ${(err as Error).message}`);
  }
}

async function deleteOptionsOf(req: IncomingMessage, url: URL): Promise<DeleteOptions> {
  const body = (await readBody(req)) ?? {};
  const options: DeleteOptions = {gracePeriodSeconds: body.gracePeriodSeconds ?? undefined, propagationPolicy: body.propagationPolicy, preconditions: body.preconditions};
  if (url.searchParams.has('gracePeriodSeconds')) options.gracePeriodSeconds = Number(url.searchParams.get('gracePeriodSeconds'));
  if (url.searchParams.has('propagationPolicy')) options.propagationPolicy = url.searchParams.get('propagationPolicy')!;
  return options;
}

function successStatus(type: ResourceType, obj: KubeObject): Record<string, unknown> {
  const details: Record<string, unknown> = {name: obj.metadata.name, kind: type.resource, uid: obj.metadata.uid};
  if (type.group) details.group = type.group;
  return {kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', details};
}

function sendJson(res: ServerResponse, code: number, body: unknown): void {
  sendText(res, code, JSON.stringify(body));
}

function sendText(res: ServerResponse, code: number, text: string): void {
  res.writeHead(code, {'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'cache-control': 'no-cache, private'});
  res.end(text);
}

function sendError(res: ServerResponse, err: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const apiError = err instanceof ApiError ? err : new ApiError(500, 'InternalError', `Internal error occurred: ${(err as Error)?.message ?? String(err)}`);
  if (!(err instanceof ApiError)) process.emitWarning(`api server: ${(err as Error)?.stack ?? String(err)}`);
  sendJson(res, apiError.code, apiError.toStatus());
}

