// What a traced packet's fate comes to, in terms two rulesets of any layout share: where it goes
// (which endpoints, how likely each), whether it is masqueraded or pinned by session affinity,
// or that it is dropped, refused, or goes on untouched, to the node itself or onward.
import {parseIP} from '../model/ip.ts';
import type {TraceHop, TraceResult} from '../trace/types.ts';

export interface OutcomePath {
  /** "ip:port" for DNAT; else what ended the path. */
  to: string;
  probability: number;
  masquerade: boolean;
}

export interface Outcome {
  verdict: 'DNAT' | 'DROP' | 'REJECT' | 'ACCEPT';
  /** DNAT: one per endpoint (sorted by endpoint); empty otherwise. */
  paths: OutcomePath[];
  /** A client's later connections follow its first (ClientIP affinity, ipvs persistence). */
  affinity: boolean;
  /**
   * ACCEPT: the packet keeps its destination, and that address is the node's own (a host socket
   * answers, as on kube-ipvs0's service addresses) or not (it is routed on).
   */
  deliveredTo?: 'node' | 'onward';
}

// Probabilities are compared at this precision: iptables' statistic rules print five decimals.
const precision = 1000;

function rounded(probability: number): number {
  return Math.round(probability * precision) / precision;
}

// The rules that pin a client: iptables' `-m recent --set`, nftables' affinity sets, ipvs persistence.
const affinityMark = /-m recent .*--set|@affinity-|persistence/;

function pinsClient(hops: TraceHop[]): boolean {
  return hops.some((hop) => affinityMark.test(hop.rule) || affinityMark.test(hop.explanation));
}

/** outcomeOf reduces a trace to its outcome; `isLocal` tells the node's own addresses under that ruleset. */
export function outcomeOf(trace: TraceResult, isLocal: (address: string) => boolean): Outcome {
  const affinity = pinsClient(trace.hops) || trace.branches.some((branch) => pinsClient(branch.hops));
  if (trace.verdict !== 'DNAT') {
    const outcome: Outcome = {verdict: trace.verdict, paths: [], affinity: false};
    if (trace.verdict === 'ACCEPT') outcome.deliveredTo = isLocal(trace.packet.dstIP) ? 'node' : 'onward';
    return outcome;
  }
  const byTarget = new Map<string, OutcomePath>();
  for (const branch of trace.branches) {
    const existing = byTarget.get(branch.endpoint);
    if (existing) {
      existing.probability += branch.probability;
      existing.masquerade ||= branch.masquerade;
    } else byTarget.set(branch.endpoint, {to: branch.endpoint, probability: branch.probability, masquerade: branch.masquerade});
  }
  const paths = [...byTarget.values()]
    .map((path) => ({...path, probability: rounded(path.probability)}))
    .sort((a, b) => (a.to < b.to ? -1 : a.to > b.to ? 1 : 0));
  return {verdict: 'DNAT', paths, affinity};
}

/** outcomeKey: equal keys, equal behaviour. */
export function outcomeKey(outcome: Outcome): string {
  const paths = outcome.paths.map((path) => `${path.to}@${path.probability}${path.masquerade ? '+masq' : ''}`).join(',');
  return `${outcome.verdict}|${outcome.deliveredTo ?? ''}|${outcome.affinity ? 'affinity' : ''}|${paths}`;
}

/**
 * answers: the service answers (an endpoint gets the connection). A packet left alone on its way to
 * the node itself reaches only what listens there, which the rules do not know.
 */
export function answers(outcome: Outcome): boolean {
  return outcome.verdict === 'DNAT';
}

/** describeOutcome: the outcome as the end of a sentence ("is dropped", "is sent to ..."). */
export function describeOutcome(outcome: Outcome): string {
  switch (outcome.verdict) {
    case 'DROP':
      return 'is dropped';
    case 'REJECT':
      return 'is refused';
    case 'ACCEPT':
      return outcome.deliveredTo === 'node'
        ? 'reaches the node itself untouched, where only a host socket on that address and port would answer'
        : 'goes on untouched to its own destination, off the node';
    case 'DNAT': {
      const shares = outcome.paths.map((path) =>
        outcome.paths.length > 1 ? `${path.to} (${Math.round(path.probability * 1000) / 10}%)` : path.to,
      );
      const masqueraded = outcome.paths.filter((path) => path.masquerade).length;
      const masquerade =
        masqueraded === 0
          ? 'not masqueraded'
          : masqueraded === outcome.paths.length
            ? 'masqueraded'
            : `masqueraded on the way to ${masqueraded} of them`;
      return `is sent to ${shares.join(', ')}, ${masquerade}${outcome.affinity ? ', with session affinity' : ''}`;
    }
  }
}

/** What in the outcome changed, in a few words, for summaries: 'verdict', 'endpoints', 'masquerade', 'affinity', 'delivery'. */
export function changedAspects(before: Outcome, after: Outcome): string[] {
  if (before.verdict !== after.verdict) return ['verdict'];
  const aspects: string[] = [];
  if (before.deliveredTo !== after.deliveredTo) aspects.push('delivery');
  const targets = (outcome: Outcome) => outcome.paths.map((path) => `${path.to}@${path.probability}`).join(',');
  if (targets(before) !== targets(after)) aspects.push('endpoints');
  const masq = (outcome: Outcome) => outcome.paths.map((path) => `${path.to}:${path.masquerade}`).join(',');
  if (targets(before) === targets(after) && masq(before) !== masq(after)) aspects.push('masquerade');
  if (before.affinity !== after.affinity) aspects.push('affinity');
  return aspects;
}

/** isLocalTo: whether an address is one of `addresses` or loopback. */
export function localAddressCheck(addresses: string[]): (address: string) => boolean {
  const local = new Set(addresses.map((address) => parseIP(address)?.text ?? address));
  return (address) => {
    const ip = parseIP(address);
    if (!ip) return false;
    return local.has(ip.text) || (ip.family === 'IPv4' ? ip.bytes[0] === 127 : ip.text === '::1');
  };
}
