import {Args} from '@oclif/core';
import type {StatusResult} from '../../protocol/methods.ts';
import {AgentCommand, concurrencyFlag, connectionFlags} from '../lib/agent-command.ts';
import {formatAge, formatData, formatDuration, formatTable, outputFlag, palette, useColor} from '../lib/output.ts';

export default class Status extends AgentCommand {
  static override summary = 'Show the proxyctl agents: mode, readiness, version, last sync, services, drift.';
  static override description =
    `Asks every agent (or the one on NODE) how it is doing. DRIFT counts the services whose rules in the kernel differ from what the agent means to have (see "kubectl proxyctl diff"). Agents that do not answer are named on stderr; the others are still shown, and the exit code is 2.`;

  static override examples = [
    {description: 'Every agent in the cluster', command: '<%= config.bin %> status'},
    {description: 'One node, as JSON', command: '<%= config.bin %> status node-1 -o json'},
    {
      description: "On a node, its agent straight at its default address (a lab's agents: see the api ports in lab status)",
      command: '<%= config.bin %> status --agent-url ws://127.0.0.1:10260/',
    },
  ];

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
      process.stdout.write(statusTable(answered, flags.output === 'wide', useColor(flags.output)));
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
      agent.mode,
      agent.ready ? c.green('true') : c.red('false'),
      agent.version,
      last ? `${formatAge(now - Date.parse(last.at))} ago${last.ok ? '' : ` ${c.red('(failed)')}`}` : '-',
      last ? `${formatDuration(last.durationMs)} ${last.kind}` : '-',
      String(agent.services),
      String(agent.endpoints),
      agent.drift.checkedAt === null ? '?' : agent.drift.services.length > 0 ? c.yellow(String(agent.drift.services.length)) : '0',
      agent.syncFailures > 0 ? c.yellow(String(agent.syncFailures)) : '0',
    ];
    if (wide)
      row.push(agent.drift.services.join(',') || '-', agent.rulesReadAt ? `${formatAge(now - Date.parse(agent.rulesReadAt))} ago` : '-');
    return row;
  });
  return formatTable(head, rows);
}
