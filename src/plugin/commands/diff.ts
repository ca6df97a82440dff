import {Args, Flags} from '@oclif/core';
import type {DiffResult, StatusResult} from '../../protocol/methods.ts';
import {AgentCommand, concurrencyFlag, connectionFlags, namespaceFlag} from '../lib/agent-command.ts';
import {objectNamespace} from '../lib/kube-config.ts';
import {resolveServiceKey, splitServiceReference} from '../lib/service-target.ts';
import type {AgentLocator} from '../lib/agent-locator.ts';
import {driftWords, nodeReport, printReports} from '../lib/behaviour-report.ts';
import {colorDiff} from '../lib/diff-text.ts';
import {formatAge, formatData, formatTable, outputFlag, palette, useColor} from '../lib/output.ts';
import {exitCodes, PluginError} from '../lib/plugin-error.ts';
import {modelFlags, objectsFileFlag} from '../lib/model-flags.ts';
import {diffSavedRules} from '../lib/offline-diff.ts';
import {renderModes} from '../lib/render-rules.ts';
import {examples, helpText} from '../lib/help-text.ts';

interface NodeDiff {
  node: string;
  status: StatusResult;
  diff: DiffResult;
}

export default class Diff extends AgentCommand {
  static override summary =
    "Compare the rules an agent means to have with the rules in its node's kernel, or saved rules with the objects they were written for.";
  static override description = helpText`
    Prints a unified diff, grouped by service, of the rules the agent on NODE means to have ("--- desired")
    against the rules its kernel holds ("+++ applied"): a "-" line is a rule missing from the kernel, a "+"
    line one that is there but not wanted. Rules someone deleted, changed or slipped in show up here. Exit
    code 0: no difference; 1: they differ; 2 or more: an error, as kubectl diff.

    On an observing agent (proxyctl-agent --observe, beside kube-proxy) the desired rules are what
    kube-proxy should have programmed, and each drifted service port is explained first, e.g.
    "default/web:http: endpoint 10.244.1.7 still programmed, removed from the EndpointSlice 4m ago", "not
    programmed on this node", "rule not written by kube-proxy: ...", "no kube-proxy rules at all on this
    node"; -o json and -o yaml carry the same in each group's explanations.

    With --all-nodes: one line per node (mode, drifted services, last sync, agent version) instead of the
    diffs; the exit code is 1 if any node differs, 2 if any node could not be asked.

    With --behaviour: the desired and applied rules compared by what they do rather than by their text:
    every packet class of every service port (as migrate-check traces them) through both, and each class
    whose fate differs in a plain sentence. Useful when the layouts differ (observe mode over kube-proxy's
    rules, another kube-proxy version), where a text diff shows every rule.

    Without a cluster: --rules FILE -f OBJECTS compares saved rules (kube-proxy's or the agent's) with what
    should have been programmed for the Services and EndpointSlices in OBJECTS on that node, with the node
    settings given as for render (--node-name, --node-ip, --cluster-cidr, --nodeport-addresses,
    --service-cidr, --masquerade-all, --localhost-nodeports, --nfacct-counters, --random-fully, ...). The
    format of each --rules file is found from its text, and the mode from the format (--mode to insist on
    one): iptables-save of either front end; \`nft list ruleset\` as text or JSON; for ipvs mode
    \`ipvsadm-save -n\`, \`ipset save\` and iptables-save, in one file or in several --rules (only the parts
    given are compared). Each service port that differs is named NAMESPACE/NAME:PORT, then the differences
    follow. Counters, rule order where it decides nothing (KUBE-SERVICES' service rules, set elements, chain
    order) are no differences. Exit code 0: the rules match; 1: they differ; 2: bad input (an unreadable
    file names its line; objects that are not valid are named on stderr).
  `;

  static override examples = examples`
    # What differs on node-1
    kubectl proxyctl diff node-1

    # Only one service
    kubectl proxyctl diff node-1 --service demoapp -n default

    # Every node at once
    kubectl proxyctl diff --all-nodes

    # Offline: a node's saved iptables rules against the objects they were written for
    kubectl proxyctl diff --rules node-1.iptables-save -f services.yaml --node-name node-1 --node-ip 10.240.0.11
      --cluster-cidr 10.244.0.0/16

    # Offline, ipvs mode: the node's three dumps
    (ipvsadm-save -n; ipset save; iptables-save) > node-1.ipvs &&
      kubectl proxyctl diff --rules node-1.ipvs -f services.yaml --node-name node-1 --cluster-cidr 10.244.0.0/16 -o yaml

    # What the drift does, not which rules differ
    kubectl proxyctl diff node-1 --behaviour
  `;

  static override args = {node: Args.string({description: 'The node whose rules to compare.'})};

  static override flags = {
    ...namespaceFlag,
    ...connectionFlags,
    'all-nodes': Flags.boolean({summary: 'Ask every agent; print a table.', default: false}),
    service: Flags.string({
      summary: "Only the rules of this service: NAME (in the -n namespace, else the context's) or NAMESPACE/NAME, either with :PORT.",
    }),
    behaviour: Flags.boolean({summary: 'Compare by what the rules do to each class of packet, not by their text.', default: false}),
    output: outputFlag(['text', 'json', 'yaml']),
    concurrency: concurrencyFlag('Agents asked at once with --all-nodes.'),
    rules: Flags.string({
      summary:
        'Offline: saved rules to compare ("-": stdin): iptables-save, nft list ruleset (text or -j), or ipvs mode\'s ipvsadm-save -n, ipset save and ' +
        'iptables-save (one file or repeated --rules). Needs -f.',
      multiple: true,
      helpGroup: 'OFFLINE',
    }),
    filename: objectsFileFlag.optional,
    ...modelFlags,
    mode: Flags.option({
      summary: 'Offline: the proxy mode the rules are in. Default: the one the --rules files are in.',
      options: renderModes,
      helpGroup: 'OFFLINE',
    })(),
  };

  async run(): Promise<void> {
    const {args, flags} = await this.parse(Diff);
    if (flags.rules !== undefined) {
      if (args.node !== undefined || flags['all-nodes'])
        throw new PluginError('--rules compares saved rules without a cluster: give no NODE and no --all-nodes');
      await diffSavedRules(flags as typeof flags & {rules: string[]});
      return;
    }
    const offlineOnly = ['filename', 'mode', 'node-name', 'node-ip', 'cluster-cidr', 'service-cidr', 'nodeport-addresses'] as const;
    for (const name of offlineOnly)
      if (flags[name] !== undefined) throw new PluginError(`--${name} is for comparing saved rules: add --rules FILE`);
    const locator = this.locator(flags);
    const nodes = await locator.chooseNodes(args.node, flags['all-nodes']);
    const params = flags.service ? {service: await serviceKey(locator, flags.service, flags.namespace)} : {};
    const progress = flags['all-nodes'] ? 'agents answered' : undefined;
    if (flags.behaviour) {
      const asked = await this.askAgents(locator, nodes, {concurrency: flags.concurrency, progress}, (client) =>
        client.call('behaviour', params),
      );
      const reports = asked.answered.map((answer) =>
        nodeReport(answer.node, answer.diff, answer.evidence, driftWords, 'in the applied rules'),
      );
      printReports(reports, asked.failed, flags.output, flags['all-nodes']);
      if (asked.failed.length === 0 && reports.some((report) => !report.equal)) process.exitCode = exitCodes.differs;
      return;
    }
    const {answered, failed} = await this.askAgents(
      locator,
      nodes,
      {concurrency: flags.concurrency, progress},
      async (client): Promise<NodeDiff> => {
        const [status, diff] = await Promise.all([client.call('status', {}), client.call('diff', params)]);
        return {node: status.node, status, diff};
      },
    );

    const color = useColor(flags.output);
    if (flags.output === 'json' || flags.output === 'yaml') {
      const nodesOut = answered.map(({node, diff}) => ({node, ...diff}));
      process.stdout.write(
        formatData(flags['all-nodes'] ? {nodes: nodesOut, errors: failed} : (nodesOut[0] ?? {errors: failed}), flags.output),
      );
    } else if (flags['all-nodes']) {
      if (answered.length > 0) process.stdout.write(driftTable(answered, color));
    } else {
      for (const {node, diff} of answered) {
        if (diff.equal) continue;
        process.stdout.write(driftExplanations(node, diff));
        process.stdout.write(`${colorDiff(diff.text.replace(/\n?$/, ''), palette(color))}\n`);
      }
    }
    if (failed.length === 0 && answered.some(({diff}) => !diff.equal)) process.exitCode = exitCodes.differs;
  }
}

/**
 * The key the agent groups rules by ("namespace/name[:port]"), for a Service the API server says
 * exists. Straight to an agent (--agent-url) without any kubeconfig there is no API server to ask:
 * the name is taken as given, in -n's namespace or default.
 */
async function serviceKey(locator: AgentLocator, reference: string, namespace: string | undefined): Promise<string> {
  let config;
  try {
    config = locator.kubeConfig();
  } catch (error) {
    if (!locator.direct) throw error;
    const named = splitServiceReference(reference, namespace || 'default');
    return `${named.namespace}/${named.name}${named.port !== undefined ? `:${named.port}` : ''}`;
  }
  return resolveServiceKey(config, reference, objectNamespace(config, namespace));
}

function driftTable(nodes: NodeDiff[], color: boolean): string {
  const c = palette(color);
  const now = Date.now();
  const rows = nodes.map(({node, status, diff}) => {
    const drifted = diff.groups
      .filter((group) => group.added.length > 0 || group.removed.length > 0)
      .map((group) => group.servicePort || '(no service)');
    const last = status.lastSync;
    return [
      node,
      status.observe ? `observe: ${status.observe.observing}` : status.mode,
      drifted.length === 0 ? c.green('none') : c.yellow(drifted.join(',')),
      last ? `${formatAge(now - Date.parse(last.at))} ago${last.ok ? '' : ' (failed)'}` : '-',
      status.version,
    ];
  });
  return formatTable(['NODE', 'MODE', 'DRIFTED SERVICES', 'LAST SYNC', 'AGENT VERSION'], rows);
}

/** An observer's explanations of each drifted service port, one line each, before the rules. */
function driftExplanations(node: string, diff: DiffResult): string {
  const lines: string[] = [];
  for (const group of diff.groups) {
    for (const explanation of group.explanations ?? [])
      lines.push(`${node}: ${group.servicePort || '(rules of no service)'}: ${explanation.text}`);
  }
  return lines.length > 0 ? `${lines.join('\n')}\n\n` : '';
}
