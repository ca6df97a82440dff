// Where a running lab is recorded: /run/proxyctl-lab/NAME/ holds state.json (pids, namespaces,
// ports, kubeconfig path), the kubeconfig and the logs, so that any shell can inspect or remove it.
import {mkdir, readFile, rename, rm, writeFile} from 'node:fs/promises';
import {join} from 'node:path';
import type {ClusterTopology} from './netns/index.ts';

/** The directory holding one directory per lab; PROXYCTL_LAB_DIR moves it (e.g. for a second checkout). */
export function labStateRoot(): string {
  return process.env.PROXYCTL_LAB_DIR || '/run/proxyctl-lab';
}

export const defaultLabName = 'proxyctl';

// A DNS label short enough that "pxl-NAME." plus "pod-79-239" stays a readable namespace name.
// No '.': the dot ends the name in the namespace prefix, so that lab "a" never owns lab "a-b"'s namespaces.
const labNamePattern = /^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$/;

/** checkLabName throws a message naming the flag when NAME cannot be a lab name. */
export function checkLabName(name: string): string {
  if (!labNamePattern.test(name)) {
    throw new LabError(
      `--name ${JSON.stringify(name)}: a lab name is 1-32 lowercase letters, digits or '-', starting and ending with a letter or digit`,
    );
  }
  return name;
}

/** labNamespacePrefix is the start of every network namespace of lab NAME, and of no other lab's. */
export function labNamespacePrefix(name: string): string {
  return `pxl-${checkLabName(name)}.`;
}

/** The kubeconfig's cluster name of lab NAME; its context and user are admin@ that. One per lab, so kubeconfigs merge. */
export function labClusterName(name: string): string {
  return `${labClusterPrefix}${checkLabName(name)}`;
}

const labClusterPrefix = 'proxyctl-lab-';

/** The lab a kubeconfig cluster name belongs to, if it is a lab's. */
export function labNameOfCluster(cluster: string): string | undefined {
  const name = cluster.startsWith(labClusterPrefix) ? cluster.slice(labClusterPrefix.length) : '';
  return labNamePattern.test(name) ? name : undefined;
}

export function labContextName(name: string): string {
  return `admin@${labClusterName(name)}`;
}

export function labDir(name: string): string {
  return join(labStateRoot(), checkLabName(name));
}

export function labStatePath(name: string): string {
  return join(labDir(name), 'state.json');
}

/** LabError: a failure the user can act on; the CLI prints its message alone. */
export class LabError extends Error {
  override name = 'LabError';
  /** Process exit code for the CLI. */
  readonly exitCode: number;
  constructor(message: string, options: {exitCode?: number; cause?: unknown} = {}) {
    super(message, {cause: options.cause});
    this.exitCode = options.exitCode ?? 1;
  }
}

export type LabPhase = 'starting' | 'ready' | 'failed' | 'stopping';

/** AgentState: one node's agent process and the loopback ports it serves on. */
export interface AgentState {
  node: string;
  /** The node's network namespace, where the agent writes its rules. */
  namespace: string;
  pid?: number;
  /** The Pod registered for it in kube-system. */
  pod: string;
  healthzPort: number;
  metricsPort: number;
  apiPort: number;
  log: string;
  restarts: number;
}

/** LabSpec: what `lab up` was asked to build. */
export interface LabSpec {
  name: string;
  nodes: number;
  podsPerNode: number;
  proxyMode: 'iptables' | 'nftables' | 'ipvs';
  /** Start one agent per node (default true). */
  agents: boolean;
  /**
   * Each node's agent is an observer (proxyctl-agent --observe) beside a proxying agent that
   * stands in for kube-proxy; the plugin's commands go to the observers.
   */
  observe?: boolean;
}

export interface LabState {
  spec: LabSpec;
  phase: LabPhase;
  /** What failed, when phase is failed. */
  error?: string;
  /** The supervisor: hosts the API server, starts the workloads and the agents, tears down on SIGTERM. */
  supervisorPid: number;
  startedAt: string;
  readyAt?: string;
  prefix: string;
  dir: string;
  kubeconfig: string;
  supervisorLog: string;
  apiServer?: {url: string; port: number};
  topology?: ClusterTopology;
  agents: AgentState[];
  /** With spec.observe: the proxying agents that stand in for kube-proxy, one per node (the pods of the DaemonSet kube-system/kube-proxy). */
  standIns?: AgentState[];
  /** Demo server processes, by pod ("NAME" in default, else "NAMESPACE/NAME"). */
  workloads: Record<string, number>;
  /** Network namespaces the kubelets made for pods created through the API, by pod as workloads names them (for `lab exec`). */
  podNamespaces?: Record<string, string>;
  /** Milliseconds from the supervisor's start to each step, for `lab status` and the bench. */
  timings: Record<string, number>;
}

export async function readLabState(name: string): Promise<LabState | undefined> {
  let text: string;
  try {
    text = await readFile(labStatePath(name), 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
  try {
    return JSON.parse(text) as LabState;
  } catch (error) {
    throw new LabError(
      `lab ${name}: ${labStatePath(name)} is not valid JSON (${(error as Error).message}); \`kubectl proxyctl lab down --name ${name}\` removes the lab anyway`,
    );
  }
}

/** writeLabState replaces state.json atomically, so a reader never sees half a file. */
export async function writeLabState(state: LabState): Promise<void> {
  const path = labStatePath(state.spec.name);
  const temporary = `${path}.${process.pid}.tmp`;
  await writeFile(temporary, `${JSON.stringify(state, null, 2)}\n`, {mode: 0o600});
  await rename(temporary, path);
}

/**
 * claimLabDir creates the lab's directory; its creation is the lock that makes a second `lab up`
 * of the same name fail. Resolves false when it exists already.
 */
export async function claimLabDir(name: string): Promise<boolean> {
  await mkdir(labStateRoot(), {recursive: true, mode: 0o755});
  try {
    await mkdir(labDir(name), {mode: 0o700});
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw error;
  }
}

export async function removeLabDir(name: string): Promise<void> {
  await rm(labDir(name), {recursive: true, force: true});
}
