// The line-length check names each line over the limit by file and line number, and passes lines at the limit.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import {mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {test} from 'node:test';
import {longLines} from '../../scripts/check-line-length.ts';

test('lines over the limit are named with their number and length; a line at the limit passes', () => {
  const text = ['short', 'x'.repeat(10), 'y'.repeat(11), '', 'z'.repeat(12)].join('\n');
  assert.deepEqual(longLines('a.ts', text, 10), [
    {file: 'a.ts', line: 3, length: 11},
    {file: 'a.ts', line: 5, length: 12},
  ]);
  assert.deepEqual(longLines('a.ts', 'x'.repeat(10), 10), []);
});

test('the script fails naming each file:line over the limit, and passes a tree within it', () => {
  const dir = mkdtempSync(join(tmpdir(), 'line-length-'));
  try {
    writeFileSync(join(dir, 'ok.ts'), `export const ok = 1;\n`);
    writeFileSync(join(dir, 'long.ts'), `export const a = 1;\nexport const b = '${'b'.repeat(40)}';\n`);
    const run = (max: number) =>
      spawnSync(process.execPath, ['scripts/check-line-length.ts', dir, '--max', String(max)], {encoding: 'utf8'});
    const failed = run(40);
    assert.equal(failed.status, 1);
    assert.match(failed.stderr, /long\.ts:2: 60 characters \(at most 40\)/);
    assert.doesNotMatch(failed.stderr, /ok\.ts/);
    assert.equal(run(60).status, 0);
  } finally {
    rmSync(dir, {recursive: true, force: true});
  }
});
