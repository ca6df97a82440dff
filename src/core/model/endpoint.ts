// The name kube-proxy gives an endpoint of a service port.
import {joinHostPort} from './ip.ts';
import type {Endpoint} from './types.ts';

/**
 * "ip:port" ("[ip]:port" for IPv6, as Go's net.JoinHostPort writes it): the endpoint string
 * kube-proxy hashes into endpoint chain names and sorts endpoints by. Made when asked for, not
 * kept in each endpoint: a model of 100,000 endpoints would hold 4 MB of these strings.
 */
export function endpointKey(endpoint: Pick<Endpoint, 'ip' | 'port'>): string {
  return joinHostPort(endpoint.ip, endpoint.port);
}
