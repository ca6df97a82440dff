// traceIptables: the first packet of a connection walked through an iptables ruleset as the kernel
// walks it: hook by hook, table by table, following jumps, gotos, RETURNs and policies, forking
// where `-m statistic` picks an endpoint at random.
import {joinHostPort, parseIP, type ParsedIP} from '../model/ip.ts';
import type {Packet, TraceBranch, TraceContext, TraceHop, TraceResult, TraceVerdict} from '../trace/types.ts';
import {isServiceChainName} from './chains.ts';
import {Explainer, explainRule, masqueradeBecause} from './explain.ts';
import {matchRule, type AddressKind, type PacketState} from './match.ts';
import {findChain, isProxyChain, servicePortOfComment, type IptablesChain, type IptablesRule, type IptablesRuleset} from './ruleset.ts';

type Hook = TraceHop['hook'];

/** Walk is one possible path of the packet; walks fork where a rule matches at random. */
interface Walk {
  state: PacketState;
  probability: number;
  hops: TraceHop[];
  /** "ip:port" after DNAT. */
  endpoint?: string;
  /** Index of the first hop that is this walk's own (where it split from the others). */
  splitAt?: number;
  /** Index of the hop that led into the chain that DNATed (the endpoint chain). */
  endpointAt?: number;
  /** Why the masquerade mark was set, and by which chain. */
  markedBy?: {chain: string; because: string};
  masqueradeReason?: string;
  /** The walk ended in DROP or REJECT. */
  outcome?: 'DROP' | 'REJECT';
  /** Where it ended, for warnings: "filter FORWARD". */
  endedAt?: string;
  servicePort?: string;
}

/**
 * How a walk leaves a chain: 'return' to the chain that called it (RETURN, or the end of a user
 * chain); 'accept' ends this table's say at this hook (ACCEPT, a NAT target, an ACCEPT policy);
 * 'stop' ends the packet (DROP, REJECT, a DROP policy).
 */
type Exit = 'return' | 'accept' | 'stop';

interface ChainExit {
  walk: Walk;
  exit: Exit;
}

/** A caller's rule, for explaining why a chain like KUBE-MARK-MASQ was entered. */
interface Caller {
  rule: IptablesRule;
  state: PacketState;
  hopIndex: number;
}

const maxDepth = 64;
const maxWalks = 4096;

class Tracer {
  ruleset: IptablesRuleset;
  explainer: Explainer;
  addresses: AddressKind;
  warnings: string[] = [];
  private warned = new Set<string>();
  private walkCount = 1;
  hook: Hook = 'PREROUTING';

  /** The node's own addresses, in the order the caller gave them. */
  localAddresses: ParsedIP[];

  /** Whether hops get their sentences (TraceContext.explain). */
  explain: boolean;

  constructor(ruleset: IptablesRuleset, addresses: AddressKind, localAddresses: ParsedIP[], explain = true) {
    this.explain = explain;
    this.ruleset = ruleset;
    this.explainer = new Explainer(ruleset);
    this.addresses = addresses;
    this.localAddresses = localAddresses;
  }

  nodeAddress(family: ParsedIP['family']): string | undefined {
    return this.localAddresses.find((address) => address.family === family)?.text;
  }

  warn(text: string): void {
    if (this.warned.has(text)) return;
    this.warned.add(text);
    this.warnings.push(text);
  }

  /** runHook walks the built-in chain of one table at one hook; walks that were dropped or refused stop there. */
  runHook(hook: Hook, table: string, walk: Walk): Walk[] {
    const chain = findChain(this.ruleset, table, hook);
    if (!chain) return [walk];
    // Only a packet that starts a tracked connection passes the nat table.
    if (table === 'nat' && walk.state.ctState !== 'NEW') return [walk];
    this.hook = hook;
    return this.runChain(chain, 0, walk, 0, undefined).map((result) => result.walk);
  }

  /**
   * runChain walks the chain from rule `start`. A rule whose target lets the packet go on (MARK,
   * LOG, a jump that returns) continues the loop, so long chains do not deepen the stack; only a
   * random fork recurses, once per branch.
   */
  runChain(chain: IptablesChain, start: number, walk: Walk, depth: number, caller: Caller | undefined): ChainExit[] {
    const candidates = candidateRules(chain, walk.state.dst.text);
    let current = walk;
    for (let position = firstAtOrAfter(candidates, start); position < candidates.length; position++) {
      const index = candidates[position];
      const rule = chain.rules[index];
      const result = matchRule(rule, current.state, this.addresses);
      if (result.kind === 'no') continue;
      if (result.kind === 'unknown') {
        for (const reason of result.reasons)
          this.warn(`${rule.table} ${rule.chain} (line ${rule.line}): ${reason}; the rule was treated as not matching: ${rule.text}`);
        continue;
      }
      if (result.probability < 1) {
        if (this.walkCount >= maxWalks) {
          this.warn(`more than ${maxWalks} paths: later random choices were not followed`);
          continue;
        }
        this.walkCount++;
        const taken = fork(current, current.probability * result.probability);
        const rest = fork(current, current.probability * (1 - result.probability));
        const takenOutcome = this.applyTarget(chain, index, rule, taken, depth, caller, result.probability);
        const takenExits = Array.isArray(takenOutcome) ? takenOutcome : this.runChain(chain, index + 1, takenOutcome, depth, caller);
        return [...takenExits, ...this.runChain(chain, index + 1, rest, depth, caller)];
      }
      const outcome = this.applyTarget(chain, index, rule, current, depth, caller, 1);
      if (Array.isArray(outcome)) return outcome;
      current = outcome;
    }
    return this.endOfChain(chain, current);
  }

  endOfChain(chain: IptablesChain, walk: Walk): ChainExit[] {
    if (chain.kind !== 'builtin') return [{walk, exit: 'return'}];
    const policy = chain.policy ?? 'ACCEPT';
    if (policy === 'DROP' || chain.table === 'filter') {
      const explanation =
        policy === 'DROP'
          ? `No rule of ${chain.table} ${chain.name} accepted the packet, so the chain's policy DROP drops it.`
          : `No rule of ${chain.table} ${chain.name} stopped the packet, so the chain's policy ACCEPT lets it through.`;
      walk.hops.push({hook: this.hook, table: chain.table, chain: chain.name, rule: '', target: policy, explanation});
    }
    if (policy === 'DROP') {
      walk.outcome = 'DROP';
      walk.endedAt = `${chain.table} ${chain.name} policy`;
      return [{walk, exit: 'stop'}];
    }
    return [{walk, exit: 'accept'}];
  }

  pushHop(walk: Walk, rule: IptablesRule, before: PacketState, ruleProbability: number, caller?: Caller): number {
    const explanation = !this.explain
      ? ''
      : explainRule(this.explainer, rule, {
          ruleProbability,
          branchProbability: walk.probability,
          before,
          after: walk.state,
          callerChain: caller?.rule.chain,
        });
    walk.hops.push({
      hook: this.hook,
      table: rule.table,
      chain: rule.chain,
      rule: rule.text,
      target: rule.target?.name ?? '(none)',
      explanation,
    });
    if (isProxyChain(rule.chain)) {
      walk.servicePort ??=
        servicePortOfComment(rule.comment) ??
        (isServiceChainName(rule.chain) ? this.explainer.serviceOf(rule.table, rule.chain) : undefined);
      this.noteServiceProblem(rule);
    }
    return walk.hops.length - 1;
  }

  /** applyTarget does what the matched rule's target says: ends the chain (exits), or returns the walk to go on with the next rule. */
  applyTarget(
    chain: IptablesChain,
    index: number,
    rule: IptablesRule,
    walk: Walk,
    depth: number,
    caller: Caller | undefined,
    ruleProbability: number,
  ): ChainExit[] | Walk {
    const before = walk.state;
    const target = rule.target;
    const next = () => walk;
    const stop = (outcome: 'DROP' | 'REJECT'): ChainExit[] => {
      this.pushHop(walk, rule, before, ruleProbability);
      walk.outcome = outcome;
      walk.endedAt = `${rule.table} ${rule.chain}`;
      return [{walk, exit: 'stop'}];
    };
    if (!target) {
      this.pushHop(walk, rule, before, ruleProbability);
      return next();
    }
    switch (target.name) {
      case 'ACCEPT':
        this.pushHop(walk, rule, before, ruleProbability);
        return [{walk, exit: 'accept'}];
      case 'DROP':
        return stop('DROP');
      case 'REJECT':
        return stop('REJECT');
      case 'RETURN':
        this.pushHop(walk, rule, before, ruleProbability);
        return chain.kind === 'builtin' ? this.endOfChain(chain, walk) : [{walk, exit: 'return'}];
      case 'MARK': {
        const setting = target.options.find((entry) => entry.name === 'set-xmark')?.values[0] ?? '0/0';
        const [valueText, maskText] = setting.split('/');
        const value = Number(valueText);
        const mask = Number(maskText);
        walk.state = {...before, mark: ((before.mark & ~mask) ^ value) >>> 0};
        // The reason to remember is the rule that sent the packet to KUBE-MARK-MASQ.
        const setBits = (walk.state.mark & ~before.mark) >>> 0;
        if (setBits && rule.chain === 'KUBE-MARK-MASQ') {
          walk.markedBy = {
            chain: rule.chain,
            because: this.explain ? masqueradeBecause(this.explainer, caller?.rule ?? rule, caller?.state ?? before) : '',
          };
        }
        this.pushHop(walk, rule, before, ruleProbability);
        return next();
      }
      case 'DNAT': {
        const to = target.options.find((entry) => entry.name === 'to-destination')?.values[0];
        const destination = to ? parseDestination(to, before.dstPort) : undefined;
        if (!destination) {
          this.warn(
            `${rule.table} ${rule.chain} (line ${rule.line}): DNAT destination "${to ?? ''}" cannot be read; the packet was left unchanged`,
          );
          this.pushHop(walk, rule, before, ruleProbability);
          return [{walk, exit: 'accept'}];
        }
        walk.state = {...before, dst: destination.ip, dstPort: destination.port, dnatDone: true};
        walk.endpoint = joinHostPort(destination.ip.text, destination.port);
        const hopIndex = this.pushHop(walk, rule, before, ruleProbability, caller);
        walk.endpointAt = chain.name.startsWith('KUBE-SEP-') && caller ? caller.hopIndex : hopIndex;
        this.noteAffinity(rule, walk);
        return [{walk, exit: 'accept'}];
      }
      case 'REDIRECT': {
        // The kernel rewrites the destination to the node itself: loopback for the node's own
        // packets, else an address of the node (the incoming interface's, which the trace does not know).
        const toPorts = target.options.find((entry) => entry.name === 'to-ports')?.values[0];
        const port = toPorts ? Number(toPorts.split(/[-:]/)[0]) : before.dstPort;
        const address =
          before.inInterface === '' ? (before.dst.family === 'IPv4' ? '127.0.0.1' : '::1') : this.nodeAddress(before.dst.family);
        const ip = address === undefined ? undefined : parseIP(address);
        if (!ip || !Number.isInteger(port)) {
          this.warn(
            `${rule.table} ${rule.chain} (line ${rule.line}): REDIRECT needs an address of the node; none of this family was given`,
          );
          this.pushHop(walk, rule, before, ruleProbability);
          return [{walk, exit: 'accept'}];
        }
        walk.state = {...before, dst: ip, dstPort: port, dnatDone: true};
        walk.endpoint = joinHostPort(ip.text, port);
        walk.endpointAt = this.pushHop(walk, rule, before, ruleProbability, caller);
        return [{walk, exit: 'accept'}];
      }
      case 'MASQUERADE':
      case 'SNAT': {
        this.pushHop(walk, rule, before, ruleProbability);
        walk.masqueradeReason =
          walk.markedBy && rule.chain === 'KUBE-POSTROUTING'
            ? `marked for masquerade by ${walk.markedBy.chain} because ${walk.markedBy.because}`
            : `${rule.table} ${rule.chain} rewrites the source ` +
              `with ${target.name}${this.explain ? ` because ${masqueradeBecause(this.explainer, rule, before)}` : ''}`;
        return [{walk, exit: 'accept'}];
      }
      case 'NOTRACK':
        walk.state = {...before, ctState: 'UNTRACKED'};
        this.pushHop(walk, rule, before, ruleProbability);
        return next();
      case 'CT':
        if (target.options.some((entry) => entry.name === 'notrack')) walk.state = {...before, ctState: 'UNTRACKED'};
        this.pushHop(walk, rule, before, ruleProbability);
        return next();
      case 'LOG':
      case 'NFLOG':
      case 'TRACE':
      case 'AUDIT':
      case 'COUNTER':
        this.pushHop(walk, rule, before, ruleProbability);
        return next();
      default:
        break;
    }
    const subchain = findChain(this.ruleset, rule.table, target.name);
    if (!subchain) {
      this.warn(
        `${rule.table} ${rule.chain} (line ${rule.line}): target ${target.name} is not modelled by the trace; the packet was assumed to go on unchanged`,
      );
      this.pushHop(walk, rule, before, ruleProbability);
      return next();
    }
    const hopIndex = this.pushHop(walk, rule, before, ruleProbability);
    if (depth >= maxDepth) {
      this.warn(`${rule.table} ${rule.chain}: chains nest deeper than ${maxDepth}; the walk stopped at ${target.name}`);
      return [{walk, exit: 'accept'}];
    }
    const results = this.runChain(subchain, 0, walk, depth + 1, {rule, state: before, hopIndex});
    if (target.goto) return results.flatMap((result) => (result.exit === 'return' ? this.endOfGoto(chain, result.walk) : [result]));
    if (results.length === 1 && results[0].exit === 'return') return results[0].walk;
    return results.flatMap((result) => (result.exit === 'return' ? this.runChain(chain, index + 1, result.walk, depth, caller) : [result]));
  }

  /** After a goto, a RETURN leaves the chain that made the goto. */
  endOfGoto(chain: IptablesChain, walk: Walk): ChainExit[] {
    return chain.kind === 'builtin' ? this.endOfChain(chain, walk) : [{walk, exit: 'return'}];
  }

  /** noteServiceProblem turns the proxy's "has no endpoints" rules the packet met into warnings (REJECT, or older kube-proxy's KUBE-MARK-DROP). */
  noteServiceProblem(rule: IptablesRule): void {
    const comment = rule.comment;
    if (!comment || !comment.endsWith('endpoints')) return;
    const service = servicePortOfComment(comment);
    if (!service) return;
    if (/has no endpoints$/.test(comment)) this.warn(`${service} has no endpoints: connections to it are refused`);
    else if (/has no local endpoints$/.test(comment))
      this.warn(`${service} has a Local traffic policy and no endpoint on this node: the traffic that policy covers is dropped here`);
  }

  noteAffinity(rule: IptablesRule, walk: Walk): void {
    const recent = rule.matches.find((match) => match.module === 'recent' && match.options.some((entry) => entry.name === 'set'));
    if (!recent) return;
    const service = walk.servicePort ?? servicePortOfComment(rule.comment) ?? 'this service';
    this.warn(
      `${service} has session affinity (ClientIP): this trace shows a client's first connection, chosen ` +
        `at random; the kernel then remembers the client ${walk.state.src.text}, and its later connections ` +
        `go straight to the endpoint this one reached`,
    );
  }
}

/**
 * DestinationIndex lists, for a long chain such as KUBE-SERVICES, the rules that test one host
 * destination by address, and the rules that could match any destination. Rules are still
 * evaluated one by one in chain order; the index only skips those whose `-d` cannot match.
 */
interface DestinationIndex {
  byHost: Map<string, number[]>;
  anyDestination: number[];
  all: number[];
}

const indexThreshold = 32;
const destinationIndexes = new WeakMap<IptablesRule[], DestinationIndex>();

function destinationIndex(rules: IptablesRule[]): DestinationIndex {
  let index = destinationIndexes.get(rules);
  if (index) return index;
  index = {byHost: new Map(), anyDestination: [], all: rules.map((_, position) => position)};
  for (let position = 0; position < rules.length; position++) {
    const destination = rules[position].destination;
    const slash = destination ? destination.cidr.indexOf('/') : -1;
    const host =
      destination && !destination.negated && (destination.cidr.endsWith('/32') || destination.cidr.endsWith('/128'))
        ? destination.cidr.slice(0, slash)
        : undefined;
    if (host === undefined) {
      index.anyDestination.push(position);
      continue;
    }
    const list = index.byHost.get(host);
    if (list) list.push(position);
    else index.byHost.set(host, [position]);
  }
  destinationIndexes.set(rules, index);
  return index;
}

/** candidateRules: positions of the rules that may match a packet to this destination, in chain order. */
function candidateRules(chain: IptablesChain, destination: string): number[] {
  if (chain.rules.length < indexThreshold) return destinationIndex(chain.rules).all;
  const index = destinationIndex(chain.rules);
  const hosts = index.byHost.get(destination);
  if (!hosts) return index.anyDestination;
  const merged: number[] = [];
  let a = 0;
  let b = 0;
  while (a < hosts.length || b < index.anyDestination.length) {
    if (b >= index.anyDestination.length || (a < hosts.length && hosts[a] < index.anyDestination[b])) merged.push(hosts[a++]);
    else merged.push(index.anyDestination[b++]);
  }
  return merged;
}

function firstAtOrAfter(positions: number[], start: number): number {
  let low = 0;
  let high = positions.length;
  while (low < high) {
    const middle = (low + high) >> 1;
    if (positions[middle] < start) low = middle + 1;
    else high = middle;
  }
  return low;
}

function fork(walk: Walk, probability: number): Walk {
  return {...walk, probability, hops: [...walk.hops], splitAt: walk.splitAt ?? walk.hops.length};
}

// A DNAT target is read once per rule text: every packet through an endpoint chain meets the same one.
const destinations = new Map<string, {ip: ParsedIP; port: number | undefined} | null>();
const destinationCacheLimit = 100_000;

function parseDestination(text: string, currentPort: number): {ip: ParsedIP; port: number} | undefined {
  let known = destinations.get(text);
  if (known === undefined) {
    known = readDestination(text) ?? null;
    if (destinations.size >= destinationCacheLimit) destinations.clear();
    destinations.set(text, known);
  }
  if (known === null) return undefined;
  const port = known.port ?? currentPort;
  if (!Number.isInteger(port) || port < 1 || port > 65535) return undefined;
  return {ip: known.ip, port};
}

/** readDestination: the address and, when given, the port of a --to-destination value. */
function readDestination(text: string): {ip: ParsedIP; port: number | undefined} | undefined {
  // "ip", "ip:port", "ip:port-port", "ip-ip:port", "[v6]:port", "v6".
  let host = text;
  let portText: string | undefined;
  const bracketed = /^\[([^\]]+)\](?::(.+))?$/.exec(text);
  if (bracketed) {
    host = bracketed[1];
    portText = bracketed[2];
  } else if ((text.match(/:/g) ?? []).length === 1) {
    [host, portText] = text.split(':');
  }
  const ip = parseIP(host.split('-')[0]);
  if (!ip) return undefined;
  const port = portText === undefined ? undefined : Number(portText.split('-')[0]);
  if (port !== undefined && (!Number.isInteger(port) || port < 1 || port > 65535)) return undefined;
  return {ip, port};
}

function hooksOf(origin: Packet['origin'], phase: 'before-routing' | 'local-in' | 'forward' | 'out'): Array<[Hook, string]> {
  switch (phase) {
    case 'before-routing':
      return origin === 'arriving'
        ? [
            ['PREROUTING', 'raw'],
            ['PREROUTING', 'mangle'],
            ['PREROUTING', 'nat'],
          ]
        : [
            ['OUTPUT', 'raw'],
            ['OUTPUT', 'mangle'],
            ['OUTPUT', 'nat'],
            ['OUTPUT', 'filter'],
            ['OUTPUT', 'security'],
            ['POSTROUTING', 'mangle'],
            ['POSTROUTING', 'nat'],
          ];
    case 'local-in':
      return [
        ['INPUT', 'mangle'],
        ['INPUT', 'filter'],
        ['INPUT', 'security'],
        ['INPUT', 'nat'],
      ];
    case 'forward':
      return [
        ['FORWARD', 'mangle'],
        ['FORWARD', 'filter'],
        ['FORWARD', 'security'],
        ['POSTROUTING', 'mangle'],
        ['POSTROUTING', 'nat'],
      ];
    case 'out':
      return [];
  }
}

/**
 * traceIptables walks the first packet of a connection through the ruleset: PREROUTING (arriving on
 * an interface) or OUTPUT (sent by the node), the routing decision on the destination after DNAT
 * (an address of the node: INPUT; else FORWARD), then POSTROUTING. Each matched rule becomes a hop
 * with a sentence saying why; `-m statistic` splits the walk into branches, one per endpoint.
 */
export function traceIptables(ruleset: IptablesRuleset, packet: Packet, context: TraceContext): TraceResult {
  const src = parseIP(packet.srcIP);
  const dst = parseIP(packet.dstIP);
  if (!src) throw new Error(`trace: packet srcIP "${packet.srcIP}" is not an IP address`);
  if (!dst) throw new Error(`trace: packet dstIP "${packet.dstIP}" is not an IP address`);
  if (!Number.isInteger(packet.dstPort) || packet.dstPort < 1 || packet.dstPort > 65535)
    throw new Error(`trace: packet dstPort ${packet.dstPort} is not a port (1-65535)`);
  const local = new Set<string>();
  const localAddresses: ParsedIP[] = [];
  for (const address of context.localAddresses) {
    const parsed = parseIP(address);
    if (!parsed) throw new Error(`trace: local address "${address}" is not an IP address`);
    local.add(parsed.text);
    localAddresses.push(parsed);
  }
  const isNodeAddress = (ip: ParsedIP): boolean => local.has(ip.text) || (ip.family === 'IPv4' ? ip.bytes[0] === 127 : ip.text === '::1');
  // Addresses `-m addrtype` asked about while no node address of their family was given: the
  // answer "not local" is then a guess, and a NodePort on a node address goes unseen.
  const givenFamilies = new Set(localAddresses.map((address) => address.family));
  const guessedNotLocal = new Set<string>();
  const addresses: AddressKind = {
    isLocal: (ip) => {
      const answer = isNodeAddress(ip);
      if (!answer && !givenFamilies.has(ip.family)) guessedNotLocal.add(ip.text);
      return answer;
    },
  };
  const tracer = new Tracer(ruleset, addresses, localAddresses, context.explain !== false);
  if (src.family !== ruleset.family || dst.family !== ruleset.family) {
    tracer.warn(
      `the packet is ${dst.family} but the rules ` +
        `are ${ruleset.family}: ${ruleset.family === 'IPv4' ? 'iptables' : 'ip6tables'} rules never see it ` +
        `(trace it through the ${dst.family === 'IPv4' ? 'iptables-save' : 'ip6tables-save'} dump)`,
    );
  }
  for (const note of ruleset.notes) tracer.warn(`the dump says "${note}": the trace covers only the rules in this dump`);

  const initial: Walk = {
    state: {
      src,
      dst,
      dstPort: packet.dstPort,
      protocol: packet.protocol.toLowerCase(),
      inInterface: packet.origin === 'local' ? '' : packet.inInterface,
      outInterface: undefined,
      mark: 0,
      ctState: packet.conntrack === 'invalid' ? 'INVALID' : 'NEW',
      dnatDone: false,
      originalDst: dst,
      originalDstPort: packet.dstPort,
    },
    probability: 1,
    hops: [],
  };
  if (packet.origin === 'local' && isNodeAddress(dst)) initial.state.outInterface = 'lo';

  const finished: Walk[] = [];
  const through = (walks: Walk[], hooks: Array<[Hook, string]>): Walk[] => {
    let current = walks;
    for (const [hook, table] of hooks) {
      const next: Walk[] = [];
      for (const walk of current) {
        for (const result of tracer.runHook(hook, table, walk)) {
          if (result.outcome) finished.push(result);
          else next.push(result);
        }
      }
      current = next;
    }
    return current;
  };

  const routed = through([initial], hooksOf(packet.origin, 'before-routing'));
  for (const walk of routed) {
    const toNode = isNodeAddress(walk.state.dst);
    if (packet.origin === 'arriving') {
      finished.push(
        ...through([{...walk, state: {...walk.state, outInterface: undefined}}], hooksOf('arriving', toNode ? 'local-in' : 'forward')),
      );
    } else if (toNode) {
      // The node's packet to one of its own addresses loops back in through INPUT.
      finished.push(...through([{...walk, state: {...walk.state, inInterface: 'lo'}}], hooksOf('local', 'local-in')));
    } else {
      finished.push(walk);
    }
  }
  // Only the packet's own addresses matter to the user: those the rules rewrote to are endpoints.
  const guessed = [dst, src].filter(
    (ip, index, both) => guessedNotLocal.has(ip.text) && both.findIndex((other) => other.text === ip.text) === index,
  );
  if (guessed.length > 0) {
    tracer.warn(
      `no address of the node was given, so -m addrtype LOCAL matched only ` +
        `loopback: ${guessed.map((ip) => ip.text).join(' and ')} was taken for another host's address, and a ` +
        `NodePort there would be missed; give the node's addresses`,
    );
  }
  return summarize(packet, finished, tracer);
}

function outcomeOf(walk: Walk): TraceVerdict {
  return walk.outcome ?? (walk.endpoint ? 'DNAT' : 'ACCEPT');
}

function commonPrefix(walks: Walk[]): number {
  let length = Math.min(...walks.map((walk) => walk.hops.length));
  for (const walk of walks.slice(1)) {
    let same = 0;
    while (same < length && walk.hops[same] === walks[0].hops[same]) same++;
    length = same;
  }
  return length;
}

function summarize(packet: Packet, walks: Walk[], tracer: Tracer): TraceResult {
  const servicePort = walks.find((walk) => walk.servicePort)?.servicePort;
  const warnings = tracer.warnings;
  const totals = new Map<TraceVerdict, number>();
  for (const walk of walks) totals.set(outcomeOf(walk), (totals.get(outcomeOf(walk)) ?? 0) + walk.probability);
  const verdict: TraceVerdict = totals.has('DNAT') ? 'DNAT' : [...totals.entries()].sort((a, b) => b[1] - a[1])[0][0];

  if (walks.length === 1 && verdict !== 'DNAT') {
    return {packet, verdict, hops: walks[0].hops, branches: [], ...(servicePort ? {servicePort} : {}), warnings};
  }

  const shared = Math.min(commonPrefix(walks), ...walks.map((walk) => Math.min(walk.splitAt ?? Infinity, walk.endpointAt ?? Infinity)));
  const branches: TraceBranch[] = [];
  const byLabel = new Map<string, TraceBranch>();
  for (const walk of walks) {
    const outcome = outcomeOf(walk);
    // When every path ends the same way, branches keep their endpoints, so a DNAT that is then
    // dropped still shows where it was headed; mixed outcomes are told apart by outcome.
    const label = outcome === 'DNAT' || totals.size === 1 ? (walk.endpoint ?? outcome) : outcome;
    if (outcome !== 'DNAT' && (totals.size > 1 || walk.endpoint)) {
      const where = walk.endedAt ? ` in ${walk.endedAt}` : '';
      const after = walk.endpoint ? ` after DNAT to ${walk.endpoint}` : '';
      warnings.push(`${(walk.probability * 100).toFixed(1)}% of connections end in ${outcome}${where}${after}, not at an endpoint`);
    }
    const existing = byLabel.get(label);
    if (existing) {
      existing.probability += walk.probability;
      continue;
    }
    const masquerade = walk.masqueradeReason !== undefined;
    const branch: TraceBranch = {
      endpoint: label,
      probability: walk.probability,
      hops: walk.hops.slice(shared),
      masquerade,
      masqueradeReason: masquerade ? walk.masqueradeReason! : notMasqueradedReason(walk, packet),
    };
    byLabel.set(label, branch);
    branches.push(branch);
  }
  return {packet, verdict, hops: walks[0].hops.slice(0, shared), branches, ...(servicePort ? {servicePort} : {}), warnings};
}

function notMasqueradedReason(walk: Walk, packet: Packet): string {
  if (walk.outcome) return `not masqueraded: the packet is ${walk.outcome === 'DROP' ? 'dropped' : 'refused'} before it leaves the node`;
  const sawPostrouting = walk.hops.some((hop) => hop.chain === 'KUBE-POSTROUTING');
  if (sawPostrouting) {
    return `not masqueraded: no rule marked the packet for masquerade, so the endpoint sees the client's own address ${packet.srcIP}`;
  }
  return `not masqueraded: no rule rewrote the source, so the endpoint sees ${packet.srcIP}`;
}
