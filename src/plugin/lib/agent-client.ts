// AgentClient: one WebSocket connection to an agent speaking proxyctl.v1, over a direct URL or any
// stream (a port-forward through the API server). Every answer is checked against the method's
// schema; refusals, timeouts and errors become one-line PluginErrors that say what to do.
import type {IncomingMessage} from 'node:http';
import type {Duplex} from 'node:stream';
import WebSocket from 'ws';
import {errorCodes, readAnswer, type RpcResponse} from '../../protocol/jsonrpc.ts';
import {
  methodSpecs,
  notificationSchemas,
  isNotificationName,
  type MethodName,
  type NotificationName,
  type NotificationTypes,
  type ParamsOf,
  type ResultOf,
} from '../../protocol/methods.ts';
import {limits, protocolHeader, protocolName} from '../../protocol/version.ts';
import {errorLine, PluginError} from './plugin-error.ts';
import {describeTimeout} from './request-timeout.ts';

export interface AgentConnectOptions {
  /** ws://host:port/ of the agent, or a placeholder when `stream` carries the bytes. */
  url: string;
  /** Carries the WebSocket (e.g. a port-forward); absent: a TCP connection to url. */
  stream?: () => Duplex;
  /** Bearer token for agents that listen beyond loopback. */
  token?: string;
  /** Limit for the handshake and for each call; 0 for none. */
  timeoutMs: number;
  /** Who we talk to, for messages: "the agent on node node-1". */
  label: string;
}

type Listener = (params: unknown) => void;

function readBody(res: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    let body = '';
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => (body = (body + chunk).slice(0, 2000)));
    res.on('end', () => resolve(body.trim()));
    res.on('error', () => resolve(body.trim()));
  });
}

/** The error for a refused handshake: the agent's own one-line reason, with what to do. */
async function refusal(res: IncomingMessage, label: string): Promise<PluginError> {
  const body = await readBody(res);
  const speaks = res.headers[protocolHeader];
  if (res.statusCode === 400 && typeof speaks === 'string' && speaks !== protocolName) {
    return new PluginError(
      `${label} speaks ${speaks}, this plugin speaks ${protocolName}: use a kubectl-proxyctl release that matches the agents`,
    );
  }
  if (!speaks)
    return new PluginError(
      `${label}: HTTP ${res.statusCode} from something that is not a proxyctl agent${body ? ` (${body.split('\n')[0].slice(0, 200)})` : ''}: check the ` +
        `address or port`,
    );
  return new PluginError(`${label} refused the connection (HTTP ${res.statusCode}): ${body || 'no reason given'}`);
}

export class AgentClient {
  readonly label: string;
  readonly #ws: WebSocket;
  readonly #timeoutMs: number;
  readonly #pending = new Map<
    number,
    {method: string; resolve: (response: RpcResponse) => void; reject: (error: Error) => void; timer?: NodeJS.Timeout}
  >();
  readonly #listeners = new Map<string, Set<Listener>>();
  #nextId = 1;
  #closedBecause: string | undefined;

  private constructor(ws: WebSocket, options: AgentConnectOptions) {
    this.#ws = ws;
    this.label = options.label;
    this.#timeoutMs = options.timeoutMs;
    ws.on('message', (data, isBinary) => this.#receive(isBinary ? '' : data.toString()));
    ws.on('close', (code, reason) =>
      this.#fail(`${this.label} closed the connection (${code}${reason.length > 0 ? ` ${reason.toString()}` : ''})`),
    );
    ws.on('error', (error) => this.#fail(`connection to ${this.label} failed: ${errorLine(error)}`));
  }

  static connect(options: AgentConnectOptions): Promise<AgentClient> {
    const {label} = options;
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(options.url, [protocolName], {
        maxPayload: limits.maxPayloadBytes * 64,
        perMessageDeflate: false,
        headers: options.token ? {authorization: `Bearer ${options.token}`} : {},
        ...(options.stream ? {createConnection: options.stream as never} : {}),
        ...(options.timeoutMs > 0 ? {handshakeTimeout: options.timeoutMs} : {}),
      });
      let settled = false;
      const settle = (error: Error | undefined) => {
        if (settled) return;
        settled = true;
        if (error) {
          ws.removeAllListeners();
          ws.on('error', () => {});
          ws.terminate();
          reject(error);
        } else {
          ws.removeAllListeners();
          resolve(new AgentClient(ws, options));
        }
      };
      ws.once('open', () => {
        if (ws.protocol !== protocolName)
          settle(
            new PluginError(
              `${label} did not agree to ${protocolName} (it chose ${ws.protocol || 'no subprotocol'}): use a kubectl-proxyctl release that matches the agents`,
            ),
          );
        else settle(undefined);
      });
      ws.once('unexpected-response', (_req, res) => void refusal(res, label).then(settle));
      ws.on('error', (error) => {
        const text = errorLine(error);
        if (/ECONNREFUSED/.test(text))
          settle(
            new PluginError(`cannot reach ${label}: connection refused: is the agent running and listening there (--api-bind-address)?`),
          );
        else if (/timed out|ETIMEDOUT/i.test(text))
          settle(
            new PluginError(
              `${label} did not answer within ${describeTimeout(options.timeoutMs)}: check that it runs, or raise --request-timeout`,
            ),
          );
        else settle(new PluginError(`cannot reach ${label}: ${text}`));
      });
    });
  }

  /** call sends one request and resolves with the agent's checked answer. */
  call<M extends MethodName>(method: M, params: ParamsOf<M>): Promise<ResultOf<M>> {
    if (this.#closedBecause) return Promise.reject(new PluginError(this.#closedBecause));
    const id = this.#nextId++;
    return new Promise<RpcResponse>((resolve, reject) => {
      const entry: {method: string; resolve: typeof resolve; reject: typeof reject; timer?: NodeJS.Timeout} = {method, resolve, reject};
      if (this.#timeoutMs > 0) {
        entry.timer = setTimeout(() => {
          this.#pending.delete(id);
          reject(
            new PluginError(
              `${this.label} did not answer ${method} within ${describeTimeout(this.#timeoutMs)}: raise --request-timeout, or see the agent's log`,
            ),
          );
        }, this.#timeoutMs);
      }
      this.#pending.set(id, entry);
      this.#ws.send(JSON.stringify({jsonrpc: '2.0', id, method, params}));
    }).then((response) => {
      if ('error' in response) throw this.#callError(method, response.error.code, response.error.message);
      const problem = methodSpecs[method].result.check(response.result, 'result');
      if (problem)
        throw new PluginError(
          `${this.label} answered ${method} with something this plugin does not understand (${problem}): plugin and agent releases may differ`,
        );
      return response.result as ResultOf<M>;
    });
  }

  /** on listens for a notification (after events.subscribe). */
  on<N extends NotificationName>(name: N, listener: (params: NotificationTypes[N]) => void): () => void {
    const set = this.#listeners.get(name) ?? new Set();
    set.add(listener as Listener);
    this.#listeners.set(name, set);
    return () => set.delete(listener as Listener);
  }

  close(): void {
    this.#closedBecause ??= `connection to ${this.label} closed`;
    this.#ws.close(1000);
    // A port-forward may never complete the close handshake.
    setTimeout(() => this.#ws.terminate(), 500).unref();
  }

  #callError(method: string, code: number, message: string): PluginError {
    if (code === errorCodes.forbidden) return new PluginError(`${this.label} refused ${method}: ${message}`);
    if (code === errorCodes.methodNotFound)
      return new PluginError(`${this.label} does not know ${method}: plugin and agent releases differ (${message})`);
    if (code === errorCodes.serverError) return new PluginError(message);
    return new PluginError(`${this.label} answered ${method} with error ${code}: ${message}`);
  }

  #receive(text: string): void {
    const answer = readAnswer(text);
    if (answer.kind === 'invalid') return;
    if (answer.kind === 'notification') {
      const {method, params} = answer.notification;
      if (!isNotificationName(method) || notificationSchemas[method].check(params, 'params')) return;
      for (const listener of this.#listeners.get(method) ?? []) listener(params);
      return;
    }
    const id = answer.response.id;
    if (typeof id !== 'number') return;
    const entry = this.#pending.get(id);
    if (!entry) return;
    this.#pending.delete(id);
    clearTimeout(entry.timer);
    entry.resolve(answer.response);
  }

  #fail(reason: string): void {
    this.#closedBecause ??= reason;
    for (const [id, entry] of this.#pending) {
      this.#pending.delete(id);
      clearTimeout(entry.timer);
      entry.reject(new PluginError(`${reason} before it answered ${entry.method}`));
    }
  }
}
