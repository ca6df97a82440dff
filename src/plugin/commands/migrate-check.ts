import {Args, Flags} from '@oclif/core';
import {
  behaviourSide,
  diffBehaviour,
  packetClasses,
  renderedSide,
  type BehaviourDiff,
  type ModeRules,
  type PacketClass,
  type ProxyMode,
} from '../../core/behaviour/index.ts';
import {accessFilterVerdict, type IpvsState} from '../../core/ipvs/index.ts';
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
import {examples, helpText} from '../lib/help-text.ts';
import {readRulesFlag, type RulesDump} from '../lib/rules-dump.ts';

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

    Host sockets (ipvs nodes): every socket the node listens on (ss -l) on 0.0.0.0, [::], * or a service
    address, on a port no virtual server takes there, answers on the service addresses bound to kube-ipvs0
    today, and stops after the switch; unless the node's KUBE-IPVS-FILTER (written by kube-proxy versions
    with the fix for kubernetes#72236, and by proxyctl) refuses new connections to those ports, in which
    case none answers.

    Offline: --rules DUMP with -f OBJECTS (the Services, EndpointSlices and Node the dump was written for)
    and render's node settings flags. DUMP is iptables-save output, nft list ruleset (text or -j), an nft -f
    script, or ipvs mode's state: ipvsadm-save -n, ipset save and iptables-save, one after the other in one
    file or in repeated --rules (as for diff --rules). An ipvs dump's NodePort virtual servers say the
    node's addresses; without \`ip addr\` output, KUBE-IPVS-IPS says which addresses kube-ipvs0 holds.
  `;

  static override examples = examples`
    # Would node-1 behave the same in nftables mode?
    kubectl proxyctl migrate-check --to nftables node-1

    # Every node, worst first
    kubectl proxyctl migrate-check --to nftables --all-nodes

    # Offline, over a saved iptables-save dump and the objects it was written for
    kubectl proxyctl migrate-check --to nftables --rules node-1.iptables-save -f cluster.yaml --cluster-cidr 10.244.0.0/16

    # Offline, over an ipvs node's saved state
    (ipvsadm-save -n; ipset save; iptables-save) > node-1.ipvs &&
      kubectl proxyctl migrate-check --to nftables --rules node-1.ipvs -f cluster.yaml --node-ip 10.240.0.11 --cluster-cidr 10.244.0.0/16

    # One service only, as JSON
    kubectl proxyctl migrate-check --to nftables node-1 --service default/web -o json
  `;

  static override args = {node: Args.string({description: 'The node to check (live).'})};

  static override flags = {
    ...connectionFlags,
    to: Flags.option({summary: 'The proxy mode to switch to.', options: modes, required: true})(),
    'all-nodes': Flags.boolean({summary: 'Check every node that runs an agent; print one table, worst first.', default: false}),
    service: Flags.string({summary: 'Only this service: NAMESPACE/NAME (or NAMESPACE/NAME:PORT).'}),
    output: outputFlag(['text', 'json', 'yaml']),
    concurrency: concurrencyFlag('Agents asked at once with --all-nodes.'),
    rules: Flags.string({
      summary:
        'Offline: the saved rules of the node ("-": stdin): iptables-save, nft list ruleset (text or -j), an nft -f script, or ipvs mode\'s ' +
        'ipvsadm-save -n, ipset save and iptables-save (one file or repeated --rules).',
      multiple: true,
      helpGroup: 'OFFLINE',
    }),
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
    let offline;
    try {
      offline = await readOfflineModel(flags.filename, offlineSettings(flags));
    } catch (error) {
      if (error instanceof InputError) throw new PluginError(error.message);
      throw error;
    }
    for (const problem of offline.problems) process.stderr.write(`skipped: ${problem}\n`);
    const {model, serviceCIDRs} = offline;
    const files = flags.rules.join(', ');
    const dump = readRulesFlag(flags.rules, model.family);
    for (const warning of dump.warnings) process.stderr.write(`warning: ${warning}\n`);
    const today = dumpRules(dump, files);
    const nodeAddresses = [...new Set([...model.nodeIPs, ...dumpNodeAddresses(today, model)])];
    const before = behaviourSide(today, nodeAddresses);
    const classes = packetClasses(model, {nodeAddresses, serviceCIDRs, ...(flags.service ? {service: flags.service} : {})});
    checkObjectsMatch(model, today.mode, before, classes, {nodeAddresses, serviceCIDRs}, files);
    const after = renderedSide(model, flags.to, {nodeAddresses, serviceCIDRs});
    const bar = progressBar('packet classes compared');
    const diff = diffBehaviour(classes, before, after, {onProgress: (done, total) => bar.update(done, total)});
    bar.end();
    return nodeReport(
      model.nodeName || '(offline)',
      diff,
      offlineEvidence(today, model, diff, flags.to),
      switchWords,
      `after the switch to ${flags.to} mode`,
    );
  }
}

type OfflineFlags = Parameters<typeof offlineSettings>[0] & {rules: string[]; filename: string[]; to: ProxyMode; service?: string};

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

/**
 * The dump as one mode's rules for the tracers. ipvs mode's behaviour lives in its virtual servers
 * first: a dump without ipvsadm output, or an ipvs node's iptables layer alone, is refused.
 */
function dumpRules(dump: RulesDump, files: string): ModeRules {
  switch (dump.mode) {
    case 'iptables':
      if (dump.parts.some((part) => /--match-set KUBE-(6-)?CLUSTER-IP /.test(part.text)))
        throw new PluginError(
          `--rules ${files} is the iptables layer of an ipvs-mode node: ipvs mode's behaviour lives in its virtual servers and sets, which an ` +
            'iptables dump does not hold; give `ipvsadm-save -n`, `ipset save` and `iptables-save` output together',
        );
      return {mode: 'iptables', rules: dump.ruleset};
    case 'nftables':
      return {mode: 'nftables', rules: dump.ruleset};
    case 'ipvs': {
      if (!dump.parts.some((part) => part.format === 'ipvsadm-save -n'))
        throw new PluginError(
          `--rules ${files} holds ipvs mode's sets but no \`ipvsadm-save -n\` output: its virtual servers decide where every service packet goes`,
        );
      const {state} = dump;
      if (state.boundAddresses.length > 0) return {mode: 'ipvs', rules: state};
      // kube-proxy keeps KUBE-IPVS-IPS equal to what kube-ipvs0 holds: a dump without `ip addr` output still says it there.
      const ips = state.sets.find((set) => set.name === (state.family === 'IPv6' ? 'KUBE-6-IPVS-IPS' : 'KUBE-IPVS-IPS'));
      return {mode: 'ipvs', rules: {...state, boundAddresses: [...(ips?.entries ?? [])].sort()}};
    }
  }
}

/**
 * The node's addresses a dump shows beyond the objects: those render recorded in an iptables dump,
 * and in ipvs mode every address with a virtual server that is no service address (NodePorts get
 * one on every node address kube-proxy serves them on, primary or not).
 */
function dumpNodeAddresses(today: ModeRules, model: ProxyModel): string[] {
  if (today.mode === 'iptables') return today.rules.nodeAddresses ?? [];
  if (today.mode !== 'ipvs') return [];
  const services = new Set(model.servicePorts.flatMap((port) => [port.clusterIP, ...port.externalIPs, ...port.loadBalancerIPs]));
  const bound = new Set(today.rules.boundAddresses);
  return [...new Set(today.rules.virtualServers.map((server) => server.address))].filter(
    (address) => !bound.has(address) && !services.has(address),
  );
}

/** What the node itself would show, said for a dump: where to look before switching. */
function offlineEvidence(today: ModeRules, model: ProxyModel, diff: BehaviourDiff, to: ProxyMode): string[] {
  const entries = new Set(diff.groups.flatMap((group) => group.changes.map((change) => change.class.entry)));
  const evidence: string[] = [];
  if (today.mode === 'iptables' && to !== 'iptables') {
    if (entries.has('node-port-loopback'))
      evidence.push(
        "on the node, kube-proxy's kubeproxy_iptables_localhost_nodeports_accepted_packets_total (or `nfacct get localhost_nps_accepted_pkts`) counts " +
          'connections to NodePorts on 127.0.0.1: above 0, something uses them',
      );
    if (entries.has('conntrack-invalid'))
      evidence.push(
        'on the node, kubeproxy_iptables_ct_state_invalid_dropped_packets_total (or `nfacct get ct_state_invalid_dropped_pkts`) counts the INVALID ' +
          'packets dropped today: above 0, connections may see resets after the switch unless nf_conntrack_tcp_be_liberal is set',
      );
  }
  if (today.mode === 'ipvs' && to !== 'ipvs') evidence.push(...ipvsOfflineEvidence(today.rules, model));
  return evidence;
}

/** For an ipvs dump: the host sockets and ARP answers kube-ipvs0 brings, and how to look for them on the node. */
function ipvsOfflineEvidence(state: IpvsState, model: ProxyModel): string[] {
  const evidence: string[] = [];
  const bound = state.boundAddresses;
  if (bound.length > 0) {
    // Port 0 is no service's: the verdict is the one for every port no service uses.
    const refused = accessFilterVerdict(state, bound[0], 0, 'TCP')?.refused === true;
    // The filter lets the health check node ports through (to the proxy's own health server) on every service address.
    const healthPorts = model.servicePorts.filter((port) => port.healthCheckNodePort > 0).map((port) => port.healthCheckNodePort);
    evidence.push(
      refused
        ? `the dump's KUBE-IPVS-FILTER refuses new connections to the ${bound.length} service addresses bound to kube-ipvs0 on ports no service uses: ` +
            `no host socket answers there today, as after the switch${
              healthPorts.length > 0
                ? ` (but for the health check node ports ${[...new Set(healthPorts)].join(', ')}, which it lets through to the proxy's health server)`
                : ''
            }`
        : `nothing in the dump refuses connections to the ${bound.length} service addresses bound to kube-ipvs0 on ports no service uses ` +
            '(no KUBE-IPVS-FILTER jumped to from filter INPUT, or no iptables-save output given): on the node, a host socket `ss -ltnup` lists on ' +
            '0.0.0.0, [::], * or a service address answers on those addresses today and would not after the switch',
    );
  }
  const lbIPs = new Set(model.servicePorts.flatMap((port) => port.loadBalancerIPs).filter((address) => bound.includes(address)));
  if (lbIPs.size > 0)
    evidence.push(
      `on the node, unless arp_ignore=1 and arp_announce=2 (kube-proxy's strictARP; \`sysctl net.ipv4.conf.all.arp_ignore net.ipv4.conf.all.arp_announce\`), ` +
        `the node answers ARP for the ${lbIPs.size} load-balancer IPs bound to kube-ipvs0 today, and would not after the switch`,
    );
  return evidence;
}
