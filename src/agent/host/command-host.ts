// CommandHost: the Host that runs the real commands (through execa; the dumps of the rules with
// their output in a file of their own), optionally inside a network namespace with `ip netns exec NAME`.
import {execa} from 'execa';
import {spawn} from 'node:child_process';
import {close, fstat, openSync, read, unlinkSync} from 'node:fs';
import {promisify} from 'node:util';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import type {IPFamily} from '../../core/model/index.ts';
import type {Writable} from 'node:stream';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import {type ConntrackFilter, type Host, HostCommandError, type IptablesFrontEnd, type RestoreInput, type RestoreOptions} from './host.ts';
import {NamespaceAnchor} from './namespace-anchor.ts';
import {ReadBuffer, readProcFile} from './proc-file.ts';

export interface CommandResult {
  exitCode: number | undefined;
  stdout: string;
  stderr: string;
}

export interface CommandRunOptions {
  /** Written to the command's standard input, which is then closed. */
  input?: RestoreInput;
  /** Gets the command's process id as it starts. */
  started?: (pid: number) => void;
  /** Called once all of `input` is written (see RestoreOptions.inputTaken). */
  inputTaken?: () => void;
  /**
   * The command's output goes to a file (unlinked, in the temporary directory) and is read once it
   * ends. For whole dumps of the rules: a pipe is read only when the agent's event loop is free,
   * and on a large node iptables-save waited at a full pipe while the agent rendered the rules to
   * compare with it (docs/agent.md, Host). Also for the small reads an agent repeats every few
   * seconds (ipvs mode's looks, the nfacct counters of each scrape): a command spawned this way
   * costs the agent a fraction of the CPU that one through execa does (docs/agent.md, Host).
   * Through the pipe when no file can be made.
   */
  spool?: boolean;
}

/** CommandRunner runs one program and never throws for a non-zero exit. */
export type CommandRunner = (command: string[], options?: CommandRunOptions) => Promise<CommandResult>;

export const execaRunner: CommandRunner = async (command, {input, started, inputTaken, spool} = {}) => {
  const spoolFile = spool && input === undefined ? openSpoolFile() : undefined;
  if (spoolFile) {
    try {
      const result = await runSpooled(command, spoolFile.fd, started);
      return {...result, stdout: await readSpooled(spoolFile)};
    } finally {
      await spoolFile.close();
    }
  }
  // cleanup: false. execa would otherwise register exit and signal handlers around every command
  // (a cost on every command), to kill it should the agent exit first; a restore the agent started
  // is better left to commit or fail on its own, atomically, than killed halfway.
  const subprocess = execa(command[0], command.slice(1), {reject: false, stripFinalNewline: false, cleanup: false, env: {LC_ALL: 'C'}});
  if (subprocess.pid !== undefined) started?.(subprocess.pid);
  // Written to stdin here rather than given as execa's `input`: execa keeps a subprocess's options,
  // input included, for as long as the subprocess object lives, and that outlives the command until
  // Node closes the process handle. A full restore's input holds whole tables, and the collection
  // right after the sync (releaseGarbage) would find it still held.
  let inputFailure: unknown;
  if (input !== undefined && subprocess.stdin) {
    writeInput(subprocess.stdin, input, inputTaken).catch((error: unknown) => {
      inputFailure = error;
      // Input cut short must not be committed: the command is stopped before it reads the end.
      subprocess.kill('SIGKILL');
    });
  }
  const result = await subprocess;
  if (inputFailure !== undefined) throw inputFailure;
  if (result.failed && result.exitCode === undefined) {
    return {exitCode: undefined, stdout: '', stderr: String(result.originalMessage ?? result.message)};
  }
  return {exitCode: result.exitCode, stdout: String(result.stdout ?? ''), stderr: String(result.stderr ?? '')};
};

/**
 * runSpooled runs a command whose output goes to `stdoutFd`, the descriptor handed to the command
 * itself. Not through execa: given a file for the output, execa writes it from this process,
 * through the same event loop a pipe waits for.
 */
function runSpooled(
  command: string[],
  stdoutFd: number,
  started: ((pid: number) => void) | undefined,
): Promise<Omit<CommandResult, 'stdout'>> {
  return new Promise((resolve) => {
    const child = spawn(command[0], command.slice(1), {stdio: ['ignore', stdoutFd, 'pipe'], env: {...process.env, LC_ALL: 'C'}});
    if (child.pid !== undefined) started?.(child.pid);
    const stderr: Buffer[] = [];
    child.stderr!.on('data', (chunk: Buffer) => stderr.push(chunk));
    child.once('error', (error) => resolve({exitCode: undefined, stderr: error.message}));
    child.once('close', (code) => resolve({exitCode: code ?? undefined, stderr: Buffer.concat(stderr).toString('utf8')}));
  });
}

let spoolFiles = 0;

/**
 * A new file for a command's output, already unlinked; undefined when none can be made (a
 * read-only temporary directory). Made at once, so that the command starts at once, as a piped one
 * does, whatever the event loop does next.
 */
function openSpoolFile(): {fd: number; close(): Promise<void>} | undefined {
  const path = join(tmpdir(), `proxyctl-output-${process.pid}-${++spoolFiles}`);
  let fd: number;
  try {
    fd = openSync(path, 'wx+', 0o600);
  } catch {
    return undefined;
  }
  try {
    unlinkSync(path);
  } catch {
    // Left behind: its name says whose it was.
  }
  return {fd, close: () => new Promise((resolve) => close(fd, () => resolve()))};
}

/** All the command wrote to its spool file, from the start (the command moved the shared offset to its end). */
async function readSpooled(file: {fd: number}): Promise<string> {
  const {size} = await promisify(fstat)(file.fd);
  const buffer = Buffer.allocUnsafe(size);
  const readAt = promisify(read);
  for (let at = 0; at < size; ) {
    const {bytesRead} = await readAt(file.fd, buffer, at, size - at, at);
    if (bytesRead === 0) break;
    at += bytesRead;
  }
  return buffer.toString('utf8', 0, size);
}

/**
 * writeInput writes a text at once, and pieces one at a time, letting the event loop run after
 * each so that the pipe is fed while the next piece is made. A command that stops reading (it
 * refused a line and exited) ends the writing; its exit status tells why.
 */
async function writeInput(stdin: Writable, input: RestoreInput, inputTaken: (() => void) | undefined): Promise<void> {
  const taken = (error?: Error | null): void => {
    if (!error) inputTaken?.();
  };
  if (typeof input === 'string') {
    stdin.end(input, taken);
    return;
  }
  for (const piece of input) {
    if (stdin.destroyed) return;
    stdin.write(piece);
    await new Promise((resolve) => setImmediate(resolve));
  }
  stdin.end(taken);
}

/**
 * Wait up to 5 s for the xtables lock, polling every 100 ms, as kube-proxy does; the lock is shared
 * with kubelet, CNI plugins and firewalld.
 */
const xtablesWait = ['-w', '5', '-W', '100000'];

/** The kernel's table of virtual and real servers (Host.ipvsTable), in /proc/net. */
const ipvsTableName = 'ip_vs';

export interface CommandHostOptions {
  netns?: string;
  runner?: CommandRunner;
  /** Called with each command line before it runs (for --v=4 logs). */
  onCommand?: (command: string[]) => void;
  /**
   * Run iptables-nft or iptables-legacy (and their save, restore and ip6tables twins) rather than
   * whichever `iptables` the node's alternatives name: an observing agent reads the front end
   * kube-proxy wrote to. Default: `iptables`.
   */
  iptablesVariant?: IptablesVariant;
}

/** Which iptables binaries a CommandHost runs: the node's default, or one front end by name. */
export type IptablesVariant = 'default' | 'nft' | 'legacy';

export class CommandHost implements Host {
  readonly netns: string | undefined;
  readonly #runner: CommandRunner;
  readonly #onCommand: ((command: string[]) => void) | undefined;
  readonly #spawnListeners = new Set<(pid: number, command: string[]) => void>();
  readonly #variant: IptablesVariant;
  /** With a netns: the process through which its /proc/net is read, started at the first such read. */
  #anchor: NamespaceAnchor | undefined;
  /** What ipvsTable reads into, kept from look to look (the table is megabytes at 10,000 services); made at the first read. */
  #ipvsTableBuffer: ReadBuffer | undefined;

  constructor(options: CommandHostOptions = {}) {
    this.netns = options.netns;
    this.#variant = options.iptablesVariant ?? 'default';
    this.#runner = options.runner ?? execaRunner;
    this.#onCommand = options.onCommand;
  }

  /** run executes the command (inside the namespace when set); exit codes in `accept` do not throw. */
  async run(
    command: string[],
    options: {input?: RestoreInput; accept?: number[]; inputTaken?: () => void; spool?: boolean} = {},
  ): Promise<CommandResult> {
    const full = this.netns === undefined ? command : ['ip', 'netns', 'exec', this.netns, ...command];
    this.#onCommand?.(full);
    // `ip netns exec` execs the command in place: the process id is the command's own.
    const started =
      this.#spawnListeners.size > 0 ? (pid: number) => this.#spawnListeners.forEach((listener) => listener(pid, full)) : undefined;
    const result = await this.#runner(full, {input: options.input, started, inputTaken: options.inputTaken, spool: options.spool});
    if (result.exitCode === 0 || (result.exitCode !== undefined && options.accept?.includes(result.exitCode))) return result;
    throw new HostCommandError(full, result.exitCode, result.stderr || result.stdout);
  }

  onSpawn(listener: (pid: number, command: string[]) => void): () => void {
    this.#spawnListeners.add(listener);
    return () => this.#spawnListeners.delete(listener);
  }

  async iptablesRestore(family: IPFamily, rules: RestoreInput, options: RestoreOptions): Promise<void> {
    const command = [restoreCommand(family, this.#variant), ...xtablesWait];
    if (options.noflush) command.push('--noflush');
    if (options.counters) command.push('--counters');
    await this.run(command, {input: rules, inputTaken: options.inputTaken});
  }

  async iptablesSave(family: IPFamily, table?: IptablesTable): Promise<string> {
    return (await this.run([saveCommand(family, this.#variant), ...(table ? ['-t', table] : [])], {spool: true})).stdout;
  }

  async iptablesListChain(family: IPFamily, table: IptablesTable, chain: string): Promise<string | undefined> {
    const command = [iptablesCommand(family, this.#variant), ...xtablesWait, '-t', table, '-S', chain];
    // Exit 1: no such chain; 3 (legacy): no such table.
    const result = await this.run(command, {accept: [1, 3]});
    if (result.exitCode === 0) return result.stdout;
    // "No chain/target/match by that name", "Table does not exist" (legacy); iptables-nft 1.8.9 says a
    // chain it cannot find, or a table that does not exist, "is incompatible, use 'nft' tool".
    if (/No chain\/target\/match|does not exist|doesn't exist|is incompatible/i.test(result.stderr)) return undefined;
    throw new HostCommandError(command, result.exitCode, result.stderr);
  }

  async iptablesFrontEnd(family: IPFamily): Promise<IptablesFrontEnd> {
    return parseIptablesFrontEnd(await this.iptablesVersion(family));
  }

  async iptablesVersion(family: IPFamily): Promise<string> {
    return (await this.run([iptablesCommand(family, this.#variant), '--version'])).stdout.trim();
  }

  async nfacct(args: string[]): Promise<string> {
    return (await this.run(['nfacct', ...args], {spool: args[0] === 'list' || args[0] === 'get'})).stdout;
  }

  async nft(args: string[], input?: string): Promise<string> {
    return (await this.run(['nft', ...args], {input, spool: args.includes('list')})).stdout;
  }

  async ipset(args: string[], input?: string): Promise<string> {
    return (await this.run(['ipset', ...args], {input, spool: args[0] === 'save' || args[0] === 'list'})).stdout;
  }

  async ipvsadm(args: string[], input?: string): Promise<string> {
    return (await this.run(['ipvsadm', ...args], {input, spool: /^-[SL]/.test(args[0] ?? '') || args.includes('--save')})).stdout;
  }

  async ipvsTable(onRead?: (read: Buffer) => void): Promise<Buffer> {
    // /proc/net is the reading process's namespace: another namespace's is read through a process
    // kept there, or, until one is, by a command run there.
    const into = (this.#ipvsTableBuffer ??= new ReadBuffer());
    if (this.netns === undefined) return readProcFile(`/proc/net/${ipvsTableName}`, {into, onRead});
    this.#anchor ??= new NamespaceAnchor(this.netns, this.#onCommand);
    let given = false;
    const read = await this.#anchor.readProcNet(ipvsTableName, into, onRead && ((bytes) => ((given = true), onRead(bytes))));
    if (read !== undefined) return read;
    // The bytes given to onRead are not the ones cat would print: the caller would finish a table it never began.
    if (given) throw new Error(`the process kept in netns ${this.netns} ended while /proc/net/${ipvsTableName} was read`);
    return Buffer.from((await this.run(['cat', `/proc/net/${ipvsTableName}`], {spool: true})).stdout, 'latin1');
  }

  close(): void {
    this.#anchor?.close();
  }

  async ip(args: string[], input?: string): Promise<string> {
    return (await this.run(['ip', ...args], {input, spool: args.includes('show')})).stdout;
  }

  async conntrackDelete(filter: ConntrackFilter): Promise<number> {
    const command = ['conntrack', '-D', '-f', filter.family === 'IPv6' ? 'ipv6' : 'ipv4', '-p', filter.protocol.toLowerCase()];
    if (filter.origDst !== undefined) command.push('--orig-dst', filter.origDst);
    if (filter.dport !== undefined) command.push('--dport', String(filter.dport));
    if (filter.dstNat !== undefined) command.push('--dst-nat', filter.dstNat);
    // conntrack exits 1 when nothing matched; the count is on stderr either way.
    const result = await this.run(command, {accept: [1]});
    const count = /(\d+) flow entries have been deleted/.exec(result.stderr);
    if (result.exitCode === 1 && !count) throw new HostCommandError(command, 1, result.stderr);
    return count ? Number(count[1]) : 0;
  }

  async sysctlRead(name: string): Promise<string> {
    return (await this.run(['sysctl', '-n', name])).stdout.trim();
  }

  async sysctlWrite(name: string, value: string): Promise<void> {
    await this.run(['sysctl', '-q', '-w', `${name}=${value}`]);
  }

  async listeningSockets(): Promise<string> {
    return (await this.run(['ss', '-H', '-l', '-n', '-t', '-u', '-p'])).stdout;
  }
}

/** parseIptablesFrontEnd reads "iptables v1.8.9 (nf_tables)" or "(legacy)"; older versions say neither and are legacy. */
export function parseIptablesFrontEnd(versionText: string): IptablesFrontEnd {
  return /\(nf_tables\)/.test(versionText) ? 'nf_tables' : 'legacy';
}

function iptablesCommand(family: IPFamily, variant: IptablesVariant = 'default'): string {
  const base = family === 'IPv6' ? 'ip6tables' : 'iptables';
  return variant === 'default' ? base : `${base}-${variant}`;
}
function restoreCommand(family: IPFamily, variant: IptablesVariant): string {
  return `${iptablesCommand(family, variant)}-restore`;
}
function saveCommand(family: IPFamily, variant: IptablesVariant): string {
  return `${iptablesCommand(family, variant)}-save`;
}
