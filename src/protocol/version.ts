// The protocol's name, version and limits: what agent and plugin must agree on before any method.

/** WebSocket subprotocol: the agent accepts only this one; a new incompatible version gets a new name. */
export const protocolName = 'proxyctl.v1';

/** Response header by which an agent that refuses a handshake says which protocol it speaks. */
export const protocolHeader = 'x-proxyctl-protocol';

/** Where the agent listens by default (host network namespace, loopback only). */
export const defaultAgentHost = '127.0.0.1';
export const defaultAgentPort = 10260;

export const limits = {
  /** Largest WebSocket message either side accepts; larger frames close the connection with 1009. */
  maxPayloadBytes: 1024 * 1024,
  /** Requests a connection may have unanswered at once; more are answered at once with an error. */
  maxInFlight: 16,
  /** Largest `params` of one request, as JSON. */
  maxParamsBytes: 16 * 1024,
  /** Unsent bytes for one connection above which its event stream is dropped. */
  eventBufferBytes: 1024 * 1024,
  /** Unsent bytes for one connection above which the connection is closed (it does not read). */
  maxBufferedBytes: 16 * 1024 * 1024,
} as const;

export type Limits = {-readonly [K in keyof typeof limits]: number};
