import {Args, Flags} from '@oclif/core';
import {readFileSync} from 'node:fs';
import {
  behaviourSide,
  diffBehaviour,
  DumpFormatError,
  packetClasses,
  readRulesDump,
  renderedSide,
  type BehaviourDiff,
  type ModeRules,
  type PacketClass,
  type ProxyMode,
} from '../../core/behaviour/index.ts';
import type {ProxyModel} from '../../core/model/index.ts';
import type {BehaviourAnswer} from '../../protocol/methods.ts';
import {AgentCommand, concurrencyFlag, connectionFlags} from '../lib/agent-command.ts';
import {nodeReport, printReports, switchWords, type NodeBehaviourReport} from '../lib/behaviour-report.ts';
import {InputError, readOfflineModel} from '../lib/model-input.ts';
import {modelFlags, objectsFileFlag, offlineSettings} from '../lib/model-flags.ts';
import {inHelpGroup} from '../lib/help-group.ts';
import {outputFlag} from '../lib/output.ts';
import {progressBar} from '../lib/progress-bar.ts';
import {errorLine, exitCodes, PluginError} from '../lib/plugin-error.ts';
import {helpText} from '../lib/help-text.ts';

const modes = ['nftables', 'iptables', 'ipvs'] as const;

export default class MigrateCheck extends AgentCommand {
  static override summary = 'Say what would behave differently if a node switched proxy mode, before switching it.';
  static override description = helpText`
    Compares the rules a node holds today (proxyctl's, or kube-proxy's read through observe mode) with the
    rules the --to mode would write for the same node, objects and settings, by what they do rather than by
    their text: every service port's ClusterIP, NodePort on every node address and on 127.0.0.1,
    externalIPs, load-balancer IPs and health check port, an undefined port of each ClusterIP and an unused
    service-CIDR address, each from a pod on the node, a pod on another node, the node itself and outside
    clients (inside and outside loadBalancerSourceRanges), traced through both rulesets.

    Prints, per node, each behaviour that would change in a plain sentence, the evidence the node has
    (counters of localhost NodePorts and INVALID drops, host sockets that answer on service addresses only
    because ipvs binds them to kube-ipvs0, ARP settings against load-balancer IPs), and a verdict line. Exit
    code 0: nothing would change; 1: something would; 2: bad input or an error (an unknown dump format, a
    mode the node's kernel cannot run, objects that do not match the dump). Nothing on the node is changed.

    Offline: --rules DUMP (iptables-save output, nft -j list table JSON, or an nft -f script) with -f
    OBJECTS (the Services, EndpointSlices and Node the dump was written for) and render's node settings
    flags.
  `;

  static override examples = [
    {description: 'Would node-1 behave the same in nftables mode?', command: '<%= config.bin %> migrate-check --to nftables node-1'},
    {description: 'Every node, worst first', command: '<%= config.bin %> migrate-check --to nftables --all-nodes'},
    {
      description: 'Offline, over a saved iptables-save dump and the objects it was written for',
      command: '<%= config.bin %> migrate-check --to nftables --rules node-1.iptables-save -f cluster.yaml --cluster-cidr 10.244.0.0/16',
    },
    {
      description: 'One service only, as JSON',
      command: '<%= config.bin %> migrate-check --to nftables node-1 --service default/web -o json',
    },
  ];

  static override args = {node: Args.string({description: 'The node to check (live).'})};

  static override flags = {
    ...connectionFlags,
    to: Flags.option({summary: 'The proxy mode to switch to.', options: modes, required: true})(),
    'all-nodes': Flags.boolean({summary: 'Check every node that runs an agent; print one table, worst first.', default: false}),
    service: Flags.string({summary: 'Only this service: NAMESPACE/NAME (or NAMESPACE/NAME:PORT).'}),
    output: outputFlag(['text', 'json', 'yaml']),
    concurrency: concurrencyFlag('Agents asked at once with --all-nodes.'),
    rules: Flags.string({summary: 'Offline: the saved rules of the node ("-": stdin).', helpGroup: 'OFFLINE'}),
    filename: objectsFileFlag.optional,
    // Shown with the other offline flags: here they describe the node a dump was saved on.
    ...inHelpGroup('OFFLINE', modelFlags),
  };

  async run(): Promise<void> {
    const {args, flags} = await this.parse(MigrateCheck);
    if (flags.service !== undefined && !/^[^/\s]+\/[^/\s:]+(:[^\s]+)?$/.test(flags.service))
      throw new PluginError(`--service ${flags.service}: give NAMESPACE/NAME or NAMESPACE/NAME:PORT`);
    let reports: NodeBehaviourReport[];
    let failed: unknown[] = [];
    if (flags.rules !== undefined) {
      if (args.node || flags['all-nodes'])
        throw new PluginError('--rules checks a saved dump without a cluster: leave out NODE and --all-nodes');
      if (!flags.filename?.length)
        throw new PluginError('--rules needs -f OBJECTS: the Services, EndpointSlices and Node the dump was written for');
      reports = [await this.offline(flags as OfflineFlags)];
    } else {
      if (flags.filename?.length) throw new PluginError('-f is for offline checks: add --rules DUMP, or name a NODE');
      const locator = this.locator(flags);
      const nodes = await locator.chooseNodes(args.node, flags['all-nodes']);
      const progress = flags['all-nodes'] ? 'nodes checked' : undefined;
      const asked = await this.askAgents(locator, nodes, {concurrency: flags.concurrency, progress}, (client) =>
        client.call('behaviour', {to: flags.to, ...(flags.service ? {service: flags.service} : {})}),
      );
      failed = asked.failed;
      reports = asked.answered.map((answer: BehaviourAnswer) =>
        nodeReport(answer.node, answer.diff, answer.evidence, switchWords, `after the switch to ${flags.to} mode`),
      );
    }
    printReports(reports, failed, flags.output, flags['all-nodes']);
    if (failed.length === 0 && reports.some((report) => !report.equal)) process.exitCode = exitCodes.differs;
  }

  private async offline(flags: OfflineFlags): Promise<NodeBehaviourReport> {
    const file = flags.rules;
    let text: string;
    try {
      text = readFileSync(file === '-' ? 0 : file, 'utf8');
    } catch (error) {
      throw new PluginError(`--rules ${file}: cannot read it: ${errorLine(error)}`);
    }
    let today: ModeRules;
    try {
      today = readRulesDump(text, `--rules ${file}`);
    } catch (error) {
      if (error instanceof DumpFormatError) throw new PluginError(error.message);
      throw new PluginError(`--rules ${file}: cannot be read: ${errorLine(error)}`);
    }
    let offline;
    try {
      offline = await readOfflineModel(flags.filename, offlineSettings(flags));
    } catch (error) {
      if (error instanceof InputError) throw new PluginError(error.message);
      throw error;
    }
    for (const problem of offline.problems) process.stderr.write(`skipped: ${problem}\n`);
    const {model, serviceCIDRs} = offline;
    const recorded = today.mode === 'iptables' ? (today.rules.nodeAddresses ?? []) : [];
    const nodeAddresses = [...new Set([...model.nodeIPs, ...recorded])];
    const before = behaviourSide(today, nodeAddresses);
    const classes = packetClasses(model, {nodeAddresses, serviceCIDRs, ...(flags.service ? {service: flags.service} : {})});
    checkObjectsMatch(model, today.mode, before, classes, {nodeAddresses, serviceCIDRs}, file);
    const after = renderedSide(model, flags.to, {nodeAddresses, serviceCIDRs});
    const bar = progressBar('packet classes compared');
    const diff = diffBehaviour(classes, before, after, {onProgress: (done, total) => bar.update(done, total)});
    bar.end();
    return nodeReport(
      model.nodeName || '(offline)',
      diff,
      offlineEvidence(today.mode, diff),
      switchWords,
      `after the switch to ${flags.to} mode`,
    );
  }
}

type OfflineFlags = Parameters<typeof offlineSettings>[0] & {rules: string; filename: string[]; to: ProxyMode; service?: string};

/**
 * Objects that do not match the dump would make every difference look like a mode difference: the
 * objects rendered in the dump's own mode must send every ClusterIP where the dump does.
 */
function checkObjectsMatch(
  model: ProxyModel,
  mode: ProxyMode,
  dump: ReturnType<typeof behaviourSide>,
  classes: PacketClass[],
  options: {nodeAddresses: string[]; serviceCIDRs: string[]},
  file: string,
): void {
  const clusterIPs = classes.filter((entry) => entry.entry === 'cluster-ip' && entry.source === 'pod-here');
  const own = renderedSide(model, mode, options);
  const mismatched = diffBehaviour(clusterIPs, dump, own).groups.map((group) => group.servicePort);
  if (mismatched.length === 0) return;
  const named = mismatched.slice(0, 5).join(', ') + (mismatched.length > 5 ? ` and ${mismatched.length - 5} more` : '');
  throw new PluginError(
    `the objects do not match --rules ${file}: ${mismatched.length} of ${clusterIPs.length} ClusterIPs of service ports (${named}) go elsewhere in the ` +
      `dump than the objects say (other endpoints, or the service is missing on one side); give the objects the dump was written for`,
  );
}

/** What the node itself would show, said for a dump: where to look before switching. */
function offlineEvidence(mode: ProxyMode, diff: BehaviourDiff): string[] {
  const entries = new Set(diff.groups.flatMap((group) => group.changes.map((change) => change.class.entry)));
  const evidence: string[] = [];
  if (mode === 'iptables' && entries.has('node-port-loopback'))
    evidence.push(
      "on the node, kube-proxy's kubeproxy_iptables_localhost_nodeports_accepted_packets_total (or `nfacct get localhost_nps_accepted_pkts`) counts " +
        'connections to NodePorts on 127.0.0.1: above 0, something uses them',
    );
  if (mode === 'iptables' && entries.has('conntrack-invalid'))
    evidence.push(
      'on the node, kubeproxy_iptables_ct_state_invalid_dropped_packets_total (or `nfacct get ct_state_invalid_dropped_pkts`) counts the INVALID ' +
        'packets dropped today: above 0, connections may see resets after the switch unless nf_conntrack_tcp_be_liberal is set',
    );
  return evidence;
}
