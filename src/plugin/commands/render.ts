import {Command, Flags} from '@oclif/core';
import {nftablesLayouts} from '../../core/model/index.ts';
import {formatData, outputFlag} from '../lib/output.ts';
import {InputError, readOfflineModel} from '../lib/model-input.ts';
import {ipvsParts, renderModes, renderRules} from '../lib/render-rules.ts';

// Exit codes: 0 rules printed; 2 bad input (as for bad flags, which oclif reports with 2 too).
const badInput = 2;

export default class Render extends Command {
  static override summary = 'Print the rules the proxy would write for the Services and EndpointSlices in a file.';
  static override description =
    `Reads Services, EndpointSlices and optionally the Node (YAML with several documents, or JSON: single objects or a v1 List) and prints what the proxy on that node would program, without a cluster. One IP family per run, as kube-proxy runs one proxier per family.

What is printed depends on --mode, and each text loads into an empty network namespace as it is. iptables: iptables-restore input for the nat and filter tables. nftables: an \`nft -f\` script for the table ip kube-proxy (ip6 kube-proxy with --ip-family ipv6).

ipvs mode's state has four parts, each in the input format of the tool that loads it: the ipsets (\`ipset restore\`), the iptables layer that matches them (\`iptables-restore\`, after the sets exist), the service addresses on the kube-ipvs0 dummy device (\`ip -batch -\`) and the virtual and real servers (\`ipvsadm-restore\`). Without --part all four are printed in that order, each after a heading line starting with "#", to read; --part prints one part alone, to pipe into its tool.

-o json prints the ProxyModel instead: every service port with its endpoints as the proxy categorised them.

Objects that are not valid are skipped and named on stderr with their file and field; the rules for the rest are still printed, and the exit code is 2. Input that is valid but renders to nothing (no objects at all, an FQDN EndpointSlice, slice ports that match no service port, a Service only of the other IP family) or that kube-apiserver would refuse by default (a NodePort outside 30000-32767) gets a warning on stderr naming the object; the exit code stays 0.

In iptables mode the first line, a comment, records the node addresses the rules were rendered for; \`trace --rules\` over the output takes them as the node's own addresses.`;

  static override examples = [
    {
      description: 'The rules node-1 of the bundled example gets',
      command: '<%= config.bin %> render -f examples/cluster.yaml --cluster-cidr 10.244.0.0/16',
    },
    {
      description: 'Load them into a scratch network namespace',
      command: 'ip netns add scratch && <%= config.bin %> render -f examples/cluster.yaml | ip netns exec scratch iptables-restore',
    },
    {
      description: 'The nftables table for node-1, loaded into a scratch namespace',
      command: '<%= config.bin %> render -f examples/cluster.yaml --mode nftables | ip netns exec scratch nft -f -',
    },
    {
      description: "nftables mode with the lab's service CIDR: unused service addresses are dropped",
      command: '<%= config.bin %> render -f examples/cluster.yaml --mode nftables --service-cidr 10.96.0.0/12',
    },
    {
      description: "kube-proxy's own nftables layout (a chain per endpoint), as kube-proxy would write it for node-1",
      command: '<%= config.bin %> render -f examples/cluster.yaml --mode nftables --nftables-layout kube-proxy --service-cidr 10.96.0.0/12',
    },
    {description: 'ipvs mode: every part, to read', command: '<%= config.bin %> render -f examples/cluster.yaml --mode ipvs'},
    // Load order matters: the iptables layer matches the sets by name.
    ...(
      [
        ['ipset', 'ipset restore', 'ipvs mode, loaded part by part: 1. the ipsets'],
        ['iptables', 'iptables-restore', '2. the iptables layer that matches them'],
        ['addresses', 'ip -batch -', '3. the service addresses on kube-ipvs0'],
        ['ipvsadm', 'ipvsadm-restore', '4. the virtual and real servers'],
      ] as const
    ).map(([part, tool, description]) => ({
      description,
      command: `<%= config.bin %> render -f examples/cluster.yaml --mode ipvs --part ${part} | ip netns exec scratch ${tool}`,
    })),
    {
      description: 'The model as JSON, for another node and masquerading everything',
      command: '<%= config.bin %> render -f examples/cluster.yaml --node-name node-0 --node-ip 10.240.0.10 --masquerade-all -o json',
    },
  ];

  static override flags = {
    filename: Flags.string({
      char: 'f',
      summary: 'File with Services, EndpointSlices and the Node; "-" reads stdin. Repeat for several files.',
      multiple: true,
      required: true,
    }),
    mode: Flags.option({summary: 'Proxy mode whose rules to print.', options: renderModes, default: 'iptables'})(),
    part: Flags.option({
      summary: 'With --mode ipvs: print only this part, in the input format of the tool that loads it.',
      options: ipvsParts,
    })(),
    'ip-family': Flags.option({summary: 'IP family of the rules.', options: ['ipv4', 'ipv6'] as const, default: 'ipv4'})(),
    'node-name': Flags.string({summary: 'The node the rules are for (its endpoints are local). Default: the Node in the input.'}),
    'node-ip': Flags.string({summary: "The node's addresses, primary first. Default: the Node's InternalIPs.", multiple: true}),
    'cluster-cidr': Flags.string({
      summary: 'Pod CIDR of the cluster (kube-proxy --cluster-cidr); traffic from outside it is masqueraded.',
      multiple: true,
      delimiter: ',',
    }),
    'service-cidr': Flags.string({
      summary:
        'Service CIDRs of the cluster (kube-apiserver --service-cluster-ip-range); nftables mode drops traffic to their addresses that are no ClusterIP.',
      multiple: true,
      delimiter: ',',
    }),
    'masquerade-all': Flags.boolean({summary: 'Masquerade all traffic sent to service IPs (kube-proxy --masquerade-all).', default: false}),
    'masquerade-bit': Flags.integer({summary: 'Bit of the packet mark that flags packets for masquerading.', min: 0, max: 31}),
    'nodeport-addresses': Flags.string({
      summary: 'Where NodePorts listen: CIDRs, or "primary" (kube-proxy --nodeport-addresses). Default: every local address.',
      multiple: true,
      delimiter: ',',
    }),
    'detect-local': Flags.option({
      summary: 'How pod traffic is told from other traffic. Default: cluster-cidr when --cluster-cidr is given, else none.',
      options: ['cluster-cidr', 'node-cidr', 'bridge-interface', 'interface-name-prefix', 'none'] as const,
    })(),
    'pod-bridge-interface': Flags.string({summary: 'Bridge the pods hang off (with --detect-local bridge-interface).'}),
    'pod-interface-name-prefix': Flags.string({summary: "Prefix of the pods' interfaces (with --detect-local interface-name-prefix)."}),
    'localhost-nodeports': Flags.option({
      summary: 'Accept NodePort connections on 127.0.0.1 (iptables mode, IPv4).',
      options: ['true', 'false'] as const,
    })(),
    'nftables-layout': Flags.option({
      summary:
        "nftables mode's table layout: proxyctl's own, or kube-proxy's (a chain per endpoint, as kube-proxy 1.34+ writes it; kube-proxy-1.33 as 1.33 and before).",
      options: nftablesLayouts,
    })(),
    output: outputFlag(['text', 'json']),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(Render);
    if (flags.part !== undefined && flags.mode !== 'ipvs')
      this.error(`--part ${flags.part}: only ipvs mode has parts; --mode ${flags.mode} prints one text`, {exit: badInput});
    let offline;
    try {
      offline = await readOfflineModel(flags.filename, {
        family: flags['ip-family'] === 'ipv6' ? 'IPv6' : 'IPv4',
        nodeName: flags['node-name'],
        nodeIPs: flags['node-ip'],
        clusterCIDRs: flags['cluster-cidr'],
        serviceCIDRs: flags['service-cidr'],
        masqueradeAll: flags['masquerade-all'] || undefined,
        masqueradeBit: flags['masquerade-bit'],
        nodePortAddresses: flags['nodeport-addresses'],
        detectLocal: flags['detect-local'],
        podBridgeInterface: flags['pod-bridge-interface'],
        podInterfaceNamePrefix: flags['pod-interface-name-prefix'],
        localhostNodePorts: flags['localhost-nodeports'] === undefined ? undefined : flags['localhost-nodeports'] === 'true',
        nftablesLayout: flags['nftables-layout'],
      });
    } catch (error) {
      if (error instanceof InputError) this.error(error.message, {exit: badInput});
      throw error;
    }
    const {model, problems, warnings, serviceCIDRs} = offline;
    process.stdout.write(flags.output === 'json' ? formatData(model, 'json') : renderRules(model, flags.mode, flags.part, {serviceCIDRs}));
    for (const warning of warnings) process.stderr.write(`warning: ${warning}\n`);
    if (problems.length > 0) {
      for (const problem of problems) process.stderr.write(`skipped: ${problem}\n`);
      this.exit(badInput);
    }
  }
}
