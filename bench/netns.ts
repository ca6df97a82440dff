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

/** RulesetMonitor: a monitor of the namespace's ruleset, each line it printed with when it arrived. */
export interface RulesetMonitor {
  /** How many lines have arrived: a mark to wait from. */
  readonly seen: number;
  /** When the first line after `from` that `matches` arrived (performance.now()). */
  waitFor(matches: (line: string) => boolean, from: number, timeoutMs: number): Promise<number>;
  stop(): void;
}

/** How a ruleset monitor is run, and a change it is sure to report: proof that it listens. */
interface MonitorKind {
  name: string;
  command: string[];
  probe(name: string): {make: string[]; undo: string[]; reported(line: string): boolean};
}

/**
 * The kernel tells these monitors of each ruleset transaction as it commits, so a change is seen
 * when it is made, with no poller competing for the CPU or the ruleset.
 * - xtables: iptables-nft's own monitor, printing rules as iptables syntax. `nft monitor` cannot
 *   stand in for it there: it reads the whole ruleset before it listens, which at 430k iptables
 *   rules takes minutes. xtables-monitor writes through stdio, block-buffered into a pipe, hence
 *   stdbuf.
 * - nft: `nft monitor`, for the agent's own nftables table.
 */
export const monitorKinds = {
  xtables: {
    name: 'xtables-monitor',
    command: ['stdbuf', '-oL', 'xtables-monitor', '--event'],
    probe: (name) => ({
      make: ['iptables', '-w', '5', '-t', 'filter', '-N', name],
      undo: ['iptables', '-w', '5', '-t', 'filter', '-X', name],
      reported: (line) => line.trim() === `EVENT: -4 -t filter -N ${name}`,
    }),
  },
  nft: {
    name: 'nft monitor',
    command: ['nft', 'monitor'],
    probe: (name) => ({
      make: ['nft', 'add', 'table', 'ip', name],
      undo: ['nft', 'delete', 'table', 'ip', name],
      reported: (line) => line === `add table ip ${name}`,
    }),
  },
} satisfies Record<string, MonitorKind>;

/** startRulesetMonitor runs a monitor in the namespace; resolves once a probe change is seen reported. */
export async function startRulesetMonitor(namespace: string, kind: MonitorKind, startTimeoutMs = 120_000): Promise<RulesetMonitor> {
  const child = spawn('ip', ['netns', 'exec', namespace, ...kind.command], {stdio: ['ignore', 'pipe', 'inherit']});
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
  const {name} = kind;
  const monitor: RulesetMonitor = {
    get seen() {
      return lines.length;
    },
    async waitFor(matches, from, timeoutMs) {
      const deadline = performance.now() + timeoutMs;
      for (let index = from; ; ) {
        for (; index < lines.length; index++) if (matches(lines[index].line)) return lines[index].at;
        if (ended) throw new Error(`${name} in ${namespace} ended`);
        if (performance.now() > deadline) throw new Error(`${name} in ${namespace} saw no such change within ${timeoutMs / 1000} s`);
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    },
    stop: () => child.kill(),
  };
  // The monitor starts listening some time after it starts: probe until it reports a probe change.
  try {
    const deadline = performance.now() + startTimeoutMs;
    for (let probe = 0; ; probe++) {
      const {make, undo, reported} = kind.probe(`pxbench_probe_${probe}`);
      const mark = monitor.seen;
      runIn(namespace, make);
      runIn(namespace, undo);
      // Each probe is a new ruleset generation, which makes a monitor that is still reading the
      // ruleset (nft monitor at 10,000 services: seconds) start its reading over: wait longer each time.
      if (
        await monitor.waitFor(reported, mark, Math.min(1000 * 2 ** probe, 30_000)).then(
          () => true,
          () => false,
        )
      )
        return monitor;
      if (ended || performance.now() > deadline)
        throw new Error(`${name} in ${namespace} did not start listening within ${startTimeoutMs / 1000} s`);
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
