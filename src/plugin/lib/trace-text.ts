// Renders a TraceResult for people: the path hop by hop, the endpoints with their odds, the
// masquerade decision and the warnings that matter.
import Table from 'cli-table3';
import type {TraceHop, TraceResult} from '../../core/trace/types.ts';
import type {Palette} from './output.ts';

/** EndpointInfo names the pod and node behind an endpoint, when the caller knows them. */
export interface EndpointInfo {
  pod?: string;
  node?: string;
  ready?: boolean;
  terminating?: boolean;
}

export interface TraceTextOptions {
  palette: Palette;
  /** Show the full rule text under each hop (-o wide). */
  wide: boolean;
  /** "ip:port" -> pod/node, to label endpoints. */
  endpointInfo?: Map<string, EndpointInfo>;
}

const verdictSentence: Record<TraceResult['verdict'], string> = {
  DNAT: 'the connection is forwarded (DNAT) to one of the endpoints below',
  REJECT: 'the connection is refused at once (REJECT)',
  DROP: 'the packet is dropped silently (DROP): the client will time out',
  ACCEPT: 'no proxy rule changes the packet; it goes on to its original destination',
};

function packetText(result: TraceResult): string {
  const p = result.packet;
  const from = p.origin === 'local' ? `${p.srcIP} (sent by the node itself)` : p.srcIP;
  return `${from} -> ${p.dstIP}:${p.dstPort}/${p.protocol.toLowerCase()}`;
}

function hopLines(hops: TraceHop[], options: TraceTextOptions, indent: string): string[] {
  const {palette: c} = options;
  const lines: string[] = [];
  for (const hop of hops) {
    lines.push(`${indent}${c.dim(`${hop.hook.padEnd(11)} ${hop.table.padEnd(6)}`)} ${c.bold(hop.chain)} -> ${c.cyan(hop.target)}`);
    lines.push(`${indent}  ${hop.explanation}`);
    if (options.wide && hop.rule) lines.push(`${indent}  ${c.dim(hop.rule)}`);
  }
  return lines;
}

/** formatTraceText is what `kubectl proxyctl trace` prints in text mode. */
export function formatTraceText(result: TraceResult, options: TraceTextOptions): string {
  const c = options.palette;
  const lines: string[] = [];
  lines.push(`${c.bold('Packet')}   ${packetText(result)}`);
  if (result.servicePort) lines.push(`${c.bold('Service')}  ${result.servicePort}`);
  const verdictColor = result.verdict === 'DNAT' ? c.green : result.verdict === 'ACCEPT' ? c.cyan : c.red;
  lines.push(`${c.bold('Verdict')}  ${verdictColor(result.verdict)}: ${verdictSentence[result.verdict]}`);
  lines.push('');
  lines.push(c.bold('Path'));
  lines.push(...hopLines(result.hops, options, '  '));

  if (result.branches.length > 0) {
    lines.push('');
    lines.push(c.bold('Endpoints'));
    const table = new Table({
      head: ['ENDPOINT', 'PROBABILITY', 'POD', 'NODE', 'MASQUERADE'],
      style: {head: [], border: [], compact: true},
      chars: {top: '', 'top-mid': '', 'top-left': '', 'top-right': '', bottom: '', 'bottom-mid': '', 'bottom-left': '', 'bottom-right': '', left: '  ', 'left-mid': '', mid: '', 'mid-mid': '', right: '', 'right-mid': '', middle: '  '},
    });
    for (const branch of result.branches) {
      const info = options.endpointInfo?.get(branch.endpoint);
      table.push([
        branch.endpoint,
        `${(branch.probability * 100).toFixed(1)}%`,
        info?.pod ?? '-',
        info?.node ?? '-',
        branch.masquerade ? 'yes' : 'no',
      ]);
    }
    lines.push(table.toString());
    for (const branch of result.branches) {
      lines.push('');
      lines.push(`  ${c.bold(`via ${branch.endpoint}`)} (${(branch.probability * 100).toFixed(1)}%)`);
      lines.push(...hopLines(branch.hops, options, '    '));
      lines.push(`    masquerade: ${branch.masquerade ? 'yes' : 'no'} - ${branch.masqueradeReason}`);
    }
  }

  if (result.warnings.length > 0) {
    lines.push('');
    lines.push(c.bold('Warnings'));
    for (const warning of result.warnings) lines.push(`  ${c.yellow('!')} ${warning}`);
  }
  return lines.join('\n') + '\n';
}
