// Fails when a function under src/ is longer than a reader can hold at once (150 lines by
// default): such a function does several jobs that want names of their own.
// Usage: node scripts/check-function-length.ts [DIR] [--max N]   (default src, 150)
import ts from 'typescript';
import {runSourceCheck} from './source-check.ts';

export interface LongFunction {
  file: string;
  name: string;
  line: number;
  lines: number;
}

function functionName(node: ts.Node, source: ts.SourceFile): string {
  const named = node as ts.Node & {name?: ts.Node};
  if (named.name) return named.name.getText(source);
  const parent = node.parent;
  if (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent))
    return parent.name.getText(source);
  return '(anonymous)';
}

/** Every function, method, accessor and arrow function of `text` longer than `max` lines. */
export function longFunctions(file: string, text: string, max: number): LongFunction[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const found: LongFunction[] = [];
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body) {
      const first = source.getLineAndCharacterOfPosition(node.getStart(source)).line;
      const last = source.getLineAndCharacterOfPosition(node.getEnd()).line;
      if (last - first + 1 > max) found.push({file, name: functionName(node, source), line: first + 1, lines: last - first + 1});
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  runSourceCheck(
    {
      defaultMax: 150,
      find: longFunctions,
      problem: (found, max) => `${found.name} is ${found.lines} lines (at most ${max})`,
      passed: (max) => `no function over ${max} lines`,
    },
    process.argv.slice(2),
  );
}
