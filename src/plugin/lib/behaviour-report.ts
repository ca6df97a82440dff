// A behaviour diff as `migrate-check` and `diff --behaviour` print it: per node, the changes per
// service port in plain sentences, the node's evidence, and a verdict line; --all-nodes as one
// table, worst node first.
import {changeSentence, sentenceGroups, type BehaviourDiff, type SideWords} from '../../core/behaviour/index.ts';
import {formatData, formatTable, palette, useColor, type Palette} from './output.ts';

export interface NodeBehaviourReport {
  node: string;
  /** What is compared: "iptables mode" -> "nftables mode". */
  from: string;
  to: string;
  equal: boolean;
  summary: BehaviourDiff['summary'];
  services: Array<{servicePort: string; sentences: string[]}>;
  /** What the node shows that bears on the changes (counters, sockets, ARP settings). */
  evidence: string[];
  verdict: string;
  /** Every changed class with both outcomes, for -o json|yaml. */
  changes: BehaviourDiff['groups'];
}

export const switchWords: SideWords = {before: 'today', after: 'after the switch'};
export const driftWords: SideWords = {before: 'in the desired rules', after: 'in the applied rules'};

export function nodeReport(node: string, diff: BehaviourDiff, evidence: string[], words: SideWords, action: string): NodeBehaviourReport {
  const services = diff.groups.map((group) => ({
    servicePort: group.servicePort || '(node-wide)',
    sentences: sentenceGroups(group).map((changes) => changeSentence(changes, words)),
  }));
  const {summary} = diff;
  const ports = (count: number) => `${count} service port${count === 1 ? '' : 's'}`;
  const stopped = summary.stopAnswering;
  const verdict = diff.equal
    ? `nothing would change: all ${summary.classes} packet classes of ${ports(summary.servicePorts)} behave the same ${action}`
    : `${summary.changedClasses} of ${summary.classes} packet classes would behave differently ${action}, ` +
      `in ${summary.changedServicePorts} of ${ports(summary.servicePorts)}${
        stopped > 0 ? `; ${stopped} of them answer ${words.before} and would not ${words.after}` : ''
      }`;
  return {node, from: diff.before, to: diff.after, equal: diff.equal, summary, services, evidence, verdict, changes: diff.groups};
}

export function formatReportText(report: NodeBehaviourReport, c: Palette): string {
  const lines = [`${c.bold('Node')}     ${report.node}: ${report.from} -> ${report.to}`];
  for (const service of report.services) {
    lines.push('', c.bold(service.servicePort));
    for (const sentence of service.sentences) lines.push(`  - ${sentence}`);
  }
  if (report.evidence.length > 0) {
    lines.push('', c.bold('Evidence'));
    for (const item of report.evidence) lines.push(`  - ${item}`);
  }
  lines.push('', `${c.bold('Verdict')}  ${report.equal ? c.green(report.verdict) : c.yellow(report.verdict)}`);
  return `${lines.join('\n')}\n`;
}

/** reportTable: one line per node, the nodes with most classes that stop answering first. */
export function reportTable(reports: NodeBehaviourReport[], c: Palette): string {
  const sorted = [...reports].sort(
    (a, b) =>
      b.summary.stopAnswering - a.summary.stopAnswering ||
      b.summary.changedClasses - a.summary.changedClasses ||
      (a.node < b.node ? -1 : 1),
  );
  const rows = sorted.map((report) => [
    report.node,
    `${report.from} -> ${report.to}`,
    report.equal ? c.green('none') : c.yellow(String(report.summary.changedClasses)),
    String(report.summary.stopAnswering),
    report.services.map((service) => service.servicePort).join(',') || '-',
    String(report.evidence.length),
  ]);
  return formatTable(['NODE', 'COMPARED', 'CHANGED CLASSES', 'STOP ANSWERING', 'SERVICES', 'EVIDENCE'], rows);
}

/** printReports: text per node (a table with --all-nodes), or every report as data. */
export function printReports(reports: NodeBehaviourReport[], failed: unknown[], output: 'text' | 'json' | 'yaml', allNodes: boolean): void {
  if (output === 'json' || output === 'yaml') {
    process.stdout.write(formatData(allNodes ? {nodes: reports, errors: failed} : (reports[0] ?? {errors: failed}), output));
    return;
  }
  const c = palette(useColor(output));
  if (allNodes) {
    if (reports.length > 0) process.stdout.write(reportTable(reports, c));
    return;
  }
  process.stdout.write(reports.map((report) => formatReportText(report, c)).join('\n'));
}
