import {Command, Flags} from '@oclif/core';
import {requireLab} from '../../../lab/lab-control.ts';
import {defaultLabName, LabError} from '../../../lab/lab-state.ts';
import {formatLabStatus, readLabStatus} from '../../../lab/lab-status.ts';
import {formatData} from '../../lib/output.ts';

export default class LabStatus extends Command {
  static override summary = "Show a lab's nodes, agents, pods, external client and services, and how to use them.";
  static override description = 'Reads the state the lab keeps in /run/proxyctl-lab/NAME and asks its API server for the live objects. Exit code 1 when no such lab runs.';

  static override examples = [
    {description: 'The default lab', command: '<%= config.bin %> lab status'},
    {description: 'As JSON, e.g. for scripts', command: '<%= config.bin %> lab status --name big -o json'},
  ];

  static override flags = {
    name: Flags.string({summary: 'Name of the lab.', default: defaultLabName}),
    output: Flags.option({char: 'o', summary: 'Output format.', options: ['text', 'json', 'yaml'] as const, default: 'text'})(),
  };

  async run(): Promise<void> {
    const {flags} = await this.parse(LabStatus);
    try {
      const status = await readLabStatus(await requireLab(flags.name));
      process.stdout.write(flags.output === 'text' ? formatLabStatus(status) : formatData(status, flags.output));
    } catch (error) {
      if (error instanceof LabError) this.error(error.message, {exit: error.exitCode});
      throw error;
    }
  }
}
