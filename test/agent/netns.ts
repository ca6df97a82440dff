// Fresh network namespaces for kernel tests: a unique per-run prefix, always deleted afterwards.
import {randomBytes} from 'node:crypto';
import {execFileSync} from 'node:child_process';
import type {TestContext} from 'node:test';

export const isRoot = process.getuid?.() === 0;

/** createNetns makes "pxa-<random>" and registers its deletion with the test, on failure too. */
export function createNetns(t: TestContext): string {
  const name = `pxa-${randomBytes(4).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', name]);
  t.after(() => {
    try {
      execFileSync('ip', ['netns', 'del', name]);
    } catch {
      // already gone
    }
  });
  return name;
}

export function inNetns(name: string, command: string[], input?: string): string {
  return execFileSync('ip', ['netns', 'exec', name, ...command], {input, encoding: 'utf8'});
}
