// JSON-RPC 2.0 envelopes as proxyctl.v1 uses them: one request or notification per WebSocket text
// message (no batches), error codes, and the checks that sort an incoming message.

export const errorCodes = {
  /** Not JSON. */
  parseError: -32700,
  /** JSON, but not a JSON-RPC 2.0 request. */
  invalidRequest: -32600,
  methodNotFound: -32601,
  /** params does not fit the method; data.field names the field. */
  invalidParams: -32602,
  internalError: -32603,
  /** The method's handler failed; data: {method, cause}. */
  serverError: -32000,
  /** The connection already has limits.maxInFlight requests unanswered; retry when one is answered. */
  tooManyRequests: -32001,
  /** The caller may not call this method (agents that check access). */
  forbidden: -32003,
} as const;

export type RequestId = string | number;

export interface RpcRequest {
  jsonrpc: '2.0';
  id: RequestId;
  method: string;
  params?: unknown;
}

export interface RpcNotification {
  jsonrpc: '2.0';
  method: string;
  params?: unknown;
}

export interface RpcErrorObject {
  code: number;
  message: string;
  data?: unknown;
}

export interface RpcSuccess {
  jsonrpc: '2.0';
  id: RequestId;
  result: unknown;
}

export interface RpcFailure {
  jsonrpc: '2.0';
  id: RequestId | null;
  error: RpcErrorObject;
}

export type RpcResponse = RpcSuccess | RpcFailure;

/** IncomingRequest: what the agent makes of one message. */
export type IncomingRequest =
  | {kind: 'request'; request: RpcRequest}
  | {kind: 'notification'; notification: RpcNotification}
  /** Answer `response` and go on. */
  | {kind: 'invalid'; response: RpcFailure};

/** IncomingAnswer: what the plugin makes of one message from the agent. */
export type IncomingAnswer =
  | {kind: 'response'; response: RpcResponse}
  | {kind: 'notification'; notification: RpcNotification}
  | {kind: 'invalid'; problem: string};

export function failure(id: RequestId | null, code: number, message: string, data?: unknown): RpcFailure {
  return data === undefined ? {jsonrpc: '2.0', id, error: {code, message}} : {jsonrpc: '2.0', id, error: {code, message, data}};
}

export function success(id: RequestId, result: unknown): RpcSuccess {
  return {jsonrpc: '2.0', id, result};
}

const maxMethodLength = 128;
const maxIdLength = 128;

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function validId(id: unknown): id is RequestId {
  return (typeof id === 'string' && id.length <= maxIdLength) || (typeof id === 'number' && Number.isFinite(id));
}

/** What keeps a message from being looked at as a request or an answer at all. */
type MessageFault = {fault: 'not JSON'; reason: string} | {fault: 'batch'} | {fault: 'not an object'};

/** readObject: one message's JSON object, or its fault; each reader words the fault for its side. */
function readObject(text: string): {message: Record<string, unknown>} | MessageFault {
  let message: unknown;
  try {
    message = JSON.parse(text);
  } catch (err) {
    return {fault: 'not JSON', reason: (err as Error).message};
  }
  if (Array.isArray(message)) return {fault: 'batch'};
  if (!isObject(message)) return {fault: 'not an object'};
  return {message};
}

/** The answer to a request that is no JSON object, as JSON-RPC 2.0 says to give it. */
function requestFault(read: MessageFault): RpcFailure {
  if (read.fault === 'not JSON') return failure(null, errorCodes.parseError, `parse error: ${read.reason}`);
  if (read.fault === 'batch')
    return failure(null, errorCodes.invalidRequest, 'invalid request: batches are not supported; send one request per message');
  return failure(null, errorCodes.invalidRequest, 'invalid request: a request must be a JSON object');
}

/** Sorts a message a client sent into a request, a notification, or the error to answer it with. */
export function readRequest(text: string): IncomingRequest {
  const read = readObject(text);
  if ('fault' in read) return {kind: 'invalid', response: requestFault(read)};
  const {message} = read;
  const hasId = Object.hasOwn(message, 'id');
  const id = hasId && validId(message.id) ? message.id : null;
  const invalid = (why: string): IncomingRequest => ({
    kind: 'invalid',
    response: failure(id, errorCodes.invalidRequest, `invalid request: ${why}`),
  });
  if (message.jsonrpc !== '2.0') return invalid('jsonrpc must be "2.0"');
  if (hasId && !validId(message.id)) return invalid(`id must be a string (at most ${maxIdLength} characters) or a number`);
  if (typeof message.method !== 'string' || message.method.length === 0) return invalid('method must be a non-empty string');
  if (message.method.length > maxMethodLength) return invalid(`method must be at most ${maxMethodLength} characters long`);
  if (Object.hasOwn(message, 'params') && typeof message.params !== 'object') return invalid('params must be an object');
  const base = {jsonrpc: '2.0' as const, method: message.method, ...(message.params === undefined ? {} : {params: message.params})};
  if (!hasId) return {kind: 'notification', notification: base};
  return {kind: 'request', request: {...base, id: message.id as RequestId}};
}

/** Sorts a message an agent sent into a response or a notification; `problem` says what is wrong otherwise. */
export function readAnswer(text: string): IncomingAnswer {
  const read = readObject(text);
  if ('fault' in read) return {kind: 'invalid', problem: read.fault === 'not JSON' ? `not JSON: ${read.reason}` : 'not a JSON object'};
  const {message} = read;
  if (message.jsonrpc !== '2.0') return {kind: 'invalid', problem: 'jsonrpc is not "2.0"'};
  if (!Object.hasOwn(message, 'id')) {
    if (typeof message.method !== 'string') return {kind: 'invalid', problem: 'neither a response (no id) nor a notification (no method)'};
    return {kind: 'notification', notification: {jsonrpc: '2.0', method: message.method, params: message.params}};
  }
  if (message.id !== null && !validId(message.id)) return {kind: 'invalid', problem: 'id is neither a string nor a number'};
  if (Object.hasOwn(message, 'error')) {
    const error = message.error;
    if (!isObject(error) || typeof error.code !== 'number' || typeof error.message !== 'string') {
      return {kind: 'invalid', problem: 'error is not {code: number, message: string}'};
    }
    return {kind: 'response', response: failure(message.id as RequestId | null, error.code, error.message, error.data)};
  }
  if (!Object.hasOwn(message, 'result') || message.id === null) return {kind: 'invalid', problem: 'a response without result or error'};
  return {kind: 'response', response: success(message.id as RequestId, message.result)};
}
