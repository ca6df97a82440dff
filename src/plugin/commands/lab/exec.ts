import {Args, Flags} from '@oclif/core';
import {execInLab} from '../../../lab/lab-control.ts';
import {defaultLabName} from '../../../lab/lab-state.ts';
import {PluginCommand} from '../../lib/plugin-command.ts';

export default class LabExec extends PluginCommand {
  static override summary = 'Run a command inside a lab pod, node or external client (its network namespace).';
  static override description = `TARGET is a pod (pod-0-1), a node (node-0, or its agent pod proxyctl-agent-node-0), an external client (client-0, or just "client"), or "upstream". The command runs as root in that namespace with this terminal; its exit code is passed through.`;

  static override examples = [
    {description: 'A request to the demoapp ClusterIP from a pod', command: '<%= config.bin %> lab exec pod-1-1 -- curl -s http://10.96.0.10/'},
    {description: 'The NodePort from outside the cluster', command: '<%= config.bin %> lab exec client -- curl -s http://10.240.0.11:30080/'},
    {description: "A node's nat table", command: '<%= config.bin %> lab exec node-0 -- iptables-save -t nat'},
  ];

  // Everything after the first "--" is the command, handed over as it is.
  static override usage = 'lab exec [--name NAME] TARGET -- COMMAND [ARG...]';

  static override strict = false;

  static override args = {
    target: Args.string({description: 'Pod, node or client to run in.', required: true}),
  };

  static override flags = {
    name: Flags.string({summary: 'Name of the lab.', default: defaultLabName}),
  };

  async run(): Promise<void> {
    const {args, flags, argv} = await this.parse(LabExec);
    const command = (argv as string[]).slice(1);
    const code = await execInLab(flags.name, args.target, command);
    if (code !== 0) this.exit(code);
  }
}
