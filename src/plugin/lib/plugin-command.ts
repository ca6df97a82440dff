// PluginCommand: what every command shares, so that all fail alike: one line "error: ..." on
// stderr, the exit code the failure carries (2 for any error without one, as kubectl diff's
// convention keeps 1 for "differs"), and progress lines only for a person watching stderr.
import {Command} from '@oclif/core';
import {errorLine, exitCodes} from './plugin-error.ts';

export abstract class PluginCommand extends Command {
  #progressShown = false;

  /** progress rewrites one line on stderr, and only for a person watching it on a terminal that can. */
  protected progress(line: string): void {
    if (!process.stderr.isTTY || process.env.TERM === 'dumb') return;
    process.stderr.write(`\r\u001b[2K${line}`);
    this.#progressShown = true;
  }

  protected endProgress(): void {
    if (this.#progressShown) process.stderr.write('\r\u001b[2K');
    this.#progressShown = false;
  }

  protected override async catch(error: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    // this.exit() and oclif's own exits pass through.
    if (error.code === 'EEXIT') throw error;
    this.endProgress();
    // PluginError and LabError carry their exit code; oclif's parse errors carry theirs in oclif.exit.
    const own = typeof error.exitCode === 'number' && error.exitCode > 0 ? error.exitCode : undefined;
    process.stderr.write(
      `error: ${errorLine(error).replace(/ See more help with --help$/, `: see "kubectl proxyctl ${this.id?.replaceAll(':', ' ') ?? ''} --help"`)}\n`,
    );
    process.exitCode = own ?? Math.max(error.oclif?.exit ?? exitCodes.error, exitCodes.error);
    return undefined;
  }
}
