import {Args} from '@oclif/core';
import type {StatusResult} from '../../protocol/methods.ts';
import {AgentCommand, concurrencyFlag, connectionFlags} from '../lib/agent-command.ts';
import {formatAge, formatData, formatDuration, formatTable, outputFlag, palette, useColor} from '../lib/output.ts';
import {examples, helpText} from '../lib/help-text.ts';

export default class Status extends AgentCommand {
  static override summary = 'Show the proxyctl agents: mode, readiness, version, last sync, services, drift.';
  static override description = helpText`
    Asks every agent (or the one on NODE) how it is doing. DRIFT counts the services whose rules in the
    kernel differ from what the agent means to have (see "kubectl proxyctl diff"). Agents that do not answer
    are named on stderr; the others are still shown, and the exit code is 2.

    An observing agent (proxyctl-agent --observe, beside kube-proxy) shows its MODE as "observe: kube-proxy
    MODE", and DRIFT says how long the node has differed from what kube-proxy should have programmed ("2 for
    4m"). Below the table: what it found when that is not one clear mode (no kube-proxy rules at all, or
    several modes' rules), what it could not read, and, for one node or with -o wide, kube-proxy's settings
    it renders with and where each came from.
  `;

  static override examples = examples`
    # Every agent in the cluster
    kubectl proxyctl status

    # One node, as JSON
    kubectl proxyctl status node-1 -o json

    # An observing agent beside kube-proxy, at its default address
    kubectl proxyctl status --agent-url ws://127.0.0.1:10270/

    # On a node, its agent straight at its default address (a lab's agents: see the api ports in lab status)
    kubectl proxyctl status --agent-url ws://127.0.0.1:10260/
  `;

  static override args = {node: Args.string({description: 'Only the agent on this node.'})};

  static override flags = {
    ...connectionFlags,
    output: outputFlag(['text', 'wide', 'json', 'yaml']),
    concurrency: concurrencyFlag('Agents asked at once.'),
  };

  async run(): Promise<void> {
    const {args, flags} = await this.parse(Status);
    const locator = this.locator(flags);
    const nodes = args.node === undefined && !locator.direct ? await locator.nodes() : [args.node];
    const {answered, failed} = await this.askAgents(
      locator,
      nodes,
      {concurrency: flags.concurrency, progress: 'agents answered'},
      (client) => client.call('status', {}),
    );
    if (flags.output === 'json' || flags.output === 'yaml') {
      process.stdout.write(formatData({agents: answered, errors: failed}, flags.output));
    } else if (answered.length > 0) {
      const wide = flags.output === 'wide';
      process.stdout.write(statusTable(answered, wide, useColor(flags.output)));
      process.stdout.write(observeNotes(answered, wide || nodes.length === 1));
    }
  }
}

function statusTable(agents: StatusResult[], wide: boolean, color: boolean): string {
  const c = palette(color);
  const now = Date.now();
  const head = ['NODE', 'MODE', 'READY', 'VERSION', 'LAST SYNC', 'DURATION', 'SERVICES', 'ENDPOINTS', 'DRIFT', 'SYNC FAILURES'];
  if (wide) head.push('DRIFTED SERVICES', 'RULES READ');
  const rows = agents.map((agent) => {
    const last = agent.lastSync;
    const row = [
      agent.node,
      agent.observe ? `observe: ${agent.observe.observing}` : agent.mode,
      agent.ready ? c.green('true') : c.red('false'),
      agent.version,
      last ? `${formatAge(now - Date.parse(last.at))} ago${last.ok ? '' : ` ${c.red('(failed)')}`}` : '-',
      last ? `${formatDuration(last.durationMs)} ${last.kind}` : '-',
      String(agent.services),
      String(agent.endpoints),
      driftCell(agent, now, c),
      agent.syncFailures > 0 ? c.yellow(String(agent.syncFailures)) : '0',
    ];
    if (wide)
      row.push(agent.drift.services.join(',') || '-', agent.rulesReadAt ? `${formatAge(now - Date.parse(agent.rulesReadAt))} ago` : '-');
    return row;
  });
  return formatTable(head, rows);
}

/** DRIFT: drifted service ports at the last check, and for an observer how long the node has differed. */
function driftCell(agent: StatusResult, now: number, c: ReturnType<typeof palette>): string {
  if (agent.drift.checkedAt === null) return '?';
  if (agent.drift.services.length === 0) return '0';
  const since = agent.observe?.driftSince;
  return c.yellow(`${agent.drift.services.length}${since ? ` for ${formatAge(now - Date.parse(since))}` : ''}`);
}

/**
 * observeNotes: for each observing agent, its finding when it is not one clear mode and what it
 * could not read; with `settings`, kube-proxy's settings it renders with and their sources.
 */
function observeNotes(agents: StatusResult[], settings: boolean): string {
  const lines: string[] = [];
  for (const agent of agents) {
    const observe = agent.observe;
    if (!observe) continue;
    if (observe.finding === 'none found' || observe.finding === 'several found') lines.push(`${agent.node}: ${observe.summary}`);
    for (const problem of observe.problems) lines.push(`${agent.node}: ${problem}`);
    if (!settings) continue;
    lines.push(`${agent.node}: ${observe.summary}; kube-proxy's settings:`);
    for (const setting of observe.settings) lines.push(`  ${setting.name}: ${setting.value || '(none)'}  (${setting.source})`);
  }
  return lines.length > 0 ? `\n${lines.join('\n')}\n` : '';
}
