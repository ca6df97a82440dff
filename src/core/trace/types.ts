// The answer of every backend's tracer: a packet walked through the rules a node really holds.
import type {Protocol} from '../model/types.ts';

/** Packet is the first packet of a connection as the node sees it. */
export interface Packet {
  srcIP: string;
  dstIP: string;
  dstPort: number;
  protocol: Protocol;
  /**
   * 'arriving': the packet arrives on an interface (PREROUTING), from a pod or from outside.
   * 'local': the node itself sends it (OUTPUT), e.g. curl run on the node.
   */
  origin: 'arriving' | 'local';
  /** Interface the packet arrives on (for bridge / interface-prefix local detection). */
  inInterface?: string;
  /**
   * How conntrack sees the packet; default 'new'. 'invalid' is a packet conntrack cannot place
   * (an out-of-window TCP segment): the nat table never sees it, and only rules matching that
   * state (iptables mode's INVALID drop) act on it.
   */
  conntrack?: 'new' | 'invalid';
}

/** TraceContext is what the tracer must know about the node that no rule says. */
export interface TraceContext {
  /** Addresses the node holds (for `-m addrtype --dst-type LOCAL` and `--src-type LOCAL`). */
  localAddresses: string[];
  /**
   * false: hops and masquerade reasons carry no sentences, for callers that read only where packets
   * go (a behaviour diff traces tens of thousands). Default true.
   */
  explain?: boolean;
}

/** TraceHop is one rule the packet matched (or the chain policy it fell to). */
export interface TraceHop {
  hook: 'PREROUTING' | 'INPUT' | 'FORWARD' | 'OUTPUT' | 'POSTROUTING';
  table: string;
  chain: string;
  /** The rule as the kernel lists it (iptables-save / nft syntax); empty for a chain policy. */
  rule: string;
  /** Jump target or verdict: a chain name, DNAT, MARK, RETURN, REJECT, DROP, ACCEPT, ... */
  target: string;
  /** One plain sentence: why the rule matched and what it does to the packet. */
  explanation: string;
}

/** TraceBranch is one endpoint the packet can be sent to, and the path that leads there. */
export interface TraceBranch {
  /** Destination after DNAT, "ip:port". */
  endpoint: string;
  /** Probability that a new connection picks this endpoint (0..1). */
  probability: number;
  /** The hops from the point where paths split (the endpoint chain onwards). */
  hops: TraceHop[];
  /** Whether the packet is source-NATed on the way out, and why. */
  masquerade: boolean;
  masqueradeReason: string;
}

export type TraceVerdict =
  /** DNAT to one of the branches' endpoints. */
  | 'DNAT'
  /** Refused at once (REJECT, e.g. a service without endpoints). */
  | 'REJECT'
  /** Silently dropped (e.g. Local traffic policy with no local endpoint). */
  | 'DROP'
  /** No proxy rule touched the packet; it goes on to its original destination. */
  | 'ACCEPT';

export interface TraceResult {
  packet: Packet;
  verdict: TraceVerdict;
  /** Hops shared by every branch, in order, across hooks and tables. */
  hops: TraceHop[];
  /** One per endpoint when verdict is DNAT; probabilities sum to 1. */
  branches: TraceBranch[];
  /** Service port key ("ns/name:port") the rules attribute the packet to, when known. */
  servicePort?: string;
  /** Things a user should know (e.g. "default/web:http has no endpoints"). */
  warnings: string[];
}
