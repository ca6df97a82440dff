// The agent's WebSocket JSON-RPC server: protocol version and authentication are settled at the
// handshake; each accepted connection is an AgentConnection.
import {createServer, type IncomingMessage, type Server} from 'node:http';
import type {AddressInfo} from 'node:net';
import type {Duplex} from 'node:stream';
import {WebSocketServer} from 'ws';
import {
  defaultAgentHost,
  defaultAgentPort,
  limits as defaultLimits,
  protocolHeader,
  protocolName,
  type Limits,
} from '../../protocol/version.ts';
import type {Access} from '../../protocol/methods.ts';
import type {Logger} from '../log.ts';
import {describeAttributes, nodeProxyAttributes, type AccessReviewer, type ReviewedUser} from './access.ts';
import {AgentConnection} from './connection.ts';
import type {AgentApiHandlers} from './handlers.ts';

export interface AgentApiOptions {
  /** Default 127.0.0.1. Any other address requires `auth`. */
  host?: string;
  /** Default 10260; 0 picks a free port. */
  port?: number;
  handlers: AgentApiHandlers;
  /** Checks bearer tokens and access; required unless host is a loopback address. */
  auth?: AccessReviewer;
  /** The node this agent runs on: the nodes/proxy object access is checked against. Required with auth. */
  nodeName?: string;
  log: Logger;
  /** Overrides of the protocol's limits (tests use small ones). */
  limits?: Partial<Limits>;
}

export interface AgentApi {
  /** ws://host:port/ */
  url: string;
  host: string;
  port: number;
  /** Open connections. */
  connectionCount(): number;
  stop(): Promise<void>;
}

export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^(::ffff:)?127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

function offeredProtocols(req: IncomingMessage): string[] {
  const header = req.headers['sec-websocket-protocol'];
  if (!header) return [];
  return header
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p.length > 0);
}

const statusText: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  426: 'Upgrade Required',
  503: 'Service Unavailable',
};

/** Answers a handshake with an HTTP error whose body is one line saying what to do. */
function refuseUpgrade(socket: Duplex, status: number, message: string): void {
  const body = `${message}\n`;
  const headers = [
    `HTTP/1.1 ${status} ${statusText[status] ?? 'Error'}`,
    'content-type: text/plain; charset=utf-8',
    `content-length: ${Buffer.byteLength(body)}`,
    `${protocolHeader}: ${protocolName}`,
    ...(status === 401 ? ['www-authenticate: Bearer'] : []),
    'connection: close',
  ];
  socket.end(`${headers.join('\r\n')}\r\n\r\n${body}`);
}

export function versionMismatchMessage(offered: string[]): string {
  if (offered.length === 0)
    return `this proxyctl agent speaks WebSocket subprotocol ${protocolName} and the client offered none: connect with kubectl proxyctl`;
  return `this proxyctl agent speaks ${protocolName} and the client offered ${offered.join(', ')}: use a kubectl-proxyctl release that speaks ${protocolName}`;
}

type Verdict = {ok: true; user: ReviewedUser} | {ok: false; status: number; message: string};

export async function startAgentApi(options: AgentApiOptions): Promise<AgentApi> {
  const host = options.host ?? defaultAgentHost;
  const requestedPort = options.port ?? defaultAgentPort;
  const limits: Limits = {...defaultLimits, ...options.limits};
  const {handlers, auth, log} = options;
  if (!isLoopbackHost(host) && !auth) {
    throw new Error(
      `agent api on ${host}:${requestedPort}: a non-loopback address needs authentication (TokenReview ` +
        `and SubjectAccessReview): listen on 127.0.0.1 or turn authentication on`,
    );
  }
  const nodeName = options.nodeName ?? '';
  if (auth && !nodeName) throw new Error('agent api: authentication needs the node name (access is checked on nodes/proxy of this node)');

  const connections = new Set<AgentConnection>();
  const wss = new WebSocketServer({
    noServer: true,
    maxPayload: limits.maxPayloadBytes,
    perMessageDeflate: false,
    // The version was checked before handleUpgrade, so the client offered exactly this one.
    handleProtocols: () => protocolName,
  });

  const review = async (user: ReviewedUser, access: Access): Promise<string | null> => {
    if (!auth) return null;
    const attributes = nodeProxyAttributes(nodeName, access);
    const answer = await auth.subjectAccessReview(user.username, user.groups, attributes);
    if (answer.allowed) return null;
    return `user ${user.username} may not ${describeAttributes(attributes)}${answer.reason ? ` (${answer.reason})` : ''}`;
  };

  const authenticate = async (req: IncomingMessage): Promise<Verdict> => {
    if (!auth) return {ok: true, user: {username: 'system:anonymous', groups: []}};
    const match = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
    if (!match)
      return {
        ok: false,
        status: 401,
        message: 'this proxyctl agent needs a bearer token: send Authorization: Bearer <token> of a user or service account',
      };
    let user: ReviewedUser;
    try {
      const answer = await auth.tokenReview(match[1]);
      if (!answer.authenticated || !answer.user) {
        return {
          ok: false,
          status: 401,
          message: `the token was not accepted${answer.error ? ` (${answer.error})` : ''}: use a valid token of a user or service account`,
        };
      }
      user = answer.user;
      const denied = await review(user, 'read');
      if (denied) return {ok: false, status: 403, message: `${denied}: ask for get on nodes/proxy`};
    } catch (err) {
      log.warn('agent api: access review failed', {error: (err as Error).message});
      return {
        ok: false,
        status: 503,
        message: `this proxyctl agent could not check the token with the API server: ${(err as Error).message}`,
      };
    }
    return {ok: true, user};
  };

  const upgrade = async (req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> => {
    const peer = `${req.socket.remoteAddress}:${req.socket.remotePort}`;
    const offered = offeredProtocols(req);
    if (!offered.includes(protocolName)) {
      log.warn('agent api: refused a client of another protocol version', {peer, offered: offered.join(',') || 'none'});
      refuseUpgrade(socket, 400, versionMismatchMessage(offered));
      return;
    }
    const verdict = await authenticate(req);
    if (!verdict.ok) {
      log.warn('agent api: refused a connection', {peer, status: verdict.status, reason: verdict.message});
      refuseUpgrade(socket, verdict.status, verdict.message);
      return;
    }
    if (socket.destroyed) return;
    const user = verdict.user;
    wss.handleUpgrade(req, socket, head, (ws) => {
      const connection = new AgentConnection(ws, {
        handlers,
        limits,
        log,
        peer: auth ? `${peer} (${user.username})` : peer,
        authorize: auth ? (access) => review(user, access) : undefined,
      });
      connections.add(connection);
      ws.once('close', () => connections.delete(connection));
      log.detail(2, 'agent api: connection opened', {peer, user: auth ? user.username : undefined});
    });
  };

  const server: Server = createServer((_req, res) => {
    res.writeHead(426, {'content-type': 'text/plain; charset=utf-8', [protocolHeader]: protocolName, upgrade: 'websocket'});
    res.end(`this is a proxyctl agent: it speaks JSON-RPC over WebSocket (subprotocol ${protocolName}); use kubectl proxyctl\n`);
  });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    // A client that resets mid-handshake must not take the agent down.
    socket.on('error', (err) => log.detail(2, 'agent api: handshake socket error', {error: err.message}));
    upgrade(req, socket, head).catch((err: Error) => {
      log.error('agent api: handshake failed', {error: err.message});
      socket.destroy();
    });
  });
  server.on('clientError', (_err, socket) => socket.destroy());

  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) =>
      reject(
        new Error(
          `agent api: cannot listen on ${host}:${requestedPort}: ${err.code === 'EADDRINUSE' ? 'address already in use' : err.message}`,
        ),
      ),
    );
    server.listen(requestedPort, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const urlHost = host.includes(':') ? `[${host}]` : host;
  log.info('agent api: listening', {address: `${urlHost}:${port}`, protocol: protocolName, auth: auth ? 'tokenreview' : 'none (loopback)'});

  return {
    url: `ws://${urlHost}:${port}/`,
    host,
    port,
    connectionCount: () => connections.size,
    async stop() {
      for (const connection of connections) connection.close(1001, 'agent stopping');
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      // Clients that do not answer the close handshake are cut off after a moment.
      const cutOff = setTimeout(() => {
        for (const connection of connections) connection.terminate();
        server.closeAllConnections();
      }, 1000);
      await closed;
      clearTimeout(cutOff);
      wss.close();
    },
  };
}
