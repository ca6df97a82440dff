// Scratch network namespaces for benchmarks, so kernel floors are measured without touching the
// host's rules. Deleted on exit, also when a benchmark throws.
import {execFileSync, spawn, spawnSync} from 'node:child_process';

export const isRoot = process.getuid?.() === 0;
const made = new Set<string>();

export function scratchNamespace(purpose: string): string {
  const name = `pxbench-${process.pid}-${purpose}`;
  execFileSync('ip', ['netns', 'add', name]);
  made.add(name);
  return name;
}

export function deleteNamespace(name: string): void {
  spawnSync('ip', ['netns', 'del', name]);
  made.delete(name);
}

/** runIn runs a command in the namespace, feeding it stdin, and returns stdout. */
export function runIn(namespace: string, command: string[], input?: string): string {
  const result = spawnSync('ip', ['netns', 'exec', namespace, ...command], {input, encoding: 'utf8', maxBuffer: 1 << 30});
  if (result.status !== 0) throw new Error(`${command.join(' ')} in ${namespace} failed: ${result.stderr || result.error?.message}`);
  return result.stdout;
}

/** runInAsync is runIn without blocking this process, so that its other work (a poller) goes on meanwhile. */
export function runInAsync(namespace: string, command: string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('ip', ['netns', 'exec', namespace, ...command], {stdio: ['pipe', 'pipe', 'pipe']});
    const [stdout, stderr] = [[] as Buffer[], [] as Buffer[]];
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => stderr.push(chunk));
    child.on('error', reject);
    child.on('close', (status) => {
      if (status === 0) resolve(Buffer.concat(stdout).toString('utf8'));
      else reject(new Error(`${command.join(' ')} in ${namespace} failed: ${Buffer.concat(stderr).toString('utf8')}`));
    });
    child.stdin.end(input ?? '');
  });
}

/** RulesetMonitor: `nft monitor` in a namespace, each line it printed with when it arrived. */
export interface RulesetMonitor {
  /** How many lines have arrived: a mark to wait from. */
  readonly seen: number;
  /** When the first line after `from` that `matches` arrived (performance.now()). */
  waitFor(matches: (line: string) => boolean, from: number, timeoutMs: number): Promise<number>;
  stop(): void;
}

/**
 * startRulesetMonitor runs `nft monitor` in the namespace: the kernel tells it of each ruleset
 * transaction as it commits, iptables-nft's included, so a change is seen when it is made, with no
 * poller competing for the CPU or the ruleset. Resolves once the monitor is seen to listen (a
 * probe table it reports).
 */
export async function startRulesetMonitor(namespace: string): Promise<RulesetMonitor> {
  const child = spawn('ip', ['netns', 'exec', namespace, 'nft', 'monitor'], {stdio: ['ignore', 'pipe', 'inherit']});
  const lines: Array<{line: string; at: number}> = [];
  let partial = '';
  let ended = false;
  child.on('exit', () => (ended = true));
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
    const at = performance.now();
    const parts = (partial + chunk).split('\n');
    partial = parts.pop()!;
    for (const line of parts) lines.push({line, at});
  });
  const monitor: RulesetMonitor = {
    get seen() {
      return lines.length;
    },
    async waitFor(matches, from, timeoutMs) {
      const deadline = performance.now() + timeoutMs;
      for (let index = from; ; ) {
        for (; index < lines.length; index++) if (matches(lines[index].line)) return lines[index].at;
        if (ended) throw new Error(`nft monitor in ${namespace} ended`);
        if (performance.now() > deadline) throw new Error(`nft monitor in ${namespace} saw no such change within ${timeoutMs / 1000} s`);
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    },
    stop: () => child.kill(),
  };
  // The monitor may read the ruleset before it listens: probe until it reports a probe table.
  try {
    for (let probe = 0; ; probe++) {
      const table = `pxbench_probe_${probe}`;
      const mark = monitor.seen;
      runIn(namespace, ['nft', 'add', 'table', 'ip', table]);
      runIn(namespace, ['nft', 'delete', 'table', 'ip', table]);
      const reported = await monitor.waitFor((line) => line === `add table ip ${table}`, mark, 1000).then(
        () => true,
        () => false,
      );
      if (reported) return monitor;
      if (ended || probe >= 30) throw new Error(`nft monitor in ${namespace} did not start listening`);
    }
  } catch (error) {
    monitor.stop();
    throw error;
  }
}

function deleteAll(): void {
  for (const name of made) spawnSync('ip', ['netns', 'del', name]);
}
process.on('exit', deleteAll);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    deleteAll();
    process.exit(130);
  });
}
