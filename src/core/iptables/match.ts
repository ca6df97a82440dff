// Whether one iptables rule matches the first packet of a connection: the matches kube-proxy uses
// (and a few more) evaluated the way the kernel does; anything else is reported as not evaluated.
import {cidrContains, parseCIDR, parseIP, type ParsedCIDR, type ParsedIP} from '../model/ip.ts';
import {parseMarkValue, parseNumber} from './rule-syntax.ts';
import type {IptablesRule, NamedCondition, RuleMatch, RuleOption} from './ruleset.ts';

/** PacketState is the packet as a rule sees it at one point of its walk. */
export interface PacketState {
  src: ParsedIP;
  dst: ParsedIP;
  dstPort: number;
  /** Lower case: tcp, udp, sctp. */
  protocol: string;
  /** Interface the packet came in on; '' when the node sent it; undefined when not known. */
  inInterface: string | undefined;
  /** Interface it leaves by, when known (loopback for the node's own addresses). */
  outInterface: string | undefined;
  mark: number;
  /** Conntrack state of the connection: NEW, or UNTRACKED after NOTRACK. */
  ctState: 'NEW' | 'UNTRACKED' | 'INVALID';
  /** The destination was rewritten (conntrack's DNAT status). */
  dnatDone: boolean;
  /** Destination before any DNAT (conntrack's original destination). */
  originalDst: ParsedIP;
  originalDstPort: number;
}

/** AddressKind answers `-m addrtype` and routing questions about the node's addresses. */
export interface AddressKind {
  isLocal(ip: ParsedIP): boolean;
}

/**
 * MatchResult: 'no'; 'yes' with the probability that the rule matches (below 1 only with
 * `-m statistic --mode random`); or 'unknown' with the reasons the rule could not be evaluated
 * (the tracer treats it as not matching and warns).
 */
export type MatchResult = {kind: 'no'} | {kind: 'yes'; probability: number} | {kind: 'unknown'; reasons: string[]};

type Check = (state: PacketState, addresses: AddressKind) => boolean | string;

interface CompiledRule {
  checks: Check[];
  /** Probability of `-m statistic --mode random`, 1 without it. */
  probability: number;
}

const compiled = new WeakMap<IptablesRule, CompiledRule>();
const no: MatchResult = {kind: 'no'};

/** matchRule evaluates the rule against the packet. Results depend on the state only, so rules compile once. */
export function matchRule(rule: IptablesRule, state: PacketState, addresses: AddressKind): MatchResult {
  let entry = compiled.get(rule);
  if (!entry) {
    entry = compileRule(rule);
    compiled.set(rule, entry);
  }
  let reasons: string[] | undefined;
  for (const check of entry.checks) {
    const result = check(state, addresses);
    if (result === false) return no;
    if (typeof result === 'string') (reasons ??= []).push(result);
  }
  if (reasons) return {kind: 'unknown', reasons};
  if (entry.probability <= 0) return no;
  return {kind: 'yes', probability: entry.probability};
}

function compileRule(rule: IptablesRule): CompiledRule {
  const checks: Check[] = [];
  let probability = 1;
  // Cheap, decisive checks first: most rules of a long KUBE-SERVICES fail on the destination.
  if (rule.destination) checks.push(addressCheck(rule.destination.cidr, rule.destination.negated, (state) => state.dst));
  if (rule.protocol) {
    const {name, negated} = rule.protocol;
    checks.push((state) => (state.protocol === name) !== negated);
  }
  if (rule.source) checks.push(addressCheck(rule.source.cidr, rule.source.negated, (state) => state.src));
  if (rule.inInterface) checks.push(interfaceCheck(rule.inInterface, 'input', (state) => state.inInterface));
  if (rule.outInterface) checks.push(interfaceCheck(rule.outInterface, 'output', (state) => state.outInterface));
  // A first packet is never a later fragment.
  if (rule.fragment) checks.push(() => rule.fragment!.negated);
  for (const match of rule.matches) {
    if (match.module === 'statistic') {
      const mode = option(match, 'mode')?.values[0];
      const chance = option(match, 'probability');
      if (mode === 'random' && chance) {
        const value = Number(chance.values[0]);
        probability *= chance.negated ? 1 - value : value;
        continue;
      }
    }
    checks.push(...matchChecks(match));
  }
  return {checks, probability};
}

function option(match: RuleMatch, name: string): RuleOption | undefined {
  return match.options.find((entry) => entry.name === name);
}

function addressCheck(cidrText: string, negated: boolean, pick: (state: PacketState) => ParsedIP): Check {
  const cidr = parseCIDR(cidrText);
  if (!cidr) return () => `address ${cidrText} cannot be read`;
  const full = cidr.prefixLength === cidr.network.bytes.length * 8;
  // A host route compares as text: canonical addresses are equal exactly when their texts are.
  if (full) return (state) => (pick(state).text === cidr.network.text) !== negated;
  return (state) => cidrContains(cidr, pick(state)) !== negated;
}

export function interfaceMatches(pattern: string, name: string): boolean {
  return pattern.endsWith('+') ? name.startsWith(pattern.slice(0, -1)) : name === pattern;
}

function interfaceCheck(condition: NamedCondition, direction: 'input' | 'output', pick: (state: PacketState) => string | undefined): Check {
  return (state) => {
    const name = pick(state);
    if (name === undefined) {
      const tested = `${condition.negated ? '! ' : ''}${direction === 'input' ? '-i' : '-o'} ${condition.name}`;
      return direction === 'input'
        ? `the packet's input interface is not known (rule tests ${tested}; name the interface the packet arrives on)`
        : `the packet's output interface is not known (rule tests ${tested})`;
    }
    return interfaceMatches(condition.name, name) !== condition.negated;
  };
}

/** portInSpec reads "80", "80:90", ":90", "80:" and comma lists of them. */
export function portInSpec(spec: string, port: number): boolean | undefined {
  for (const part of spec.split(',')) {
    const [lowText, highText] = part.includes(':') ? part.split(':') : [part, part];
    const low = lowText === '' ? 0 : parseNumber(lowText);
    const high = highText === '' ? 65535 : parseNumber(highText);
    if (low === undefined || high === undefined) return undefined;
    if (port >= low && port <= high) return true;
  }
  return false;
}

const firstPacketTcpFlags = new Set(['SYN']);

/** One check per option of `match`, or undefined when `handler` cannot read one of them. */
function optionChecks(match: RuleMatch, handler: (entry: RuleOption) => Check | undefined): Check[] | undefined {
  const checks: Check[] = [];
  for (const entry of match.options) {
    const check = handler(entry);
    if (!check) return undefined;
    checks.push(check);
  }
  return checks;
}

/** An option of -m tcp, udp, sctp or udplite. */
function transportOptionCheck(module: string, entry: RuleOption): Check | undefined {
  switch (entry.name) {
    case 'dport': {
      const spec = entry.values[0];
      return (state) => {
        const inside = portInSpec(spec, state.dstPort);
        return inside === undefined ? `port "${spec}" of -m ${module} cannot be read` : inside !== entry.negated;
      };
    }
    case 'sport':
      return () => `-m ${module} --sport tests the source port, which the trace does not know`;
    case 'tcp-flags': {
      const [maskText, setText] = entry.values;
      const mask = maskText === 'ALL' ? ['FIN', 'SYN', 'RST', 'PSH', 'ACK', 'URG'] : maskText.split(',');
      const set = setText === 'NONE' ? [] : setText === 'ALL' ? mask : setText.split(',');
      const matches = mask.every((flag) => firstPacketTcpFlags.has(flag) === set.includes(flag));
      return () => matches !== entry.negated;
    }
    default:
      return undefined;
  }
}

/** An option of -m conntrack or -m state. */
function conntrackOptionCheck(entry: RuleOption): Check | undefined {
  switch (entry.name) {
    case 'ctstate':
    case 'state': {
      const states = entry.values[0].split(',');
      return (state) => {
        const current = new Set<string>([state.ctState]);
        if (state.dnatDone) current.add('DNAT');
        return states.some((name) => current.has(name)) !== entry.negated;
      };
    }
    case 'ctproto':
      return (state) => (state.protocol === entry.values[0].toLowerCase()) !== entry.negated;
    case 'ctorigdst':
    case 'ctorigsrc': {
      const cidr = parseCIDR(
        entry.values[0].includes('/') ? entry.values[0] : `${entry.values[0]}/${entry.values[0].includes(':') ? 128 : 32}`,
      );
      if (!cidr) return undefined;
      return (state) => cidrContains(cidr, entry.name === 'ctorigdst' ? state.originalDst : state.src) !== entry.negated;
    }
    case 'ctorigdstport':
      return (state) => {
        const inside = portInSpec(entry.values[0], state.originalDstPort);
        return inside === undefined ? `--ctorigdstport ${entry.values[0]} cannot be read` : inside !== entry.negated;
      };
    default:
      return undefined;
  }
}

function matchChecks(match: RuleMatch): Check[] {
  const unknown = (what: string): Check[] => [() => what];
  const each = (handler: (entry: RuleOption) => Check | undefined): Check[] | undefined => optionChecks(match, handler);
  switch (match.module) {
    case 'comment':
      return [];
    case 'nfacct':
      // Counts the packet in a named nfacct object and always matches.
      return [];
    case 'tcp':
    case 'udp':
    case 'sctp':
    case 'udplite': {
      const module = match.module;
      const result = each((entry) => transportOptionCheck(module, entry));
      const protocolCheck: Check = (state) => state.protocol === module;
      return result ? [protocolCheck, ...result] : [protocolCheck, ...unknown(`unknown match option of -m ${module}`)];
    }
    case 'multiport': {
      const result = each((entry) => {
        const spec = entry.values[0];
        if (entry.name === 'dports' || entry.name === 'ports') {
          return (state) => {
            const inside = portInSpec(spec, state.dstPort);
            if (inside === undefined) return `ports "${spec}" of -m multiport cannot be read`;
            if (entry.name === 'ports' && !inside) return '-m multiport --ports also tests the source port, which the trace does not know';
            return inside !== entry.negated;
          };
        }
        if (entry.name === 'sports') return () => '-m multiport --sports tests the source port, which the trace does not know';
        return undefined;
      });
      return result ?? unknown('unknown option of -m multiport');
    }
    case 'addrtype': {
      const result = each((entry) => {
        if (entry.name === 'limit-iface-in' || entry.name === 'limit-iface-out') return () => true;
        if (entry.name !== 'src-type' && entry.name !== 'dst-type') return undefined;
        const types = entry.values[0].split(',');
        const pick = entry.name === 'src-type' ? (state: PacketState) => state.src : (state: PacketState) => state.dst;
        return (state, addresses) => {
          let answer = false;
          for (const type of types) {
            const kind = addressType(type, pick(state), addresses);
            if (kind === undefined) return `-m addrtype --${entry.name} ${type} is not evaluated by the trace`;
            answer ||= kind;
          }
          return answer !== entry.negated;
        };
      });
      return result ?? unknown('unknown option of -m addrtype');
    }
    case 'mark': {
      const entry = option(match, 'mark');
      const parsed = entry && parseMarkValue(entry.values[0]);
      if (!entry || !parsed) return unknown('-m mark without a readable --mark');
      return [(state) => ((state.mark & parsed.mask) >>> 0 === parsed.value) !== entry.negated];
    }
    case 'conntrack':
    case 'state': {
      const result = each(conntrackOptionCheck);
      return result ?? unknown(`-m ${match.module} option not evaluated by the trace`);
    }
    case 'recent': {
      // A connection's first packet: no list has an entry for it yet unless an earlier
      // connection put one there, which is session affinity's second connection, not this one.
      const checking = match.options.find((entry) => ['rcheck', 'update', 'remove'].includes(entry.name));
      if (checking) return [() => checking.negated];
      return [];
    }
    case 'pkttype': {
      const entry = option(match, 'pkt-type');
      if (!entry) return unknown('-m pkttype without --pkt-type');
      return [(state) => (packetType(state.dst) === entry.values[0].toLowerCase()) !== entry.negated];
    }
    case 'iprange': {
      const result = each((entry) => {
        if (entry.name !== 'src-range' && entry.name !== 'dst-range') return undefined;
        const [lowText, highText] = entry.values[0].split('-');
        const low = parseIP(lowText);
        const high = parseIP(highText ?? lowText);
        if (!low || !high) return undefined;
        return (state) => {
          const ip = entry.name === 'src-range' ? state.src : state.dst;
          return (
            (ip.family === low.family && compareBytes(ip.bytes, low.bytes) >= 0 && compareBytes(ip.bytes, high.bytes) <= 0) !==
            entry.negated
          );
        };
      });
      return result ?? unknown('-m iprange option not evaluated by the trace');
    }
    case 'icmp':
    case 'icmp6':
      // The traced packet is TCP, UDP or SCTP.
      return [() => false];
    default:
      return unknown(`unknown match -m ${match.module}`);
  }
}

function compareBytes(a: number[], b: number[]): number {
  for (let index = 0; index < a.length; index++) if (a[index] !== b[index]) return a[index] - b[index];
  return 0;
}

const multicastV4 = parseCIDR('224.0.0.0/4') as ParsedCIDR;
const multicastV6 = parseCIDR('ff00::/8') as ParsedCIDR;

function isMulticast(ip: ParsedIP): boolean {
  return cidrContains(ip.family === 'IPv4' ? multicastV4 : multicastV6, ip);
}

function packetType(ip: ParsedIP): string {
  if (isMulticast(ip)) return 'multicast';
  if (ip.text === '255.255.255.255') return 'broadcast';
  return 'unicast';
}

function addressType(type: string, ip: ParsedIP, addresses: AddressKind): boolean | undefined {
  switch (type) {
    case 'LOCAL':
      return addresses.isLocal(ip);
    case 'UNICAST':
      return !addresses.isLocal(ip) && packetType(ip) === 'unicast';
    case 'MULTICAST':
      return isMulticast(ip);
    case 'BROADCAST':
      return ip.text === '255.255.255.255';
    default:
      return undefined;
  }
}
