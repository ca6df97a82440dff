// Go's time.Duration text ("30s", "1m0s", "1h30m", "500ms", "0"), as KubeProxyConfiguration writes
// durations, read into milliseconds and written back the way Go prints them.

const unitMilliseconds: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  µs: 1e-3,
  μs: 1e-3,
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

/** parseGoDuration returns milliseconds, or undefined when the text is not a Go duration. */
export function parseGoDuration(text: string): number | undefined {
  if (typeof text !== 'string') return undefined;
  let rest = text.trim();
  if (rest === '') return undefined;
  let sign = 1;
  if (rest[0] === '-' || rest[0] === '+') {
    if (rest[0] === '-') sign = -1;
    rest = rest.slice(1);
  }
  if (rest === '0') return 0;
  if (rest === '') return undefined;
  let total = 0;
  const part = /^(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/;
  while (rest.length > 0) {
    const match = part.exec(rest);
    if (!match) return undefined;
    total += Number(match[1]) * unitMilliseconds[match[2]];
    rest = rest.slice(match[0].length);
  }
  return sign * total;
}

/** formatGoDuration prints milliseconds as Go's Duration.String does: "1m0s", "30s", "1h0m0s", "500ms". */
export function formatGoDuration(milliseconds: number): string {
  if (milliseconds === 0) return '0s';
  const sign = milliseconds < 0 ? '-' : '';
  let rest = Math.abs(milliseconds);
  if (rest < 1000) return `${sign}${trimNumber(rest)}ms`;
  const hours = Math.floor(rest / 3_600_000);
  rest -= hours * 3_600_000;
  const minutes = Math.floor(rest / 60_000);
  rest -= minutes * 60_000;
  const seconds = trimNumber(rest / 1000);
  if (hours > 0) return `${sign}${hours}h${minutes}m${seconds}s`;
  if (minutes > 0) return `${sign}${minutes}m${seconds}s`;
  return `${sign}${seconds}s`;
}

function trimNumber(value: number): string {
  return String(Number(value.toFixed(6)));
}
