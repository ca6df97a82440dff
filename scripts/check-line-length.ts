// Fails when a line of a source file under src/ is longer than a side-by-side diff shows (160
// characters by default). The formatter keeps code within its own width but cannot split a string
// literal or a comment; those are split by hand at word breaks.
// Usage: node scripts/check-line-length.ts [DIR] [--max N]   (default src, 160)
import {readFileSync} from 'node:fs';
import {relative, resolve} from 'node:path';
import {sourceFiles} from './check-import-cycles.ts';

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
  const args = process.argv.slice(2);
  const maxAt = args.indexOf('--max');
  const max = maxAt >= 0 ? Number(args.splice(maxAt, 2)[1]) : 160;
  const root = resolve(args[0] ?? 'src');
  const found = sourceFiles(root).flatMap((file) => longLines(file, readFileSync(file, 'utf8'), max));
  for (const f of found) console.error(`${relative(process.cwd(), f.file)}:${f.line}: ${f.length} characters (at most ${max})`);
  if (found.length > 0) process.exit(1);
  console.log(`no line over ${max} characters in ${relative(process.cwd(), root) || '.'}`);
}
