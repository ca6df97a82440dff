import {Args} from '@oclif/core';
import {execInLab} from '../../../lab/lab-control.ts';
import {labNameFlag} from '../../lib/lab-name-flag.ts';
import {PluginCommand} from '../../lib/plugin-command.ts';
import {PluginError} from '../../lib/plugin-error.ts';
import {examples, helpText} from '../../lib/help-text.ts';

/**
 * splitAtDoubleDash separates `lab exec`'s own arguments from the command's. Everything after the
 * first `--` is the command, word for word: oclif's parser would group repeated flags and take a
 * second `--` or a `--name` inside the command as its own, so it only sees what comes before.
 * Without a `--`, every argument goes to the parser and the command is what it leaves positional.
 */
export function splitAtDoubleDash(argv: string[]): {own: string[]; command: string[] | undefined} {
  const at = argv.indexOf('--');
  if (at < 0) return {own: argv, command: undefined};
  return {own: argv.slice(0, at), command: argv.slice(at + 1)};
}

export default class LabExec extends PluginCommand {
  static override summary = 'Run a command inside a lab pod, node or external client (its network namespace).';
  static override description = helpText`
    TARGET is a pod (pod-0-1), a node (node-0, or its agent pod proxyctl-agent-node-0), an external client
    (client-0, or just "client"), or "upstream". The command runs as root in that namespace with this
    terminal; its exit code is passed through. Everything after the first -- reaches the command unchanged.
  `;

  static override examples = examples`
    # A request to the demoapp ClusterIP from a pod
    kubectl proxyctl lab exec pod-1-1 -- curl -s http://10.96.0.10/

    # The NodePort from outside the cluster
    kubectl proxyctl lab exec client -- curl -s http://10.240.0.11:30080/

    # A node's nat table
    kubectl proxyctl lab exec node-0 -- iptables-save -t nat
  `;

  // Everything after the first "--" is the command, handed over as it is.
  static override usage = 'lab exec [--name NAME] TARGET -- COMMAND [ARG...]';

  static override strict = false;

  static override args = {
    target: Args.string({description: 'Pod, node or client to run in.', required: true}),
  };

  static override flags = {
    name: labNameFlag(),
  };

  async run(): Promise<void> {
    const {own, command: afterDoubleDash} = splitAtDoubleDash(this.argv);
    const {args, flags, argv} = await this.parse(LabExec, own);
    const extra = (argv as string[]).slice(1);
    if (afterDoubleDash && extra.length > 0)
      throw new PluginError(`lab exec: ${JSON.stringify(extra[0])} comes before --; put the whole command after --`);
    const command = afterDoubleDash ?? extra;
    const code = await execInLab(flags.name, args.target, command);
    if (code !== 0) this.exit(code);
  }
}
