// NamespaceAnchor: a process kept inside a named network namespace, so that the agent, which runs
// outside it (--netns), can read that namespace's /proc/net files as files, through the anchor's
// /proc/PID/net, instead of running a command there for each read. ipvs mode's looks read
// /proc/net/ip_vs every few seconds: a `cat` through `ip netns exec` for each costs a fork and two
// execs, in the qemu guest the longest of a look's three parts (docs/observe.md).
//
// The anchor is `cat` reading a pipe the agent never writes: it ends when the agent does, however
// the agent ends, since the pipe then closes. It is read through only once it is seen inside the
// namespace (its /proc/PID/ns/net is the namespace's own file, /run/netns/NAME: `ip netns exec`
// enters it before it becomes cat), and a read counts only if the anchor had not ended by its end
// (not reaped, so its process id was not another process's). Until then, and after, the caller
// reads by a command, as without an anchor.
import {spawn, type ChildProcess} from 'node:child_process';
import {stat} from 'node:fs/promises';
import {type ReadBuffer, readProcFile} from './proc-file.ts';

/** Where `ip netns add` mounts each namespace it names. */
const namedNamespaces = '/run/netns';

/** An anchor that ended is started again at most this often, so that one that cannot start costs no spawn per read. */
const restartAfterMs = 30_000;

export class NamespaceAnchor {
  readonly #netns: string;
  readonly #onCommand: ((command: string[]) => void) | undefined;
  #process: ChildProcess | undefined;
  #startedAt = -Infinity;
  /** The anchor was seen inside the namespace. */
  #entered = false;
  #closed = false;

  constructor(netns: string, onCommand?: (command: string[]) => void) {
    this.#netns = netns;
    this.#onCommand = onCommand;
  }

  /**
   * The namespace's /proc/net/NAME read as a file through the anchor; undefined when no anchor is
   * inside the namespace yet (it was just started) or can be kept there. Rejects as reading it does
   * when the file is not there (for ip_vs: IP_VS not loaded). `into` and `onRead`: as readProcFile's.
   */
  async readProcNet(name: string, into?: ReadBuffer, onRead?: (read: Buffer) => void): Promise<Buffer | undefined> {
    const anchor = await this.#inside();
    if (!anchor) return undefined;
    const alive = () => anchor.exitCode === null && anchor.signalCode === null;
    let text: Buffer;
    try {
      text = await readProcFile(`/proc/${anchor.pid}/net/${name}`, {
        into,
        // The anchor is reaped between bursts, if at all: bytes given while it lives are the namespace's.
        onRead: onRead && ((read) => alive() && onRead(read)),
      });
    } catch (error) {
      // Not there in the namespace (for ip_vs: IP_VS not loaded), or the anchor ended meanwhile.
      if (alive()) throw error;
      return undefined;
    }
    // Not reaped yet, the process id was still the anchor's: the text is the namespace's.
    return alive() ? text : undefined;
  }

  /** Ends the anchor for good (it also ends by itself when the agent does): reads then answer nothing. */
  close(): void {
    this.#closed = true;
    this.#process?.kill();
    this.#process = undefined;
  }

  /** The anchor, once it is inside the namespace (started when there is none); undefined until then. */
  async #inside(): Promise<ChildProcess | undefined> {
    const anchor = this.#process;
    // No process id: it could not be started (no `ip`), and is started again in time like one that ended.
    if (anchor?.pid !== undefined && anchor.exitCode === null && anchor.signalCode === null) {
      if (this.#entered) return anchor;
      // `ip netns exec` enters the namespace and then becomes cat: once inside, it stays.
      if (!(await inNamespace(anchor.pid, this.#netns)) || this.#process !== anchor) return undefined;
      this.#entered = true;
      return anchor;
    }
    if (!this.#closed && performance.now() - this.#startedAt >= restartAfterMs) this.#start();
    return undefined;
  }

  #start(): void {
    this.#startedAt = performance.now();
    this.#entered = false;
    const command = ['ip', 'netns', 'exec', this.#netns, 'cat'];
    this.#onCommand?.(command);
    const child = spawn(command[0], command.slice(1), {stdio: ['pipe', 'ignore', 'ignore']});
    child.once('error', () => {});
    // Neither the anchor nor its pipe keeps the agent running.
    child.unref();
    (child.stdin as unknown as {unref?: () => void} | null)?.unref?.();
    this.#process = child;
  }
}

/** True when the process is in the named namespace: its namespace file is the one `ip netns` mounted. */
async function inNamespace(pid: number, netns: string): Promise<boolean> {
  const [namespace, its] = await Promise.all([
    stat(`${namedNamespaces}/${netns}`).catch(() => undefined),
    stat(`/proc/${pid}/ns/net`).catch(() => undefined),
  ]);
  return namespace !== undefined && its !== undefined && namespace.dev === its.dev && namespace.ino === its.ino;
}
