import {examples} from '../../lib/help-text.ts';
import {requireLab} from '../../../lab/lab-control.ts';
import {labNameFlag} from '../../lib/lab-name-flag.ts';
import {PluginCommand} from '../../lib/plugin-command.ts';
import {formatLabStatus, readLabStatus} from '../../../lab/lab-status.ts';
import {formatData, outputFlag} from '../../lib/output.ts';

export default class LabStatus extends PluginCommand {
  static override summary = "Show a lab's nodes, agents, pods, external client and services, and how to use them.";
  static override description =
    'Reads the state the lab keeps in /run/proxyctl-lab/NAME and asks its API server for the live objects. Exit code 1 when no such lab runs.';

  static override examples = examples`
    # The default lab
    kubectl proxyctl lab status

    # As JSON, e.g. for scripts
    kubectl proxyctl lab status --name big -o json
  `;

  static override flags = {
    name: labNameFlag(),
    output: outputFlag(['text', 'json', 'yaml']),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(LabStatus);
    const status = await readLabStatus(await requireLab(flags.name));
    process.stdout.write(flags.output === 'text' ? formatLabStatus(status) : formatData(status, flags.output));
  }
}
