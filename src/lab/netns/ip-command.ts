// Running iproute2's `ip` (alone, as a batch, or inside a namespace) and telling clearly why the
// machine cannot do network namespaces when it cannot.
import {execa} from 'execa';
import {errorText} from '../../core/error-text.ts';

/** NetnsError: an `ip` command failed; the message holds the command, what it was for, and stderr. */
export class NetnsError extends Error {
  override name = 'NetnsError';
  readonly command: string[];
  readonly stderr: string;
  constructor(purpose: string, command: string[], stderr: string, options?: {cause?: unknown}) {
    const detail = stderr.trim().split('\n').slice(0, 6).join(' / ') || 'no error output';
    super(`${purpose}: ${command.join(' ')}: ${detail}`, options);
    this.command = command;
    this.stderr = stderr;
  }
}

/** NetnsUnavailableError: this machine or user cannot create network namespaces, and why. */
export class NetnsUnavailableError extends Error {
  override name = 'NetnsUnavailableError';
}

export interface CommandOutput {
  stdout: string;
  stderr: string;
  exitCode: number;
}

/**
 * runCommand runs a program and resolves with its output when it exits 0; otherwise it throws a
 * NetnsError that says what the command was for. A missing program is reported as such.
 */
export async function runCommand(
  purpose: string,
  command: string[],
  options: {input?: string; timeoutMs?: number} = {},
): Promise<CommandOutput> {
  const result = await execa(command[0], command.slice(1), {
    input: options.input,
    reject: false,
    env: {LC_ALL: 'C'},
    timeout: options.timeoutMs,
  });
  if (result.failed && result.exitCode === undefined) {
    const reason = result.code === 'ENOENT' ? `${command[0]} is not installed` : String(result.originalMessage ?? result.message);
    throw new NetnsError(purpose, command, reason);
  }
  const output = {stdout: String(result.stdout ?? ''), stderr: String(result.stderr ?? ''), exitCode: result.exitCode ?? -1};
  if (output.exitCode !== 0) throw new NetnsError(purpose, command, output.stderr || output.stdout || `exit ${output.exitCode}`);
  return output;
}

/**
 * runIpBatch feeds `ip -batch -` one command per line, in the host's namespace or (with
 * namespace) inside that one: hundreds of links, addresses and routes in one process. The batch
 * stops at the first failing line, and the error names it.
 */
export async function runIpBatch(purpose: string, lines: string[], namespace?: string): Promise<void> {
  if (lines.length === 0) return;
  const command = namespace === undefined ? ['ip', '-batch', '-'] : ['ip', '-n', namespace, '-batch', '-'];
  try {
    await runCommand(purpose, command, {input: `${lines.join('\n')}\n`});
  } catch (error) {
    if (!(error instanceof NetnsError)) throw error;
    // iproute2 reports "Command failed -:LINE"; quote the line so the reader need not count.
    const failedLine = /Command failed -:(\d+)/.exec(error.stderr)?.[1];
    const quoted = failedLine === undefined ? '' : ` (line ${failedLine}: "${lines[Number(failedLine) - 1]}")`;
    throw new NetnsError(`${purpose}${quoted}`, command, error.stderr, {cause: error});
  }
}

let support: Promise<void> | undefined;

/**
 * checkNetnsSupport resolves when this process can create network namespaces: it runs as root,
 * `ip` is installed and `ip netns` answers. It rejects with a NetnsUnavailableError saying what is
 * missing. The answer is computed once.
 */
export function checkNetnsSupport(): Promise<void> {
  support ??= probeNetnsSupport();
  return support;
}

/** netnsUnavailableReason is checkNetnsSupport's answer as a sentence, or undefined when all is well. */
export async function netnsUnavailableReason(): Promise<string | undefined> {
  try {
    await checkNetnsSupport();
    return undefined;
  } catch (error) {
    return errorText(error);
  }
}

async function probeNetnsSupport(): Promise<void> {
  const uid = process.getuid?.();
  if (uid !== 0) {
    throw new NetnsUnavailableError(
      `network namespaces need root (this process runs as uid ${uid ?? 'unknown'}): run it as root, e.g. with sudo`,
    );
  }
  const result = await execa('ip', ['netns', 'list'], {reject: false, env: {LC_ALL: 'C'}});
  if (result.failed && result.exitCode === undefined) {
    const missing = result.code === 'ENOENT';
    throw new NetnsUnavailableError(
      missing
        ? 'the ip command (iproute2) is not installed: apt-get install iproute2'
        : `cannot run ip: ${String(result.originalMessage ?? result.message)}`,
    );
  }
  if (result.exitCode !== 0) {
    throw new NetnsUnavailableError(`ip netns does not work here: ${String(result.stderr).trim() || `exit ${result.exitCode}`}`);
  }
}
