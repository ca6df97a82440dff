// How long the kubectl plugin takes as a new process, as a user runs it: `kubectl proxyctl ...`
// (bin/ on PATH; bin/kubectl-proxyctl alone when kubectl is not installed), against a two-node lab
// (the lab's demo services and pods, one agent per node, the lab's plain-HTTP API server).
// Floors: kubectl running a plugin that does nothing (a shell script; without kubectl, `node -e 0`)
// for the commands that ask nothing of the cluster, and `kubectl get svc` against the same API
// server for those that ask the API server and agents. `node -e 0` is printed too: the part of any
// figure that is Node's own start.
// The same status and trace also run inside this process once loaded: what is left when process
// start and module loading are taken away (the API server, the port-forwards and the agents).
import {execFile, execFileSync} from 'node:child_process';
import {chmodSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {promisify} from 'node:util';
import Status from '../src/plugin/commands/status.ts';
import Trace from '../src/plugin/commands/trace.ts';
import {downLab, upLab} from '../src/lab/lab-control.ts';
import {runQuietly} from './lab-trace.ts';
import {figure, heading, percentile, skipped, timed} from './report.ts';

const execFileAsync = promisify(execFile);
const isRoot = process.getuid?.() === 0;
const projectRoot = fileURLToPath(new URL('..', import.meta.url));
const runs = 11;
const goals = {version: 150, status: 400, trace: 400};

function hasKubectl(): boolean {
  try {
    execFileSync('kubectl', ['version', '--client'], {stdio: 'ignore'});
    return true;
  } catch {
    return false;
  }
}

/** median runs `argv` as a new process `runs` times (after one run that warms the disk cache) and returns the median and the fastest, in ms. */
export async function median(argv: string[], env: NodeJS.ProcessEnv): Promise<{p50: number; min: number}> {
  const times: number[] = [];
  for (let i = 0; i <= runs; i++) {
    const run = await timed(() => execFileAsync(argv[0], argv.slice(1), {env, maxBuffer: 16 << 20}));
    if (i > 0) times.push(run.ms);
  }
  times.sort((a, b) => a - b);
  return {p50: percentile(times, 50), min: times[0]};
}

/** kubectl's own share of `kubectl proxyctl ...`: kubectl finding and starting a plugin that does nothing. Prints it and returns it as a floor. */
export async function kubectlPluginFloor(env: NodeJS.ProcessEnv): Promise<{name: string; p50: number; min: number}> {
  const noopDir = mkdtempSync(join(tmpdir(), 'proxyctl-bench-'));
  writeFileSync(join(noopDir, 'kubectl-proxyctlbenchnoop'), '#!/bin/sh\nexit 0\n');
  chmodSync(join(noopDir, 'kubectl-proxyctlbenchnoop'), 0o755);
  try {
    const floor = await median(['kubectl', 'proxyctlbenchnoop'], {...env, PATH: `${noopDir}:${env.PATH}`});
    figure({
      name: 'kubectl proxyctlbenchnoop (a shell script)',
      value: floor.p50,
      unit: 'ms',
      note: `min ${floor.min.toFixed(0)} ms: kubectl finding and starting a plugin`,
    });
    return {name: 'kubectl + a no-op plugin', ...floor};
  } finally {
    rmSync(noopDir, {recursive: true, force: true});
  }
}

export async function benchPlugin(): Promise<void> {
  const kubectl = hasKubectl();
  const plugin = kubectl ? ['kubectl', 'proxyctl'] : [`${projectRoot}bin/kubectl-proxyctl`];
  heading(
    'kubectl plugin start, as a new process',
    `${plugin.join(' ')} --version / --help, status (2 agents) and trace demoapp --node node-1 against a two-node lab (3 demo pods per node, the lab API server over HTTPS as kubectl reaches it); p50 of ${runs} runs after one warm-up`,
  );
  const env = {...process.env, PATH: `${projectRoot}bin:${process.env.PATH}`, NO_COLOR: '1'};
  const node = await median([process.execPath, '-e', '0'], env);
  figure({name: 'node -e 0', value: node.p50, unit: 'ms', note: `min ${node.min.toFixed(0)} ms`});
  let startFloor = {name: 'node -e 0', ...node};
  if (kubectl) startFloor = await kubectlPluginFloor(env);
  const version = await median([...plugin, '--version'], env);
  figure({
    name: `${plugin.join(' ')} --version`,
    value: version.p50,
    unit: 'ms',
    floor: {name: startFloor.name, value: startFloor.p50},
    note: `min ${version.min.toFixed(0)} ms; goal <= ${goals.version} ms ${version.p50 <= goals.version ? 'met' : 'NOT met'}`,
  });
  const help = await median([...plugin, '--help'], env);
  figure({
    name: `${plugin.join(' ')} --help`,
    value: help.p50,
    unit: 'ms',
    floor: {name: startFloor.name, value: startFloor.p50},
    note: `min ${help.min.toFixed(0)} ms`,
  });
  if (!isRoot) {
    skipped('status and trace', 'need root (the lab builds network namespaces)');
    return;
  }
  if (!kubectl) skipped('kubectl get svc floor', 'kubectl is not installed: the floor is node -e 0');

  const name = `bench-plugin-${process.pid}`;
  const interrupted = () => void downLab(name).finally(() => process.exit(130));
  process.once('SIGINT', interrupted).once('SIGTERM', interrupted);
  try {
    const state = await upLab({name, nodes: 2, podsPerNode: 3});
    const labEnv = {...env, KUBECONFIG: state.kubeconfig};
    const apiFloor = kubectl
      ? {name: 'kubectl get svc', ...(await median(['kubectl', 'get', 'svc'], labEnv))}
      : {name: 'node -e 0', ...node};
    const commands = {status: ['status'], trace: ['trace', 'demoapp', '--node', 'node-1']};
    for (const [command, argv] of Object.entries(commands) as [keyof typeof commands, string[]][]) {
      const cold = await median([...plugin, ...argv], labEnv);
      const Command = command === 'status' ? Status : Trace;
      const loaded: number[] = [];
      for (let i = 0; i <= runs; i++) {
        const run = await timed(() => runQuietly(() => Command.run(argv.slice(1), projectRoot), state.kubeconfig));
        if (i > 0) loaded.push(run.ms); // the first run loads the modules
      }
      loaded.sort((a, b) => a - b);
      const goal = goals[command];
      figure({
        name: `${plugin.join(' ')} ${argv.join(' ')}`,
        value: cold.p50,
        unit: 'ms',
        floor: {name: apiFloor.name, value: apiFloor.p50},
        note: `min ${cold.min.toFixed(0)} ms; goal <= ${goal} ms ${cold.p50 <= goal ? 'met' : 'NOT met'}`,
      });
      figure({
        name: `  the same, in a loaded plugin`,
        value: percentile(loaded, 50),
        unit: 'ms',
        note: `min ${loaded[0].toFixed(0)} ms: API server, port-forward, agent`,
      });
    }
  } finally {
    process.off('SIGINT', interrupted).off('SIGTERM', interrupted);
    await downLab(name).catch((error: Error) => console.error(`lab down ${name}: ${error.message}`));
  }
}

/** Run alone: node bench/plugin.ts */
if (import.meta.main) await benchPlugin();
