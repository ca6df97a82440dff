// LabCommand: what every lab command shares: --name, the lab it works on (several labs can run
// side by side), and, from PluginCommand, how failures are printed.
import {Flags} from '@oclif/core';
import {defaultLabName} from '../../lab/lab-state.ts';
import {PluginCommand} from './plugin-command.ts';

/** labNameFlag: --name, default the default lab's name. */
export function labNameFlag(summary = 'Name of the lab.') {
  return Flags.string({summary, default: defaultLabName});
}

export abstract class LabCommand extends PluginCommand {
  static override baseFlags = {name: labNameFlag()};
}
