// ProxyModel -> iptables-restore input for the filter and nat tables, written the way kube-proxy's
// iptables proxier (pkg/proxy/iptables/proxier.go) writes it: same chains, rule order, comments,
// probabilities and hashed chain names, so that both can be compared line by line.
import {portsWithIdentities, servicePortIdentity} from '../model/changes.ts';
import {endpointKey} from '../model/endpoint.ts';
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
  /**
   * Jump rules to insert (-I for 'prepend', -A for 'append') at the end of their table's part,
   * in the same atomic write as the chains they lead to, once those are filled: the agent's way
   * of adding the ones the kernel lacks without an iptables command per rule.
   */
  insertJumps?: IptablesJumpRule[];
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
  return (
    nodePortPlan(model).localhostNodePorts &&
    model.config.iptablesFeatures.nfacctCounters.includes(nfacctCounters.localhostNodePortsAccepted)
  );
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
 * RenderedTable: what an input renderIptablesWrite made does to one table, told by the renderer
 * rather than read back out of the text: the chains it declares (and so flushes), those it then
 * deletes, and the rules it writes into each chain, in restore spelling (IptablesSaveSpelling
 * gives iptables-save's). A full render (no changedServicePorts) keeps only the count of the rules
 * of each per-service chain: those are most of a large cluster's rules.
 */
export interface RenderedTable {
  declared: string[];
  deleted: string[];
  /** Per declared chain, its rules; a per-service chain of a full render, how many. */
  rules: Map<string, string[] | number>;
  /** The insertJumps of this table, as written (at the table's end, once the chains they lead to are filled). */
  jumps: IptablesJumpRule[];
}

/** IptablesRenderRecord: what the input does, table by table, and the nat chains of each service port it writes. */
export interface IptablesRenderRecord {
  family: ProxyModel['family'];
  tables: Record<ProxyTable, RenderedTable>;
  /** Per service port whose own chains the input writes (servicePortIdentity): those chains. */
  servicePortChains: Map<string, string[]>;
}

/** IptablesRender: an input in pieces, and its record, complete once the last piece has been taken. */
export interface IptablesRender {
  chunks: Generator<Buffer>;
  record: IptablesRenderRecord;
}

/**
 * renderIptablesWrite is renderIptablesChunks with its record: the agent learns what its write
 * leaves from the renderer, while the input streams to iptables-restore, without keeping or
 * re-reading the text.
 */
export function renderIptablesWrite(model: ProxyModel, options: RenderIptablesOptions = {}): IptablesRender {
  const table = (): RenderedTable => ({declared: [], deleted: [], rules: new Map(), jumps: []});
  const record: IptablesRenderRecord = {family: model.family, tables: {filter: table(), nat: table()}, servicePortChains: new Map()};
  return {chunks: renderIptablesChunks(model, options, record), record};
}

/**
 * TableWriter writes one table's chain declarations and rules into LineBuffers and, when the
 * render keeps a record, notes them there as it goes.
 */
class TableWriter {
  readonly chainLines = new LineBuffer();
  readonly rules = new LineBuffer();
  readonly #record: RenderedTable | undefined;
  readonly #countServiceChains: boolean;

  constructor(record: RenderedTable | undefined, countServiceChains: boolean) {
    this.#record = record;
    this.#countServiceChains = countServiceChains;
  }

  declare(chain: string): void {
    this.chainLines.push(`:${chain} - [0:0]`);
    this.#record?.declared.push(chain);
  }

  delete(chain: string): void {
    this.rules.push(`-X ${chain}`);
    this.#record?.deleted.push(chain);
  }

  /** A rule ("-A CHAIN ...") in `chain`. */
  add(chain: string, line: string): void {
    this.rules.push(line);
    const record = this.#record;
    if (!record) return;
    const sofar = record.rules.get(chain);
    if (this.#countServiceChains && isServiceChainName(chain)) record.rules.set(chain, ((sofar as number | undefined) ?? 0) + 1);
    else if (sofar === undefined) record.rules.set(chain, [line]);
    else (sofar as string[]).push(line);
  }

  /** A LineSink for rules of any chain, told from each line. */
  readonly sink: LineSink = {
    push: (...lines: string[]) => {
      for (const line of lines) this.add(line.slice(3, line.indexOf(' ', 3)), line);
    },
  };
}

/** RenderContext: what the nat rules of every service port are written with. */
interface RenderContext {
  nat: TableWriter;
  largeCluster: boolean;
  probability: (n: number) => string;
  detector: ReturnType<typeof localTrafficMatches>;
  masqueradeAll: boolean;
  primaryNodeIP: ReturnType<typeof parseIP>;
}

/**
 * renderIptablesChunks is renderIptables' output in pieces, handed out as they are ready, so that
 * iptables-restore can read the first while the rest is rendered: the render is much faster than
 * the restore reads, so the sync takes about as long as the restore alone. With `record`, what the
 * input does is noted there as it is written (see renderIptablesWrite).
 *
 * Two passes over the service ports keep kube-proxy's order. The first writes the filter table and
 * declares the nat chains (iptables-restore refuses a jump to a chain not declared yet); the
 * second writes the nat rules, which are most of the output, a chunk at a time.
 */
export function* renderIptablesChunks(
  model: ProxyModel,
  options: RenderIptablesOptions = {},
  record?: IptablesRenderRecord,
): Generator<Buffer> {
  const {changedServicePorts, existingChains, includeJumps = false, extraLines = {}, insertJumps = []} = options;
  const writeFixedChains =
    changedServicePorts === undefined || options.previous === undefined || fixedChainsChange(options.previous, model, changedServicePorts);
  const plan = nodePortPlan(model);
  const countLocalhost = countsLocalhostNodePorts(model);
  const countServiceChains = changedServicePorts === undefined;
  const filter = new TableWriter(record?.tables.filter, countServiceChains);
  const nat = new TableWriter(record?.tables.nat, countServiceChains);
  // Where the fixed chains' rules go: nowhere when they are left out.
  const fixedNat: LineSink = writeFixedChains ? nat.sink : discardLines;
  const fixedFilter: LineSink = writeFixedChains ? filter.sink : discardLines;
  if (writeFixedChains) declareFixedChains(model, plan, filter, nat);

  const probabilities: string[] = [];
  const context: RenderContext = {
    nat,
    largeCluster: isLargeCluster(model),
    probability: (n) => (probabilities[n] ??= probabilityText(n)),
    detector: localTrafficMatches(model.config.localDetector),
    masqueradeAll: model.config.masqueradeAll,
    primaryNodeIP: model.nodeIPs[0] === undefined ? undefined : parseIP(model.nodeIPs[0]),
  };

  // A partial render that leaves the fixed chains out, and need not tell which chains are in use,
  // writes the changed ports alone: at 10,000 services the others are most of its time.
  const tellsActiveChains = existingChains !== undefined;
  const changedOnly = changedServicePorts !== undefined && !writeFixedChains && !tellsActiveChains;
  const ports = changedOnly ? portsWithIdentities(model, changedServicePorts) : model.servicePorts;

  // First pass: the filter table's rules, and the nat chains declared.
  const {written, activeNatChains} = declarePortChains(ports, {
    changedServicePorts,
    tellsActiveChains,
    writeFixedChains,
    fixedFilter,
    countLocalhost,
    nat,
    record,
  });
  const staleNatChains = declareStaleChains(model, options, activeNatChains, filter, nat);
  writeFixedFilterRules(model, fixedFilter);

  const jumps = includeJumps ? renderJumpRules(model) : [];
  const lines = (...text: string[]): Buffer => Buffer.from(text.map((line) => `${line}\n`).join(''), 'utf8');
  /** A table's part up to its rules: "*table", the caller's first lines, the chains declared, the jump rules. */
  const head = (table: ProxyTable, writer: TableWriter): Buffer[] => [
    lines(
      `*${table}`,
      ...(extraLines[table]?.start ?? []),
      ...(includeJumps ? builtinChains[table].map((chain) => `:${chain} ACCEPT [0:0]`) : []),
    ),
    ...writer.chainLines.buffers(),
    lines(...(includeJumps ? jumpRuleLines(jumps, table) : [])),
  ];
  /** A table's end: the jumps to insert, the caller's last lines, COMMIT. */
  const tail = (table: ProxyTable): Buffer => {
    const inserted = insertJumps.filter((jump) => jump.table === table);
    record?.tables[table].jumps.push(...inserted);
    return lines(...inserted.map(insertLine), ...(extraLines[table]?.end ?? []), 'COMMIT');
  };
  yield Buffer.concat([...head('filter', filter), ...filter.rules.buffers(), tail('filter'), ...head('nat', nat)]);

  // Second pass: the nat rules, in chunks.
  writeMasqueradeRules(model, fixedNat);
  for (let index = 0; index < ports.length; index++) {
    const port = ports[index];
    const own = written[index];
    if (!own) {
      if (writeFixedChains) writeFixedChainRules(port, fixedNat, discardLines, countLocalhost);
      continue;
    }
    writeFixedChainRules(port, fixedNat, discardLines, countLocalhost, own.names);
    writePortChains(context, port, own);
    yield* nat.rules.takeFull();
  }
  for (const chain of staleNatChains) nat.delete(chain);
  writeNodePortsJump(model, plan, fixedNat);
  yield Buffer.concat([...nat.rules.buffers(), tail('nat')]);
}

/** declareFixedChains declares the fixed chains of both tables, and writes kubelet's KUBE-FIREWALL rule where NodePorts answer on 127.0.0.1. */
function declareFixedChains(model: ProxyModel, plan: NodePortPlan, filter: TableWriter, nat: TableWriter): void {
  for (const chain of Object.values(filterChains)) filter.declare(chain);
  for (const chain of Object.values(natChains)) nat.declare(chain);
  if (!plan.localhostNodePorts) return;
  // NodePorts on 127.0.0.1 need route_localnet, which lets martian packets to 127/8 in; this
  // rule (also written by kubelet) drops them again.
  filter.declare(kubeletFirewallChain);
  filter.add(
    kubeletFirewallChain,
    `-A ${kubeletFirewallChain} -m comment --comment "block incoming localnet connections" ` +
      `-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
  );
}

/**
 * declarePortChains is the first pass over the ports: their filter rules, and their own nat
 * chains declared, for the ports whose chains are written. Returns what the second pass needs per
 * written port, and the nat chains in use when the caller asks which are stale.
 */
function declarePortChains(
  ports: ServicePort[],
  pass: {
    changedServicePorts?: ReadonlySet<string>;
    tellsActiveChains: boolean;
    writeFixedChains: boolean;
    fixedFilter: LineSink;
    countLocalhost: boolean;
    nat: TableWriter;
    record?: IptablesRenderRecord;
  },
): {written: Array<WrittenPort | undefined>; activeNatChains: Set<string> | undefined} {
  const {changedServicePorts, writeFixedChains, fixedFilter, countLocalhost, nat, record} = pass;
  const activeNatChains = pass.tellsActiveChains ? new Set<string>() : undefined;
  const written: Array<WrittenPort | undefined> = [];
  for (let index = 0; index < ports.length; index++) {
    const port = ports[index];
    const identity = changedServicePorts === undefined && !record ? undefined : servicePortIdentity(port);
    const writesChains = changedServicePorts === undefined || changedServicePorts.has(identity!);
    if (!writesChains && activeNatChains === undefined) {
      if (writeFixedChains) writeFixedChainRules(port, discardLines, fixedFilter, countLocalhost);
      continue;
    }
    const names = chainNamesOf(port);
    const chains = writeFixedChainRules(port, discardLines, fixedFilter, countLocalhost, names);
    // Every endpoint chain name is hashed once, though the SVC, SVL and SEP rules all use it.
    const endpointChains = new Map<Endpoint, string>();
    const own = ownChains(port, names, chains, endpointChains);
    // Chains of a port left alone in a partial render are not declared (that would flush them),
    // but they are still in use, so not stale.
    if (activeNatChains) for (const chain of own) activeNatChains.add(chain);
    if (!writesChains) continue;
    for (const chain of own) nat.declare(chain);
    if (record) record.servicePortChains.set(identity!, own);
    written[index] = {names, chains, endpointChains};
  }
  return {written, activeNatChains};
}

/** ownChains: the nat chains of the port itself (EXT, FW, SVC, SVL, SEP), in the order they are declared. */
function ownChains(port: ServicePort, names: ChainNames, chains: PortChains, endpointChains?: Map<Endpoint, string>): string[] {
  const own: string[] = [];
  if (chains.usesExternalChain) own.push(names.externalChain);
  if (chains.usesFirewallChain) own.push(names.firewallChain);
  if (port.clusterEndpoints.length > 0 && port.usesClusterEndpoints) own.push(names.clusterChain);
  if (port.localEndpoints.length > 0 && port.usesLocalEndpoints) own.push(names.localChain);
  for (const endpoint of port.allReachableEndpoints) {
    const chain = endpointChainName(port, endpoint);
    endpointChains?.set(endpoint, chain);
    own.push(chain);
  }
  return own;
}

/**
 * declareStaleChains declares (so flushes) the per-service chains no port uses any more, and
 * returns the nat ones, to be deleted once no rule jumps to them; filter ones are deleted at once.
 * With existingChains: every such chain the kernel has. In a partial render with the previous
 * model: those the changed ports used before and no longer use, found from those ports alone
 * (chain names hash the service port's name, so no other port can be using them).
 */
function declareStaleChains(
  model: ProxyModel,
  options: RenderIptablesOptions,
  activeNatChains: Set<string> | undefined,
  filter: TableWriter,
  nat: TableWriter,
): string[] {
  const {existingChains, changedServicePorts, previous} = options;
  const staleNatChains: string[] = [];
  if (existingChains && activeNatChains) {
    for (const table of ['filter', 'nat'] as const) {
      for (const chain of [...(existingChains.get(table) ?? [])].sort()) {
        if (!isServiceChainName(chain) || (table === 'nat' && activeNatChains.has(chain))) continue;
        // The chain line flushes it, so nothing in it still points elsewhere when it is deleted.
        if (table === 'nat') {
          nat.declare(chain);
          staleNatChains.push(chain);
        } else {
          filter.declare(chain);
          filter.delete(chain);
        }
      }
    }
  } else if (changedServicePorts && previous) {
    const stale = new Set<string>();
    const chainsOf = (port: ServicePort): string[] => {
      const names = chainNamesOf(port);
      return ownChains(port, names, writeFixedChainRules(port, discardLines, discardLines, false, names));
    };
    for (const port of portsWithIdentities(previous, changedServicePorts)) for (const chain of chainsOf(port)) stale.add(chain);
    for (const port of portsWithIdentities(model, changedServicePorts)) for (const chain of chainsOf(port)) stale.delete(chain);
    for (const chain of [...stale].sort()) {
      nat.declare(chain);
      staleNatChains.push(chain);
    }
  }
  return staleNatChains;
}

/** writeFixedFilterRules: KUBE-FORWARD's rules. */
function writeFixedFilterRules(model: ProxyModel, fixedFilter: LineSink): void {
  const features = model.config.iptablesFeatures;
  const mark = masqueradeMark(model.config.masqueradeBit);
  if (!features.conntrackTCPLiberal) {
    // Without nf_conntrack_tcp_be_liberal an out-of-window packet is INVALID, escapes DNAT
    // reversal and makes the client reset the connection.
    const counter = features.nfacctCounters.includes(nfacctCounters.ctStateInvalidDropped)
      ? ` -m nfacct --nfacct-name ${nfacctCounters.ctStateInvalidDropped}`
      : '';
    fixedFilter.push(`-A ${filterChains.forward} -m conntrack --ctstate INVALID${counter} -j DROP`);
  }
  fixedFilter.push(
    `-A ${filterChains.forward} -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`,
    `-A ${filterChains.forward} -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
  );
}

/** writeMasqueradeRules: KUBE-POSTROUTING's and KUBE-MARK-MASQ's rules. */
function writeMasqueradeRules(model: ProxyModel, fixedNat: LineSink): void {
  const mark = masqueradeMark(model.config.masqueradeBit);
  fixedNat.push(
    `-A ${natChains.postrouting} -m mark ! --mark ${mark}/${mark} -j RETURN`,
    // Clearing the mark keeps a packet that passes the stack again from being masqueraded twice.
    `-A ${natChains.postrouting} -j MARK --xor-mark ${mark}`,
    `-A ${natChains.postrouting} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE` +
      (model.config.iptablesFeatures.randomFully ? ' --random-fully' : ''),
    `-A ${natChains.markMasq} -j MARK --or-mark ${mark}`,
  );
}

/** writeNodePortsJump: KUBE-SERVICES' last rule(s), the jump to KUBE-NODEPORTS for the addresses NodePorts answer on. */
function writeNodePortsJump(model: ProxyModel, plan: NodePortPlan, fixedNat: LineSink): void {
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
}

/** writePortChains writes the rules of the port's own chains: SVC/SVL, EXT, FW and SEP. */
function writePortChains(context: RenderContext, port: ServicePort, {names, chains, endpointChains}: WrittenPort): void {
  const {nat, detector, masqueradeAll, primaryNodeIP, largeCluster} = context;
  const MASQ = natChains.markMasq;
  const name = port.key;
  const protocol = port.protocol.toLowerCase();
  const matchProtocol = `-m ${protocol} -p ${protocol}`;
  const {clusterChain, localChain, externalChain, firewallChain} = names;
  const chainOf = (endpoint: Endpoint): string => endpointChains.get(endpoint) ?? endpointChainName(port, endpoint);

  if (chains.hasInternalEndpoints) {
    const internal = chains.internalChain;
    const clusterIPMatch = `-m comment --comment ${quote(`${name} cluster IP`)} ${matchProtocol} -d ${port.clusterIP} --dport ${port.port}`;
    if (masqueradeAll) nat.add(internal, `-A ${internal} ${clusterIPMatch} -j ${MASQ}`);
    // Off-cluster clients may route the service range to any node; their traffic can leave
    // the node again towards the endpoint, so it is masqueraded.
    else if (detector) nat.add(internal, `-A ${internal} ${clusterIPMatch} ${detector.ifNotLocal} -j ${MASQ}`);
  }

  if (chains.usesExternalChain) {
    const add = (line: string): void => nat.add(externalChain, `-A ${externalChain} ${line}`);
    if (!port.externalPolicyLocal) {
      add(`-m comment --comment ${quote(`masquerade traffic for ${name} external destinations`)} -j ${MASQ}`);
    } else {
      // Pods reaching an external address of the service behave as if they went out to a
      // load balancer and came back: neither traffic policy applies to them.
      if (detector)
        add(`-m comment --comment ${quote(`pod traffic for ${name} external destinations`)} ${detector.ifLocal} -j ${clusterChain}`);
      // The node itself would pick the external address as its source, so it is masqueraded.
      add(
        `-m comment --comment ${quote(`masquerade LOCAL traffic for ${name} external destinations`)} -m addrtype --src-type LOCAL -j ${MASQ}`,
      );
      add(
        `-m comment --comment ${quote(`route LOCAL traffic for ${name} external destinations`)} -m addrtype --src-type LOCAL -j ${clusterChain}`,
      );
    }
    if (chains.hasExternalEndpoints) add(`-j ${chains.externalPolicyChain}`);
  }

  if (chains.usesFirewallChain) {
    const head = `-A ${firewallChain} -m comment --comment ${quote(`${name} loadbalancer IP`)}`;
    let allowFromNode = false;
    for (const range of port.loadBalancerSourceRanges) {
      nat.add(firewallChain, `${head} -s ${range} -j ${externalChain}`);
      const cidr = parseCIDR(range);
      if (cidr && primaryNodeIP && cidrContains(cidr, primaryNodeIP)) allowFromNode = true;
    }
    // A node reaching a VIP-like load-balancer address that is also local loops back with
    // the VIP as source; when the node is allowed, so is that.
    if (allowFromNode) for (const ip of port.loadBalancerIPs) nat.add(firewallChain, `${head} -s ${ip} -j ${externalChain}`);
    nat.add(
      firewallChain,
      `-A ${firewallChain} -m comment --comment ${quote(`other traffic to ${name} will be dropped by KUBE-PROXY-FIREWALL`)}`,
    );
  }

  if (port.clusterEndpoints.length > 0 && port.usesClusterEndpoints)
    writeServiceToEndpointRules(context, port, clusterChain, port.clusterEndpoints, chainOf);
  if (port.localEndpoints.length > 0 && port.usesLocalEndpoints)
    writeServiceToEndpointRules(context, port, localChain, port.localEndpoints, chainOf);

  for (const endpoint of port.allReachableEndpoints) {
    const chain = chainOf(endpoint);
    const head = largeCluster ? `-A ${chain}` : `-A ${chain} -m comment --comment ${name}`;
    // A pod reaching itself through the service must not see its own address as source.
    nat.add(chain, `${head} -s ${endpoint.ip} -j ${MASQ}`);
    const affinity = port.sessionAffinity ? ` -m recent --name ${chain} --set` : '';
    nat.add(chain, `${head}${affinity} ${matchProtocol} -j DNAT --to-destination ${endpointKey(endpoint)}`);
  }
}

/** writeServiceToEndpointRules: session-affinity checks first, then the random spread over the endpoints. */
function writeServiceToEndpointRules(
  context: RenderContext,
  port: ServicePort,
  chain: string,
  endpoints: Endpoint[],
  chainOf: (endpoint: Endpoint) => string,
): void {
  const {nat, largeCluster, probability} = context;
  const name = port.key;
  const endpointChains = endpoints.map(chainOf);
  const head = (endpoint: Endpoint): string =>
    largeCluster ? `-A ${chain}` : `-A ${chain} -m comment --comment ${quote(`${name} -> ${endpointKey(endpoint)}`)}`;
  if (port.sessionAffinity) {
    const seconds = port.sessionAffinity.timeoutSeconds;
    endpoints.forEach((endpoint, index) => {
      const target = endpointChains[index];
      nat.add(chain, `${head(endpoint)} -m recent --name ${target} --rcheck --seconds ${seconds} --reap -j ${target}`);
    });
  }
  const count = endpoints.length;
  endpoints.forEach((endpoint, index) => {
    const spread = index < count - 1 ? ` -m statistic --mode random --probability ${probability(count - index)}` : '';
    nat.add(chain, `${head(endpoint)}${spread} -j ${endpointChains[index]}`);
  });
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
  names?: ChainNames,
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
  const usesFirewallChain =
    hasEndpoints && port.loadBalancerIPs.length > 0 && (port.loadBalancerSourceRanges.length > 0 || port.loadBalancerSourceRangesInvalid);
  const loadBalancerChain = usesFirewallChain ? firewallChain : externalChain;

  // Used only where the traffic has no endpoint: none at all (REJECT), or none on this node
  // under a Local policy (DROP).
  const filterVerdict = hasEndpoints
    ? {target: 'DROP', comment: quote(`${name} has no local endpoints`)}
    : {target: 'REJECT', comment: quote(`${name} has no endpoints`)};

  if (hasInternalEndpoints) {
    natRules.push(
      `-A ${natChains.services} -m comment --comment ${quote(`${name} cluster IP`)} ${matchProtocol} ` +
        `-d ${port.clusterIP} --dport ${port.port} -j ${internalChain}`,
    );
  } else {
    filterRules.push(
      `-A ${filterChains.services} -m comment --comment ${filterVerdict.comment} ${matchProtocol} ` +
        `-d ${port.clusterIP} --dport ${port.port} -j ${filterVerdict.target}`,
    );
  }

  for (const ip of port.externalIPs) {
    if (hasEndpoints) {
      natRules.push(
        `-A ${natChains.services} -m comment --comment ${quote(`${name} external IP`)} ${matchProtocol} -d ${ip} --dport ${port.port} -j ${externalChain}`,
      );
    }
    // No endpoints at all (REJECT), or none for external traffic that the EXT chain did not
    // short-circuit (DROP).
    if (!hasExternalEndpoints) {
      filterRules.push(
        `-A ${filterChains.externalServices} -m comment --comment ${filterVerdict.comment} ${matchProtocol} ` +
          `-d ${ip} --dport ${port.port} -j ${filterVerdict.target}`,
      );
    }
  }

  for (const ip of port.loadBalancerIPs) {
    if (hasEndpoints) {
      natRules.push(
        `-A ${natChains.services} -m comment --comment ${quote(`${name} loadbalancer IP`)} ${matchProtocol} ` +
          `-d ${ip} --dport ${port.port} -j ${loadBalancerChain}`,
      );
    }
    if (usesFirewallChain) {
      filterRules.push(
        `-A ${filterChains.proxyFirewall} -m comment ` +
          `--comment ${quote(`${name} traffic not accepted by ${firewallChain}`)} ${matchProtocol} -d ${ip} ` +
          `--dport ${port.port} -j DROP`,
      );
    }
  }
  if (!hasExternalEndpoints) {
    for (const ip of port.loadBalancerIPs) {
      filterRules.push(
        `-A ${filterChains.externalServices} -m comment --comment ${filterVerdict.comment} ${matchProtocol} ` +
          `-d ${ip} --dport ${port.port} -j ${filterVerdict.target}`,
      );
    }
  }

  if (port.nodePort !== 0) {
    // NodePorts are not subject to loadBalancerSourceRanges (kube-proxy never was).
    if (hasEndpoints && countLocalhost) {
      // Counts what reaches NodePorts on 127.0.0.0/8 (route_localnet), which nftables mode does not serve.
      const counter = `-m nfacct --nfacct-name ${nfacctCounters.localhostNodePortsAccepted}`;
      natRules.push(
        `-A ${natChains.nodePorts} -m comment --comment ${name} ${matchProtocol} -d 127.0.0.0/8 --dport ${port.nodePort} ${counter} -j ${externalChain}`,
      );
    }
    if (hasEndpoints)
      natRules.push(`-A ${natChains.nodePorts} -m comment --comment ${name} ${matchProtocol} --dport ${port.nodePort} -j ${externalChain}`);
    if (!hasExternalEndpoints) {
      filterRules.push(
        `-A ${filterChains.externalServices} -m comment --comment ${filterVerdict.comment} -m addrtype ` +
          `--dst-type LOCAL ${matchProtocol} --dport ${port.nodePort} -j ${filterVerdict.target}`,
      );
    }
  }

  if (port.healthCheckNodePort !== 0) {
    // Load balancers probe this port whether or not the node has local endpoints.
    filterRules.push(
      `-A ${filterChains.nodePorts} -m comment --comment ${quote(`${name} health check node port`)} ` +
        `-m tcp -p tcp --dport ${port.healthCheckNodePort} -j ACCEPT`,
    );
  }

  return {hasInternalEndpoints, hasExternalEndpoints, internalChain, externalPolicyChain, usesExternalChain, usesFirewallChain};
}

/** WrittenPort: what the first pass of renderIptablesChunks learned of a port whose own chains it writes. */
interface WrittenPort {
  names: ChainNames;
  chains: PortChains;
  /** Each endpoint of the port -> its KUBE-SEP chain. */
  endpointChains: Map<Endpoint, string>;
}

interface PortChains {
  hasInternalEndpoints: boolean;
  hasExternalEndpoints: boolean;
  internalChain: string;
  externalPolicyChain: string;
  usesExternalChain: boolean;
  usesFirewallChain: boolean;
}

interface ChainNames {
  clusterChain: string;
  localChain: string;
  externalChain: string;
  firewallChain: string;
}

function chainNamesOf(port: ServicePort): ChainNames {
  const hashed = portProtoHash(port.key, port.protocol);
  return {
    clusterChain: serviceChainPrefixes.cluster + hashed,
    localChain: serviceChainPrefixes.local + hashed,
    externalChain: serviceChainPrefixes.external + hashed,
    firewallChain: serviceChainPrefixes.firewall + hashed,
  };
}

/** insertLine: the iptables-restore command that puts a jump rule in its built-in chain. */
export function insertLine(jump: IptablesJumpRule): string {
  return `${jump.position === 'prepend' ? '-I' : '-A'} ${jump.chain} ${restoreArgs(jump.rule)}`;
}

/**
 * jumpRuleLines writes the jump rules of one table as they stand after kube-proxy ensured them
 * on empty built-in chains: each prepended rule lands before the ones ensured earlier.
 */
function jumpRuleLines(jumps: IptablesJumpRule[], table: ProxyTable): string[] {
  const lines: string[] = [];
  for (const chain of builtinChains[table]) {
    const inChain = jumps.filter((jump) => jump.table === table && jump.chain === chain);
    const ordered = [
      ...inChain.filter((jump) => jump.position === 'prepend').reverse(),
      ...inChain.filter((jump) => jump.position === 'append'),
    ];
    for (const jump of ordered) lines.push(`-A ${chain} ${restoreArgs(jump.rule)}`);
  }
  return lines;
}
