// Where a pods/portforward stream goes: the pod IP by default, or whatever the lab's resolver says.
import {connect} from 'node:net';
import type {Duplex} from 'node:stream';
import type {KubeObject} from './object-log.ts';

export type PodTarget = {host: string; port: number} | {connect: () => Duplex | Promise<Duplex>};

/** The lab points host-network pods at their node namespace's loopback; tests point pods at local servers. */
export type PodAddressResolver = (pod: KubeObject, port: number) => PodTarget | Promise<PodTarget>;

export const podIPResolver: PodAddressResolver = (pod, port) => {
  const ip = pod.status?.podIP;
  if (!ip) throw new Error(`pod ${pod.metadata.namespace}/${pod.metadata.name} has no IP address`);
  return {host: ip, port};
};

/** Opens a TCP stream to `port` of `pod`; resolves once connected, rejects with the dial error. */
export async function dialPod(resolver: PodAddressResolver, pod: KubeObject, port: number): Promise<Duplex> {
  const target = await resolver(pod, port);
  if ('connect' in target) return await target.connect();
  return await new Promise<Duplex>((resolve, reject) => {
    // No Nagle, as kubelet's Go sockets: a request the client writes in two pieces would otherwise
    // wait for the pod's delayed ACK on every call through the port-forward (docs/development.md,
    // Plugin start).
    const socket = connect({host: target.host, port: target.port, noDelay: true});
    socket.once('connect', () => {
      socket.off('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}

/** Ports from `?ports=80&ports=81` or `?ports=80,81`. */
export function requestedPorts(search: URLSearchParams): number[] {
  const ports: number[] = [];
  for (const value of search.getAll('ports')) for (const part of value.split(',')) if (part.trim()) ports.push(Number(part.trim()));
  return ports;
}

export function portForwardError(pod: KubeObject, port: number, err: unknown): string {
  return `error forwarding port ${port} to pod ${pod.metadata.uid}, uid : ${(err as Error).message}`;
}
