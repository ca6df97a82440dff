// --name: the lab a lab command works on (several labs can run side by side).
import {Flags} from '@oclif/core';
import {defaultLabName} from '../../lab/lab-state.ts';

/** labNameFlag: --name of every lab command, default the default lab's name. */
export function labNameFlag(summary = 'Name of the lab.') {
  return Flags.string({summary, default: defaultLabName});
}
