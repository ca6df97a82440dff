// nft monitor as the signal that the kernel's rules changed: trusted only once it has reported a
// change made after the agent's last write, so that a lagging monitor never makes a cache stale.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {randomBytes} from 'node:crypto';
import {test} from 'node:test';
import {watchNftRuleset} from '../../../src/agent/api/ruleset-changes.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {isRoot, until} from '../../plugin/agent-cluster.ts';

test('watchNftRuleset: counts changes in its namespace; distrusts silence after an own write until it hears one', async (t) => {
  if (!isRoot) {
    t.skip('needs root: runs nft monitor in a fresh network namespace');
    return;
  }
  const netns = `pxapi-${process.pid}-${randomBytes(3).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', netns]);
  t.after(() => execFileSync('ip', ['netns', 'del', netns]));
  const changes = await watchNftRuleset({netns, log: memoryLogger()});
  t.after(() => changes.close());
  assert.equal(changes.watching(), false, 'not trusted before it has reported anything');

  const iptables = (...args: string[]) => execFileSync('ip', ['netns', 'exec', netns, 'iptables', ...args]);
  iptables('-t', 'nat', '-N', 'PXAPI-TEST');
  await until('the monitor to report the new chain', () => changes.watching());
  const quiet = changes.generation();
  assert.equal(changes.generation(), quiet, 'no change, same generation');

  iptables('-t', 'nat', '-A', 'PXAPI-TEST', '-j', 'RETURN');
  await until('the monitor to report the new rule', () => changes.generation() > quiet);

  // An own write the monitor has not reported yet: silence means nothing until it does.
  changes.bump(Date.now() + 1000);
  assert.equal(changes.watching(), false);
  iptables('-t', 'nat', '-F', 'PXAPI-TEST');
  await until('the monitor to catch up', () => changes.watching());
});
