// The embedded Kubernetes API server: HTTP on loopback, kube-apiserver's REST protocol over the in-memory store.
// Requests go through the handler chain in handlers/; this file builds what the handlers share and serves it.
import {randomBytes} from 'node:crypto';
import {createServer, type Server} from 'node:http';
import type {AddressInfo, Socket} from 'node:net';
import {writeFile} from 'node:fs/promises';
import {stringify as toYaml} from 'yaml';
import {AccessControl, type Grant, type UserEntry} from './access-control.ts';
import {ClusterStore} from './cluster-store.ts';
import {EndpointSliceController} from './endpointslice-controller.ts';
import {EventRecorder} from './event-recorder.ts';
import {WorkloadControllers} from './workload-controllers.ts';
import {handleRequest} from './handlers/chain.ts';
import type {ServerContext, UnauthenticatedRequests} from './handlers/context.ts';
import {handleUpgrade, rejectUpgrade} from './handlers/portforward.ts';
import {sendError} from './handlers/response.ts';
import {Cidr, ClusterIPAllocator, NodePortAllocator, PortRange} from './ip-allocator.ts';
import {ObjectLog} from './object-log.ts';
import type {PodLogSource} from './pod-log-source.ts';
import {podIPResolver, type PodAddressResolver} from './portforward-target.ts';
import {WebSocketPortForwarder} from './portforward-websocket.ts';
import {listenPlainAndTls} from './tls-listener.ts';
import {SpdyPortForwarder} from './portforward-spdy.ts';
import {defaultServiceCIDR} from './servicecidr-rules.ts';

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
  unauthenticated?: UnauthenticatedRequests;
  /** The address the `kubernetes` service's EndpointSlice names; defaults to host. */
  advertiseAddress?: string;
  /**
   * The kubeconfig's cluster name, and the suffix of its user and context names ("admin@NAME");
   * distinct per server so that kubeconfigs of several servers can be merged. Default "proxyctl-lab".
   */
  clusterName?: string;
  /** Where pods/log reads a container's log; without one, logs are a 400 as for a pod no kubelet runs. */
  podLogs?: PodLogSource;
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
  /** The scheduler, ReplicaSet and Deployment controllers and the garbage collector. */
  workloads: WorkloadControllers;
  /** Events as the control plane's components write them; the lab's kubelets write theirs here too. */
  events: EventRecorder;
  adminToken: string;
  kubeconfig(options?: KubeconfigOptions): string;
  writeKubeconfig(path: string, options?: KubeconfigOptions): Promise<void>;
  /** Resolves when the controllers have caught up with every change so far. */
  settle(): Promise<void>;
  stop(): Promise<void>;
}

function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

export async function startApiServer(options: ApiServerOptions = {}): Promise<ApiServer> {
  const host = options.host ?? '127.0.0.1';
  if (!isLoopback(host)) throw new Error(`api server host ${host}: only loopback addresses are allowed`);
  const cidrs = (options.serviceCIDR ?? '10.96.0.0/12').split(',').map((c) => new Cidr(c));
  const network = {
    clusterIPs: cidrs.map((c) => new ClusterIPAllocator(c)),
    nodePorts: new NodePortAllocator(new PortRange(options.nodePortRange ?? '30000-32767')),
  };
  const log = new ObjectLog(options.watchWindow ?? 10000);
  const store = new ClusterStore(log, network);
  const adminToken = options.adminToken ?? randomBytes(24).toString('hex');
  const access = new AccessControl(
    log,
    [{name: 'admin', token: adminToken, groups: ['system:masters']}, ...(options.users ?? [])],
    options.grants ?? [],
  );
  const controller = new EndpointSliceController(store, {maxEndpointsPerSlice: options.maxEndpointsPerSlice});
  const events = new EventRecorder(store);
  const workloads = new WorkloadControllers(store, events);
  const resolver = options.resolvePodAddress ?? podIPResolver;
  const context: ServerContext = {
    store,
    log,
    access,
    unauthenticated: options.unauthenticated,
    wsForwarder: new WebSocketPortForwarder(resolver),
    spdyForwarder: new SpdyPortForwarder(resolver),
    bookmarkMs: (options.bookmarkIntervalSeconds ?? 60) * 1000,
    maxWatchMs: (options.maxWatchSeconds ?? 1800) * 1000,
    watchTimers: new Set<() => void>(),
    hostPort: '',
    podLogs: options.podLogs,
  };

  for (const name of ['default', 'kube-system', 'kube-public', 'kube-node-lease']) store.create('namespaces', {metadata: {name}});

  const server: Server = createServer((req, res) => {
    handleRequest(context, req, res).catch((err) => sendError(res, err));
  });
  server.keepAliveTimeout = 30_000;
  const sockets = new Set<Socket>();
  const track = (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  };
  server.on('upgrade', (req, socket, head) => {
    handleUpgrade(context, req, socket, head).catch((err) => rejectUpgrade(socket, err));
  });

  const listener = await listenPlainAndTls(server, host, options.port ?? 0, track);
  const port = (listener.address() as AddressInfo).port;
  const urlHost = host.includes(':') ? `[${host}]` : host;
  context.hostPort = `${urlHost}:${port}`;
  const url = `http://${context.hostPort}`;
  const secureUrl = `https://${context.hostPort}`;

  createKubernetesService(store, options.advertiseAddress ?? host, port);
  store.create('servicecidrs', defaultServiceCIDR(cidrs.map((cidr) => cidr.text)));
  controller.start();
  workloads.start();

  const kubeconfig = (opts: KubeconfigOptions = {}) => kubeconfigText(access, options.clusterName ?? 'proxyctl-lab', secureUrl, opts);

  return {
    url,
    secureUrl,
    host,
    port,
    store,
    access,
    endpointSlices: controller,
    workloads,
    events,
    adminToken,
    kubeconfig,
    writeKubeconfig: (path, opts) => writeFile(path, kubeconfig(opts), {mode: 0o600}),
    settle: async () => {
      // Controllers write for one another: a Deployment's ReplicaSet, its pods, their bindings, slices.
      for (let round = 0; round < 10; round++) {
        await new Promise((r) => setImmediate(r));
        if (!workloads.busy() && !controller.busy()) break;
        await workloads.whenIdle();
        await controller.whenIdle();
      }
    },
    stop: async () => {
      controller.stop();
      workloads.stop();
      store.stop();
      for (const stopWatch of [...context.watchTimers]) stopWatch();
      context.wsForwarder.close();
      context.spdyForwarder.close();
      const closed = new Promise<void>((resolve) => listener.close(() => resolve()));
      server.closeAllConnections();
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}

function kubeconfigText(access: AccessControl, clusterName: string, secureUrl: string, opts: KubeconfigOptions): string {
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
}

/** The `kubernetes` service in default, pointing at this server, as kube-apiserver's endpoint reconciler keeps it. */
function createKubernetesService(store: ClusterStore, address: string, port: number): void {
  store.create('services', {
    metadata: {name: 'kubernetes', namespace: 'default', labels: {component: 'apiserver', provider: 'kubernetes'}},
    spec: {type: 'ClusterIP', ports: [{name: 'https', port: 443, protocol: 'TCP', targetPort: port}], sessionAffinity: 'None'},
  });
  store.create(
    'endpointslices',
    {
      metadata: {name: 'kubernetes', namespace: 'default', labels: {'kubernetes.io/service-name': 'kubernetes'}},
      addressType: address.includes(':') ? 'IPv6' : 'IPv4',
      endpoints: [
        {addresses: [address === 'localhost' ? '127.0.0.1' : address], conditions: {ready: true, serving: true, terminating: false}},
      ],
      ports: [{name: 'https', port, protocol: 'TCP'}],
    },
    undefined,
    {apiServerEndpoints: true},
  );
}
