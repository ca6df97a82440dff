// pods/portforward: the one upgrade request, over WebSocket (client-node) or SPDY (kubectl), through
// the same authentication and authorization as every request.
import type {IncomingMessage} from 'node:http';
import type {Duplex} from 'node:stream';
import {ApiError, badRequest, pathNotFound} from '../api-error.ts';
import {requestedPorts} from '../portforward-target.ts';
import {authenticate} from './authentication.ts';
import {authorize} from './authorization.ts';
import type {ServerContext} from './context.ts';
import {parseRoute} from './routing.ts';

export async function handleUpgrade(context: ServerContext, req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://apiserver');
  const route = parseRoute(url.pathname, url.searchParams);
  if (!route || route.subresource !== 'portforward' || !route.name) throw pathNotFound();
  const user = authenticate(context, req);
  const {type} = route;
  // Both the WebSocket GET and the SPDY POST need "create" on pods/portforward.
  authorize(context.access, {
    user,
    verb: 'create',
    group: type.group,
    resource: type.resource,
    subresource: 'portforward',
    namespace: route.namespace,
    name: route.name,
  });
  const pod = context.store.get(type, route.namespace, route.name);
  if (pod.status?.phase !== 'Running' && pod.status?.phase !== undefined && pod.status.phase !== 'Pending') {
    throw badRequest(`pod ${route.name} is not running (phase ${pod.status.phase})`);
  }
  const ports = requestedPorts(url.searchParams);
  const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
  if (upgrade === 'websocket') {
    if (ports.length === 0 || ports.some((p) => !Number.isInteger(p) || p < 1 || p > 65535))
      throw badRequest('query parameter "port" is required');
    context.wsForwarder.handle(req, socket, head, pod, ports);
    return;
  }
  if (upgrade.startsWith('spdy/')) {
    context.spdyForwarder.handle(req, socket, head, pod);
    return;
  }
  throw badRequest(`unsupported upgrade protocol ${req.headers.upgrade}`);
}

export function rejectUpgrade(socket: Duplex, err: unknown): void {
  const status = err instanceof ApiError ? err.toStatus() : new ApiError(500, 'InternalError', String(err)).toStatus();
  const body = JSON.stringify(status);
  socket.end(
    `HTTP/1.1 ${status.code} ${status.reason}\r\ncontent-type: ` +
      `application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}
