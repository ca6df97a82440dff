// Renders a TraceResult for people. The tracer answers one path per endpoint, and those paths are
// nearly always the same but for the endpoint's own chain; so the path is printed once, a hop a
// line, the endpoints as a table, and only where an endpoint's path differs, those hops. The
// sentences and rule texts come with -o wide; -o json/yaml carry everything.
import type {TraceBranch, TraceHop, TraceResult} from '../../core/trace/types.ts';
import {formatTable, type Palette} from './output.ts';

/** EndpointInfo names the pod and node behind an endpoint, when the caller knows them. */
export interface EndpointInfo {
  pod?: string;
  node?: string;
  ready?: boolean;
  terminating?: boolean;
}

export interface TraceTextOptions {
  palette: Palette;
  /** The sentence and the rule text under each hop, the endpoint chains, each endpoint's masquerade reason (-o wide). */
  wide: boolean;
  /** "ip:port" -> pod/node, to label endpoints. */
  endpointInfo?: Map<string, EndpointInfo>;
  /** Columns to fit the endpoints of a large service into (default 80). */
  width?: number;
}

/** Up to this many endpoints get a row each with pod and node; more are laid out side by side. */
export const endpointRowsLimit = 20;

const verdictSentence: Record<TraceResult['verdict'], string> = {
  DNAT: 'the connection is forwarded (DNAT) to one of the endpoints below',
  REJECT: 'the connection is refused at once (REJECT)',
  DROP: 'the packet is dropped silently (DROP): the client will time out',
  ACCEPT: 'no proxy rule changes the packet; it goes on to its original destination',
};

/** A set of endpoints whose packets take the same path, but for each endpoint's own chain. */
export interface PathGroup {
  /** One string per hop, the endpoint's own chain written as "*". */
  key: string[];
  branches: TraceBranch[];
}

/**
 * The chain that belongs to one endpoint alone (iptables' KUBE-SEP-...): the first hop of a branch
 * jumps to it and later hops run in it. nftables picks the endpoint from a map: no such chain.
 */
function endpointChain(branch: TraceBranch): string | undefined {
  const first = branch.hops[0];
  if (!first) return undefined;
  return branch.hops.some((hop) => hop.chain === first.target) ? first.target : undefined;
}

function hopKey(hop: TraceHop, ownChain: string | undefined): string {
  const name = (chain: string) => (chain === ownChain ? '*' : chain);
  return `${hop.hook} ${hop.table} ${name(hop.chain)} -> ${name(hop.target)}`;
}

/** groupBranches puts endpoints with the same path together, the largest group first. */
export function groupBranches(branches: TraceBranch[]): PathGroup[] {
  const groups = new Map<string, PathGroup>();
  for (const branch of branches) {
    const chain = endpointChain(branch);
    const key = branch.hops.map((hop) => hopKey(hop, chain));
    const id = key.join('\n');
    const group = groups.get(id) ?? {key, branches: []};
    group.branches.push(branch);
    groups.set(id, group);
  }
  return [...groups.values()].sort((a, b) => b.branches.length - a.branches.length);
}

function packetText(result: TraceResult): string {
  const p = result.packet;
  const from = p.origin === 'local' ? `${p.srcIP} (sent by the node itself)` : p.srcIP;
  return `${from} -> ${p.dstIP}:${p.dstPort}/${p.protocol.toLowerCase()}`;
}

const percent = (probability: number) => `${(probability * 100).toFixed(1)}%`;

/** "KUBE-SEP-*": what the endpoints' own chains have in common, for the path shown once. */
function chainPattern(branches: TraceBranch[]): string {
  const chains = branches.map(endpointChain).filter((chain): chain is string => chain !== undefined);
  if (chains.length === 0) return '*';
  if (chains.length === 1) return chains[0];
  let prefix = chains[0];
  for (const chain of chains) while (!chain.startsWith(prefix)) prefix = prefix.slice(0, -1);
  return `${prefix}*`;
}

const explainedKey = (hop: TraceHop) => `${hop.explanation}\n${hop.rule}`;

class HopPrinter {
  readonly #c: Palette;
  readonly #wide: boolean;
  readonly #tableWidth: number;
  /** Sentences and rule texts already printed: -o wide shows each once. */
  readonly explained = new Set<string>();

  constructor(result: TraceResult, options: TraceTextOptions) {
    this.#c = options.palette;
    this.#wide = options.wide;
    const tables = [...result.hops, ...result.branches.flatMap((branch) => branch.hops)].map((hop) => hop.table.length);
    this.#tableWidth = Math.max(6, ...tables);
  }

  /** One line per hop (marked "+" or "-" in a difference); with -o wide, its sentence and rule text under it. */
  lines(hops: TraceHop[], indent: string, how: {rename?: (chain: string) => string; explain?: boolean; mark?: string} = {}): string[] {
    const c = this.#c;
    const rename = how.rename ?? ((chain: string) => chain);
    const lines: string[] = [];
    for (const hop of hops) {
      const lead = how.mark ? `${indent.slice(0, -2)}${how.mark} ` : indent;
      lines.push(
        `${lead}${c.dim(`${hop.hook.padEnd(11)} ${hop.table.padEnd(this.#tableWidth)}`)} ${c.bold(rename(hop.chain))} -> ${c.cyan(rename(hop.target))}`,
      );
      if (how.explain ?? this.#wide) {
        this.explained.add(explainedKey(hop));
        lines.push(`${indent}    ${hop.explanation}`);
        if (hop.rule) lines.push(`${indent}    ${c.dim(hop.rule)}`);
      }
    }
    return lines;
  }
}

/** formatTraceText is what `kubectl proxyctl trace` prints in text and wide mode. */
export function formatTraceText(result: TraceResult, options: TraceTextOptions): string {
  const c = options.palette;
  const printer = new HopPrinter(result, options);
  const groups = groupBranches(result.branches);
  const main = groups[0];
  const lines: string[] = [];
  lines.push(`${c.bold('Packet')}      ${packetText(result)}`);
  if (result.servicePort) lines.push(`${c.bold('Service')}     ${result.servicePort}`);
  const verdictColor = result.verdict === 'DNAT' ? c.green : result.verdict === 'ACCEPT' ? c.cyan : c.red;
  lines.push(`${c.bold('Verdict')}     ${verdictColor(result.verdict)}: ${verdictSentence[result.verdict]}`);
  const reasons = [...new Set(result.branches.map((branch) => branch.masqueradeReason))];
  if (reasons.length === 1) lines.push(`${c.bold('Masquerade')}  ${result.branches[0].masquerade ? 'yes' : 'no'} - ${reasons[0]}`);

  lines.push('', c.bold('Path'));
  lines.push(...printer.lines(result.hops, '  '));
  if (main) lines.push(...mainGroupLines(main, printer, options));
  if (result.branches.length > 0) {
    lines.push('', c.bold('Endpoints'));
    lines.push(...endpointLines(result.branches, options));
    for (const group of groups.slice(1)) lines.push(...otherPathLines(group, main, printer, options));
    if (options.wide) lines.push(...perEndpointLines(result.branches, printer, options));
  }

  if (result.warnings.length > 0) {
    lines.push('', c.bold('Warnings'));
    for (const warning of result.warnings) lines.push(`  ${c.yellow('!')} ${warning}`);
  }
  return lines.join('\n') + '\n';
}

/**
 * The part of the path after the split, once for the largest group. Some hops' sentences name the
 * endpoint, so under -o wide a hop shows its sentence here only when it reads the same for all of
 * them; the others follow per endpoint (perEndpointLines).
 */
function mainGroupLines(group: PathGroup, printer: HopPrinter, options: TraceTextOptions): string[] {
  const pattern = chainPattern(group.branches);
  const first = group.branches[0];
  const own = endpointChain(first);
  const rename = (chain: string) => (chain === own ? pattern : chain);
  const lines: string[] = [];
  first.hops.forEach((hop, index) => {
    const same = group.branches.every(
      (branch) => branch.hops[index].explanation === hop.explanation && branch.hops[index].rule === hop.rule,
    );
    lines.push(...printer.lines([hop], '  ', {rename, explain: options.wide && same}));
  });
  return lines;
}

/** -o wide, last: per endpoint, the hops whose sentence was not printed above (they name the endpoint), and its masquerade reason. */
function perEndpointLines(branches: TraceBranch[], printer: HopPrinter, options: TraceTextOptions): string[] {
  const lines: string[] = [];
  for (const branch of branches) {
    const hops = branch.hops.filter((hop) => !printer.explained.has(explainedKey(hop)));
    lines.push('', `  ${options.palette.bold(`via ${branch.endpoint}`)} (${percent(branch.probability)})`);
    lines.push(...printer.lines(hops, '    ', {explain: true}));
    lines.push(`    masquerade: ${branch.masquerade ? 'yes' : 'no'} - ${branch.masqueradeReason}`);
  }
  return lines;
}

/** The endpoints as a table (one row each), or side by side when there are too many for one screen. */
function endpointLines(branches: TraceBranch[], options: TraceTextOptions): string[] {
  const info = (branch: TraceBranch) => options.endpointInfo?.get(branch.endpoint);
  if (branches.length <= endpointRowsLimit || options.wide) {
    const head = ['ENDPOINT', 'PROBABILITY', 'POD', 'NODE', 'MASQUERADE'];
    if (options.wide) head.push('CHAIN');
    const rows = branches.map((branch) => {
      const row = [
        branch.endpoint,
        percent(branch.probability),
        info(branch)?.pod ?? '-',
        info(branch)?.node ?? '-',
        branch.masquerade ? 'yes' : 'no',
      ];
      if (options.wide) row.push(endpointChain(branch) ?? '-');
      return row;
    });
    return indent(formatTable(head, rows));
  }
  const sameOdds = branches.every((branch) => Math.abs(branch.probability - branches[0].probability) < 1e-9);
  const sameMasquerade = branches.every((branch) => branch.masquerade === branches[0].masquerade);
  const nodes = new Set(branches.map((branch) => info(branch)?.node).filter(Boolean));
  const cells = branches.map(
    (branch) =>
      `${branch.endpoint}${sameOdds ? '' : ` ${percent(branch.probability)}`}${sameMasquerade || !branch.masquerade ? '' : ' (masquerade)'}`,
  );
  const summary = [`${branches.length} endpoints${nodes.size > 0 ? ` on ${nodes.size} node${nodes.size === 1 ? '' : 's'}` : ''}`];
  if (sameOdds) summary.push(`${percent(branches[0].probability)} each`);
  if (sameMasquerade) summary.push(branches[0].masquerade ? 'all masqueraded' : 'none masqueraded');
  const width = Math.max(...cells.map((cell) => cell.length));
  const columns = Math.max(1, Math.floor(((options.width ?? 80) - 2 + 3) / (width + 3)));
  const lines = [`  ${summary.join(', ')} (-o wide: one row each, with pod and node)`];
  for (let start = 0; start < cells.length; start += columns) {
    lines.push(
      `  ${cells
        .slice(start, start + columns)
        .map((cell, i, row) => (i === row.length - 1 ? cell : cell.padEnd(width)))
        .join('   ')}`,
    );
  }
  return lines;
}

/** Endpoints whose path is not the one shown: only the hops that differ, "+" theirs, "-" the shown path's. */
function otherPathLines(group: PathGroup, main: PathGroup, printer: HopPrinter, options: TraceTextOptions): string[] {
  const c = options.palette;
  const names = group.branches.map((branch) => {
    const pod = options.endpointInfo?.get(branch.endpoint)?.pod;
    return pod ? `${branch.endpoint} (${pod})` : branch.endpoint;
  });
  const lines = ['', `  ${c.bold(names.join(', '))} ${group.branches.length === 1 ? 'takes' : 'take'} another path:`];
  const branch = group.branches[0];
  const renameOwn = (ofGroup: PathGroup, example: TraceBranch) => {
    const own = endpointChain(example);
    const pattern = chainPattern(ofGroup.branches);
    return (chain: string) => (chain === own ? pattern : chain);
  };
  for (const change of diffKeys(main.key, group.key)) {
    if (change.side === '-')
      lines.push(
        ...printer.lines([main.branches[0].hops[change.index]], '      ', {
          rename: renameOwn(main, main.branches[0]),
          explain: false,
          mark: c.red('-'),
        }),
      );
    else lines.push(...printer.lines([branch.hops[change.index]], '      ', {rename: renameOwn(group, branch), mark: c.green('+')}));
  }
  const reasons = new Set(group.branches.map((other) => other.masqueradeReason));
  if (reasons.size === 1) lines.push(`    masquerade: ${branch.masquerade ? 'yes' : 'no'} - ${branch.masqueradeReason}`);
  return lines;
}

/**
 * diffKeys: the hops only in `from` ("-") or only in `to` ("+"), in path order. Paths are a dozen
 * hops that rarely repeat, so each hop of `to` is matched to the next equal hop of `from`.
 */
export function diffKeys(from: string[], to: string[]): {side: '-' | '+'; index: number}[] {
  const changes: {side: '-' | '+'; index: number}[] = [];
  let next = 0;
  to.forEach((key, index) => {
    const match = from.indexOf(key, next);
    if (match === -1) {
      changes.push({side: '+', index});
      return;
    }
    for (let skipped = next; skipped < match; skipped++) changes.push({side: '-', index: skipped});
    next = match + 1;
  });
  for (let rest = next; rest < from.length; rest++) changes.push({side: '-', index: rest});
  return changes;
}

function indent(table: string): string[] {
  return table
    .trimEnd()
    .split('\n')
    .map((line) => `  ${line}`);
}
