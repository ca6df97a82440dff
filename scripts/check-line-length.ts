// Fails when a line of a source file under src/ is longer than a side-by-side diff shows (160
// characters by default). The formatter keeps code within its own width but cannot split a string
// literal or a comment; those are split by hand at word breaks.
// Usage: node scripts/check-line-length.ts [DIR] [--max N]   (default src, 160)
import {runSourceCheck} from './source-check.ts';

export interface LongLine {
  file: string;
  line: number;
  length: number;
}

/** Every line of `text` longer than `max` characters, with its 1-based number. */
export function longLines(file: string, text: string, max: number): LongLine[] {
  return text
    .split('\n')
    .map((line, index) => ({file, line: index + 1, length: line.length}))
    .filter((line) => line.length > max);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  runSourceCheck(
    {
      defaultMax: 160,
      find: longLines,
      problem: (found, max) => `${found.length} characters (at most ${max})`,
      passed: (max) => `no line over ${max} characters`,
    },
    process.argv.slice(2),
  );
}
