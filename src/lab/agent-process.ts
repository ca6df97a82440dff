// One node's proxyctl-agent as a process on the host: its rules go into the node's namespace
// (--netns), its health, metrics and API servers onto per-node loopback ports. Restarted after it
// dies, as the kubelet restarts a DaemonSet pod's container, with a growing delay.
import {type ChildProcess, spawn} from 'node:child_process';
import {closeSync, openSync, readFileSync} from 'node:fs';
import {createServer} from 'node:net';
import {fileURLToPath} from 'node:url';
import type {AgentState, LabSpec} from './lab-state.ts';
import {siblingProgram} from './workload/launch.ts';

export interface AgentProcessOptions {
  state: AgentState;
  kubeconfig: string;
  /** What the agent proxies with. */
  settings: {clusterCIDR: string; proxyMode: LabSpec['proxyMode']};
  /** Flags after the lab's own (--observe for an observing agent). */
  extraArgs?: string[];
  /** Told whenever the process starts, syncs for the first time, or exits. */
  onChange: (agent: AgentProcess) => void;
}

/** freeLoopbackPorts returns count distinct ports that were free on 127.0.0.1 a moment ago. */
export async function freeLoopbackPorts(count: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      {length: count},
      () =>
        new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
          const server = createServer();
          server.once('error', reject);
          server.listen(0, '127.0.0.1', () => resolve(server));
        }),
    ),
  );
  const ports = servers.map((server) => (server.address() as {port: number}).port);
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  return ports;
}

/**
 * How a lab node starts its agent. From the build (dist/src/lab), as the image does:
 * bin/proxyctl-agent, which runs dist/src/agent/main.js with the agent's Node flags (memory
 * settings, the tree-shaken client-node). From source (src/lab), Node runs src/agent/main.ts.
 */
export function agentCommand(): string[] {
  const program = siblingProgram('../agent/main', import.meta.url);
  if (program.endsWith('.ts')) return [process.execPath, program];
  return [fileURLToPath(new URL('../../../bin/proxyctl-agent', import.meta.url))];
}

/**
 * agentHasSynced: whether the agent whose healthz server is on this loopback port has synced (or,
 * observing, read the node) once: its /healthz has a lastUpdated. Its status code cannot say it:
 * as kube-proxy's, it is 200 while the agent starts.
 */
export async function agentHasSynced(healthzPort: number): Promise<boolean> {
  try {
    const response = await fetch(`http://127.0.0.1:${healthzPort}/healthz`, {signal: AbortSignal.timeout(1000)});
    return Boolean(((await response.json()) as {lastUpdated?: string}).lastUpdated);
  } catch {
    return false;
  }
}

/** lastLines returns the end of a log file, for error messages. */
export function lastLines(path: string, count = 5): string {
  try {
    const lines = readFileSync(path, 'utf8').trimEnd().split('\n');
    return lines.slice(-count).join('\n');
  } catch {
    return '';
  }
}

export class AgentProcess {
  readonly state: AgentState;
  readonly #options: AgentProcessOptions;
  #child: ChildProcess | undefined;
  #synced = false;
  #stopping = false;
  #restartTimer: NodeJS.Timeout | undefined;
  #poll: NodeJS.Timeout | undefined;
  #exitWaiters: Array<(reason: string) => void> = [];

  constructor(options: AgentProcessOptions) {
    this.#options = options;
    this.state = options.state;
  }

  get synced(): boolean {
    return this.#synced;
  }

  get running(): boolean {
    return this.#child !== undefined;
  }

  commandLine(): string[] {
    const {state} = this;
    return [
      ...agentCommand(),
      '--netns',
      state.namespace,
      '--hostname-override',
      state.node,
      '--kubeconfig',
      this.#options.kubeconfig,
      '--cluster-cidr',
      this.#options.settings.clusterCIDR,
      '--proxy-mode',
      this.#options.settings.proxyMode,
      '--healthz-bind-address',
      `127.0.0.1:${state.healthzPort}`,
      '--metrics-bind-address',
      `127.0.0.1:${state.metricsPort}`,
      '--api-bind-address',
      `127.0.0.1:${state.apiPort}`,
      '--v',
      '1',
      ...(this.#options.extraArgs ?? []),
    ];
  }

  start(): void {
    const [program, ...args] = this.commandLine();
    const log = openSync(this.state.log, 'a');
    let child: ChildProcess;
    try {
      child = spawn(program, args, {stdio: ['ignore', log, log]});
    } finally {
      closeSync(log);
    }
    this.#child = child;
    this.#synced = false;
    this.state.pid = child.pid;
    child.once('exit', (code, signal) => this.#exited(child, code, signal));
    // A process that could not start at all is reported like one that exited at once.
    child.once('error', () => this.#exited(child, 127, null));
    this.#options.onChange(this);
    this.#pollHealth();
  }

  /** waitSynced resolves once the agent has written its rules once; rejects if it exits first. */
  waitSynced(timeoutMs: number): Promise<void> {
    if (this.#synced) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        done();
        reject(
          new Error(
            `agent on ${this.state.node} has not synced its rules after ${timeoutMs / 1000} s; its log ${this.state.log} ends:\n${lastLines(this.state.log)}`,
          ),
        );
      }, timeoutMs);
      const check = setInterval(() => {
        if (this.#synced) {
          done();
          resolve();
        }
      }, 50);
      const onExit = (reason: string) => {
        done();
        reject(
          new Error(
            `agent on ${this.state.node} ${reason} before its first sync; its log ${this.state.log} ends:\n${lastLines(this.state.log)}`,
          ),
        );
      };
      const done = () => {
        clearTimeout(timer);
        clearInterval(check);
        this.#exitWaiters = this.#exitWaiters.filter((waiter) => waiter !== onExit);
      };
      this.#exitWaiters.push(onExit);
    });
  }

  #pollHealth(): void {
    clearTimeout(this.#poll);
    const child = this.#child;
    if (!child || this.#synced) return;
    void agentHasSynced(this.state.healthzPort).then((synced) => {
      if (this.#child !== child) return;
      if (synced) {
        this.#synced = true;
        this.#options.onChange(this);
      } else {
        this.#poll = setTimeout(() => this.#pollHealth(), 100);
      }
    });
  }

  #exited(child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (this.#child !== child) return;
    this.#child = undefined;
    this.#synced = false;
    this.state.pid = undefined;
    clearTimeout(this.#poll);
    const reason = signal ? `was killed by ${signal}` : `exited with code ${code}`;
    for (const waiter of this.#exitWaiters.splice(0)) waiter(reason);
    this.#options.onChange(this);
    if (this.#stopping) return;
    this.state.restarts++;
    const delay = Math.min(10_000, 1000 * 2 ** Math.min(this.state.restarts - 1, 4));
    this.#restartTimer = setTimeout(() => {
      if (!this.#stopping) this.start();
    }, delay);
  }

  /** stop ends the agent (SIGTERM, which leaves its rules; SIGKILL after 3 s) and keeps it stopped. */
  async stop(): Promise<void> {
    this.#stopping = true;
    clearTimeout(this.#restartTimer);
    clearTimeout(this.#poll);
    const child = this.#child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
    await exited;
    clearTimeout(timer);
  }

  /** restart stops the agent, runs between (e.g. replacing its Pod), and starts it as new: no restarts counted. */
  async restart(between: () => void = () => undefined): Promise<void> {
    await this.stop();
    between();
    this.#stopping = false;
    this.state.restarts = 0;
    this.start();
  }

  /** killNow sends SIGKILL, for exit paths that cannot wait. */
  killNow(): void {
    this.#stopping = true;
    clearTimeout(this.#restartTimer);
    this.#child?.kill('SIGKILL');
  }
}
