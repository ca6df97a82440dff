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
