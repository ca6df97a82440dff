// The import-circle check finds circles through every kind of import, and only circles.
import assert from 'node:assert/strict';
import {mkdirSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, test} from 'node:test';
import {importCycles, importGraph, sourceFiles} from '../../scripts/check-import-cycles.ts';

const root = mkdtempSync(join(tmpdir(), 'pxcycles-'));
after(() => rmSync(root, {recursive: true, force: true}));

function tree(files: Record<string, string>): string {
  const dir = mkdtempSync(join(root, 'src-'));
  for (const [name, text] of Object.entries(files)) {
    mkdirSync(join(dir, name, '..'), {recursive: true});
    writeFileSync(join(dir, name), text);
  }
  return dir;
}

const circlesOf = (dir: string): string[][] =>
  importCycles(importGraph(sourceFiles(dir))).map((cycle) => cycle.map((file) => file.slice(dir.length + 1)));

test('a chain of imports that points one way is no circle', () => {
  const dir = tree({
    'a.ts': "import {b} from './b.ts';\n",
    'b.ts': "import {c} from './sub/c.ts';\n",
    'sub/c.ts': "export const c = 1;\nimport {x} from 'node:fs';\n",
  });
  assert.deepEqual(circlesOf(dir), []);
});

test('type-only, multi-line, re-export and import() type imports all close circles', () => {
  const cases: Array<[string, string]> = [
    ['import type', "import type {A} from './a.ts';\n"],
    ['multi-line', "import {\n  one,\n  two,\n} from '../a.ts';\n".replace('../a.ts', './a.ts')],
    ['re-export', "export {A} from './a.ts';\n"],
    ['import() type', "type M = typeof import('./a.ts');\n"],
  ];
  for (const [kind, importOfA] of cases) {
    const dir = tree({'a.ts': "import {b} from './b.ts';\n", 'b.ts': importOfA});
    assert.deepEqual(circlesOf(dir), [['a.ts', 'b.ts']], kind);
  }
});

test('a longer circle is named whole, once', () => {
  const dir = tree({
    'a.ts': "import './b.ts';\n",
    'b.ts': "import './c.ts';\n",
    'c.ts': "import './a.ts';\n",
    'd.ts': "import './a.ts';\n",
  });
  assert.deepEqual(circlesOf(dir), [['a.ts', 'b.ts', 'c.ts']]);
});
