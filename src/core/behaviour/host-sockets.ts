// Host sockets that answer on service addresses only because ipvs mode binds those addresses to
// kube-ipvs0: a process listening on the wildcard address (or on a service address itself) gets
// every new connection to a service address on a port no virtual server takes, unless the node's
// KUBE-IPVS-FILTER refuses it. After a switch to iptables or nftables mode the addresses are no
// longer the node's and those connections stop reaching the socket.
import {accessFilterVerdict, type IpvsState, virtualServerKey} from '../ipvs/index.ts';
import {parseIP} from '../model/ip.ts';
import type {Protocol} from '../model/types.ts';

export interface ListeningSocket {
  protocol: Protocol;
  /** "0.0.0.0", "::" (IPv6 only), "*" (both families), or one address. */
  address: string;
  port: number;
  /** The device the socket is bound to (SO_BINDTODEVICE, ss's "%eth0"). */
  device?: string;
  /** "sshd (pid 812)", when ss could name it. */
  process?: string;
}

/** socketText: "0.0.0.0:22/TCP (sshd, pid 812)". */
export function socketText(socket: ListeningSocket): string {
  const host = socket.address.includes(':') ? `[${socket.address}]` : socket.address;
  return `${host}${socket.device ? `%${socket.device}` : ''}:${socket.port}/${socket.protocol}${socket.process ? ` (${socket.process})` : ''}`;
}

/**
 * parseListeningSockets reads `ss -H -l -n -t -u -p` output: "tcp LISTEN 0 4096 0.0.0.0:22 0.0.0.0:*
 * users:(("sshd",pid=812,fd=3))". ss writes "*" for an IPv6 socket that takes IPv4 too, "[::]"
 * for one that takes IPv6 only. Lines it cannot read are left out.
 */
export function parseListeningSockets(text: string): ListeningSocket[] {
  const sockets: ListeningSocket[] = [];
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/);
    const protocol = ({tcp: 'TCP', udp: 'UDP', sctp: 'SCTP'} as const)[words[0] as 'tcp' | 'udp' | 'sctp'];
    if (!protocol || words.length < 5) continue;
    const local = /^(?:\[([^\]]+)\]|([^\s%[\]]+?))(?:%(\S+))?:(\d+)$/.exec(words[4]);
    if (!local) continue;
    let address = local[1] ?? local[2];
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
    if (mapped) address = mapped[1];
    if (address !== '*' && !parseIP(address)) continue;
    const users = /users:\(\("((?:[^"\\]|\\.)*)",pid=(\d+)/.exec(line);
    sockets.push({
      protocol,
      address,
      port: Number(local[4]),
      ...(local[3] ? {device: local[3]} : {}),
      ...(users ? {process: `${users[1]}, pid ${users[2]}`} : {}),
    });
  }
  return sockets;
}

export interface SocketOnServiceAddresses {
  socket: ListeningSocket;
  /** The service addresses (bound to kube-ipvs0) it answers on today. */
  addresses: string[];
}

export interface HostSocketFindings {
  answering: SocketOnServiceAddresses[];
  /** Sockets bound to a device, left out: they answer only what arrives on that device. */
  deviceBound: ListeningSocket[];
  /** Whether the node's KUBE-IPVS-FILTER refused any of them. */
  filtered: boolean;
}

function takes(socket: ListeningSocket, address: string, family: IpvsState['family']): boolean {
  if (socket.address === '*') return true;
  if (socket.address === '0.0.0.0') return family === 'IPv4';
  if (socket.address === '::') return family === 'IPv6';
  return socket.address === address;
}

/**
 * socketsOnServiceAddresses: for each listening socket, the addresses bound to kube-ipvs0 it
 * answers on today: it takes the address, no virtual server takes that port there, and the node's
 * KUBE-IPVS-FILTER (if any) lets new connections through.
 */
export function socketsOnServiceAddresses(states: IpvsState[], sockets: ListeningSocket[]): HostSocketFindings {
  const answering: SocketOnServiceAddresses[] = [];
  const deviceBound = sockets.filter((socket) => socket.device !== undefined);
  let filtered = false;
  const served = states.map((state) => new Set(state.virtualServers.map(virtualServerKey)));
  for (const socket of sockets) {
    if (socket.device !== undefined) continue;
    const addresses: string[] = [];
    for (const [index, state] of states.entries()) {
      for (const address of state.boundAddresses) {
        if (!takes(socket, address, state.family)) continue;
        if (served[index].has(virtualServerKey({protocol: socket.protocol, address, port: socket.port}))) continue;
        if (accessFilterVerdict(state, address, socket.port, socket.protocol)?.refused) {
          filtered = true;
          continue;
        }
        addresses.push(address);
      }
    }
    if (addresses.length > 0) answering.push({socket, addresses});
  }
  return {answering, deviceBound, filtered};
}

function someAddresses(addresses: string[]): string {
  const shown = addresses.slice(0, 3).join(', ');
  return addresses.length > 3 ? `${shown} and ${addresses.length - 3} more service addresses` : shown;
}

/** hostSocketSentences says the findings for migrate-check's evidence, one sentence per answering socket. */
export function hostSocketSentences(findings: HostSocketFindings, boundCount: number, to: string): string[] {
  if (findings.answering.length === 0)
    return [
      `no host socket answers on the ${boundCount} service address${boundCount === 1 ? '' : 'es'} bound to kube-ipvs0${
        findings.filtered ? " (the node's KUBE-IPVS-FILTER refuses new connections on ports no service uses)" : ''
      }: nothing that answers there today stops answering after the switch`,
    ];
  return findings.answering.map(
    ({socket, addresses}) =>
      `host socket ${socketText(socket)} answers on ${someAddresses(addresses)} today, only because ipvs mode binds ${
        addresses.length === 1 ? 'that address' : 'those addresses'
      } to kube-ipvs0; after the switch to ${to} mode it would not`,
  );
}
