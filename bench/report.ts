// How benchmarks print: a heading with the workload, then one line per figure, each next to the
// kernel floor it is measured against when there is one.

export interface Figure {
  name: string;
  /** Milliseconds, bytes or a count, as `unit` says. */
  value: number;
  unit: 'ms' | 'MiB' | 'count' | 'per second';
  /** The floor this figure is compared with, and the goal for the ratio if the issue sets one. */
  floor?: {name: string; value: number; goal?: number};
  note?: string;
}

export function heading(title: string, workload: string): void {
  console.log(`\n== ${title}\n   workload: ${workload}`);
}

export function figure(f: Figure): void {
  let line = `   ${f.name.padEnd(44)} ${format(f.value, f.unit).padStart(12)}`;
  if (f.floor) {
    const ratio = f.value / f.floor.value;
    line += `   ${ratio.toFixed(3)}x ${f.floor.name} (${format(f.floor.value, f.unit)})`;
    if (f.floor.goal !== undefined) line += ratio <= f.floor.goal ? `  goal <= ${f.floor.goal}x met` : `  goal <= ${f.floor.goal}x NOT met`;
  }
  if (f.note) line += `   ${f.note}`;
  console.log(line);
}

export function skipped(what: string, why: string): void {
  console.log(`   ${what.padEnd(44)} skipped: ${why}`);
}

function format(value: number, unit: Figure['unit']): string {
  if (unit === 'ms') return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(value < 10 ? 2 : 0)} ms`;
  if (unit === 'MiB') return `${value.toFixed(0)} MiB`;
  if (unit === 'per second') return `${Math.round(value).toLocaleString('en-US')}/s`;
  return Math.round(value).toLocaleString('en-US');
}

/** timed runs fn once and returns its result and wall time in milliseconds. */
export async function timed<T>(fn: () => T | Promise<T>): Promise<{result: T; ms: number}> {
  const start = process.hrtime.bigint();
  const result = await fn();
  return {result, ms: Number(process.hrtime.bigint() - start) / 1e6};
}

export function mib(bytes: number): number {
  return bytes / (1024 * 1024);
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}
