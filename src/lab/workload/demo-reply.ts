// What the demo server answers over HTTP and UDP: who it is, and the addresses it saw.

/** DemoReply tells which pod answered, its address on the socket, and the client address it saw. */
export interface DemoReply {
  pod: string;
  /** The server's own address on the connection (after DNAT: the endpoint's IP). */
  podIP: string;
  /** The remote address the server saw: the client's own, or a node's if it was masqueraded. */
  clientIP: string;
  protocol: 'tcp' | 'udp';
}

export function isDemoReply(value: unknown): value is DemoReply {
  if (typeof value !== 'object' || value === null) return false;
  const reply = value as Record<string, unknown>;
  return (
    typeof reply.pod === 'string' &&
    typeof reply.podIP === 'string' &&
    typeof reply.clientIP === 'string' &&
    (reply.protocol === 'tcp' || reply.protocol === 'udp')
  );
}

/** plainIPv4 turns "::ffff:10.0.0.1" (a v4 address on a dual-stack socket) into "10.0.0.1". */
export function plainIPv4(address: string | undefined): string {
  if (address === undefined) return '';
  return address.startsWith('::ffff:') ? address.slice(7) : address;
}
