// Fails when modules under src/ import each other in a circle, type-only imports included: a
// circle means two files each know the other's insides, and the arrows of docs/design.md no longer
// say what depends on what. Usage: node scripts/check-import-cycles.ts [DIR]   (default src)
import {readdirSync, readFileSync, statSync} from 'node:fs';
import {dirname, join, relative, resolve} from 'node:path';

/** Static `import ... from`, `export ... from` and bare `import '...'` of relative paths. */
const importPattern = /^\s*(?:import|export)\s(?:[^'";]*?\sfrom\s)?['"](\.{1,2}\/[^'"]+)['"]/gm;
/** `import('...')`, as an expression or in a type (`typeof import('./x.ts')`). */
const importCallPattern = /\bimport\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g;

export function sourceFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of readdirSync(dir)) {
    const path = join(dir, entry);
    if (statSync(path).isDirectory()) files.push(...sourceFiles(path));
    else if (path.endsWith('.ts')) files.push(path);
  }
  return files.sort();
}

export function importGraph(files: string[]): Map<string, string[]> {
  const known = new Set(files);
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const targets: string[] = [];
    const text = readFileSync(file, 'utf8');
    for (const match of [...text.matchAll(importPattern), ...text.matchAll(importCallPattern)]) {
      const target = resolve(dirname(file), match[1]);
      if (known.has(target)) targets.push(target);
    }
    graph.set(file, targets);
  }
  return graph;
}

/** The strongly connected components with more than one module (Tarjan), each sorted. */
export function importCycles(graph: Map<string, string[]>): string[][] {
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const cycles: string[][] = [];
  const visit = (node: string): void => {
    index.set(node, counter);
    low.set(node, counter);
    counter++;
    stack.push(node);
    onStack.add(node);
    for (const next of graph.get(node) ?? []) {
      if (!index.has(next)) {
        visit(next);
        low.set(node, Math.min(low.get(node)!, low.get(next)!));
      } else if (onStack.has(next)) {
        low.set(node, Math.min(low.get(node)!, index.get(next)!));
      }
    }
    if (low.get(node) !== index.get(node)) return;
    const component: string[] = [];
    let member: string;
    do {
      member = stack.pop()!;
      onStack.delete(member);
      component.push(member);
    } while (member !== node);
    if (component.length > 1 || (graph.get(node) ?? []).includes(node)) cycles.push(component.sort());
  };
  for (const node of graph.keys()) if (!index.has(node)) visit(node);
  return cycles;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const root = resolve(process.argv[2] ?? 'src');
  const cycles = importCycles(importGraph(sourceFiles(root)));
  for (const cycle of cycles) console.error(`import circle: ${cycle.map((file) => relative(process.cwd(), file)).join(' <-> ')}`);
  if (cycles.length > 0) process.exit(1);
  console.log(`no import circles in ${relative(process.cwd(), root) || '.'}`);
}
