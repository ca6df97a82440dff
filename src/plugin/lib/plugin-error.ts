// PluginError: a failure the plugin reports as one line (what went wrong and what to do) with its
// exit code. kubectl diff's convention holds for every command: 1 means "differs", >1 an error.
import {errorText} from '../../core/error-text.ts';

export const exitCodes = {
  ok: 0,
  /** diff: desired and applied rules differ. */
  differs: 1,
  /** Anything that kept the command from answering: bad flags, unreachable agent, refused access. */
  error: 2,
} as const;

export class PluginError extends Error {
  override name = 'PluginError';
  readonly exitCode: number;
  constructor(message: string, exitCode: number = exitCodes.error) {
    super(message);
    this.exitCode = exitCode;
  }
}

/** The message of anything thrown, on one line. */
export function errorLine(error: unknown): string {
  const text = errorText(error);
  return text.replace(/\s*\n\s*/g, ' ').trim();
}
