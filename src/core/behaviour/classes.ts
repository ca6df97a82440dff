// The packet classes a behaviour diff traces: for every service port, each way into it (ClusterIP,
// NodePort on every node address and loopback, externalIPs, load-balancer IPs, the health check
// port, a ClusterIP's undefined port) from each kind of client, plus the node-wide classes (an
// unused service-CIDR address, a packet conntrack marks INVALID). The classes come from the model
// alone, so the same list is traced through both rulesets.
import {cidrContains, parseCIDR, parseIP, type ParsedCIDR} from '../model/ip.ts';
import type {IPFamily, ProxyModel, ServicePort} from '../model/types.ts';
import type {Packet} from '../trace/types.ts';

export type EntryKind =
  | 'cluster-ip'
  | 'cluster-ip-undefined-port'
  | 'node-port'
  | 'node-port-loopback'
  | 'external-ip'
  | 'load-balancer'
  | 'health-check-node-port'
  | 'service-cidr-unused'
  | 'conntrack-invalid';

export type SourceKind = 'pod-here' | 'pod-elsewhere' | 'node' | 'external' | 'external-allowed' | 'external-denied';

/** Where a source class's packets come from: an address, and how they enter the node. */
export interface SourceAddress {
  ip: string;
  /** Interface the packet arrives on; the node's own packets arrive on none. */
  inInterface?: string;
}

/** The clients a class is sent from; classes.ts picks defaults that the rules tell apart. */
export interface Sources {
  podHere: SourceAddress;
  podElsewhere: SourceAddress;
  external: SourceAddress;
}

export interface PacketClass {
  /** "ns/name:port" of the service port the class belongs to; '' for node-wide classes. */
  servicePort: string;
  entry: EntryKind;
  /** The address the packet is sent to, in words: "NodePort 30080 on 10.0.3.12, which is not a primary node IP". */
  target: string;
  source: SourceKind;
  packet: Packet;
}

export interface ClassOptions {
  /**
   * Every address the node holds of the model's family (primary first); NodePorts are tried on each.
   * Default: the model's node IPs.
   */
  nodeAddresses?: string[];
  /** The cluster's service CIDRs: an address in them that is no ClusterIP is tried too. */
  serviceCIDRs?: string[];
  /** The node's pod CIDR, when the local detector does not say it. */
  podCIDR?: string;
  sources?: Partial<Sources>;
  /** Limit the classes to one service ("ns/name") or service port ("ns/name:port"). */
  service?: string;
}

/** The interface packets from other hosts arrive on, in the classes' world. */
export const uplinkInterface = 'eth0';

const sourceWords: Record<SourceKind, string> = {
  'pod-here': 'a pod on this node',
  'pod-elsewhere': 'a pod on another node',
  node: 'the node itself',
  external: 'a client outside the cluster',
  'external-allowed': 'a client inside loadBalancerSourceRanges',
  'external-denied': 'a client outside loadBalancerSourceRanges',
};

export function sourceText(source: SourceKind): string {
  return sourceWords[source];
}

/**
 * packetClasses lists the classes of every service port of the model (or the one service asked
 * for), then the node-wide classes. Deterministic order: service ports as the model sorts them.
 */
export function packetClasses(model: ProxyModel, options: ClassOptions = {}): PacketClass[] {
  const family = model.family;
  const nodeAddresses = familyAddresses(options.nodeAddresses ?? model.nodeIPs, family);
  const sources = {...defaultSources(model, options.podCIDR), ...options.sources};
  const nodeSource = nodeAddresses[0] ?? (family === 'IPv4' ? '127.0.0.1' : '::1');
  const classes: PacketClass[] = [];
  const portsByClusterIP = new Map<string, ServicePort[]>();
  for (const port of model.servicePorts) {
    if (!port.clusterIP) continue;
    const list = portsByClusterIP.get(port.clusterIP);
    if (list) list.push(port);
    else portsByClusterIP.set(port.clusterIP, [port]);
  }
  const inService = (port: ServicePort) =>
    options.service === undefined || port.key === options.service || port.key.startsWith(`${options.service}:`);
  for (const port of model.servicePorts) {
    if (!inService(port)) continue;
    const add = (entry: EntryKind, target: string, dstIP: string, dstPort: number, from: SourceKind[], protocol = port.protocol) => {
      for (const source of from) classes.push(makeClass(port.key, entry, target, source, dstIP, dstPort, protocol, sources, nodeSource));
    };
    // A pod on another node meets this node's rules only at this node's own addresses: its packets
    // to service addresses are its own node's to DNAT.
    const atServiceAddress: SourceKind[] = ['pod-here', 'node', 'external'];
    const everyone: SourceKind[] = ['pod-here', 'pod-elsewhere', 'node', 'external'];
    const proto = port.protocol;
    if (port.clusterIP) {
      add('cluster-ip', `ClusterIP ${port.clusterIP} port ${port.port}/${proto}`, port.clusterIP, port.port, atServiceAddress);
      // A ClusterIP's undefined port is one class per ClusterIP: the first of its ports carries it.
      const siblings = portsByClusterIP.get(port.clusterIP)!;
      if (siblings[0] === port) {
        const unused = unusedPort(siblings);
        add(
          'cluster-ip-undefined-port',
          `ClusterIP ${port.clusterIP} port ${unused}/${proto}, which no service defines`,
          port.clusterIP,
          unused,
          ['pod-here', 'node'],
        );
      }
    }
    if (port.nodePort) {
      nodeAddresses.forEach((address, index) => {
        const which = index === 0 ? 'the primary node IP' : 'which is not a primary node IP';
        add('node-port', `NodePort ${port.nodePort}/${proto} on ${address}, ${which}`, address, port.nodePort, everyone);
      });
      const loopback = family === 'IPv4' ? '127.0.0.1' : '::1';
      classes.push({
        servicePort: port.key,
        entry: 'node-port-loopback',
        target: `NodePort ${port.nodePort}/${proto} on ${loopback}`,
        source: 'node',
        packet: {srcIP: loopback, dstIP: loopback, dstPort: port.nodePort, protocol: proto, origin: 'local'},
      });
    }
    for (const ip of port.externalIPs) add('external-ip', `external IP ${ip} port ${port.port}/${proto}`, ip, port.port, atServiceAddress);
    for (const ip of port.loadBalancerIPs) {
      const ranged = port.loadBalancerSourceRanges.length > 0 || port.loadBalancerSourceRangesInvalid;
      const outside = ranged ? sourceOutside(port.loadBalancerSourceRanges, family, sources.external.ip) : undefined;
      const inside = ranged ? sourceInside(port.loadBalancerSourceRanges, family) : undefined;
      const target = `load-balancer IP ${ip} port ${port.port}/${proto}`;
      add('load-balancer', target, ip, port.port, ['pod-here', 'node']);
      if (!ranged) add('load-balancer', target, ip, port.port, ['external']);
      for (const [kind, address] of [
        ['external-allowed', inside],
        ['external-denied', outside],
      ] as const) {
        if (address === undefined) continue;
        classes.push(
          makeClass(
            port.key,
            'load-balancer',
            target,
            kind,
            ip,
            port.port,
            proto,
            {...sources, external: {...sources.external, ip: address}},
            nodeSource,
          ),
        );
      }
    }
    if (port.healthCheckNodePort && nodeAddresses[0] !== undefined) {
      const target = `health check port ${port.healthCheckNodePort}/TCP on ${nodeAddresses[0]}`;
      add('health-check-node-port', target, nodeAddresses[0], port.healthCheckNodePort, ['external'], 'TCP');
    }
  }
  if (options.service === undefined) classes.push(...nodeWideClasses(model, options, sources, nodeSource, portsByClusterIP));
  return classes;
}

function makeClass(
  servicePort: string,
  entry: EntryKind,
  target: string,
  source: SourceKind,
  dstIP: string,
  dstPort: number,
  protocol: Packet['protocol'],
  sources: Sources,
  nodeSource: string,
): PacketClass {
  const from: SourceAddress =
    source === 'node'
      ? {ip: nodeSource}
      : source === 'pod-here'
        ? sources.podHere
        : source === 'pod-elsewhere'
          ? sources.podElsewhere
          : sources.external;
  const packet: Packet = {srcIP: from.ip, dstIP, dstPort, protocol, origin: source === 'node' ? 'local' : 'arriving'};
  if (from.inInterface !== undefined && source !== 'node') packet.inInterface = from.inInterface;
  return {servicePort, entry, target, source, packet};
}

function nodeWideClasses(
  model: ProxyModel,
  options: ClassOptions,
  sources: Sources,
  nodeSource: string,
  portsByClusterIP: Map<string, ServicePort[]>,
): PacketClass[] {
  const classes: PacketClass[] = [];
  for (const text of options.serviceCIDRs ?? []) {
    const cidr = parseCIDR(text);
    if (!cidr || cidr.family !== model.family) continue;
    const address = unusedAddress(cidr, portsByClusterIP);
    if (address === undefined) continue;
    for (const source of ['pod-here', 'node'] as const)
      classes.push(
        makeClass(
          '',
          'service-cidr-unused',
          `${address} port 80/TCP in service CIDR ${cidr.text}, which is no ClusterIP`,
          source,
          address,
          80,
          'TCP',
          sources,
          nodeSource,
        ),
      );
  }
  // An out-of-window segment of a connection to a pod: forwarded, not a service address.
  const endpoint =
    model.servicePorts.flatMap((port) => port.endpoints).find((candidate) => !candidate.isLocal) ?? model.servicePorts[0]?.endpoints[0];
  if (endpoint) {
    const invalid = makeClass(
      '',
      'conntrack-invalid',
      `pod ${endpoint.ip} port ${endpoint.port}/TCP with a segment conntrack marks INVALID`,
      'pod-here',
      endpoint.ip,
      endpoint.port,
      'TCP',
      sources,
      nodeSource,
    );
    invalid.packet.conntrack = 'invalid';
    classes.push(invalid);
  }
  return classes;
}

function familyAddresses(addresses: string[], family: IPFamily): string[] {
  const seen = new Set<string>();
  for (const address of addresses) {
    const ip = parseIP(address);
    if (!ip || ip.family !== family) continue;
    const loopback = family === 'IPv4' ? ip.bytes[0] === 127 : ip.text === '::1';
    if (!loopback) seen.add(ip.text);
  }
  return [...seen];
}

/** A port no service port of this ClusterIP uses: the highest free one, far from real services. */
function unusedPort(ports: ServicePort[]): number {
  const used = new Set(ports.map((port) => port.port));
  let candidate = 65535;
  while (used.has(candidate)) candidate--;
  return candidate;
}

function addressAt(cidr: ParsedCIDR, offset: number): string | undefined {
  const bytes = [...cidr.network.bytes];
  let carry = offset;
  for (let index = bytes.length - 1; index >= 0 && carry > 0; index--) {
    const sum = bytes[index] + carry;
    bytes[index] = sum & 0xff;
    carry = Math.floor(sum / 256);
  }
  const text = cidr.family === 'IPv4' ? bytes.join('.') : ipv6Text(bytes);
  const ip = parseIP(text);
  return ip && cidrContains(cidr, ip) ? ip.text : undefined;
}

function ipv6Text(bytes: number[]): string {
  const groups: string[] = [];
  for (let index = 0; index < 16; index += 2) groups.push(((bytes[index] << 8) | bytes[index + 1]).toString(16));
  return groups.join(':');
}

/** An address of the service CIDR that is no ClusterIP: the last ones are seldom allocated. */
function unusedAddress(cidr: ParsedCIDR, used: Map<string, ServicePort[]>): string | undefined {
  const hostBits = (cidr.family === 'IPv4' ? 32 : 128) - cidr.prefixLength;
  const size = hostBits >= 16 ? 65536 : 2 ** hostBits;
  for (let offset = size - 2; offset > 0; offset--) {
    const address = addressAt(cidr, offset);
    if (address !== undefined && !used.has(address)) return address;
  }
  return undefined;
}

function sourceInside(ranges: string[], family: IPFamily): string | undefined {
  for (const text of ranges) {
    const cidr = parseCIDR(text);
    if (!cidr || cidr.family !== family) continue;
    const address = addressAt(cidr, cidr.prefixLength >= (family === 'IPv4' ? 31 : 127) ? 0 : 1);
    if (address !== undefined) return address;
  }
  return undefined;
}

function sourceOutside(ranges: string[], family: IPFamily, preferred: string): string | undefined {
  const cidrs = ranges.map(parseCIDR).filter((cidr): cidr is ParsedCIDR => cidr !== undefined && cidr.family === family);
  const candidates = family === 'IPv4' ? [preferred, '203.0.113.200', '198.51.100.200', '192.0.2.200'] : [preferred, '2001:db8:ffff::200'];
  return candidates.find((text) => {
    const ip = parseIP(text);
    return ip !== undefined && ip.family === family && !cidrs.some((cidr) => cidrContains(cidr, ip));
  });
}

/**
 * defaultSources: a pod address on this node the local detector counts as a pod, one on another
 * node, and an outside client, none of them an endpoint (a pod reaching itself is masqueraded).
 */
export function defaultSources(model: ProxyModel, podCIDR?: string): Sources {
  const family = model.family;
  const detector = model.config.localDetector;
  const endpointIPs = new Set(model.servicePorts.flatMap((port) => port.endpoints.map((endpoint) => endpoint.ip)));
  const cidrs = 'cidrs' in detector ? detector.cidrs : [];
  const nodeCIDRText = (detector.mode === 'NodeCIDR' ? cidrs[0] : undefined) ?? podCIDR;
  const clusterCIDRText = detector.mode === 'ClusterCIDR' ? cidrs[0] : undefined;
  const fallback = family === 'IPv4' ? '10.244.254.0/24' : 'fd00:10:244:fe::/64';
  const hereCIDR = parseCIDR(nodeCIDRText ?? clusterCIDRText ?? fallback)!;
  const pick = (cidr: ParsedCIDR, from: number): string => {
    for (let offset = from; offset < from + 4096; offset++) {
      const address = addressAt(cidr, offset);
      if (address !== undefined && !endpointIPs.has(address)) return address;
    }
    return addressAt(cidr, from) ?? cidr.network.text;
  };
  const podHere = pick(hereCIDR, 201);
  // Another node's pod: in the cluster range but outside this node's range, where one is known.
  const clusterCIDR = parseCIDR(clusterCIDRText ?? '') ?? hereCIDR;
  const elsewhereCIDR = detector.mode === 'NodeCIDR' ? (parseCIDR(nextBlock(hereCIDR)) ?? hereCIDR) : clusterCIDR;
  const podElsewhere = pick(elsewhereCIDR, detector.mode === 'NodeCIDR' ? 201 : 202 + 256);
  const hereInterface =
    detector.mode === 'BridgeInterface'
      ? detector.interfaceName
      : detector.mode === 'InterfaceNamePrefix'
        ? `${detector.interfacePrefix}0`
        : 'veth-pod';
  return {
    podHere: {ip: podHere, inInterface: hereInterface},
    podElsewhere: {ip: podElsewhere, inInterface: uplinkInterface},
    external: {ip: family === 'IPv4' ? '203.0.113.77' : '2001:db8:ffff::77', inInterface: uplinkInterface},
  };
}

/** The block of the same size right after `cidr` (another node's pod range). */
function nextBlock(cidr: ParsedCIDR): string {
  const hostBits = (cidr.family === 'IPv4' ? 32 : 128) - cidr.prefixLength;
  const bytes = [...cidr.network.bytes];
  let index = bytes.length - 1 - Math.floor(hostBits / 8);
  let carry = 1 << (hostBits % 8);
  for (; index >= 0 && carry > 0; index--) {
    const sum = bytes[index] + carry;
    bytes[index] = sum & 0xff;
    carry = sum >> 8;
  }
  return `${cidr.family === 'IPv4' ? bytes.join('.') : ipv6Text(bytes)}/${cidr.prefixLength}`;
}
