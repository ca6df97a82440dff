import {Args, Flags} from '@oclif/core';
import type {ProxyMode, SyncResult} from '../../protocol/methods.ts';
import {AgentCommand, concurrencyFlag, connectionFlags} from '../lib/agent-command.ts';
import {formatData, formatDuration, formatTable, outputFlag, palette, useColor, type Palette} from '../lib/output.ts';
import {examples, helpText} from '../lib/help-text.ts';

/** NodeSync: one agent's sync, with the node and the mode its rule counts are in. */
type NodeSync = {node: string; mode: ProxyMode} & SyncResult;

export default class Sync extends AgentCommand {
  static override summary = 'Make an agent sync its rules now and wait for the result.';
  static override description = helpText`
    Asks the agent on NODE (or every agent) to write its rules now, waits for that sync to finish, and
    prints how long it took, how many rules the kernel holds afterwards, and the drift: before syncing, the
    agent compares the rules in the kernel with the ones it means to have; if any service's rules differ
    ("kubectl proxyctl diff" shows how), the sync is full and rewrites them, and DRIFT names the services it
    repaired ("none found" otherwise). --full rewrites every chain regardless.
  `;

  static override examples = examples`
    # Sync node-1
    kubectl proxyctl sync node-1

    # Rewrite every rule on every node
    kubectl proxyctl sync --all-nodes --full
  `;

  static override args = {node: Args.string({description: 'The node to sync.'})};

  static override flags = {
    ...connectionFlags,
    'all-nodes': Flags.boolean({summary: 'Sync every agent.', default: false}),
    full: Flags.boolean({summary: 'Rewrite every chain rather than only those of changed services.', default: false}),
    output: outputFlag(['text', 'json', 'yaml']),
    concurrency: concurrencyFlag('Agents synced at once with --all-nodes.'),
  };

  async run(): Promise<void> {
    const {args, flags} = await this.parse(Sync);
    const locator = this.locator(flags);
    const nodes = await locator.chooseNodes(args.node, flags['all-nodes']);
    const {answered: synced, failed} = await this.askAgents(
      locator,
      nodes,
      {concurrency: flags.concurrency, progress: 'agents synced'},
      async (client, node): Promise<NodeSync> => {
        // The mode says what the rule counts are: nftables keeps every rule in one table.
        const status = await client.call('status', {});
        return {node: node ?? status.node, mode: status.mode, ...(await client.call('sync', flags.full ? {full: true} : {}))};
      },
    );
    if (flags.output === 'json' || flags.output === 'yaml') {
      process.stdout.write(
        formatData(flags['all-nodes'] ? {nodes: synced, errors: failed} : (synced[0] ?? {errors: failed}), flags.output),
      );
    } else if (synced.length > 0) {
      const c = palette(useColor(flags.output));
      const rows = synced.map((result) => [
        result.node,
        result.mode,
        result.kind,
        formatDuration(result.durationMs),
        ruleCounts(result),
        driftText(result, c),
      ]);
      process.stdout.write(formatTable(['NODE', 'MODE', 'SYNC', 'DURATION', 'RULES', 'DRIFT'], rows));
    }
  }
}

/** What the drift check before the sync found; a sync that follows drift is full and rewrites those services. */
function driftText(result: SyncResult, c: Palette): string {
  const drift = result.driftBefore;
  if (!drift) return '-';
  if (drift.checkedAt === null) return c.yellow("not checked (the kernel's rules could not be read)");
  if (drift.services.length === 0) return 'none found';
  const shown = drift.services
    .slice(0, 3)
    .map((service) => service || '(rules of no service)')
    .join(', ');
  return c.yellow(
    `repaired ${drift.services.length} service${drift.services.length === 1 ? '' : 's'}: ${shown}${drift.services.length > 3 ? ', ...' : ''}`,
  );
}

/** The rules the kernel holds after the sync, in the terms of the agent's mode. */
function ruleCounts(result: NodeSync): string {
  if (result.mode === 'nftables') return `${result.rules.nat + result.rules.filter} in table kube-proxy`;
  // iptables mode, and ipvs mode's iptables layer.
  return `${result.rules.nat} nat, ${result.rules.filter} filter`;
}
