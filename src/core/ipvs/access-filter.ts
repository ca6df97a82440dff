// KUBE-IPVS-FILTER: kube-proxy's answer to kubernetes#72236. ipvs mode binds every service address
// to kube-ipvs0, so a host socket on the wildcard address answers on every ClusterIP, externalIP and
// load-balancer IP; kube-proxy versions with the fix (kubernetes#108460) send filter INPUT to this
// chain, which lets through (RETURN) what the service sets hold and rejects new connections to any
// other port of an address in KUBE-IPVS-IPS. Older versions write neither the chain nor the jump.
// Read from the iptables layer the node holds, so that the answer is the node's, not a version's.
import type {Protocol} from '../model/types.ts';
import type {IpvsState} from './state.ts';

const chain = 'KUBE-IPVS-FILTER';

interface FilterRule {
  text: string;
  set: string;
  /** "dst" or "dst,dst": what of the packet the set is looked up with. */
  dirs: string;
  protocol: string | undefined;
  target: 'RETURN' | 'REJECT' | 'DROP' | 'ACCEPT';
}

interface AccessFilter {
  rules: FilterRule[];
  /** Lookups in the sets the rules name. */
  members: Map<string, {type: string; entries: Set<string>}>;
}

const filters = new WeakMap<IpvsState, AccessFilter | null>();

/** The chain's rules when filter INPUT jumps to it; null when the node has no such filter. */
function accessFilter(state: IpvsState): AccessFilter | null {
  const known = filters.get(state);
  if (known !== undefined) return known;
  let found: AccessFilter | null = null;
  const filterTable = tableSection(state.iptables, 'filter');
  // A node's dump declares filter INPUT, and then only its jump counts; restore input (a rendering)
  // holds kube-proxy's own chains alone, and the jump is the one kube-proxy ensures beside it.
  const declaresInput = /^:INPUT /m.test(filterTable);
  const jumped = new RegExp(`^-A INPUT (?:.* )?-j ${chain}(\\s|$)`, 'm').test(filterTable);
  if (filterTable.includes(`-A ${chain} `) && (jumped || !declaresInput)) {
    // A rule of another shape than kube-proxy's is left out: treated as not matching.
    const rules: FilterRule[] = [];
    for (const line of filterTable.split('\n')) {
      const text = line.trim().replace(/^\[\d+:\d+\]\s*/, '');
      if (!text.startsWith(`-A ${chain} `)) continue;
      const rule = readRule(text);
      if (rule !== undefined && rule !== 'never') rules.push(rule);
    }
    const members = new Map(state.sets.map((set) => [set.name, {type: set.type, entries: new Set(set.entries)}]));
    found = {rules, members};
  }
  filters.set(state, found);
  return found;
}

/** tableSection: one table of an iptables-save text, from its `*TABLE` line up to its COMMIT; '' when absent. */
export function tableSection(iptables: string, table: string): string {
  const start = iptables.indexOf(`*${table}\n`);
  if (start < 0) return '';
  const end = iptables.indexOf('\nCOMMIT', start);
  return iptables.slice(start, end < 0 ? undefined : end);
}

const rulePattern = new RegExp(
  [
    '^(?:-p (\\w+) )?(?:-m (?:tcp|udp|sctp) )?',
    '(?:-m conntrack --ctstate (\\S+) )?',
    '-m set --match-set (\\S+) (dst(?:,dst)?) ',
    '(?:-m conntrack --ctstate (\\S+) )?',
    '-j (RETURN|REJECT|DROP|ACCEPT)(?: --reject-with \\S+)?$',
  ].join(''),
);

/**
 * One rule as kube-proxy writes it: a set match, maybe `-p` and `--ctstate NEW`, and a verdict;
 * 'never' for a rule of other conntrack states; undefined for anything else.
 */
function readRule(text: string): FilterRule | 'never' | undefined {
  const rest = text
    .replace(/ -m comment --comment (?:"(?:[^"\\]|\\.)*"|\S+)/g, '')
    .slice(`-A ${chain}`.length)
    .trim();
  const match = rulePattern.exec(rest);
  if (!match) return undefined;
  const states = match[2] ?? match[5];
  // The connection asked about is always a new one: a rule for other states never matches it.
  if (states !== undefined && !states.split(',').includes('NEW')) return 'never';
  return {
    text,
    protocol: match[1]?.toLowerCase(),
    set: match[3],
    dirs: match[4],
    target: match[6] as FilterRule['target'],
  };
}

function inSet(filter: AccessFilter, rule: FilterRule, address: string, port: number, protocol: string): boolean {
  const set = filter.members.get(rule.set);
  if (!set) return false;
  if (rule.dirs === 'dst,dst') return set.entries.has(`${address},${protocol}:${port}`);
  if (set.type.startsWith('bitmap:port')) return set.entries.has(String(port));
  if (set.type === 'hash:ip') return set.entries.has(address);
  return false;
}

export interface AccessFilterVerdict {
  /** The rule that ended the packet's walk through the chain; undefined when it reached the end. */
  rule?: string;
  /** REJECT or DROP: the node refuses the connection before any host socket sees it. */
  refused: boolean;
}

/**
 * accessFilterVerdict: what the node's KUBE-IPVS-FILTER does to a new connection to address:port
 * (an address of the node). undefined when filter INPUT does not jump to the chain (kube-proxy
 * before kubernetes#108460, or a dump without its filter table): nothing is filtered there.
 */
export function accessFilterVerdict(state: IpvsState, address: string, port: number, protocol: Protocol): AccessFilterVerdict | undefined {
  const filter = accessFilter(state);
  if (!filter) return undefined;
  const proto = protocol.toLowerCase();
  for (const rule of filter.rules) {
    if (rule.protocol !== undefined && rule.protocol !== proto) continue;
    if (!inSet(filter, rule, address, port, proto)) continue;
    return {rule: rule.text, refused: rule.target === 'REJECT' || rule.target === 'DROP'};
  }
  return {refused: false};
}
