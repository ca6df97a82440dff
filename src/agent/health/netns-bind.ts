// bindInNetns: a listening TCP socket inside another network namespace, for a process that stays
// in its own. Node cannot setns(2), so a short-lived child made by `ip netns exec` binds the
// socket there and passes it back over IPC (netns-binder.ts). With --netns the agent opens its
// healthCheckNodePort listeners this way: they answer on the node's addresses, as kube-proxy's do.
import {spawn} from 'node:child_process';
import type {Server} from 'node:net';
import {fileURLToPath} from 'node:url';

const binder = fileURLToPath(new URL(`./netns-binder${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url));

/** BindError carries the errno code of the failed listen (EADDRINUSE, EAFNOSUPPORT, ...) when there is one. */
export class BindError extends Error {
  override name = 'BindError';
  readonly code: string | undefined;
  constructor(message: string, code?: string) {
    super(message);
    this.code = code;
  }
}

/**
 * bindInNetns resolves with a listening server whose socket lives in network namespace `netns`;
 * pass it to `http.Server.listen(server)` to serve on it. Rejects with a BindError naming the
 * namespace, address and cause.
 */
export function bindInNetns(netns: string, host: string, port: number, timeoutMs = 10_000): Promise<Server> {
  const where = `listen on ${host.includes(':') ? `[${host}]` : host}:${port} in network namespace ${netns}`;
  const child = spawn('ip', ['netns', 'exec', netns, process.execPath, binder, host, String(port)], {
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  return new Promise((resolve, reject) => {
    let stderr = '';
    const fail = (error: BindError) => {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(error);
    };
    const timer = setTimeout(() => fail(new BindError(`${where}: no answer from the binder within ${timeoutMs} ms`)), timeoutMs);
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
    });
    child.once('error', (error: NodeJS.ErrnoException) =>
      fail(new BindError(`${where}: cannot run ip netns exec: ${error.message}`, error.code)),
    );
    child.once('message', (message: {listening?: boolean; error?: {code: string; message: string}}, handle: unknown) => {
      if (message.listening && handle) {
        clearTimeout(timer);
        child.removeAllListeners('exit');
        resolve(handle as Server);
      } else {
        fail(new BindError(`${where}: ${message.error?.message ?? 'the binder sent no socket'}`, message.error?.code));
      }
    });
    child.once('exit', (code, signal) =>
      fail(new BindError(`${where}: ${stderr.trim() || `the binder ended (${signal ?? `exit ${code}`}) without a socket`}`)),
    );
  });
}
