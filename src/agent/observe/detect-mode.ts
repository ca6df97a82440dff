// Which mode kube-proxy runs in on this node, read from the kernel, as an observing agent needs to
// know before it can compare anything: nftables mode leaves `table ip kube-proxy` (or ip6),
// iptables mode a KUBE-SERVICES chain in the nat table of iptables-nft or iptables-legacy (with
// jumps to KUBE-SVC-* / KUBE-NODEPORTS, not ipvs mode's ipset matches), ipvs mode virtual servers
// and its dummy device kube-ipvs0. --observe-mode overrides the finding. None found, or more than
// one (a half-done mode switch leaves the old mode's rules), is said plainly, and the agent
// compares with one of them all the same.
import type {IPFamily} from '../../core/model/index.ts';
import type {ProxyMode} from '../config/agent-config.ts';
import type {Host, IptablesFrontEnd} from '../host/host.ts';
import {errorText} from '../../core/error-text.ts';

/** ModeEvidence: one mode's rules found on the node, and what showed it. */
export interface ModeEvidence {
  mode: ProxyMode;
  /** For iptables and ipvs: the iptables front end their chains are in. */
  frontEnd?: IptablesFrontEnd;
  /** What was found, e.g. "KUBE-SERVICES in iptables-nft (IPv4)". */
  evidence: string;
}

export type ModeFinding = 'detected' | 'override' | 'none found' | 'several found';

/** ModeDetection: what the observer compares with, and why. */
export interface ModeDetection {
  mode: ProxyMode;
  /** The iptables front end to read (iptables and ipvs modes); undefined: the node's default. */
  frontEnd?: IptablesFrontEnd;
  finding: ModeFinding;
  /** Every mode whose rules are there. */
  found: ModeEvidence[];
  /** One sentence for status and the log. */
  summary: string;
  /** Questions the node could not answer (a tool missing, say): named, never fatal. */
  unreadable: string[];
}

/** The hosts detection reads with: one per iptables front end, and one for nft, ipvsadm and ip. */
export interface DetectionHosts {
  node: Host;
  iptables: Record<IptablesFrontEnd, Host>;
}

/** When several modes' rules are there, the newer mode is taken to be the one kube-proxy runs now. */
const preference: ProxyMode[] = ['nftables', 'ipvs', 'iptables'];
const frontEndTool: Record<IptablesFrontEnd, string> = {nf_tables: 'iptables-nft', legacy: 'iptables-legacy'};

export async function detectKubeProxyMode(hosts: DetectionHosts, families: IPFamily[], override?: ProxyMode): Promise<ModeDetection> {
  const unreadable: string[] = [];
  const ask = async <T>(question: string, read: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await read();
    } catch (error) {
      unreadable.push(`${question}: ${errorText(error).split('\n')[0]}`);
      return undefined;
    }
  };
  const found: ModeEvidence[] = [];

  // `nft -t list sets` names every table (each with its sets; terse: without their elements, which
  // nft would otherwise read: 2.9 s against 0.03 s beside kube-proxy's table of 10,000 services).
  // `nft list tables` would say the same, but nft 1.0 reads the whole ruleset for it, every rule of
  // every table (iptables-nft's too, each translated back): on a large node, the slowest question.
  const tables = await ask('nft -t list sets', () => hosts.node.nft(['-t', 'list', 'sets']));
  for (const family of families) {
    const name = family === 'IPv6' ? 'ip6' : 'ip';
    if (tables !== undefined && new RegExp(`^table ${name} kube-proxy(\\s*\\{)?\\s*$`, 'm').test(tables))
      addEvidence(found, {mode: 'nftables', evidence: `table ${name} kube-proxy`});
  }

  const ipvsServers = await readIpvsEvidence(hosts.node, ask);
  for (const frontEnd of ['nf_tables', 'legacy'] as const) {
    for (const family of families) {
      const tool = family === 'IPv6' ? frontEndTool[frontEnd].replace('iptables', 'ip6tables') : frontEndTool[frontEnd];
      const layout = await ask(`${tool} -t nat -S KUBE-SERVICES`, () => iptablesLayout(hosts.iptables[frontEnd], family));
      if (layout === 'iptables') addEvidence(found, {mode: 'iptables', frontEnd, evidence: `KUBE-SERVICES in ${tool}`});
      if (layout === 'ipvs' && ipvsServers !== undefined)
        addEvidence(found, {mode: 'ipvs', frontEnd, evidence: `${ipvsServers} with kube-ipvs0, KUBE-SERVICES in ${tool}`});
    }
  }
  return decide(found, override, unreadable);
}

/** Keeps one evidence per mode and front end: the first family's, with the others' appended. */
function addEvidence(found: ModeEvidence[], evidence: ModeEvidence): void {
  const known = found.find((entry) => entry.mode === evidence.mode && entry.frontEnd === evidence.frontEnd);
  if (known) known.evidence += `, ${evidence.evidence}`;
  else found.push(evidence);
}

/** "N ipvs virtual servers" when kube-ipvs0 exists and ipvs holds any; undefined otherwise. */
async function readIpvsEvidence(
  host: Host,
  ask: <T>(question: string, read: () => Promise<T>) => Promise<T | undefined>,
): Promise<string | undefined> {
  // No kube-ipvs0 is the usual case on a node that is not in ipvs mode: not worth a complaint.
  const device = await host.ip(['link', 'show', 'kube-ipvs0']).catch(() => undefined);
  if (device === undefined) return undefined;
  const listing = await ask('ipvsadm -Ln', () => host.ipvsadm(['-Ln']));
  const servers = (listing ?? '').split('\n').filter((line) => /^(TCP|UDP|SCTP|FWM)\s/.test(line)).length;
  return servers > 0 ? `${servers} ipvs virtual servers` : undefined;
}

/**
 * iptablesLayout: whose KUBE-SERVICES a front end's nat table holds: iptables mode's (jumps to
 * service chains and KUBE-NODEPORTS), ipvs mode's (ipset matches, KUBE-NODE-PORT), or none. It
 * lists those chains alone: a dump of the table (iptables-nft-save reads the whole ruleset for
 * any table) costs seconds on a large node, for a yes or no.
 */
export async function iptablesLayout(host: Host, family: IPFamily): Promise<'iptables' | 'ipvs' | undefined> {
  const services = await host.iptablesListChain(family, 'nat', 'KUBE-SERVICES');
  if (services === undefined) return undefined;
  if (/^-A KUBE-SERVICES .*--match-set KUBE-/m.test(services)) return 'ipvs';
  return (await host.iptablesListChain(family, 'nat', 'KUBE-NODE-PORT')) === undefined ? 'iptables' : 'ipvs';
}

function describeEvidence(entry: ModeEvidence): string {
  return `${entry.mode} (${entry.evidence})`;
}

function decide(found: ModeEvidence[], override: ProxyMode | undefined, unreadable: string[]): ModeDetection {
  const seen = found.map(describeEvidence).join('; ');
  if (override !== undefined) {
    const match = found.find((entry) => entry.mode === override);
    return {
      mode: override,
      frontEnd: match?.frontEnd,
      finding: 'override',
      found,
      summary: `kube-proxy ${override} (set by --observe-mode; found on the node: ${seen || 'no kube-proxy rules'})`,
      unreadable,
    };
  }
  if (found.length === 0) {
    return {
      mode: 'iptables',
      finding: 'none found',
      found,
      summary:
        'no kube-proxy rules at all on this node: no table ip/ip6 kube-proxy, no KUBE-SERVICES in ' +
        'iptables-nft or iptables-legacy, no ipvs virtual servers with kube-ipvs0; comparing as iptables mode',
      unreadable,
    };
  }
  const chosen = [...found].sort((a, b) => preference.indexOf(a.mode) - preference.indexOf(b.mode))[0];
  if (found.length === 1) {
    return {
      mode: chosen.mode,
      frontEnd: chosen.frontEnd,
      finding: 'detected',
      found,
      summary: `kube-proxy ${describeEvidence(chosen)}`,
      unreadable,
    };
  }
  return {
    mode: chosen.mode,
    frontEnd: chosen.frontEnd,
    finding: 'several found',
    found,
    summary:
      `more than one kube-proxy mode's rules on this node (a half-done mode switch?): ${seen}; ` +
      `comparing as ${chosen.mode}${chosen.frontEnd ? ` (${frontEndTool[chosen.frontEnd]})` : ''}`,
    unreadable,
  };
}
