// The command line the size checks over src/ share: `[DIR] [--max N]`, each finding printed as
// `file:line: problem`, exit code 1 when there is any.
import {readFileSync} from 'node:fs';
import {relative, resolve} from 'node:path';
import {sourceFiles} from './check-import-cycles.ts';

export interface SourceCheck<Finding extends {file: string; line: number}> {
  defaultMax: number;
  find(file: string, text: string, max: number): Finding[];
  /** What is wrong at the finding's line, e.g. "163 characters (at most 160)". */
  problem(finding: Finding, max: number): string;
  /** What a clean run says, e.g. "no line over 160 characters". */
  passed(max: number): string;
}

export function runSourceCheck<Finding extends {file: string; line: number}>(check: SourceCheck<Finding>, argv: string[]): void {
  const args = [...argv];
  const maxAt = args.indexOf('--max');
  const max = maxAt >= 0 ? Number(args.splice(maxAt, 2)[1]) : check.defaultMax;
  const root = resolve(args[0] ?? 'src');
  const found = sourceFiles(root).flatMap((file) => check.find(file, readFileSync(file, 'utf8'), max));
  for (const f of found) console.error(`${relative(process.cwd(), f.file)}:${f.line}: ${check.problem(f, max)}`);
  if (found.length > 0) process.exit(1);
  console.log(`${check.passed(max)} in ${relative(process.cwd(), root) || '.'}`);
}
