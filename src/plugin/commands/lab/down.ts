import {downLab} from '../../../lab/lab-control.ts';
import {labNameFlag} from '../../lib/lab-name-flag.ts';
import {PluginCommand} from '../../lib/plugin-command.ts';
import {examples, helpText} from '../../lib/help-text.ts';

export default class LabDown extends PluginCommand {
  static override summary = 'Remove a lab: its agents, pods, namespaces, API server and state.';
  static override description = helpText`
    Works from any shell, also when the lab broke half-way or its supervisor died. Running it again, or for
    a lab that does not exist, changes nothing and succeeds.
  `;

  static override examples = examples`
    # Remove the default lab
    kubectl proxyctl lab down

    # Remove the lab named big
    kubectl proxyctl lab down --name big
  `;

  static override flags = {
    name: labNameFlag(),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(LabDown);
    const result = await downLab(flags.name);
    if (!result.removed) this.log(`lab ${flags.name} is not running: nothing to remove`);
    else this.log(`lab ${flags.name} removed (${result.namespaces} network namespaces, ${result.processes} processes)`);
  }
}
