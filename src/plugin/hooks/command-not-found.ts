// A mistyped command gets kubectl's answer: one line naming it and the nearest real command, exit 2.
import type {Hook} from '@oclif/core';
import {exitCodes} from '../lib/plugin-error.ts';

/** Edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`. */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({length: a.length + 1}, (_, i) => [i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.length][b.length];
}

/** The commands close enough to `typed` to be what was meant, nearest first. */
export function suggestCommands(typed: string, commands: string[]): string[] {
  const scored = commands
    .map((command) => ({command, distance: command.startsWith(typed) && typed.length >= 2 ? 0 : editDistance(typed, command)}))
    .filter(({command, distance}) => distance <= Math.max(1, Math.floor(command.length / 3)))
    .sort((a, b) => a.distance - b.distance || a.command.localeCompare(b.command));
  return scored.map(({command}) => command);
}

const hook: Hook<'command_not_found'> = async function (options) {
  const typed = options.id.replaceAll(':', ' ');
  const commands = options.config.commandIDs.map((id) => id.replaceAll(':', ' '));
  const [nearest] = suggestCommands(typed, commands);
  const hint = nearest ? `did you mean "kubectl proxyctl ${nearest}"?` : 'see "kubectl proxyctl --help" for the commands';
  process.stderr.write(`error: unknown command "${typed}" for "kubectl proxyctl": ${hint}\n`);
  process.exitCode = exitCodes.error;
};

export default hook;
