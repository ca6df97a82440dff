// One plugin connection: reads JSON-RPC requests, calls the handlers within the in-flight limit,
// answers every request (also bad ones, without closing), and streams sync events while the client reads.
import type {RawData, WebSocket} from 'ws';
import {errorCodes, failure, readRequest, success, type RpcRequest, type RpcResponse} from '../../protocol/jsonrpc.ts';
import {
  isMethodName,
  methodSpecs,
  type Access,
  type NotificationName,
  type NotificationTypes,
  type SubscribeResult,
  type SyncEvent,
} from '../../protocol/methods.ts';
import {problemField} from '../../protocol/schema.ts';
import type {Limits} from '../../protocol/version.ts';
import type {Logger} from '../log.ts';
import type {AgentApiHandlers, AnsweredMethod} from './handlers.ts';
import {errorText} from '../../core/error-text.ts';

export interface ConnectionOptions {
  handlers: AgentApiHandlers;
  limits: Limits;
  log: Logger;
  /** "address:port (user)" for log lines. */
  peer: string;
  /** Resolves to null when the caller may use methods of this access, else to the reason it may not. Absent: all allowed. */
  authorize?: (access: Access) => Promise<string | null>;
}

const methodList = Object.keys(methodSpecs).join(', ');

function messageText(data: RawData): string {
  if (Buffer.isBuffer(data)) return data.toString('utf8');
  if (Array.isArray(data)) return Buffer.concat(data).toString('utf8');
  return Buffer.from(data).toString('utf8');
}

export class AgentConnection {
  private readonly ws: WebSocket;
  private readonly options: ConnectionOptions;
  private inFlight = 0;
  private stopEvents: (() => void) | undefined;
  private readonly accessChecks = new Map<Access, Promise<string | null>>();

  constructor(ws: WebSocket, options: ConnectionOptions) {
    this.ws = ws;
    this.options = options;
    ws.on('message', (data) => this.receive(messageText(data)));
    ws.on('close', (code, reason) => {
      this.unsubscribe();
      options.log.detail(2, 'agent api: connection closed', {peer: options.peer, code, reason: reason.toString() || undefined});
    });
    // ws reports protocol errors here (e.g. a frame above maxPayload, closed with 1009) and then closes.
    ws.on('error', (err) => options.log.warn('agent api: connection error', {peer: options.peer, error: err.message}));
  }

  /** Requests answered by neither a result nor an error yet. */
  get pending(): number {
    return this.inFlight;
  }

  close(code: number, reason: string): void {
    this.unsubscribe();
    this.ws.close(code, reason);
  }

  terminate(): void {
    this.unsubscribe();
    this.ws.terminate();
  }

  private receive(text: string): void {
    const incoming = readRequest(text);
    if (incoming.kind === 'invalid') {
      this.send(incoming.response);
      return;
    }
    if (incoming.kind === 'notification') {
      // Every proxyctl.v1 method answers; a request without id would throw its answer away.
      this.options.log.detail(4, 'agent api: ignored a notification from the client', {
        peer: this.options.peer,
        method: incoming.notification.method,
      });
      return;
    }
    const {request} = incoming;
    if (this.inFlight >= this.options.limits.maxInFlight) {
      this.send(
        failure(
          request.id,
          errorCodes.tooManyRequests,
          `too many requests in flight: at most ${this.options.limits.maxInFlight} per connection; wait for an answer before sending more`,
          {
            limit: this.options.limits.maxInFlight,
          },
        ),
      );
      return;
    }
    this.inFlight++;
    this.answer(request)
      .then((response) => this.send(response))
      .finally(() => this.inFlight--);
  }

  private async answer(request: RpcRequest): Promise<RpcResponse> {
    const {id, method} = request;
    if (!isMethodName(method)) {
      return failure(id, errorCodes.methodNotFound, `method not found: ${JSON.stringify(method)} (methods: ${methodList})`);
    }
    const spec = methodSpecs[method];
    const params = request.params === undefined ? {} : request.params;
    const size = Buffer.byteLength(JSON.stringify(params));
    if (size > this.options.limits.maxParamsBytes) {
      return failure(
        id,
        errorCodes.invalidParams,
        `invalid params: params: must be at most ${this.options.limits.maxParamsBytes} bytes as JSON, got ${size}`,
        {field: ''},
      );
    }
    const problem = spec.params.check(params, 'params');
    if (problem) return failure(id, errorCodes.invalidParams, `invalid params: ${problem}`, {field: problemField(problem, 'params')});
    const denied = await this.checkAccess(spec.access);
    if (denied) return failure(id, errorCodes.forbidden, `forbidden: ${method}: ${denied}`, {method});
    try {
      const result = method === 'events.subscribe' ? this.subscribe() : await this.call(method, params);
      return success(id, result);
    } catch (err) {
      const cause = errorText(err);
      this.options.log.warn('agent api: method failed', {peer: this.options.peer, method, error: cause});
      return failure(id, errorCodes.serverError, `${method} failed: ${cause}`, {method, cause});
    }
  }

  private call(method: AnsweredMethod, params: unknown): Promise<unknown> {
    // params fit the method's schema (checked above), so they are the handler's params.
    const handler = this.options.handlers[method] as (p: unknown) => Promise<unknown>;
    return handler(params);
  }

  private checkAccess(access: Access): Promise<string | null> {
    const authorize = this.options.authorize;
    if (!authorize) return Promise.resolve(null);
    let check = this.accessChecks.get(access);
    if (!check) {
      check = authorize(access).catch((err: Error) => {
        // Do not cache a failed review: the next call asks again.
        this.accessChecks.delete(access);
        return `access review failed: ${err.message}`;
      });
      this.accessChecks.set(access, check);
    }
    return check;
  }

  private subscribe(): SubscribeResult {
    if (!this.stopEvents) this.stopEvents = this.options.handlers.onSync((event) => this.sendEvent(event));
    return {events: ['events.sync']};
  }

  private unsubscribe(): void {
    this.stopEvents?.();
    this.stopEvents = undefined;
  }

  private sendEvent(event: SyncEvent): void {
    const buffered = this.ws.bufferedAmount;
    if (buffered > this.options.limits.eventBufferBytes) {
      // A client that does not read would make us hold every event; stop its stream instead.
      this.unsubscribe();
      this.options.log.warn('agent api: dropped the event stream of a client that does not read', {
        peer: this.options.peer,
        unsentBytes: buffered,
      });
      this.notify('events.dropped', {reason: `the client left ${buffered} bytes unread; call events.subscribe again to resume`});
      return;
    }
    this.notify('events.sync', event);
  }

  private notify<N extends NotificationName>(method: N, params: NotificationTypes[N]): void {
    this.send({jsonrpc: '2.0', method, params});
  }

  private send(message: object): void {
    if (this.ws.readyState !== this.ws.OPEN) return;
    const buffered = this.ws.bufferedAmount;
    if (buffered > this.options.limits.maxBufferedBytes) {
      this.options.log.warn('agent api: closed a connection that does not read its answers', {
        peer: this.options.peer,
        unsentBytes: buffered,
      });
      this.terminate();
      return;
    }
    this.ws.send(JSON.stringify(message));
  }
}
