// What `kubectl proxyctl lab up|down|status|exec` do: start the detached supervisor and wait for it,
// remove a lab from any shell (also one whose supervisor died), read a lab's live state, and run a
// command inside one of its namespaces.
import {type ChildProcess, fork, spawn} from 'node:child_process';
import {closeSync, openSync} from 'node:fs';
import {readdir, readFile, stat} from 'node:fs/promises';
import {constants} from 'node:os';
import {join} from 'node:path';
import {lastLines} from './agent-process.ts';
import {
  type LabSpec,
  type LabState,
  claimLabDir,
  checkLabName,
  LabError,
  labDir,
  labNamespacePrefix,
  labStateRoot,
  readLabState,
  removeLabDir,
} from './lab-state.ts';
import {checkNetnsSupport, deleteNamespacesWithPrefix, listNamespaces, NetnsUnavailableError} from './netns/index.ts';
import type {SupervisorMessage} from './supervisor.ts';
import {siblingProgram} from './workload/launch.ts';

export const proxyModes = ['iptables', 'nftables', 'ipvs'] as const;
// Each pod is a Node process of its own: the pod limit keeps a lab within one machine's memory
// (the figure: src/lab/README.md).
export const labLimits = {nodes: {min: 1, max: 20}, podsPerNode: {min: 0, max: 50}, pods: 200} as const;

export interface UpOptions {
  name: string;
  nodes: number;
  podsPerNode: number;
  proxyMode?: LabSpec['proxyMode'];
  agents?: boolean;
  /** An observing agent beside each node's agent, which stands in for kube-proxy (LabSpec.observe). */
  observe?: boolean;
  /** Each step as the supervisor finishes it (for stderr). */
  onProgress?: (text: string) => void;
  /** Aborting stops the supervisor, which removes what it built. */
  signal?: AbortSignal;
  /** Longest wait for the lab to be ready. Default 120 s. */
  timeoutMs?: number;
}

/** checkLabSpec refuses bad input before anything is made, naming the flag. */
export function checkLabSpec(options: Pick<UpOptions, 'name' | 'nodes' | 'podsPerNode' | 'proxyMode' | 'agents' | 'observe'>): LabSpec {
  checkLabName(options.name);
  const range = (flag: string, value: number, limits: {min: number; max: number}) => {
    if (!Number.isInteger(value) || value < limits.min || value > limits.max)
      throw new LabError(`--${flag} ${value}: must be a whole number from ${limits.min} to ${limits.max}`);
  };
  range('nodes', options.nodes, labLimits.nodes);
  range('pods-per-node', options.podsPerNode, labLimits.podsPerNode);
  if (options.nodes * options.podsPerNode > labLimits.pods) {
    throw new LabError(
      `--nodes ${options.nodes} x --pods-per-node ${options.podsPerNode}: at most ${labLimits.pods} pods in all (each runs its own demo server process)`,
    );
  }
  const proxyMode = options.proxyMode ?? 'iptables';
  if (!proxyModes.includes(proxyMode)) throw new LabError(`--proxy-mode ${proxyMode}: must be one of ${proxyModes.join(', ')}`);
  if (options.observe && options.agents === false)
    throw new LabError("--observe needs the agents: it runs an observer beside each node's agent");
  return {
    name: options.name,
    nodes: options.nodes,
    podsPerNode: options.podsPerNode,
    proxyMode,
    agents: options.agents ?? true,
    ...(options.observe && {observe: true}),
  };
}

/** needNetns turns "no root / no iproute2" into one LabError saying which command needs it. */
async function needNetns(command: string): Promise<void> {
  try {
    await checkNetnsSupport();
  } catch (error) {
    if (error instanceof NetnsUnavailableError) throw new LabError(`${command}: ${error.message}`);
    throw error;
  }
}

function processAlive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function commandLineOf(pid: number): Promise<string> {
  try {
    return (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0').join(' ');
  } catch {
    return '';
  }
}

/** isSupervisorOf: pid is alive and is lab NAME's supervisor (not a process that reused the pid). */
async function isSupervisorOf(pid: number | undefined, name: string): Promise<boolean> {
  if (!processAlive(pid)) return false;
  const command = await commandLineOf(pid!);
  return /supervisor\.(ts|js)/.test(command) && command.includes(`"name":"${name}"`);
}

/** runningLab: the state of lab NAME when its supervisor is alive; undefined when no such lab runs. */
export async function runningLab(name: string): Promise<LabState | undefined> {
  const state = await readLabState(name);
  if (state && (await isSupervisorOf(state.supervisorPid, name))) return state;
  return undefined;
}

/**
 * upLab builds lab NAME and resolves with its state once nodes, pods and agents are ready; the
 * supervisor keeps it running after this process exits. On any failure nothing is left behind.
 */
export async function upLab(options: UpOptions): Promise<LabState> {
  const spec = checkLabSpec(options);
  await needNetns('lab up');
  if (!(await claimLabDir(spec.name))) {
    const running = await runningLab(spec.name);
    if (!running && (await startingElsewhere(spec.name))) {
      throw new LabError(`lab ${spec.name} is being started from another shell; wait for it, or pick another --name`);
    }
    if (running) {
      throw new LabError(
        `lab ${spec.name} is already running (since ${running.startedAt}, ` +
          `kubeconfig ${running.kubeconfig}): use it, remove it with \`kubectl proxyctl lab down ` +
          `--name ${spec.name}\`, or pick another --name`,
      );
    }
    // A lab whose supervisor died: its remains are ours to clear.
    options.onProgress?.(`removing what an earlier lab ${spec.name} left behind`);
    await downLab(spec.name);
    if (!(await claimLabDir(spec.name))) throw new LabError(`lab ${spec.name} was started from another shell just now`);
  } else if ((await listNamespaces()).some((namespace) => namespace.startsWith(labNamespacePrefix(spec.name)))) {
    options.onProgress?.(`removing network namespaces an earlier lab ${spec.name} left behind`);
    await deleteNamespacesWithPrefix(labNamespacePrefix(spec.name));
  }

  const dir = labDir(spec.name);
  const log = openSync(join(dir, 'supervisor.log'), 'a', 0o600);
  let child: ChildProcess;
  try {
    child = fork(siblingProgram('supervisor', import.meta.url), ['--spec', JSON.stringify(spec)], {
      detached: true,
      stdio: ['ignore', log, log, 'ipc'],
      execPath: process.execPath,
      cwd: '/',
      // Not the caller's flags (a test runner's, say): the supervisor outlives the caller.
      execArgv: [],
    });
  } catch (error) {
    closeSync(log);
    await removeLabDir(spec.name);
    throw error;
  }
  // The child holds its own copy.
  closeSync(log);

  try {
    const state = await waitForSupervisor(child, spec, options);
    if (child.connected) child.disconnect();
    child.unref();
    return state;
  } catch (error) {
    await stopSupervisor(child);
    await downLab(spec.name).catch(() => undefined);
    throw error;
  }
}

// Between the directory's creation and the supervisor's first state.json lie a few hundred ms.
async function startingElsewhere(name: string): Promise<boolean> {
  if (await readLabState(name).catch(() => undefined)) return false;
  const created = await stat(labDir(name)).then(
    (info) => info.ctimeMs,
    () => 0,
  );
  return Date.now() - created < 10_000;
}

function waitForSupervisor(child: ChildProcess, spec: LabSpec, options: UpOptions): Promise<LabState> {
  const timeoutMs = options.timeoutMs ?? 120_000;
  return new Promise((resolve, reject) => {
    const finish = (error: Error | undefined, state?: LabState) => {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', onAbort);
      child.removeAllListeners('message');
      child.removeAllListeners('exit');
      if (error) reject(error);
      else resolve(state!);
    };
    const onAbort = () => finish(new LabError(`lab up ${spec.name} interrupted; what it had made is removed`, {exitCode: 130}));
    const timer = setTimeout(
      () =>
        finish(
          new LabError(
            `lab ${spec.name} was not ready after ${timeoutMs / 1000} s; its log ends:\n${lastLines(join(labDir(spec.name), 'supervisor.log'))}`,
          ),
        ),
      timeoutMs,
    );
    options.signal?.addEventListener('abort', onAbort, {once: true});
    if (options.signal?.aborted) onAbort();
    child.on('message', (message: SupervisorMessage) => {
      if (message.type === 'progress') options.onProgress?.(message.text);
      else if (message.type === 'ready') finish(undefined, message.state);
      else if (message.type === 'failed')
        finish(new LabError(`lab up ${spec.name} failed, and what it had made is removed: ${message.message}`));
    });
    child.on('exit', (code, signal) => {
      const log = lastLines(join(labDir(spec.name), 'supervisor.log'), 10);
      finish(
        new LabError(
          `lab ${spec.name}: its ` +
            `supervisor ${signal ? `was killed by ${signal}` : `exited with code ${code}`} before the lab was ready${log ? `; its log ends:\n${log}` : ''}`,
        ),
      );
    });
  });
}

async function waitForExit(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (processAlive(pid)) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return true;
}

async function stopSupervisor(child: ChildProcess): Promise<void> {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  if (!(await waitForExit(child.pid, 20_000))) child.kill('SIGKILL');
}

export interface DownResult {
  /** False when there was no lab of that name (nothing to do). */
  removed: boolean;
  namespaces: number;
  processes: number;
}

/** processesMentioning lists live processes whose command line contains text (the lab's agents). */
async function processesMentioning(text: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    if ((await commandLineOf(pid)).includes(text)) pids.push(pid);
  }
  return pids;
}

/**
 * downLab removes lab NAME: asks its supervisor to tear down, then removes whatever is still
 * there (the supervisor may have died): processes, network namespaces, the state directory.
 * Running it again, or for a lab that does not exist, does nothing.
 */
export async function downLab(name: string): Promise<DownResult> {
  checkLabName(name);
  await needNetns('lab down');
  const prefix = labNamespacePrefix(name);
  let state: LabState | undefined;
  try {
    state = await readLabState(name);
  } catch {
    // An unreadable state file is removed with the rest.
  }
  const dirExists = await stat(labDir(name)).then(
    () => true,
    () => false,
  );
  const namespacesBefore = (await listNamespaces()).filter((namespace) => namespace.startsWith(prefix));
  let processes = 0;
  if (state && (await isSupervisorOf(state.supervisorPid, name))) {
    process.kill(state.supervisorPid, 'SIGTERM');
    processes++;
    if (!(await waitForExit(state.supervisorPid, 20_000))) process.kill(state.supervisorPid, 'SIGKILL');
  }
  // Agents live in the host's namespace; their command line names their node's namespace.
  const leftovers = await processesMentioning(prefix);
  for (const pid of leftovers) {
    try {
      process.kill(pid, 'SIGKILL');
      processes++;
    } catch {
      // gone meanwhile
    }
  }
  const removedNamespaces = await deleteNamespacesWithPrefix(prefix);
  await removeLabDir(name);
  const namespaces = new Set([...namespacesBefore, ...removedNamespaces]).size;
  return {removed: Boolean(state) || dirExists || namespaces > 0 || processes > 0, namespaces, processes};
}

/** labNames lists the labs that have a state directory. */
export async function labNames(): Promise<string[]> {
  try {
    return (await readdir(labStateRoot(), {withFileTypes: true}))
      .filter((entry) => entry.isDirectory())
      .map((entry) => entry.name)
      .sort();
  } catch {
    return [];
  }
}

/** ExecTarget: the namespace a `lab exec` target names. */
export interface ExecTarget {
  kind: 'node' | 'pod' | 'external client' | 'upstream' | 'network';
  name: string;
  namespace: string;
}

/** execTargets lists everything `lab exec` accepts in a lab. */
export function execTargets(state: LabState): ExecTarget[] {
  const topology = state.topology;
  if (!topology) return [];
  return [
    ...topology.nodes.map((node): ExecTarget => ({kind: 'node', name: node.name, namespace: node.namespace})),
    ...topology.nodes.flatMap((node) => node.pods.map((pod): ExecTarget => ({kind: 'pod', name: pod.name, namespace: pod.namespace}))),
    // Pods created through the API, in the namespaces their kubelets made.
    ...Object.entries(state.podNamespaces ?? {}).map(([pod, namespace]): ExecTarget => ({kind: 'pod', name: pod, namespace})),
    // An agent's pod is on its node's network (hostNetwork): its namespace is the node's.
    ...state.agents.map((agent): ExecTarget => ({kind: 'node', name: agent.pod, namespace: agent.namespace})),
    ...topology.externalClients.map((client): ExecTarget => ({kind: 'external client', name: client.name, namespace: client.namespace})),
    ...(topology.upstream ? [{kind: 'upstream', name: 'upstream', namespace: topology.upstream.namespace} as ExecTarget] : []),
    {kind: 'network', name: 'network', namespace: topology.network.namespace},
  ];
}

/** resolveExecTarget finds a node, pod or client by name ("client" is the first external client; "default/pod-0-0" works too). */
export function resolveExecTarget(state: LabState, target: string): ExecTarget {
  const targets = execTargets(state);
  const wanted = target === 'client' ? 'client-0' : target.replace(/^(default|kube-system)\//, '');
  const found = targets.find((candidate) => candidate.name === wanted || candidate.namespace === target);
  if (found) return found;
  const names = targets
    .filter((candidate) => candidate.kind !== 'network' && !candidate.name.startsWith('proxyctl-agent-'))
    .map((candidate) => candidate.name);
  const shown = names.length > 12 ? `${names.slice(0, 12).join(', ')}, ... (${names.length} in all)` : names.join(', ');
  throw new LabError(`lab ${state.spec.name} has no node, pod or client named ${JSON.stringify(target)}; try one of: ${shown}`);
}

/** requireLab: the running lab NAME, or a LabError saying how to start one. */
export async function requireLab(name: string): Promise<LabState> {
  checkLabName(name);
  const state = await runningLab(name);
  if (state) return state;
  const stale = await readLabState(name).catch(() => undefined);
  if (stale)
    throw new LabError(
      `lab ${name} is not running (its supervisor ${stale.supervisorPid} is gone); clear its remains with \`kubectl proxyctl lab down --name ${name}\``,
    );
  const others = (await labNames()).filter((other) => other !== name);
  const elsewhere = others.length > 0 ? ` (labs here: ${others.join(', ')}; pick one with --name)` : '';
  throw new LabError(
    `no lab named ${name} is running; start one with \`kubectl proxyctl lab up${name === 'proxyctl' ? '' : ` --name ${name}`}\`${elsewhere}`,
  );
}

/**
 * execInLab runs command inside the target's namespace with this process's stdio and resolves
 * with its exit code (128 + signal number when a signal ended it).
 */
export async function execInLab(name: string, target: string, command: string[]): Promise<number> {
  if (command.length === 0) throw new LabError('lab exec: give a command after --, e.g. `kubectl proxyctl lab exec pod-0-0 -- ip address`');
  await needNetns('lab exec');
  const state = await requireLab(name);
  const resolved = resolveExecTarget(state, target);
  const child = spawn('ip', ['netns', 'exec', resolved.namespace, ...command], {stdio: 'inherit'});
  // Ctrl-C reaches the command (same terminal); it decides, and its exit code is ours.
  const ignore = () => undefined;
  process.on('SIGINT', ignore);
  try {
    return await new Promise((resolve, reject) => {
      child.once('error', (error) => reject(new LabError(`lab exec: cannot run ip netns exec: ${error.message}`)));
      child.once('exit', (code, signal) => resolve(code ?? 128 + (signal ? constants.signals[signal] : 0)));
    });
  } finally {
    process.off('SIGINT', ignore);
  }
}
