// Puts what `--probe` saw next to what the trace predicted: per endpoint, the predicted share and
// the connections it answered; refusals and timeouts with the verdict that explains them.
import type {ProbeResult, TraceAnswer} from '../../protocol/methods.ts';
import {formatTable, type Palette} from './output.ts';
import type {EndpointInfo} from './trace-text.ts';

/** The address part of an endpoint "ip:port" / "[ip]:port". */
export function endpointIP(endpoint: string): string {
  const bracketed = /^\[([^\]]+)\]:\d+$/.exec(endpoint);
  if (bracketed) return bracketed[1];
  const plain = /^([^:]+):\d+$/.exec(endpoint);
  return plain ? plain[1] : endpoint;
}

export interface ProbeRow {
  endpoint: string;
  pod?: string;
  predicted: number;
  answered: number;
}

/** compareProbe joins the trace's branches and the probe's answers by endpoint address. */
export function compareProbe(trace: TraceAnswer, probe: ProbeResult, endpointInfo?: Map<string, EndpointInfo>): ProbeRow[] {
  const rows = new Map<string, ProbeRow>();
  for (const branch of trace.branches) {
    rows.set(endpointIP(branch.endpoint), {
      endpoint: branch.endpoint,
      pod: endpointInfo?.get(branch.endpoint)?.pod,
      predicted: branch.probability,
      answered: 0,
    });
  }
  for (const answer of probe.answers as (ProbeResult['answers'][number] & {pod?: string})[]) {
    const row = rows.get(answer.endpoint) ?? {endpoint: answer.endpoint, pod: answer.pod, predicted: 0, answered: 0};
    row.answered += answer.count;
    row.pod ??= answer.pod;
    rows.set(answer.endpoint, row);
  }
  return [...rows.values()];
}

const expectedFailure: Record<TraceAnswer['verdict'], string | undefined> = {
  REJECT: 'the rules REJECT these connections, so each should be refused',
  DROP: 'the rules DROP these packets, so each should time out',
  DNAT: undefined,
  ACCEPT: undefined,
};

export function formatProbeText(
  trace: TraceAnswer,
  probe: ProbeResult,
  count: number,
  from: string,
  c: Palette,
  endpointInfo?: Map<string, EndpointInfo>,
): string {
  const lines = ['', `${c.bold('Probe')}       ${count} connection${count === 1 ? '' : 's'} from ${from}`];
  const rows = compareProbe(trace, probe, endpointInfo);
  if (rows.length > 0) {
    const table = formatTable(
      ['ENDPOINT', 'POD', 'PREDICTED', 'ANSWERED'],
      rows.map((row) => [
        row.endpoint,
        row.pod ?? '-',
        row.predicted > 0 ? `${(row.predicted * 100).toFixed(1)}%` : c.yellow('not predicted'),
        `${row.answered} (${((row.answered / count) * 100).toFixed(0)}%)`,
      ]),
    );
    lines.push(
      ...table
        .trimEnd()
        .split('\n')
        .map((line) => `  ${line}`),
    );
  }
  for (const failure of probe.failures) lines.push(`  ${failure.reason}: ${failure.count}`);
  const expected = expectedFailure[trace.verdict];
  if (expected) lines.push(`  ${expected}.`);
  const unexpected = rows.filter((row) => row.predicted === 0 && row.answered > 0);
  if (unexpected.length > 0)
    lines.push(`  ${c.yellow('!')} answered by endpoints the rules do not lead to: ${unexpected.map((row) => row.endpoint).join(', ')}`);
  return lines.join('\n') + '\n';
}
