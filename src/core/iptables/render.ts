// ProxyModel -> iptables-restore input for the filter and nat tables, written the way kube-proxy's
// iptables proxier (pkg/proxy/iptables/proxier.go) writes it: same chains, rule order, comments,
// probabilities and hashed chain names, so that both can be compared line by line.
import {portsWithIdentities, servicePortIdentity} from '../model/changes.ts';
import {cidrContains, parseCIDR, parseIP, type ParsedCIDR} from '../model/ip.ts';
import type {Endpoint, LocalDetector, ProxyModel, ServicePort} from '../model/types.ts';
import {
  endpointChainName,
  filterChains,
  isServiceChainName,
  kubeletFirewallChain,
  natChains,
  nfacctCounters,
  portProtoHash,
  serviceChainPrefixes,
  type ProxyTable,
} from './chains.ts';

export interface RenderIptablesOptions {
  /**
   * servicePortIdentity strings of the service ports whose own chains (KUBE-SVC/SVL/EXT/FW/SEP)
   * are written; the others' chains are neither declared nor written, so iptables-restore
   * --noflush leaves them as they are (kube-proxy's partial sync). Undefined: every chain.
   * KUBE-SERVICES, KUBE-NODEPORTS and the other fixed chains are always written in full.
   */
  changedServicePorts?: ReadonlySet<string>;
  /**
   * The proxy's chains in the kernel now, per table. Per-service chains among them that the
   * model no longer needs are flushed and deleted (-X) in the same input.
   */
  existingChains?: ReadonlyMap<string, ReadonlySet<string>>;
  /**
   * Also declare the built-in chains and write the jump rules into them, so that the output
   * loads with plain iptables-restore (no --noflush) into an empty network namespace.
   */
  includeJumps?: boolean;
  /**
   * In a partial render, the model the rules in the kernel were written from. When no service
   * port came or went and the changed ones have the same rules in the fixed chains in both, the
   * fixed chains are left out (neither declared nor written): an endpoint change then writes one
   * service's chains, not also KUBE-SERVICES' 10,000 rules at 10,000 services.
   */
  previous?: ProxyModel;
  /**
   * Lines the caller adds to a table's part: `start` right after "*table" (restore commands,
   * such as -Z), `end` right before COMMIT (rules in built-in chains that lead to the proxy's
   * chains, once those are filled).
   */
  extraLines?: Partial<Record<ProxyTable, {start?: string[]; end?: string[]}>>;
}

/** A rule in a built-in chain that leads into the proxy's chains, as argv for `iptables -t TABLE -I CHAIN`. */
export interface IptablesJumpRule {
  table: ProxyTable;
  chain: string;
  rule: string[];
  position: 'prepend' | 'append';
}

/**
 * Above this many endpoints (over all service ports) kube-proxy leaves the comments out of the
 * endpoint rules to keep the ruleset small ("large cluster mode").
 */
export const largeClusterEndpointsThreshold = 1000;

/**
 * isLargeCluster: the model has more endpoints than largeClusterEndpointsThreshold, so its
 * endpoint rules go without comments. A change across the threshold changes the rules of every
 * service port, changed or not: kube-proxy then rewrites them all (a full sync).
 */
export function isLargeCluster(model: ProxyModel): boolean {
  let total = 0;
  for (const port of model.servicePorts) total += port.endpoints.length;
  return total > largeClusterEndpointsThreshold;
}

/** masqueradeMark is the packet mark that flags SNAT, e.g. "0x4000" for bit 14. */
export function masqueradeMark(bit: number): string {
  return `0x${(2 ** bit).toString(16)}`;
}

const builtinChains: Record<ProxyTable, readonly string[]> = {
  filter: ['INPUT', 'FORWARD', 'OUTPUT'],
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
};

/**
 * renderJumpRules lists kube-proxy's rules from the built-in chains into its own, in the order
 * kube-proxy ensures them (each one prepended), plus the jumps into kubelet's KUBE-FIREWALL when
 * the render writes that chain (IPv4 with localhost NodePorts).
 */
export function renderJumpRules(model: ProxyModel): IptablesJumpRule[] {
  const jump = (table: ProxyTable, chain: string, target: string, comment: string, newOnly: boolean): IptablesJumpRule => ({
    table,
    chain,
    rule: [...(newOnly ? ['-m', 'conntrack', '--ctstate', 'NEW'] : []), '-m', 'comment', '--comment', comment, '-j', target],
    position: 'prepend',
  });
  const external = 'kubernetes externally-visible service portals';
  const portals = 'kubernetes service portals';
  const firewall = 'kubernetes load balancer firewall';
  const rules: IptablesJumpRule[] = [
    jump('filter', 'INPUT', filterChains.externalServices, external, true),
    jump('filter', 'FORWARD', filterChains.externalServices, external, true),
    jump('filter', 'INPUT', filterChains.nodePorts, 'kubernetes health check service ports', false),
    jump('filter', 'FORWARD', filterChains.services, portals, true),
    jump('filter', 'OUTPUT', filterChains.services, portals, true),
    jump('filter', 'FORWARD', filterChains.forward, 'kubernetes forwarding rules', false),
    jump('filter', 'INPUT', filterChains.proxyFirewall, firewall, true),
    jump('filter', 'OUTPUT', filterChains.proxyFirewall, firewall, true),
    jump('filter', 'FORWARD', filterChains.proxyFirewall, firewall, true),
    jump('nat', 'OUTPUT', natChains.services, portals, false),
    jump('nat', 'PREROUTING', natChains.services, portals, false),
    jump('nat', 'POSTROUTING', natChains.postrouting, 'kubernetes postrouting rules', false),
  ];
  if (nodePortPlan(model).localhostNodePorts) {
    for (const chain of ['INPUT', 'OUTPUT']) {
      rules.push({table: 'filter', chain, rule: ['-j', kubeletFirewallChain], position: 'prepend'});
    }
  }
  return rules;
}

/** countRules counts the rules (-A / -I lines) per table in iptables-restore or iptables-save text. */
export function countRules(text: string): Record<ProxyTable, number> {
  const counts: Record<ProxyTable, number> = {filter: 0, nat: 0};
  let table: string | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1).trim();
    else if ((table === 'filter' || table === 'nat') && /^(\[\d+:\d+\]\s+)?-[AI] /.test(line)) counts[table]++;
  }
  return counts;
}

/**
 * NodePortPlan is where NodePorts answer: every local address (matchAll), or the node addresses
 * inside nodePortAddresses; and whether NodePorts answer on 127.0.0.0/8 too.
 */
interface NodePortPlan {
  matchAll: boolean;
  /** With matchAll false: the addresses that get a KUBE-NODEPORTS jump, loopback ones filtered. */
  addresses: string[];
  /** kube-proxy's localhostNodePorts after its adjustments: IPv4 only, and only if 127.0.0.1 is covered. */
  localhostNodePorts: boolean;
}

/**
 * nodePortPlan follows kube-proxy's NodePortAddresses: CIDRs of the proxy's family ('primary'
 * meaning the primary node IP), none or a zero CIDR meaning every address. kube-proxy reads the
 * node's interface addresses; the model knows the node's own IPs, and the loopback address is
 * added since every node has it.
 */
function nodePortPlan(model: ProxyModel): NodePortPlan {
  const ipv4 = model.family === 'IPv4';
  const cidrs: ParsedCIDR[] = [];
  for (const entry of model.config.nodePortAddresses) {
    const text = entry === 'primary' ? (model.nodeIPs[0] === undefined ? undefined : `${model.nodeIPs[0]}/${ipv4 ? 32 : 128}`) : entry;
    const cidr = text === undefined ? undefined : parseCIDR(text);
    if (cidr && cidr.family === model.family) cidrs.push(cidr);
  }
  const matchAll = cidrs.length === 0 || cidrs.some((cidr) => cidr.prefixLength === 0);
  const loopback = parseIP(ipv4 ? '127.0.0.1' : '::1')!;
  const coversLoopback = matchAll || (ipv4 && cidrs.some((cidr) => cidr.network.bytes[0] === 127 || cidrContains(cidr, loopback)));
  const localhostNodePorts = ipv4 && model.config.localhostNodePorts && coversLoopback;
  const addresses: string[] = [];
  if (!matchAll) {
    for (const text of [loopback.text, ...model.nodeIPs]) {
      const ip = parseIP(text);
      if (!ip || addresses.includes(ip.text) || !cidrs.some((cidr) => cidrContains(cidr, ip))) continue;
      const isLoopback = ipv4 ? ip.bytes[0] === 127 : ip.text === '::1';
      if (isLoopback && !localhostNodePorts) continue;
      addresses.push(ip.text);
    }
  }
  return {matchAll, addresses, localhostNodePorts};
}

/** Whether NodePorts on 127.0.0.0/8 are counted: they answer there, and the node has the nfacct object. */
function countsLocalhostNodePorts(model: ProxyModel): boolean {
  return nodePortPlan(model).localhostNodePorts && model.config.iptablesFeatures.nfacctCounters.includes(nfacctCounters.localhostNodePortsAccepted);
}

/** The match words of a local-traffic detector ("-s 10.244.0.0/16" / "! -s 10.244.0.0/16"), or undefined for none. */
function localTrafficMatches(detector: LocalDetector): {ifLocal: string; ifNotLocal: string} | undefined {
  switch (detector.mode) {
    case 'ClusterCIDR':
    case 'NodeCIDR': {
      // kube-proxy builds its detector from the first CIDR of the family only.
      const cidr = detector.cidrs[0];
      return cidr === undefined ? undefined : {ifLocal: `-s ${cidr}`, ifNotLocal: `! -s ${cidr}`};
    }
    case 'BridgeInterface':
      return {ifLocal: `-i ${detector.interfaceName}`, ifNotLocal: `! -i ${detector.interfaceName}`};
    case 'InterfaceNamePrefix':
      return {ifLocal: `-i ${detector.interfacePrefix}+`, ifNotLocal: `! -i ${detector.interfacePrefix}+`};
    default:
      return undefined;
  }
}

/**
 * probabilityText writes 1/n as Go's fmt "%0.10f" does: the exact binary value rounded half to
 * even (JavaScript's toFixed rounds exact ties up, which differs at n = 2048).
 */
export function probabilityText(n: number): string {
  const value = 1 / n;
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, value);
  const high = view.getUint32(0);
  const low = view.getUint32(4);
  const exponentBits = (high >>> 20) & 0x7ff;
  let mantissa = (BigInt(high & 0xfffff) << 32n) | BigInt(low);
  if (exponentBits !== 0) mantissa |= 1n << 52n;
  // value = mantissa * 2^(exponentBits - 1075); for 0 < value <= 1 that exponent is negative.
  const shift = BigInt(1075 - (exponentBits === 0 ? 1 : exponentBits));
  const scaled = mantissa * 10n ** 10n;
  let quotient = scaled >> shift;
  const remainder = scaled - (quotient << shift);
  const half = 1n << (shift - 1n);
  if (remainder > half || (remainder === half && (quotient & 1n) === 1n)) quotient++;
  const digits = quotient.toString().padStart(11, '0');
  return `${digits.slice(0, -10)}.${digits.slice(-10)}`;
}

/** Comments kube-proxy writes with spaces go out quoted for iptables-restore. */
function quote(text: string): string {
  return `"${text}"`;
}

/** restoreArgs joins argv words for an iptables-restore line, quoting words with spaces. */
function restoreArgs(words: string[]): string {
  return words.map((word) => (/[\s"]/.test(word) || word === '' ? quote(word.replace(/"/g, '\\"')) : word)).join(' ');
}

/**
 * LineBuffer collects lines as UTF-8 bytes. Each line string dies young instead of living on in
 * an array of 10^5 strings until one final join; at 10,000 services that saves about a third of
 * the CPU time, most of it garbage collection.
 */
class LineBuffer {
  // Chunks start small (a partial sync writes a few lines) and double up to 256 KiB: a streamed
  // render hands out each full chunk, and the event loop feeds the pipe one pipe's worth (64 KiB)
  // per turn, so a chunk must take less time to make than iptables-restore takes to read that
  // for the restore never to wait.
  #chunkSize = 16 * 1024;
  #chunks: Buffer[] = [];
  #current = Buffer.allocUnsafe(0);
  #offset = 0;

  push(...lines: string[]): void {
    for (const line of lines) {
      // A UTF-8 character takes at most 3 bytes per UTF-16 unit; +1 for the newline.
      const room = line.length * 3 + 1;
      if (this.#current.length - this.#offset < room) {
        if (this.#offset > 0) this.#chunks.push(this.#current.subarray(0, this.#offset));
        this.#current = Buffer.allocUnsafe(Math.max(this.#chunkSize, room));
        this.#chunkSize = Math.min(this.#chunkSize * 2, 256 * 1024);
        this.#offset = 0;
      }
      this.#offset += this.#current.write(line, this.#offset, 'utf8');
      this.#current[this.#offset++] = 0x0a;
    }
  }

  /** The chunks filled so far, handed out once: the lines pushed after them stay. */
  takeFull(): Buffer[] {
    const full = this.#chunks;
    this.#chunks = [];
    return full;
  }

  buffers(): Buffer[] {
    return [...this.#chunks, this.#current.subarray(0, this.#offset)];
  }
}

/** Where rendered lines go: a LineBuffer, an array, or nowhere. */
interface LineSink {
  push(...lines: string[]): unknown;
}

const discardLines: LineSink = {push: () => undefined};

/**
 * fixedChainsChange: whether a partial render for `changed` (servicePortIdentity strings) changes
 * the fixed chains: a port came or went, or a changed port has other rules in them than before.
 * The other ports are equal in both (changedServicePorts compared them), and so are their rules.
 */
function fixedChainsChange(previous: ProxyModel, next: ProxyModel, changed: ReadonlySet<string>): boolean {
  if (previous.servicePorts.length !== next.servicePorts.length) return true;
  const portsOf = (model: ProxyModel) => new Map(portsWithIdentities(model, changed).map((port) => [servicePortIdentity(port), port]));
  const before = portsOf(previous);
  const after = portsOf(next);
  for (const identity of changed) {
    const [was, is] = [before.get(identity), after.get(identity)];
    if (!was || !is) return true;
    const [wasRules, isRules] = [[] as string[], [] as string[]];
    writeFixedChainRules(was, wasRules, wasRules, countsLocalhostNodePorts(previous));
    writeFixedChainRules(is, isRules, isRules, countsLocalhostNodePorts(next));
    if (wasRules.join('\n') !== isRules.join('\n')) return true;
  }
  return false;
}

/**
 * renderIptables writes the filter and nat tables for the model as iptables-restore input.
 * Lines follow kube-proxy's order: the fixed chains first, then each service port in model
 * order (its KUBE-SERVICES / KUBE-NODEPORTS / filter rules, then its own chains), stale chains
 * deleted, and KUBE-SERVICES ending with the jump to KUBE-NODEPORTS.
 */
export function renderIptables(model: ProxyModel, options: RenderIptablesOptions = {}): string {
  return Buffer.concat([...renderIptablesChunks(model, options)]).toString('utf8');
}

/**
 * renderIptablesChunks is renderIptables' output in pieces, handed out as they are ready, so that
 * iptables-restore can read the first while the rest is rendered: the render is much faster than
 * the restore reads, so the sync takes about as long as the restore alone.
 *
 * Two passes over the service ports keep kube-proxy's order. The first writes the filter table and
 * declares the nat chains (iptables-restore refuses a jump to a chain not declared yet); the
 * second writes the nat rules, which are most of the output, a chunk at a time.
 */
export function* renderIptablesChunks(model: ProxyModel, options: RenderIptablesOptions = {}): Generator<Buffer> {
  const {changedServicePorts, existingChains, includeJumps = false, extraLines = {}} = options;
  const writeFixedChains = changedServicePorts === undefined || options.previous === undefined || fixedChainsChange(options.previous, model, changedServicePorts);
  const mark = masqueradeMark(model.config.masqueradeBit);
  const detector = localTrafficMatches(model.config.localDetector);
  const plan = nodePortPlan(model);
  const masqueradeAll = model.config.masqueradeAll;
  const features = model.config.iptablesFeatures;
  const countLocalhost = countsLocalhostNodePorts(model);
  const primaryNodeIP = model.nodeIPs[0] === undefined ? undefined : parseIP(model.nodeIPs[0]);
  const MASQ = natChains.markMasq;

  const filterChainLines = new LineBuffer();
  const filterRules = new LineBuffer();
  const natChainLines = new LineBuffer();
  const natRules = new LineBuffer();
  const activeNatChains = existingChains ? new Set<string>() : undefined;
  // Where the fixed chains' rules go: nowhere when they are left out.
  const fixedNat: LineSink = writeFixedChains ? natRules : discardLines;
  const fixedFilter: LineSink = writeFixedChains ? filterRules : discardLines;

  if (writeFixedChains) for (const chain of Object.values(filterChains)) filterChainLines.push(`:${chain} - [0:0]`);
  if (writeFixedChains) for (const chain of Object.values(natChains)) natChainLines.push(`:${chain} - [0:0]`);

  if (plan.localhostNodePorts && writeFixedChains) {
    // NodePorts on 127.0.0.1 need route_localnet, which lets martian packets to 127/8 in; this
    // rule (also written by kubelet) drops them again.
    filterChainLines.push(`:${kubeletFirewallChain} - [0:0]`);
    filterRules.push(
      `-A ${kubeletFirewallChain} -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
    );
  }

  const largeCluster = isLargeCluster(model);
  const probabilities: string[] = [];
  const probability = (n: number): string => (probabilities[n] ??= probabilityText(n));

  // A partial render that leaves the fixed chains out, and need not tell which chains are in use,
  // writes the changed ports alone: at 10,000 services the others are most of its time.
  const changedOnly = changedServicePorts !== undefined && !writeFixedChains && activeNatChains === undefined;
  const ports = changedOnly ? portsWithIdentities(model, changedServicePorts) : model.servicePorts;
  /** Per port, what the first pass learned for the second; undefined for a port whose own chains are not written. */
  const written: Array<WrittenPort | undefined> = [];

  // First pass: the filter table's rules, and the nat chains declared.
  for (let index = 0; index < ports.length; index++) {
    const port = ports[index];
    const writesChains = changedServicePorts === undefined || changedServicePorts.has(servicePortIdentity(port));
    if (!writesChains && activeNatChains === undefined) {
      if (writeFixedChains) writeFixedChainRules(port, discardLines, fixedFilter, countLocalhost);
      continue;
    }
    const names = chainNamesOf(port);
    const chains = writeFixedChainRules(port, discardLines, fixedFilter, countLocalhost, names);
    // Chains of a port left alone in a partial render are not declared (that would flush them),
    // but they are still in use, so not stale.
    const declare = (chain: string): void => {
      if (writesChains) natChainLines.push(`:${chain} - [0:0]`);
      activeNatChains?.add(chain);
    };
    if (chains.usesExternalChain) declare(names.externalChain);
    if (chains.usesFirewallChain) declare(names.firewallChain);
    if (port.clusterEndpoints.length > 0 && port.usesClusterEndpoints) declare(names.clusterChain);
    if (port.localEndpoints.length > 0 && port.usesLocalEndpoints) declare(names.localChain);
    // Every endpoint chain name is hashed once, though the SVC, SVL and SEP rules all use it.
    const endpointChains = new Map<string, string>();
    for (const endpoint of port.allReachableEndpoints) {
      const chain = endpointChainName(port, endpoint);
      endpointChains.set(endpoint.key, chain);
      declare(chain);
    }
    if (writesChains) written[index] = {names, chains, endpointChains};
  }

  const staleNatChains: string[] = [];
  if (existingChains && activeNatChains) {
    for (const table of ['filter', 'nat'] as const) {
      const existing = existingChains.get(table);
      if (!existing) continue;
      for (const chain of [...existing].sort()) {
        if (!isServiceChainName(chain) || (table === 'nat' && activeNatChains.has(chain))) continue;
        // The chain line flushes it, so nothing in it still points elsewhere when it is deleted.
        if (table === 'nat') {
          natChainLines.push(`:${chain} - [0:0]`);
          staleNatChains.push(chain);
        } else {
          filterChainLines.push(`:${chain} - [0:0]`);
          filterRules.push(`-X ${chain}`);
        }
      }
    }
  }

  if (!features.conntrackTCPLiberal) {
    // Without nf_conntrack_tcp_be_liberal an out-of-window packet is INVALID, escapes DNAT
    // reversal and makes the client reset the connection.
    const counter = features.nfacctCounters.includes(nfacctCounters.ctStateInvalidDropped) ? ` -m nfacct --nfacct-name ${nfacctCounters.ctStateInvalidDropped}` : '';
    fixedFilter.push(`-A ${filterChains.forward} -m conntrack --ctstate INVALID${counter} -j DROP`);
  }
  fixedFilter.push(
    `-A ${filterChains.forward} -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`,
    `-A ${filterChains.forward} -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
  );

  const jumps = includeJumps ? renderJumpRules(model) : [];
  const lines = (...text: string[]): Buffer => Buffer.from(text.map((line) => `${line}\n`).join(''), 'utf8');
  /** A table's part up to its rules: "*table", the caller's first lines, the chains declared, the jump rules. */
  const head = (table: ProxyTable, chainLines: LineBuffer): Buffer[] => [
    lines(`*${table}`, ...(extraLines[table]?.start ?? []), ...(includeJumps ? builtinChains[table].map((chain) => `:${chain} ACCEPT [0:0]`) : [])),
    ...chainLines.buffers(),
    lines(...(includeJumps ? jumpRuleLines(jumps, table) : [])),
  ];
  const tail = (table: ProxyTable): Buffer => lines(...(extraLines[table]?.end ?? []), 'COMMIT');
  yield Buffer.concat([...head('filter', filterChainLines), ...filterRules.buffers(), tail('filter'), ...head('nat', natChainLines)]);

  // Second pass: the nat rules, in chunks.
  fixedNat.push(
    `-A ${natChains.postrouting} -m mark ! --mark ${mark}/${mark} -j RETURN`,
    // Clearing the mark keeps a packet that passes the stack again from being masqueraded twice.
    `-A ${natChains.postrouting} -j MARK --xor-mark ${mark}`,
    `-A ${natChains.postrouting} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE${features.randomFully ? ' --random-fully' : ''}`,
    `-A ${MASQ} -j MARK --or-mark ${mark}`,
  );
  for (let index = 0; index < ports.length; index++) {
    const port = ports[index];
    const own = written[index];
    if (!own) {
      if (writeFixedChains) writeFixedChainRules(port, fixedNat, discardLines, countLocalhost);
      continue;
    }
    writeFixedChainRules(port, fixedNat, discardLines, countLocalhost, own.names);
    writePortChains(port, own);
    yield* natRules.takeFull();
  }
  for (const chain of staleNatChains) natRules.push(`-X ${chain}`);

  const nodePortsComment = quote('kubernetes service nodeports; NOTE: this must be the last rule in this chain');
  if (plan.matchAll) {
    let destinations = '-m addrtype --dst-type LOCAL';
    // NodePorts never answer on ::1, and on 127/8 only with route_localnet.
    if (model.family === 'IPv6') destinations += ' ! -d ::1/128';
    else if (!plan.localhostNodePorts) destinations += ' ! -d 127.0.0.0/8';
    fixedNat.push(`-A ${natChains.services} -m comment --comment ${nodePortsComment} ${destinations} -j ${natChains.nodePorts}`);
  } else {
    for (const address of plan.addresses) {
      fixedNat.push(`-A ${natChains.services} -m comment --comment ${nodePortsComment} -d ${address} -j ${natChains.nodePorts}`);
    }
  }
  yield Buffer.concat([...natRules.buffers(), tail('nat')]);

  /** writePortChains writes the rules of the port's own chains: SVC/SVL, EXT, FW and SEP. */
  function writePortChains(port: ServicePort, {names, chains, endpointChains}: WrittenPort): void {
    const name = port.key;
    const protocol = port.protocol.toLowerCase();
    const matchProtocol = `-m ${protocol} -p ${protocol}`;
    const {clusterChain, localChain, externalChain, firewallChain} = names;
    const rules = natRules;
    const chainOf = (endpoint: Endpoint): string => endpointChains.get(endpoint.key) ?? endpointChainName(port, endpoint);

    if (chains.hasInternalEndpoints) {
      const clusterIPMatch = `-m comment --comment ${quote(`${name} cluster IP`)} ${matchProtocol} -d ${port.clusterIP} --dport ${port.port}`;
      if (masqueradeAll) rules.push(`-A ${chains.internalChain} ${clusterIPMatch} -j ${MASQ}`);
      // Off-cluster clients may route the service range to any node; their traffic can leave
      // the node again towards the endpoint, so it is masqueraded.
      else if (detector) rules.push(`-A ${chains.internalChain} ${clusterIPMatch} ${detector.ifNotLocal} -j ${MASQ}`);
    }

    if (chains.usesExternalChain) {
      if (!port.externalPolicyLocal) {
        rules.push(`-A ${externalChain} -m comment --comment ${quote(`masquerade traffic for ${name} external destinations`)} -j ${MASQ}`);
      } else {
        // Pods reaching an external address of the service behave as if they went out to a
        // load balancer and came back: neither traffic policy applies to them.
        if (detector) {
          rules.push(`-A ${externalChain} -m comment --comment ${quote(`pod traffic for ${name} external destinations`)} ${detector.ifLocal} -j ${clusterChain}`);
        }
        // The node itself would pick the external address as its source, so it is masqueraded.
        rules.push(
          `-A ${externalChain} -m comment --comment ${quote(`masquerade LOCAL traffic for ${name} external destinations`)} -m addrtype --src-type LOCAL -j ${MASQ}`,
          `-A ${externalChain} -m comment --comment ${quote(`route LOCAL traffic for ${name} external destinations`)} -m addrtype --src-type LOCAL -j ${clusterChain}`,
        );
      }
      if (chains.hasExternalEndpoints) rules.push(`-A ${externalChain} -j ${chains.externalPolicyChain}`);
    }

    if (chains.usesFirewallChain) {
      const head = `-A ${firewallChain} -m comment --comment ${quote(`${name} loadbalancer IP`)}`;
      let allowFromNode = false;
      for (const range of port.loadBalancerSourceRanges) {
        rules.push(`${head} -s ${range} -j ${externalChain}`);
        const cidr = parseCIDR(range);
        if (cidr && primaryNodeIP && cidrContains(cidr, primaryNodeIP)) allowFromNode = true;
      }
      // A node reaching a VIP-like load-balancer address that is also local loops back with
      // the VIP as source; when the node is allowed, so is that.
      if (allowFromNode) for (const ip of port.loadBalancerIPs) rules.push(`${head} -s ${ip} -j ${externalChain}`);
      rules.push(`-A ${firewallChain} -m comment --comment ${quote(`other traffic to ${name} will be dropped by KUBE-PROXY-FIREWALL`)}`);
    }

    if (port.clusterEndpoints.length > 0 && port.usesClusterEndpoints) writeServiceToEndpointRules(rules, port, clusterChain, port.clusterEndpoints, chainOf);
    if (port.localEndpoints.length > 0 && port.usesLocalEndpoints) writeServiceToEndpointRules(rules, port, localChain, port.localEndpoints, chainOf);

    for (const endpoint of port.allReachableEndpoints) {
      const chain = chainOf(endpoint);
      const head = largeCluster ? `-A ${chain}` : `-A ${chain} -m comment --comment ${name}`;
      // A pod reaching itself through the service must not see its own address as source.
      rules.push(`${head} -s ${endpoint.ip} -j ${MASQ}`);
      const affinity = port.sessionAffinity ? ` -m recent --name ${chain} --set` : '';
      rules.push(`${head}${affinity} ${matchProtocol} -j DNAT --to-destination ${endpoint.key}`);
    }
  }

  /** writeServiceToEndpointRules: session-affinity checks first, then the random spread over the endpoints. */
  function writeServiceToEndpointRules(rules: LineBuffer, port: ServicePort, chain: string, endpoints: Endpoint[], chainOf: (endpoint: Endpoint) => string): void {
    const name = port.key;
    const endpointChains = endpoints.map(chainOf);
    const head = (endpoint: Endpoint): string => (largeCluster ? `-A ${chain}` : `-A ${chain} -m comment --comment ${quote(`${name} -> ${endpoint.key}`)}`);
    if (port.sessionAffinity) {
      const seconds = port.sessionAffinity.timeoutSeconds;
      endpoints.forEach((endpoint, index) => {
        const target = endpointChains[index];
        rules.push(`${head(endpoint)} -m recent --name ${target} --rcheck --seconds ${seconds} --reap -j ${target}`);
      });
    }
    const count = endpoints.length;
    endpoints.forEach((endpoint, index) => {
      const spread = index < count - 1 ? ` -m statistic --mode random --probability ${probability(count - index)}` : '';
      rules.push(`${head(endpoint)}${spread} -j ${endpointChains[index]}`);
    });
  }
}

/**
 * writeFixedChainRules writes the port's rules in the fixed chains (KUBE-SERVICES, KUBE-NODEPORTS,
 * the filter chains) and tells which of its own chains it uses. They depend on the port alone.
 */
function writeFixedChainRules(
  port: ServicePort,
  natRules: LineSink,
  filterRules: LineSink,
  countLocalhost: boolean,
  names?: {clusterChain: string; localChain: string; externalChain: string; firewallChain: string},
): PortChains {
  const name = port.key;
  const protocol = port.protocol.toLowerCase();
  const matchProtocol = `-m ${protocol} -p ${protocol}`;
  const {clusterChain, localChain, externalChain, firewallChain} = names ?? chainNamesOf(port);
  const hasEndpoints = port.hasAnyEndpoints;
  const noLocal = port.localEndpoints.length === 0;
  const hasInternalEndpoints = hasEndpoints && !(port.internalPolicyLocal && noLocal);
  const hasExternalEndpoints = hasEndpoints && !(port.externalPolicyLocal && noLocal);
  const internalChain = port.internalPolicyLocal ? localChain : clusterChain;
  const externalPolicyChain = port.externalPolicyLocal ? localChain : clusterChain;
  const usesExternalChain = hasEndpoints && port.externallyAccessible;
  const usesFirewallChain = hasEndpoints && port.loadBalancerIPs.length > 0 && (port.loadBalancerSourceRanges.length > 0 || port.loadBalancerSourceRangesInvalid);
  const loadBalancerChain = usesFirewallChain ? firewallChain : externalChain;

  // Used only where the traffic has no endpoint: none at all (REJECT), or none on this node
  // under a Local policy (DROP).
  const filterVerdict = hasEndpoints
    ? {target: 'DROP', comment: quote(`${name} has no local endpoints`)}
    : {target: 'REJECT', comment: quote(`${name} has no endpoints`)};

  if (hasInternalEndpoints) {
    natRules.push(`-A ${natChains.services} -m comment --comment ${quote(`${name} cluster IP`)} ${matchProtocol} -d ${port.clusterIP} --dport ${port.port} -j ${internalChain}`);
  } else {
    filterRules.push(`-A ${filterChains.services} -m comment --comment ${filterVerdict.comment} ${matchProtocol} -d ${port.clusterIP} --dport ${port.port} -j ${filterVerdict.target}`);
  }

  for (const ip of port.externalIPs) {
    if (hasEndpoints) {
      natRules.push(`-A ${natChains.services} -m comment --comment ${quote(`${name} external IP`)} ${matchProtocol} -d ${ip} --dport ${port.port} -j ${externalChain}`);
    }
    // No endpoints at all (REJECT), or none for external traffic that the EXT chain did not
    // short-circuit (DROP).
    if (!hasExternalEndpoints) {
      filterRules.push(`-A ${filterChains.externalServices} -m comment --comment ${filterVerdict.comment} ${matchProtocol} -d ${ip} --dport ${port.port} -j ${filterVerdict.target}`);
    }
  }

  for (const ip of port.loadBalancerIPs) {
    if (hasEndpoints) {
      natRules.push(`-A ${natChains.services} -m comment --comment ${quote(`${name} loadbalancer IP`)} ${matchProtocol} -d ${ip} --dport ${port.port} -j ${loadBalancerChain}`);
    }
    if (usesFirewallChain) {
      filterRules.push(`-A ${filterChains.proxyFirewall} -m comment --comment ${quote(`${name} traffic not accepted by ${firewallChain}`)} ${matchProtocol} -d ${ip} --dport ${port.port} -j DROP`);
    }
  }
  if (!hasExternalEndpoints) {
    for (const ip of port.loadBalancerIPs) {
      filterRules.push(`-A ${filterChains.externalServices} -m comment --comment ${filterVerdict.comment} ${matchProtocol} -d ${ip} --dport ${port.port} -j ${filterVerdict.target}`);
    }
  }

  if (port.nodePort !== 0) {
    // NodePorts are not subject to loadBalancerSourceRanges (kube-proxy never was).
    if (hasEndpoints && countLocalhost) {
      // Counts what reaches NodePorts on 127.0.0.0/8 (route_localnet), which nftables mode does not serve.
      const counter = `-m nfacct --nfacct-name ${nfacctCounters.localhostNodePortsAccepted}`;
      natRules.push(`-A ${natChains.nodePorts} -m comment --comment ${name} ${matchProtocol} -d 127.0.0.0/8 --dport ${port.nodePort} ${counter} -j ${externalChain}`);
    }
    if (hasEndpoints) natRules.push(`-A ${natChains.nodePorts} -m comment --comment ${name} ${matchProtocol} --dport ${port.nodePort} -j ${externalChain}`);
    if (!hasExternalEndpoints) {
      filterRules.push(`-A ${filterChains.externalServices} -m comment --comment ${filterVerdict.comment} -m addrtype --dst-type LOCAL ${matchProtocol} --dport ${port.nodePort} -j ${filterVerdict.target}`);
    }
  }

  if (port.healthCheckNodePort !== 0) {
    // Load balancers probe this port whether or not the node has local endpoints.
    filterRules.push(`-A ${filterChains.nodePorts} -m comment --comment ${quote(`${name} health check node port`)} -m tcp -p tcp --dport ${port.healthCheckNodePort} -j ACCEPT`);
  }

  return {hasInternalEndpoints, hasExternalEndpoints, internalChain, externalPolicyChain, usesExternalChain, usesFirewallChain};
}

/** WrittenPort: what the first pass of renderIptablesChunks learned of a port whose own chains it writes. */
interface WrittenPort {
  names: ReturnType<typeof chainNamesOf>;
  chains: PortChains;
  /** Endpoint key -> its KUBE-SEP chain. */
  endpointChains: Map<string, string>;
}

interface PortChains {
  hasInternalEndpoints: boolean;
  hasExternalEndpoints: boolean;
  internalChain: string;
  externalPolicyChain: string;
  usesExternalChain: boolean;
  usesFirewallChain: boolean;
}

function chainNamesOf(port: ServicePort): {clusterChain: string; localChain: string; externalChain: string; firewallChain: string} {
  const hashed = portProtoHash(port.key, port.protocol);
  return {
    clusterChain: serviceChainPrefixes.cluster + hashed,
    localChain: serviceChainPrefixes.local + hashed,
    externalChain: serviceChainPrefixes.external + hashed,
    firewallChain: serviceChainPrefixes.firewall + hashed,
  };
}

/**
 * jumpRuleLines writes the jump rules of one table as they stand after kube-proxy ensured them
 * on empty built-in chains: each prepended rule lands before the ones ensured earlier.
 */
function jumpRuleLines(jumps: IptablesJumpRule[], table: ProxyTable): string[] {
  const lines: string[] = [];
  for (const chain of builtinChains[table]) {
    const inChain = jumps.filter((jump) => jump.table === table && jump.chain === chain);
    const ordered = [...inChain.filter((jump) => jump.position === 'prepend').reverse(), ...inChain.filter((jump) => jump.position === 'append')];
    for (const jump of ordered) lines.push(`-A ${chain} ${restoreArgs(jump.rule)}`);
  }
  return lines;
}
