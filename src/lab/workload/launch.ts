// Starting the demo server inside pod namespaces and running the demo client from any namespace,
// each as its own Node process (a process lives in one network namespace).
import {fileURLToPath} from 'node:url';
import {execInNamespace, spawnInNamespace} from '../netns/index.ts';
import type {ProbeResult, ProbeTarget} from './demoapp-client.ts';

/**
 * siblingProgram is the path of a program beside the module at base (this one by default), with
 * that module's extension: .ts when run from source, .js when built into dist/.
 */
export function siblingProgram(name: string, base: string = import.meta.url): string {
  const extension = base.endsWith('.ts') ? '.ts' : '.js';
  return fileURLToPath(new URL(`./${name}${extension}`, base));
}

export interface DemoAppSpec {
  namespace: string;
  /** The pod name the server reports. */
  name: string;
  httpPort: number;
  udpPort: number;
}

export interface RunningDemoApp extends DemoAppSpec {
  pid: number;
  /** stop ends the process (SIGTERM, then SIGKILL after a second) and waits for it. */
  stop(): Promise<void>;
}

/** startDemoApp runs demoapp.ts in the namespace and resolves once it listens. */
export async function startDemoApp(spec: DemoAppSpec, options: {startTimeoutMs?: number} = {}): Promise<RunningDemoApp> {
  const command = [
    process.execPath,
    siblingProgram('demoapp'),
    '--name',
    spec.name,
    '--http-port',
    String(spec.httpPort),
    '--udp-port',
    String(spec.udpPort),
  ];
  const child = spawnInNamespace(spec.namespace, command);
  const pid = child.pid;
  const what = `demo app ${spec.name} in ${spec.namespace}`;
  if (pid === undefined) throw new Error(`${what}: could not start ${process.execPath}`);
  let running = true;
  const exited = child.then((result) => {
    running = false;
    return result;
  });

  const stop = async () => {
    if (!running) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 1000);
    await exited;
    clearTimeout(timer);
  };

  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => (stderr = (stderr + chunk).slice(-2000)));
  try {
    await new Promise<void>((resolve, reject) => {
      let stdout = '';
      const timer = setTimeout(
        () => reject(new Error(`${what}: not listening after ${options.startTimeoutMs ?? 10000} ms`)),
        options.startTimeoutMs ?? 10000,
      );
      child.stdout?.setEncoding('utf8');
      child.stdout?.on('data', (chunk: string) => {
        stdout += chunk;
        if (stdout.includes('"ready":true')) {
          clearTimeout(timer);
          resolve();
        }
      });
      void exited.then((result) => {
        clearTimeout(timer);
        reject(new Error(`${what}: exited (${result.exitCode ?? result.signal}) before listening: ${stderr.trim() || 'no error output'}`));
      });
    });
  } catch (error) {
    await stop();
    throw error;
  }
  return {...spec, pid, stop};
}

/** DemoAppGroup starts demo servers and stops them all, also from a signal handler. */
export class DemoAppGroup {
  readonly apps: RunningDemoApp[] = [];

  async start(specs: DemoAppSpec[], options: {startTimeoutMs?: number} = {}): Promise<RunningDemoApp[]> {
    const started = await Promise.allSettled(specs.map((spec) => startDemoApp(spec, options)));
    for (const result of started) if (result.status === 'fulfilled') this.apps.push(result.value);
    const failed = started.find((result) => result.status === 'rejected');
    if (failed) throw failed.reason;
    return started.map((result) => (result as PromiseFulfilledResult<RunningDemoApp>).value);
  }

  async stopAll(): Promise<void> {
    const apps = this.apps.splice(0);
    await Promise.all(apps.map((app) => app.stop()));
  }

  /** killAllNow sends SIGKILL to every server at once, for exit and signal handlers that cannot wait. */
  killAllNow(): void {
    for (const app of this.apps.splice(0)) {
      try {
        process.kill(app.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}

/**
 * probeFromNamespace runs demoapp-client.ts inside the namespace and returns one ProbeResult per
 * request, made one after the other. startTimeoutMs bounds the client's Node start (default 10 s):
 * an emulated machine needs more.
 */
export async function probeFromNamespace(
  namespace: string,
  target: ProbeTarget,
  count = 1,
  {startTimeoutMs = 10_000}: {startTimeoutMs?: number} = {},
): Promise<ProbeResult[]> {
  const command = [
    process.execPath,
    siblingProgram('demoapp-client'),
    '--protocol',
    target.protocol,
    '--host',
    target.host,
    '--port',
    String(target.port),
    '--count',
    String(count),
  ];
  if (target.timeoutMs !== undefined) command.push('--timeout-ms', String(target.timeoutMs));
  if (target.sourceIP !== undefined) command.push('--source', target.sourceIP);
  // The client bounds each request by its own timeout; this bound only catches a hung process.
  const limit = startTimeoutMs + count * ((target.timeoutMs ?? 1000) + 200);
  const {stdout} = await execInNamespace(namespace, command, {timeoutMs: limit});
  return JSON.parse(stdout) as ProbeResult[];
}

/** A demo client that stays running in a namespace and sends each probe it is given (openProber). */
export interface NamespaceProber {
  probe(target: ProbeTarget): Promise<ProbeResult>;
  close(): Promise<void>;
}

/**
 * openProber starts demoapp-client.ts --serve inside the namespace: one Node process for all the
 * probes sent from there, where probeFromNamespace starts one per call.
 */
export function openProber(namespace: string): NamespaceProber {
  const child = spawnInNamespace(namespace, [process.execPath, siblingProgram('demoapp-client'), '--serve'], {stdin: 'pipe'});
  const waiting = new Map<number, {resolve(result: ProbeResult): void; reject(error: Error): void}>();
  let nextId = 0;
  let stderr = '';
  let ended: Error | undefined;
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString('utf8');
  });
  let pending = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    pending += chunk.toString('utf8');
    for (let end = pending.indexOf('\n'); end >= 0; end = pending.indexOf('\n')) {
      const line = pending.slice(0, end);
      pending = pending.slice(end + 1);
      const answer = JSON.parse(line) as {id: number; result?: ProbeResult; error?: string};
      const waiter = waiting.get(answer.id);
      waiting.delete(answer.id);
      if (answer.result) waiter?.resolve(answer.result);
      else waiter?.reject(new Error(`demo client in ${namespace}: ${answer.error}`));
    }
  });
  void child.then((result) => {
    ended = new Error(`demo client in ${namespace} ended (exit ${result.exitCode ?? result.signal}): ${stderr.trim() || 'no message'}`);
    for (const waiter of waiting.values()) waiter.reject(ended);
    waiting.clear();
  });
  return {
    probe(target) {
      if (ended) return Promise.reject(ended);
      const id = nextId++;
      return new Promise<ProbeResult>((resolve, reject) => {
        waiting.set(id, {resolve, reject});
        child.stdin?.write(`${JSON.stringify({id, target})}\n`);
      });
    },
    async close() {
      child.stdin?.end();
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await child;
      clearTimeout(timer);
    },
  };
}

/**
 * NamespaceProbers: one demo client (openProber) per namespace sent from, kept until closeAll, for
 * callers that send many probes over a cluster's life.
 */
export class NamespaceProbers {
  readonly #probers = new Map<string, NamespaceProber>();

  in(namespace: string): NamespaceProber {
    let prober = this.#probers.get(namespace);
    if (!prober) this.#probers.set(namespace, (prober = openProber(namespace)));
    return prober;
  }

  /** probe makes `count` requests from the namespace, one after the other, as probeFromNamespace does. */
  async probe(namespace: string, target: ProbeTarget, count = 1): Promise<ProbeResult[]> {
    const prober = this.in(namespace);
    const results: ProbeResult[] = [];
    for (let i = 0; i < count; i++) results.push(await prober.probe(target));
    return results;
  }

  async closeAll(): Promise<void> {
    const probers = [...this.#probers.values()];
    this.#probers.clear();
    await Promise.all(probers.map((prober) => prober.close()));
  }
}
