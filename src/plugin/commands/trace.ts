import type {KubeConfig} from '@kubernetes/client-node';
import {Args, Flags} from '@oclif/core';
import {isIP} from 'node:net';
import type {Packet, TraceResult} from '../../core/trace/types.ts';
import type {ProbeResult, TraceAnswer} from '../../protocol/methods.ts';
import type {AgentClient} from '../lib/agent-client.ts';
import {AgentCommand, connectionFlags, namespaceFlag} from '../lib/agent-command.ts';
import {objectNamespace} from '../lib/kube-config.ts';
import {formatAge, formatData, outputFlag, palette, useColor} from '../lib/output.ts';
import {PluginError} from '../lib/plugin-error.ts';
import {readRulesFlag, traceDump} from '../lib/rules-dump.ts';
import {formatProbeText} from '../lib/probe-text.ts';
import {
  endpointWarnings,
  nodeAddress,
  resolveService,
  resolveSource,
  type PacketSource,
  type ServiceTarget,
} from '../lib/service-target.ts';
import {formatTraceText} from '../lib/trace-text.ts';
import {inHelpGroup} from '../lib/help-group.ts';
import {examples, helpText} from '../lib/help-text.ts';

const defaultProbeCount = 20;

/** Tracing over saved rules, without a cluster. */
const offlineFlags = inHelpGroup('OFFLINE', {
  rules: Flags.string({
    summary:
      'Offline: saved rules to trace over ("-": stdin): iptables-save, nft list ruleset (text or -j), or ' +
      "ipvs mode's ipvsadm-save -n, ipset save and iptables-save (in one file or repeated --rules); " +
      'render output too. The format is found from the text.',
    multiple: true,
  }),
  src: Flags.string({summary: 'Offline: source address of the packet.'}),
  dst: Flags.string({summary: 'Offline: destination as IP:PORT[/PROTO] (PROTO tcp, udp or sctp; default tcp).'}),
  'node-ip': Flags.string({
    summary: "Offline: the node's own addresses (for NodePorts and local traffic). Default: those render recorded in the file.",
    multiple: true,
    delimiter: ',',
  }),
  'in-interface': Flags.string({summary: 'Offline: interface the packet arrives on.'}),
  origin: Flags.option({
    summary: 'Offline: arriving (from a pod or outside) or local (sent by the node).',
    options: ['arriving', 'local'] as const,
    default: 'arriving',
  })(),
});

interface NodeTrace {
  node: string;
  trace: TraceAnswer;
  probe?: ProbeResult & {count: number; from: string};
}

export default class Trace extends AgentCommand {
  static override summary = "Follow a Service's packet through the rules a node really holds, hop by hop.";
  static override description = helpText`
    Resolves SERVICE (in the -n namespace, else the kubeconfig context's) and its endpoints, asks the agent
    on the node to trace the first packet of a connection through the rules in the kernel, and prints the
    path once, a hop (hook, table, chain -> target) a line; the endpoints as a table with their probability,
    pod, node and whether the packet is masqueraded; for endpoints whose path differs (a pod reaching
    itself, say), only the hops that differ; and warnings: no endpoints (REJECT), Local traffic policy
    without a local endpoint (DROP), rules that differ from what the agent means to write, endpoints not
    ready or terminating. -o wide adds under each hop the sentence on why it matched and what it does, and
    the rule's text; -o json and -o yaml carry every endpoint's whole path.

    The packet comes from --from (a pod: its IP, entering its node; the lab's external client, client-0; or
    an address), or else from the node itself. It goes to the service's cluster IP, or with --via to its
    NodePort on the node, an external IP or a load-balancer IP. --probe N then opens N real connections the
    same way (from the pod's network namespace in the lab) and shows which endpoints answered next to the
    predicted odds.

    Without a cluster: --rules FILE traces over saved rules with --src and --dst. The format is found from
    the text: iptables-save (nf_tables or legacy), \`nft list ruleset\` as text or JSON (-j), ipvs mode's
    \`ipvsadm-save -n\`, \`ipset save\` and iptables-save (one after the other in one file, or each in its
    own --rules), and "kubectl proxyctl render" output of each mode. A file of none of these is refused
    (exit 2) naming the line that could not be read. A dump in which nothing jumps from the built-in chains
    into KUBE-SERVICES (iptables-restore input, such as kube-proxy's test output, rather than a node's dump)
    is traced as it stands, with a warning saying so.
  `;

  static override examples = examples`
    # From a pod, through the rules of its node, with 20 real connections
    kubectl proxyctl trace demoapp -n default --from pod-1-2 --probe 20

    # The NodePort as the lab's external client reaches it on node-1
    kubectl proxyctl trace demoapp-nodeport --via node-port --from client-0 --node node-1 --probe

    # From an address outside the cluster, entering node-0
    kubectl proxyctl trace demoapp --from 10.240.0.100 --node node-0

    # From each node itself, on every node, as JSON
    kubectl proxyctl trace demoapp --all-nodes -o json

    # Every hop with its sentence and rule text
    kubectl proxyctl trace demoapp --from pod-1-2 -o wide

    # Offline, over a saved dump
    kubectl proxyctl trace --rules node-1.iptables-save --src 10.244.1.5 --dst 10.96.0.10:80/tcp --node-ip 10.240.0.11

    # Offline, over an ipvs node's saved state
    kubectl proxyctl trace --rules node-1.ipvsadm --rules node-1.ipset --rules node-1.iptables-save
      --src 10.244.1.5 --dst 10.96.0.10:80 --node-ip 10.240.0.11
  `;

  static override args = {
    service: Args.string({description: "The Service: NAME (in the -n namespace, else the kubeconfig context's) or NAMESPACE/NAME."}),
  };

  static override flags = {
    ...namespaceFlag,
    ...connectionFlags,
    port: Flags.string({summary: 'The service port, by name or number (needed when the service has several).'}),
    node: Flags.string({summary: "The node whose rules to trace (default: the --from pod's node)."}),
    'all-nodes': Flags.boolean({summary: 'Trace on every node that runs an agent.', default: false}),
    from: Flags.string({
      summary:
        'Where the packet comes from: a pod (NAME or NAMESPACE/NAME), an IP address, or in a lab its external client (client-0). Default: the node itself.',
    }),
    'from-netns': Flags.string({
      summary: "Network namespace on the node to run --probe from (default: the --from pod's, else the node's).",
    }),
    via: Flags.option({
      summary: 'Which address of the service the packet is sent to.',
      options: ['cluster-ip', 'node-port', 'external-ip', 'load-balancer'] as const,
      default: 'cluster-ip',
    })(),
    probe: Flags.integer({
      summary: `Also open N real connections and show which endpoints answer ("--probe" alone: ${defaultProbeCount}).`,
      min: 1,
      max: 1000,
    }),
    output: outputFlag(['text', 'wide', 'json', 'yaml'], "Output format (wide adds each rule's text)."),
    ...offlineFlags,
  };

  override async init(): Promise<void> {
    // "--probe" with no number means the default count, which oclif's integer flags cannot say.
    this.argv = this.argv.flatMap((arg, index, all) =>
      arg === '--probe' && !/^\d+$/.test(all[index + 1] ?? '') ? ['--probe', String(defaultProbeCount)] : [arg],
    );
    await super.init();
  }

  protected override async catch(error: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    // `trace SERVICE NODE`, as diff, sync and status take their node: say which flag it is here.
    const extra = /^Unexpected arguments?: ([^\s,]+)/.exec(error.message)?.[1];
    if (extra && !extra.startsWith('-')) {
      return super.catch(
        new PluginError(`unexpected argument ${extra}: trace takes one SERVICE; to trace on node ${extra}, give --node ${extra}`),
      );
    }
    return super.catch(error);
  }

  async run(): Promise<void> {
    const {args, flags} = await this.parse(Trace);
    if (flags.rules !== undefined) {
      if (args.service) throw new PluginError('--rules traces a saved dump without a cluster: give --src and --dst instead of a SERVICE');
      this.traceOffline(flags);
      return;
    }
    for (const offline of ['src', 'dst', 'node-ip', 'in-interface'] as const) {
      if (flags[offline] !== undefined) throw new PluginError(`--${offline} is for offline traces: add --rules FILE, or trace a SERVICE`);
    }
    if (!args.service)
      throw new PluginError('name a SERVICE to trace (NAME or NAMESPACE/NAME), or give --rules FILE to trace a saved dump');
    if (flags.node !== undefined && flags['all-nodes']) throw new PluginError('give --node or --all-nodes, not both');

    const locator = this.locator(flags);
    const config = locator.kubeConfig();
    // Each request to the API server is a round trip of its own: those that do not wait on one
    // another go out together (the agent pods here, the node's address once the family is known).
    if (!locator.direct) locator.agentPods().catch(() => undefined);
    const target = await resolveService(config, args.service, objectNamespace(config, flags.namespace), flags.port);
    const family = isIP(target.clusterIPs[0]) === 6 ? 6 : 4;
    const addresses = new Map<string, Promise<string>>();
    const addressOf = (node: string) => {
      if (!addresses.has(node)) addresses.set(node, nodeAddress(config, node, family));
      return addresses.get(node)!;
    };
    const source = flags.from ? await resolveSource(config, flags.from, target.namespace) : undefined;
    let nodes: (string | undefined)[];
    if (flags['all-nodes']) nodes = await locator.nodes();
    else if (flags.node ?? source?.node) nodes = [flags.node ?? source?.node];
    else if (locator.direct) nodes = [undefined];
    else if (source) throw new PluginError(`--from ${flags.from} is an address, not a pod: name the node it enters with --node`);
    else nodes = await locator.chooseNodes(undefined, false, 'give --node NODE');
    for (const node of nodes) if (node !== undefined) addressOf(node).catch(() => undefined);

    const progress = nodes.length > 1 ? 'nodes traced' : undefined;
    const {answered: traced, failed} = await this.askAgents(locator, nodes, {concurrency: 5, progress}, (client, node) =>
      this.traceOnNode(client, addressOf, node, target, source, flags),
    );

    if (flags.output === 'json' || flags.output === 'yaml') {
      const data = traced.map(({node, trace, probe}) => ({node, service: target.servicePort, ...trace, ...(probe ? {probe} : {})}));
      process.stdout.write(formatData(flags['all-nodes'] ? {nodes: data, errors: failed} : (data[0] ?? {errors: failed}), flags.output));
    } else {
      const c = palette(useColor(flags.output));
      const endpointInfo = new Map([...target.endpoints].map(([key, info]) => [key, info]));
      const blocks = traced.map(({node, trace, probe}) => {
        const read = `rules read from the kernel ${formatAge(Date.now() - Date.parse(trace.readAt))} ago`;
        let text = `${c.bold('Node')}        ${node} (${read})\n`;
        text += formatTraceText(trace, {
          palette: c,
          wide: flags.output === 'wide',
          endpointInfo,
          width: process.stdout.isTTY ? process.stdout.columns : undefined,
        });
        if (probe) text += formatProbeText(trace, probe, probe.count, probe.from, c, endpointInfo);
        return text;
      });
      process.stdout.write(blocks.join('\n'));
    }
  }

  private async traceOnNode(
    client: AgentClient,
    addressOf: (node: string) => Promise<string>,
    node: string | undefined,
    target: ServiceTarget,
    source: PacketSource | undefined,
    flags: {via: string; probe?: number; 'from-netns'?: string; from?: string},
  ): Promise<NodeTrace> {
    const agentNode = node ?? (await client.call('status', {})).node;
    let dstIP: string;
    let dstPort = target.port;
    if (flags.via === 'node-port') {
      if (!target.nodePort) throw new PluginError(`service ${target.servicePort} has no NodePort (type ${target.type})`);
      dstIP = await addressOf(agentNode);
      dstPort = target.nodePort;
    } else if (flags.via === 'external-ip') {
      if (target.externalIPs.length === 0) throw new PluginError(`service ${target.servicePort} has no externalIPs`);
      dstIP = target.externalIPs[0];
    } else if (flags.via === 'load-balancer') {
      if (target.loadBalancerIPs.length === 0) throw new PluginError(`service ${target.servicePort} has no load-balancer IP in its status`);
      dstIP = target.loadBalancerIPs[0];
    } else {
      dstIP = target.clusterIPs[0];
    }
    const packet: Packet = source
      ? {srcIP: source.ip, dstIP, dstPort, protocol: target.protocol, origin: 'arriving'}
      : {srcIP: await addressOf(agentNode), dstIP, dstPort, protocol: target.protocol, origin: 'local'};
    const trace = await client.call('trace', {packet, service: target.servicePort});
    const warnings = [...trace.warnings];
    // The tracer already names a service without endpoints; the API server adds why and which pods.
    const tracerSaysNoEndpoints = warnings.some((warning) => warning.includes('has no endpoints'));
    for (const warning of endpointWarnings(target)) {
      if (tracerSaysNoEndpoints && warning.includes('has no endpoints')) continue;
      if (!warnings.includes(warning)) warnings.push(warning);
    }
    const answer: NodeTrace = {node: agentNode, trace: {...trace, warnings}};

    if (flags.probe !== undefined) {
      const netns = flags['from-netns'] ?? source?.netns;
      if (source && !netns) {
        throw new PluginError(
          `--probe from ${flags.from}: cannot tell which network namespace to connect from (no ` +
            `lab.proxyctl.dev/netns annotation): leave out --from to probe from the node, or name one with --from-netns`,
        );
      }
      const probe = await client.call('probe', {
        ...(netns ? {from: {netns}} : {}),
        target: {ip: dstIP, port: dstPort, protocol: target.protocol},
        count: flags.probe,
      });
      const from = source?.pod
        ? `pod ${source.pod}`
        : source?.externalClient
          ? `external client ${source.externalClient}`
          : netns
            ? `network namespace ${netns}`
            : `node ${agentNode}`;
      answer.probe = {...probe, count: flags.probe, from};
    }
    return answer;
  }

  private traceOffline(flags: {
    rules?: string[];
    src?: string;
    dst?: string;
    'node-ip'?: string[];
    'in-interface'?: string;
    origin: string;
    output: string;
  }): void {
    if (!flags.src) throw new PluginError("--rules needs --src IP (the packet's source address)");
    if (!flags.dst) throw new PluginError('--rules needs --dst IP:PORT[/PROTO] (where the packet goes)');
    if (isIP(flags.src) === 0) throw new PluginError(`--src ${flags.src}: not an IP address`);
    const destination = parseDestination(flags.dst);
    for (const ip of flags['node-ip'] ?? []) if (isIP(ip) === 0) throw new PluginError(`--node-ip ${ip}: not an IP address`);
    const dump = readRulesFlag(flags.rules!);
    for (const warning of dump.warnings) process.stderr.write(`warning: ${warning}\n`);
    const packet: Packet = {
      srcIP: flags.src,
      ...destination,
      origin: flags.origin === 'local' ? 'local' : 'arriving',
      ...(flags['in-interface'] ? {inInterface: flags['in-interface']} : {}),
    };
    const result: TraceResult = traceDump(dump, packet, flags['node-ip']);
    if (flags.output === 'json' || flags.output === 'yaml') process.stdout.write(formatData(result, flags.output));
    else
      process.stdout.write(
        formatTraceText(result, {palette: palette(useColor(flags.output === 'wide' ? 'wide' : 'text')), wide: flags.output === 'wide'}),
      );
  }
}

/** parseDestination reads IP:PORT[/PROTO], with [IPv6]:PORT. */
export function parseDestination(text: string): Pick<Packet, 'dstIP' | 'dstPort' | 'protocol'> {
  const match = /^(?:\[([^\]]+)\]|([^:/\[\]]+)):(\d+)(?:\/([a-zA-Z]+))?$/.exec(text);
  const ip = match?.[1] ?? match?.[2];
  const port = Number(match?.[3]);
  const protocol = (match?.[4] ?? 'tcp').toUpperCase();
  if (
    !match ||
    !ip ||
    isIP(ip) === 0 ||
    !Number.isInteger(port) ||
    port < 1 ||
    port > 65535 ||
    !['TCP', 'UDP', 'SCTP'].includes(protocol)
  ) {
    throw new PluginError(`--dst ${text}: must be IP:PORT[/PROTO] like 10.96.0.10:80/tcp or [fd00::10]:53/udp (PROTO tcp, udp or sctp)`);
  }
  return {dstIP: ip, dstPort: port, protocol: protocol as Packet['protocol']};
}
