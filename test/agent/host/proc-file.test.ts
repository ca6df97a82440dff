// readProcFile against the kernel's own seq files: a file spelled a page per read(), far larger
// than the first buffer, comes whole and in order, as readFileSync gives it; a missing file
// rejects as opening it does; reads into a kept buffer allocate none once it is large enough.
import assert from 'node:assert/strict';
import {readFileSync, writeFileSync, mkdtempSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import test from 'node:test';
import {ReadBuffer, readProcFile} from '../../../src/agent/host/proc-file.ts';

test('a seq file of megabytes, spelled a page per read, is read whole and in order', async () => {
  // /proc/kallsyms: a seq_file of several MB that any user may read, and that does not change while no module loads.
  const read = await readProcFile('/proc/kallsyms');
  assert.ok(read.length > 1024 * 1024, `/proc/kallsyms is ${read.length} bytes`);
  assert.ok(read.equals(readFileSync('/proc/kallsyms')));
});

test('small files and a file of the first buffer size exactly come whole', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'proc-file-'));
  t.after(() => rmSync(dir, {recursive: true, force: true}));
  for (const length of [0, 1, 4096, 64 * 1024, 64 * 1024 + 1, 300_000]) {
    const bytes = Buffer.alloc(length, 0).map((_, i) => (i * 7) % 251);
    const path = join(dir, `f${length}`);
    writeFileSync(path, bytes);
    assert.ok((await readProcFile(path)).equals(bytes), `${length} bytes`);
  }
  // A small seq file whose text does not change (a device's counters would, between two reads).
  assert.equal((await readProcFile('/proc/version')).toString('latin1'), readFileSync('/proc/version', 'latin1'));
});

test('a file that is not there rejects as opening it does', async () => {
  await assert.rejects(readProcFile('/proc/net/no_such_file'), {code: 'ENOENT'});
});

test('the event loop turns between bursts of reads, so that other work waits only a burst', async () => {
  let turns = 0;
  let longestGapMs = 0;
  let last = performance.now();
  let reading = true;
  const turn = () => {
    const now = performance.now();
    longestGapMs = Math.max(longestGapMs, now - last);
    last = now;
    turns++;
    if (reading) setImmediate(turn);
  };
  setImmediate(turn);
  const burstMs = 1;
  const startedAt = performance.now();
  await readProcFile('/proc/kallsyms', {burstMs});
  const tookMs = performance.now() - startedAt;
  reading = false;
  // Several bursts' worth: /proc/kallsyms takes tens of milliseconds to spell.
  assert.ok(tookMs > 5 * burstMs, `the read took ${tookMs.toFixed(1)} ms, too short to show bursts of ${burstMs} ms`);
  assert.ok(turns >= 3, `the event loop turned ${turns} times in a read of ${tookMs.toFixed(1)} ms`);
  assert.ok(longestGapMs < tookMs / 2, `the event loop waited ${longestGapMs.toFixed(1)} ms at once in a read of ${tookMs.toFixed(1)} ms`);
});

test('reads into a ReadBuffer reuse its memory once it is large enough; a read begun meanwhile takes a buffer of its own', async () => {
  const kallsyms = readFileSync('/proc/kallsyms');
  const into = new ReadBuffer();
  assert.ok((await readProcFile('/proc/kallsyms', {into})).equals(kallsyms));
  const grown = into.bytes;
  assert.ok(grown.length >= kallsyms.length, 'the kept buffer grew to hold the file');
  const again = await readProcFile('/proc/kallsyms', {into});
  assert.ok(again.equals(kallsyms));
  assert.equal(again.buffer, grown.buffer, 'the second read allocated no buffer');
  const [both, version] = await Promise.all([readProcFile('/proc/kallsyms', {into}), readProcFile('/proc/version', {into})]);
  assert.ok(both.equals(kallsyms), 'the first read was not written over by the one begun meanwhile');
  assert.equal(version.toString('latin1'), readFileSync('/proc/version', 'latin1'));
  assert.notEqual(version.buffer, both.buffer);
  assert.equal(into.inUse, false);
});
