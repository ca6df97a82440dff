// The sentences of a trace: why a rule matched the packet and what it does to it, in the words of
// Kubernetes Services where the rule is one of the proxy's.
import type {ParsedIP} from '../model/ip.ts';
import type {PacketState} from './match.ts';
import {parseMarkValue} from './rule-syntax.ts';
import {findChain, isProxyChain, servicePortOfComment, type IptablesRule, type IptablesRuleset, type RuleMatch} from './ruleset.ts';

/** Explainer knows the ruleset, so it can name the service or endpoint behind a hashed chain. */
export class Explainer {
  ruleset: IptablesRuleset;
  private serviceOfChain = new Map<string, string | undefined>();
  private endpointOfChain = new Map<string, string | undefined>();

  constructor(ruleset: IptablesRuleset) {
    this.ruleset = ruleset;
  }

  /** serviceOf names the service port a proxy chain belongs to, from its rules' comments. */
  serviceOf(table: string, chain: string): string | undefined {
    const key = `${table}/${chain}`;
    if (!this.serviceOfChain.has(key)) {
      const rules = findChain(this.ruleset, table, chain)?.rules ?? [];
      let found: string | undefined;
      for (const rule of rules) {
        found = servicePortOfComment(rule.comment);
        if (found) break;
      }
      this.serviceOfChain.set(key, found);
    }
    return this.serviceOfChain.get(key);
  }

  /** endpointOf: the "ip:port" an endpoint chain DNATs to. */
  endpointOf(table: string, chain: string): string | undefined {
    const key = `${table}/${chain}`;
    if (!this.endpointOfChain.has(key)) {
      const rule = findChain(this.ruleset, table, chain)?.rules.find((candidate) => candidate.target?.name === 'DNAT');
      this.endpointOfChain.set(key, rule?.target?.options.find((entry) => entry.name === 'to-destination')?.values[0]);
    }
    return this.endpointOfChain.get(key);
  }

  /** chainRole says what a chain is for, e.g. "KUBE-SVC-X, the service chain of default/web:http, which picks an endpoint". */
  chainRole(table: string, chain: string): string {
    const service = this.serviceOf(table, chain);
    const of = service ? ` of ${service}` : '';
    if (chain.startsWith('KUBE-SVC-')) return `${chain}, the service chain${of}, which picks an endpoint`;
    if (chain.startsWith('KUBE-SVL-')) return `${chain}, the chain of the endpoints${of} on this node`;
    if (chain.startsWith('KUBE-EXT-'))
      return `${chain}, the chain for traffic to the external addresses${of} (node port, external IP, load-balancer IP)`;
    if (chain.startsWith('KUBE-FW-')) return `${chain}, which checks the client against the loadBalancerSourceRanges${of}`;
    if (chain.startsWith('KUBE-XLB-')) return `${chain}, the local-endpoint chain${of}`;
    if (chain.startsWith('KUBE-SEP-')) {
      const endpoint = this.endpointOf(table, chain);
      return endpoint ? `${chain}, the chain of endpoint ${endpoint}` : `${chain}, an endpoint chain${of}`;
    }
    switch (chain) {
      case 'KUBE-SERVICES':
        return table === 'nat'
          ? "KUBE-SERVICES, the proxy's list of service addresses"
          : 'KUBE-SERVICES, which refuses connections to services without endpoints';
      case 'KUBE-NODEPORTS':
        return table === 'nat' ? "KUBE-NODEPORTS, the proxy's list of node ports" : 'KUBE-NODEPORTS, which accepts health-check node ports';
      case 'KUBE-MARK-MASQ':
        return 'KUBE-MARK-MASQ, which marks the packet for masquerade';
      case 'KUBE-POSTROUTING':
        return 'KUBE-POSTROUTING, which masquerades the packets the proxy marked';
      case 'KUBE-FORWARD':
        return 'KUBE-FORWARD, which lets forwarded service traffic through';
      case 'KUBE-PROXY-FIREWALL':
        return 'KUBE-PROXY-FIREWALL, which drops load-balancer traffic from sources that are not allowed';
      case 'KUBE-EXTERNAL-SERVICES':
        return 'KUBE-EXTERNAL-SERVICES, which refuses or drops outside traffic to services without (local) endpoints';
      case 'KUBE-MARK-DROP':
        return "KUBE-MARK-DROP, kubelet's chain that marks packets to be dropped";
      case 'KUBE-FIREWALL':
        return "KUBE-FIREWALL, kubelet's chain that drops marked and martian packets";
      default:
        return isProxyChain(chain) ? chain : `${chain} (not one of the proxy's chains)`;
    }
  }
}

const percent = (value: number) => `${(value * 100).toFixed(value === 1 || value === 0 ? 0 : 1)}%`;

function sentence(text: string): string {
  const trimmed = text.trim();
  // A sentence may open with a service name ("default/web:http has no endpoints"): names keep their case.
  const opensWithName = /^[a-z0-9-]+\//.test(trimmed);
  return `${opensWithName ? trimmed.charAt(0) : trimmed.charAt(0).toUpperCase()}${trimmed.slice(1)}${/[.!?]$/.test(trimmed) ? '' : '.'}`;
}

function hostOrNetwork(cidr: string): {host: boolean; text: string} {
  const [address, prefix] = cidr.split('/');
  const host = (address.includes(':') && prefix === '128') || (!address.includes(':') && prefix === '32');
  return {host, text: host ? address : cidr};
}

function endpointText(ip: ParsedIP, port: number): string {
  return ip.family === 'IPv6' ? `[${ip.text}]:${port}` : `${ip.text}:${port}`;
}

function option(match: RuleMatch, name: string) {
  return match.options.find((entry) => entry.name === name);
}

/** conditions lists, in plain words, what the rule tested and how the packet passed. */
export function conditions(rule: IptablesRule, state: PacketState, options: {skipProtocol?: boolean} = {}): string[] {
  const words: string[] = [];
  const address = (what: string, ip: ParsedIP, cidr: string, negated: boolean) => {
    const {host, text} = hostOrNetwork(cidr);
    if (host) words.push(`the ${what} is ${negated ? 'not ' : ''}${text}`);
    else words.push(`the ${what} ${ip.text} is ${negated ? 'outside' : 'in'} ${text}`);
  };
  if (rule.source) address('source', state.src, rule.source.cidr, rule.source.negated);
  if (rule.destination) address('destination', state.dst, rule.destination.cidr, rule.destination.negated);
  if (rule.inInterface) {
    if (state.inInterface === '') words.push('the node itself sent the packet (it has no input interface)');
    else words.push(`it arrived on ${state.inInterface}${rule.inInterface.negated ? `, not on ${rule.inInterface.name}` : ''}`);
  }
  if (rule.outInterface)
    words.push(`it leaves by ${state.outInterface}${rule.outInterface.negated ? `, not by ${rule.outInterface.name}` : ''}`);
  const portWords = (negated: boolean, spec: string) => {
    const isList = spec.includes(',') || spec.includes(':');
    const where = isList ? `in ${spec}` : spec === String(state.dstPort) ? 'the one it tests' : spec;
    return `the destination port ${state.dstPort} is ${negated ? 'not ' : ''}${where}`;
  };
  let portSaid = false;
  for (const match of rule.matches) {
    switch (match.module) {
      case 'tcp':
      case 'udp':
      case 'sctp': {
        const dport = option(match, 'dport');
        if (dport && !options.skipProtocol) {
          words.push(`it is ${match.module.toUpperCase()} to port ${state.dstPort}`);
          portSaid = true;
        }
        break;
      }
      case 'multiport': {
        const ports = option(match, 'dports') ?? option(match, 'ports');
        if (ports) words.push(portWords(ports.negated, ports.values[0]));
        break;
      }
      case 'addrtype':
        for (const entry of match.options) {
          if (entry.name === 'dst-type') {
            words.push(
              entry.values[0] === 'LOCAL'
                ? `the destination ${state.dst.text} is ${entry.negated ? 'not ' : ''}an address of this node`
                : `the destination is ${entry.negated ? 'not ' : ''}of type ${entry.values[0]}`,
            );
          }
          if (entry.name === 'src-type') {
            words.push(
              entry.values[0] === 'LOCAL'
                ? entry.negated
                  ? `the source ${state.src.text} is not an address of this node`
                  : `the node itself sent it (the source ${state.src.text} is one of its addresses)`
                : `the source is ${entry.negated ? 'not ' : ''}of type ${entry.values[0]}`,
            );
          }
        }
        break;
      case 'mark': {
        const entry = option(match, 'mark');
        const parsed = entry && parseMarkValue(entry.values[0]);
        if (entry && parsed) {
          if (parsed.value === parsed.mask)
            words.push(`the packet ${entry.negated ? 'does not carry' : 'carries'} mark bit ${entry.values[0].split('/')[0]}`);
          else words.push(`the packet mark ${entry.negated ? 'does not match' : 'matches'} ${entry.values[0]}`);
        }
        break;
      }
      case 'conntrack':
      case 'state': {
        const entry = option(match, 'ctstate') ?? option(match, 'state');
        if (entry)
          words.push(
            entry.negated
              ? `the connection is not ${entry.values[0]}`
              : entry.values[0].split(',').includes(state.ctState)
                ? 'the packet opens a new connection'
                : `the connection state is ${entry.values[0]}`,
          );
        break;
      }
      case 'recent': {
        const checking = match.options.find((entry) => ['rcheck', 'update'].includes(entry.name));
        if (checking?.negated) words.push('the client has no recent connection in this list');
        break;
      }
      default:
        break;
    }
  }
  if (rule.protocol && !options.skipProtocol) {
    if (rule.protocol.negated) words.push(`it is not ${rule.protocol.name.toUpperCase()}`);
    else if (!portSaid) words.push(`it is ${rule.protocol.name.toUpperCase()}`);
  }
  return words;
}

function joinWords(words: string[]): string {
  if (words.length <= 1) return words.join('');
  return `${words.slice(0, -1).join(', ')} and ${words[words.length - 1]}`;
}

/** HopFacts: what the tracer knows about the hop besides the rule. */
export interface HopFacts {
  /** Probability that this rule picks the packet among those reaching it (statistic), 1 without one. */
  ruleProbability: number;
  /** Probability of this branch of the walk after the rule. */
  branchProbability: number;
  /** The state before the rule. */
  before: PacketState;
  /** The state after the rule's target. */
  after: PacketState;
  /** The chain that jumped to the rule's chain, when it was a jump. */
  callerChain?: string;
}

/** explainRule writes one sentence: why the rule matched and what it does. */
export function explainRule(explainer: Explainer, rule: IptablesRule, facts: HopFacts): string {
  const service =
    servicePortOfComment(rule.comment) ?? (isProxyChain(rule.chain) ? explainer.serviceOf(rule.table, rule.chain) : undefined);
  // The proxy's own rules, told in the words of Services.
  const told = isProxyChain(rule.chain) && service ? explainServiceRule(explainer, rule, facts, service) : undefined;
  if (told) return told;
  return explainTarget(explainer, rule, facts, service);
}

/** explainTarget: the sentence any rule gets from its target, whoever wrote it. */
function explainTarget(explainer: Explainer, rule: IptablesRule, facts: HopFacts, service: string | undefined): string {
  const {before, after} = facts;
  const comment = rule.comment ?? '';
  const target = rule.target?.name;
  const why = conditions(rule, before);
  const because = why.length > 0 ? joinWords(why) : '';
  switch (target) {
    case undefined:
      return sentence(
        `${because || 'Every packet reaches this rule'}; the rule has no target ` +
          `(${comment || 'it only counts packets'}), so the packet goes on to the next rule`,
      );
    case 'KUBE-MARK-MASQ':
      return sentence(`${masqueradeBecause(explainer, rule, before)}, so the packet goes to KUBE-MARK-MASQ to be marked for masquerade`);
    case 'MARK': {
      const changed = (after.mark ^ before.mark) >>> 0;
      const setBits = (after.mark & changed) >>> 0;
      const clearedBits = (before.mark & changed) >>> 0;
      const what =
        changed === 0
          ? `leaves the packet mark at 0x${after.mark.toString(16)}`
          : setBits && !clearedBits
            ? `sets mark bit${countBits(setBits) > 1 ? 's' : ''} 0x${setBits.toString(16)} on the packet`
            : !setBits && clearedBits
              ? `clears mark bit${countBits(clearedBits) > 1 ? 's' : ''} 0x${clearedBits.toString(16)}`
              : `changes the packet mark to 0x${after.mark.toString(16)}`;
      if (rule.chain === 'KUBE-MARK-MASQ')
        return sentence(`This rule ${what}: KUBE-POSTROUTING masquerades packets that carry it when they leave the node`);
      if (rule.chain === 'KUBE-MARK-DROP') return sentence(`This rule ${what}: kubelet's KUBE-FIREWALL drops packets that carry it`);
      if (rule.chain === 'KUBE-POSTROUTING')
        return sentence(
          `The packet carries the masquerade mark, so this rule ${what} before it is masqueraded (a packet ` +
            `that comes back through the rules is not masqueraded twice)`,
        );
      return sentence(`${because ? `${because}, so this rule` : 'This rule'} ${what}`);
    }
    case 'DNAT': {
      const to = endpointText(after.dst, after.dstPort);
      const affinity = rule.matches.find((match) => match.module === 'recent' && match.options.some((entry) => entry.name === 'set'));
      const list = affinity && option(affinity, 'name')?.values[0];
      const seconds = findAffinitySeconds(explainer, rule.table, list, facts.callerChain);
      const sticky = affinity
        ? `; it also records the client ${before.src.text} in the list ${list}, so its next ` +
          `connections${seconds ? ` within ${seconds} s` : ''} go to the same endpoint (session affinity)`
        : '';
      const tested = conditions(rule, before, {skipProtocol: true});
      return sentence(
        `${tested.length > 0 ? `${joinWords(tested)}, so the` : 'The'} destination is rewritten ` +
          `from ${before.dst.text}:${before.dstPort} to ${to} (DNAT)${service ? `: the connection now goes to this endpoint of ${service}` : ''}${sticky}`,
      );
    }
    case 'REDIRECT':
      return sentence(
        `${because || 'Every packet reaches this rule'}, so the packet is redirected to ${endpointText(after.dst, after.dstPort)} on this node (REDIRECT)`,
      );
    case 'MASQUERADE':
    case 'SNAT': {
      const marked =
        rule.chain === 'KUBE-POSTROUTING' ? 'The packet carries the masquerade mark, so its' : because ? `${because}, so its` : 'Its';
      const how =
        target === 'SNAT'
          ? `to ${rule.target?.options.find((entry) => entry.name === 'to-source')?.values[0] ?? 'the given address'} (SNAT)`
          : "to the node's address on the outgoing interface (MASQUERADE)";
      return sentence(`${marked} source ${before.src.text} is rewritten ${how}: replies come back through this node`);
    }
    case 'RETURN':
      if (rule.chain === 'KUBE-POSTROUTING')
        return sentence(
          `The packet does not carry the masquerade mark, so it leaves KUBE-POSTROUTING with its source ${before.src.text} unchanged`,
        );
      return sentence(
        `${because || 'Every packet reaches this rule'}, so the packet returns from ${rule.chain} to the chain that called it`,
      );
    case 'ACCEPT':
      if (rule.chain === 'KUBE-FORWARD') return sentence(`${because || 'The packet matched'}, so KUBE-FORWARD accepts it for forwarding`);
      return sentence(
        `${because || 'Every packet reaches this rule'}, so the packet is accepted (${rule.table} ${rule.chain} lets it through)`,
      );
    case 'DROP':
      return sentence(`${because || 'Every packet reaches this rule'}, so the packet is dropped silently (the client times out)`);
    case 'REJECT':
      return sentence(
        `${because || 'Every packet reaches this rule'}, so the connection is refused (REJECT with ${rule.target?.options[0]?.values[0] ?? 'an ICMP error'})`,
      );
    default: {
      if (findChain(explainer.ruleset, rule.table, target)) {
        const lead = because || (rule.comment ? `All traffic passes this rule ("${rule.comment}")` : 'Every packet reaches this rule');
        return sentence(`${lead}, so it ${rule.target?.goto ? 'goes (goto)' : 'jumps'} to ${explainer.chainRole(rule.table, target)}`);
      }
      return sentence(`${because || 'Every packet reaches this rule'}; target ${target} is applied and the packet goes on`);
    }
  }
}

/** explainServiceRule: the sentence of one of the proxy's own rules, in the words of Services; undefined when none fits. */
function explainServiceRule(explainer: Explainer, rule: IptablesRule, facts: HopFacts, service: string): string | undefined {
  const {before} = facts;
  const comment = rule.comment ?? '';
  const target = rule.target?.name;
  const port = `${before.dst.text}:${before.dstPort}/${before.protocol.toUpperCase()}`;
  if (/ cluster IP$/.test(comment) && target && !target.startsWith('KUBE-MARK')) {
    return sentence(`${port} is the cluster IP and port of ${service}, so the packet goes to ${explainer.chainRole(rule.table, target)}`);
  }
  if (/ external IP$/.test(comment) && target)
    return sentence(`${port} is an external IP of ${service}, so the packet goes to ${explainer.chainRole(rule.table, target)}`);
  if (/ loadbalancer IP$/.test(comment) && target && rule.destination) {
    return sentence(`${port} is the load-balancer IP of ${service}, so the packet goes to ${explainer.chainRole(rule.table, target)}`);
  }
  if (/ loadbalancer IP$/.test(comment) && target && rule.source) {
    return sentence(
      `The source ${before.src.text} is inside ${rule.source.cidr}, one of the loadBalancerSourceRanges ` +
        `of ${service}, so the packet is allowed on to ${explainer.chainRole(rule.table, target)}`,
    );
  }
  if (/has no endpoints$/.test(comment)) {
    return sentence(
      `${service} has no endpoints, so ` +
        (target === 'REJECT'
          ? `the connection to ${port} is refused at once (REJECT with ${rule.target?.options[0]?.values[0] ?? 'an ICMP error'})`
          : `the packet to ${port} goes to ${target}`),
    );
  }
  if (/has no local endpoints$/.test(comment)) {
    // kube-proxy writes the cluster IP's rule (internal policy) into KUBE-SERVICES, the others into KUBE-EXTERNAL-SERVICES.
    const policy = rule.chain === 'KUBE-SERVICES' ? 'internalTrafficPolicy' : 'externalTrafficPolicy';
    return sentence(
      `${service} has ${policy} Local and no endpoint on this node, so the packet to ${port} is ${target === 'DROP' ? 'dropped' : `sent to ${target}`}`,
    );
  }
  if (/traffic not accepted by /.test(comment) && target === 'DROP') {
    return sentence(
      `The packet is still addressed to the load-balancer ` +
        `IP ${port}: ${comment.replace(/^.* traffic not accepted by /, '')} did not let its ` +
        `source ${before.src.text} through (it is not in loadBalancerSourceRanges), so it is dropped`,
    );
  }
  if (/^other traffic to .* will be dropped by /.test(comment) && !target) {
    return sentence(
      `No allowed source range matched ${before.src.text}, so the packet keeps its load-balancer ` +
        `destination and ${comment.replace(/^.* will be dropped by /, '')} in the filter table will drop it`,
    );
  }
  if (rule.chain === 'KUBE-NODEPORTS' && target && (target.startsWith('KUBE-EXT-') || target.startsWith('KUBE-SVC-'))) {
    return sentence(
      `Port ${before.dstPort}/${before.protocol.toUpperCase()} is the node port of ${service}, so the ` +
        `packet goes to ${explainer.chainRole(rule.table, target)}`,
    );
  }
  if (/ health check node port$/.test(comment) && target === 'ACCEPT') {
    return sentence(
      `Port ${before.dstPort}/${before.protocol.toUpperCase()} is the health check node port of ${service}, so the load balancer's probe is let in`,
    );
  }
  if (/^pod traffic for /.test(comment) && target) {
    return sentence(
      `The source ${before.src.text} is a pod ` +
        `(${rule.source ? `in ${rule.source.cidr}` : 'local traffic'}), so it is treated like traffic to the ` +
        `cluster IP and goes to ${explainer.chainRole(rule.table, target)}`,
    );
  }
  if (/^route LOCAL traffic for /.test(comment) && target) {
    return sentence(
      `The node itself sent the packet, so it may use every endpoint of ${service}, not only this node's: ` +
        `it goes to ${explainer.chainRole(rule.table, target)}`,
    );
  }
  if (rule.chain.startsWith('KUBE-EXT-') && target?.startsWith('KUBE-SVL-')) {
    return sentence(
      `Traffic from outside keeps its source address under externalTrafficPolicy Local, so it may only go ` +
        `to endpoints on this node: ${explainer.chainRole(rule.table, target)}`,
    );
  }
  if (rule.chain.startsWith('KUBE-EXT-') && target?.startsWith('KUBE-SVC-') && !comment) {
    return sentence(`All traffic to the external addresses of ${service} goes on to ${explainer.chainRole(rule.table, target)}`);
  }
  if (target && (target.startsWith('KUBE-SEP-') || (target.startsWith('KUBE-SVC-') && / -> /.test(comment)))) {
    const endpoint = explainer.endpointOf(rule.table, target) ?? comment.replace(/^.* -> /, '');
    if (facts.ruleProbability < 1) {
      return sentence(
        `The random draw picked endpoint ${endpoint} of ${service} (${percent(facts.ruleProbability)} of ` +
          `the connections reaching this rule, ${percent(facts.branchProbability)} of all), so the packet goes to ${target}`,
      );
    }
    const share = facts.branchProbability < 1 ? ` (${percent(facts.branchProbability)} of all)` : '';
    return sentence(`Every connection that reaches this rule goes to endpoint ${endpoint} of ${service}${share}, through ${target}`);
  }
  return undefined;
}

function countBits(value: number): number {
  let count = 0;
  for (let bits = value >>> 0; bits; bits &= bits - 1) count++;
  return count;
}

function findAffinitySeconds(
  explainer: Explainer,
  table: string,
  list: string | undefined,
  callerChain: string | undefined,
): string | undefined {
  if (!list) return undefined;
  // The service chain's rcheck rule for this list says how long the client sticks; it is in the
  // chain that jumped here, else anywhere in the table (read as text: a large dump has many rules).
  const chains = callerChain
    ? [findChain(explainer.ruleset, table, callerChain)]
    : [...(explainer.ruleset.tables.get(table)?.chains.values() ?? [])];
  for (const chain of chains) {
    for (const rule of chain?.rules ?? []) {
      if (!rule.text.includes(' --rcheck ') || !rule.text.includes(` --name ${list} `)) continue;
      const seconds = / --seconds (\d+)/.exec(rule.text);
      if (seconds) return seconds[1];
    }
  }
  return callerChain ? findAffinitySeconds(explainer, table, list, undefined) : undefined;
}

/**
 * masqueradeBecause says why a rule sends the packet to be masqueraded, in kube-proxy's terms
 * where it can: "the source 10.240.0.100 is outside the cluster CIDR 10.244.0.0/16".
 */
export function masqueradeBecause(explainer: Explainer, rule: IptablesRule, state: PacketState): string {
  const comment = rule.comment ?? '';
  const service = servicePortOfComment(comment) ?? explainer.serviceOf(rule.table, rule.chain);
  if (rule.chain.startsWith('KUBE-SEP-') && rule.source && !rule.source.negated) {
    return `the source ${state.src.text} is the endpoint itself (hairpin: a pod reaching itself through its service)`;
  }
  if (/^masquerade traffic for /.test(comment)) {
    return (
      `the packet came to an external address of ${service ?? 'the service'} (node port, external IP or ` +
      `load-balancer IP) and externalTrafficPolicy is Cluster`
    );
  }
  if (/^masquerade LOCAL traffic for /.test(comment))
    return `the node itself sent the packet to an external address of ${service ?? 'the service'}`;
  // Older kube-proxy versions wrote the cluster IP's masquerade rule into KUBE-SERVICES itself.
  if (rule.chain.startsWith('KUBE-SVC-') || rule.chain.startsWith('KUBE-SVL-') || / cluster IP$/.test(comment)) {
    if (rule.source?.negated) return `the source ${state.src.text} is outside the cluster CIDR ${rule.source.cidr}`;
    if (rule.inInterface?.negated) {
      return state.inInterface === ''
        ? `the node itself sent the packet, not a pod behind ${rule.inInterface.name}`
        : `the packet arrived on ${state.inInterface}, not from a pod behind ${rule.inInterface.name}`;
    }
    if (!rule.source && !rule.inInterface) return `masqueradeAll is on: every packet to ${service ?? 'the service'} is masqueraded`;
  }
  const words = conditions(rule, state);
  return words.length > 0 ? joinWords(words) : `every packet reaching ${rule.table} ${rule.chain} is marked`;
}
