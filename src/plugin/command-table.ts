// Every command of the plugin by its oclif id. oclif finds the commands here ("explicit" command
// discovery, package.json oclif.commands) rather than by globbing a directory, so that they can be
// bundled into one module (scripts/bundle-plugin.ts). A new command file needs its line here;
// test/plugin/plugin-launcher.test.ts checks that every file under commands/ has one.
import {commands as helpCommands} from '@oclif/plugin-help';
import Diff from './commands/diff.ts';
import LabDown from './commands/lab/down.ts';
import LabExec from './commands/lab/exec.ts';
import LabStatus from './commands/lab/status.ts';
import LabUp from './commands/lab/up.ts';
import MigrateCheck from './commands/migrate-check.ts';
import Render from './commands/render.ts';
import Status from './commands/status.ts';
import Sync from './commands/sync.ts';
import Trace from './commands/trace.ts';
import Version from './commands/version.ts';

export const COMMANDS = {
  diff: Diff,
  help: helpCommands.help,
  'lab:down': LabDown,
  'lab:exec': LabExec,
  'lab:status': LabStatus,
  'lab:up': LabUp,
  'migrate-check': MigrateCheck,
  render: Render,
  status: Status,
  sync: Sync,
  trace: Trace,
  version: Version,
};
