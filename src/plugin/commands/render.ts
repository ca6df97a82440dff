import {Command, Flags} from '@oclif/core';
import {formatData, outputFlag} from '../lib/output.ts';
import {InputError, readOfflineModel} from '../lib/model-input.ts';
import {modelFlags, objectsFileFlag, offlineSettings} from '../lib/model-flags.ts';
import {ipvsParts, renderModes, renderRules} from '../lib/render-rules.ts';
import {examples, helpText} from '../lib/help-text.ts';

// Exit codes: 0 rules printed; 2 bad input (as for bad flags, which oclif reports with 2 too).
const badInput = 2;

export default class Render extends Command {
  static override summary = 'Print the rules the proxy would write for the Services and EndpointSlices in a file.';
  static override description = helpText`
    Reads Services, EndpointSlices and optionally the Node (YAML with several documents, or JSON: single
    objects or a v1 List) and prints what the proxy on that node would program, without a cluster. One IP
    family per run, as kube-proxy runs one proxier per family.

    What is printed depends on --mode, and each text loads into an empty network namespace as it is.
    iptables: iptables-restore input for the nat and filter tables. nftables: an \`nft -f\` script for the
    table ip kube-proxy (ip6 kube-proxy with --ip-family ipv6).

    ipvs mode's state has four parts, each in the input format of the tool that loads it: the ipsets
    (\`ipset restore\`), the iptables layer that matches them (\`iptables-restore\`, after the sets exist),
    the service addresses on the kube-ipvs0 dummy device (\`ip -batch -\`) and the virtual and real servers
    (\`ipvsadm-restore\`). Without --part all four are printed in that order, each after a heading line
    starting with "#", to read; --part prints one part alone, to pipe into its tool.

    -o json prints the ProxyModel instead: every service port with its endpoints as the proxy categorised
    them.

    Objects that are not valid are skipped and named on stderr with their file and field; the rules for the
    rest are still printed, and the exit code is 2. Input that is valid but renders to nothing (no objects
    at all, an FQDN EndpointSlice, slice ports that match no service port, a Service only of the other IP
    family) or that kube-apiserver would refuse by default (a NodePort outside 30000-32767) gets a warning
    on stderr naming the object; the exit code stays 0.

    In iptables mode the first line, a comment, records the node addresses the rules were rendered for;
    \`trace --rules\` over the output takes them as the node's own addresses.
  `;

  static override examples = examples`
    # The rules node-1 of the bundled example gets
    kubectl proxyctl render -f examples/cluster.yaml --cluster-cidr 10.244.0.0/16

    # Load them into a scratch network namespace
    ip netns add scratch && kubectl proxyctl render -f examples/cluster.yaml | ip netns exec scratch iptables-restore

    # The nftables table for node-1, loaded into a scratch namespace
    kubectl proxyctl render -f examples/cluster.yaml --mode nftables | ip netns exec scratch nft -f -

    # nftables mode with the lab's service CIDR: unused service addresses are dropped
    kubectl proxyctl render -f examples/cluster.yaml --mode nftables --service-cidr 10.96.0.0/12

    # ipvs mode: every part, to read
    kubectl proxyctl render -f examples/cluster.yaml --mode ipvs

    # ipvs mode, loaded part by part (in this order: the iptables layer matches the sets by name): 1. the ipsets
    kubectl proxyctl render -f examples/cluster.yaml --mode ipvs --part ipset | ip netns exec scratch ipset restore

    # 2. the iptables layer that matches them
    kubectl proxyctl render -f examples/cluster.yaml --mode ipvs --part iptables | ip netns exec scratch iptables-restore

    # 3. the service addresses on kube-ipvs0
    kubectl proxyctl render -f examples/cluster.yaml --mode ipvs --part addresses | ip netns exec scratch ip -batch -

    # 4. the virtual and real servers
    kubectl proxyctl render -f examples/cluster.yaml --mode ipvs --part ipvsadm | ip netns exec scratch ipvsadm-restore

    # The model as JSON, for another node and masquerading everything
    kubectl proxyctl render -f examples/cluster.yaml --node-name node-0 --node-ip 10.240.0.10 --masquerade-all -o json
  `;

  static override flags = {
    ...modelFlags,
    filename: objectsFileFlag.required,
    mode: Flags.option({summary: 'Proxy mode whose rules to print.', options: renderModes, default: 'iptables'})(),
    part: Flags.option({
      summary: 'With --mode ipvs: print only this part, in the input format of the tool that loads it.',
      options: ipvsParts,
    })(),
    output: outputFlag(['text', 'json']),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(Render);
    if (flags.part !== undefined && flags.mode !== 'ipvs')
      this.error(`--part ${flags.part}: only ipvs mode has parts; --mode ${flags.mode} prints one text`, {exit: badInput});
    let offline;
    try {
      offline = await readOfflineModel(flags.filename, offlineSettings(flags));
    } catch (error) {
      if (error instanceof InputError) this.error(error.message, {exit: badInput});
      throw error;
    }
    const {model, problems, warnings, serviceCIDRs} = offline;
    process.stdout.write(
      flags.output === 'json'
        ? formatData(model, 'json')
        : renderRules(model, flags.mode, flags.part, {serviceCIDRs, scheduler: flags['ipvs-scheduler']}),
    );
    for (const warning of warnings) process.stderr.write(`warning: ${warning}\n`);
    if (problems.length > 0) {
      for (const problem of problems) process.stderr.write(`skipped: ${problem}\n`);
      this.exit(badInput);
    }
  }
}
