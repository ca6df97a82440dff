import {Flags} from '@oclif/core';
import {labLimits, proxyModes, upLab} from '../../../lab/lab-control.ts';
import {labNameFlag} from '../../lib/lab-name-flag.ts';
import {PluginCommand} from '../../lib/plugin-command.ts';
import {formatLabStatus, readLabStatus} from '../../../lab/lab-status.ts';
import {examples, helpText} from '../../lib/help-text.ts';

export default class LabUp extends PluginCommand {
  static override summary = 'Build a small cluster on this machine out of network namespaces, with one proxyctl agent per node.';
  static override description = helpText`
    Creates one network namespace per node (joined by a bridge), pods behind each node running a demo HTTP
    and UDP server, and an external client outside the cluster. An embedded Kubernetes API server holds the
    nodes, pods and demo Services (ClusterIP, NodePort, UDP, one without endpoints) and hands out a
    kubeconfig; one proxyctl agent per node writes that node's rules inside its namespace.

    Returns once nodes, pods and agents are ready; the lab keeps running in the background until \`lab
    down\`. Needs root and iproute2. Its state is in /run/proxyctl-lab/NAME.
  `;

  static override examples = examples`
    # Two nodes with three pods each
    kubectl proxyctl lab up

    # A second, bigger lab beside the first
    kubectl proxyctl lab up --name big --nodes 3 --pods-per-node 10

    # Observe kube-proxy: each node's agent stands in for it, an observer beside it answers status, trace and diff
    kubectl proxyctl lab up --name obs --observe
  `;

  static override flags = {
    nodes: Flags.integer({summary: 'Number of nodes.', default: 2, min: labLimits.nodes.min, max: labLimits.nodes.max}),
    'pods-per-node': Flags.integer({
      summary: 'Demo pods on each node.',
      default: 3,
      min: labLimits.podsPerNode.min,
      max: labLimits.podsPerNode.max,
    }),
    name: labNameFlag('Name of the lab; several labs can run side by side.'),
    'proxy-mode': Flags.option({summary: 'Proxy mode of the agents.', options: proxyModes, default: 'iptables'})(),
    agents: Flags.boolean({
      summary: 'Start one agent per node; --no-agents builds the cluster without any proxy.',
      default: true,
      allowNo: true,
    }),
    observe: Flags.boolean({
      summary:
        "Each node's agent stands in for kube-proxy, and an observing agent (proxyctl-agent --observe) runs " +
        'beside it; status, trace and diff go to the observers.',
      default: false,
    }),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(LabUp);
    const abort = new AbortController();
    const interrupt = () => abort.abort();
    process.on('SIGINT', interrupt);
    process.on('SIGTERM', interrupt);
    try {
      const state = await upLab({
        name: flags.name,
        nodes: flags.nodes,
        podsPerNode: flags['pods-per-node'],
        proxyMode: flags['proxy-mode'],
        agents: flags.agents,
        observe: flags.observe,
        signal: abort.signal,
        onProgress: (text) => process.stderr.write(`${text}\n`),
      });
      process.stdout.write(formatLabStatus(await readLabStatus(state)));
    } finally {
      process.off('SIGINT', interrupt);
      process.off('SIGTERM', interrupt);
    }
  }
}
