// What the handlers of one API server share, handed to each of them: the store and its log, access
// control, the port-forwarders, the watch limits and the open watches.
import type {IncomingMessage, ServerResponse} from 'node:http';
import type {AccessControl, UserInfo} from '../access-control.ts';
import type {ClusterStore, WriteOptions} from '../cluster-store.ts';
import type {ObjectLog} from '../object-log.ts';
import type {PodLogSource} from '../pod-log-source.ts';
import type {SpdyPortForwarder} from '../portforward-spdy.ts';
import type {WebSocketPortForwarder} from '../portforward-websocket.ts';
import type {Route} from './routing.ts';

/** Who a request without credentials is: see ApiServerOptions.unauthenticated. */
export type UnauthenticatedRequests = 'anonymous' | 'reject' | 'admin';

export interface ServerContext {
  store: ClusterStore;
  log: ObjectLog;
  access: AccessControl;
  unauthenticated: UnauthenticatedRequests | undefined;
  wsForwarder: WebSocketPortForwarder;
  spdyForwarder: SpdyPortForwarder;
  bookmarkMs: number;
  maxWatchMs: number;
  /** Ends each open watch; stop() calls them all. */
  watchTimers: Set<() => void>;
  /** host:port as clients reach it (known once the server listens); discovery names it. */
  hostPort: string;
  /** Where pods/log reads from (the lab's kubelets); absent outside a lab. */
  podLogs?: PodLogSource;
}

/** A request for a resource that got past authentication, routing and authorization. */
export interface ResourceRequest {
  req: IncomingMessage;
  res: ServerResponse;
  url: URL;
  route: Route;
  user: UserInfo;
  dryRun: boolean;
  writeOptions: WriteOptions;
}

export type ResourceHandler = (context: ServerContext, request: ResourceRequest) => void | Promise<void>;
