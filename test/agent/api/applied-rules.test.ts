// The applied-rules cache: read the kernel once per ruleset generation, never serve a reading older
// than a change it was told of, and read every time when nothing watches the ruleset.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {AppliedRulesCache} from '../../../src/agent/api/applied-rules.ts';
import type {ParsedRules} from '../../../src/agent/api/rules-backend.ts';
import {unwatchedRulesetChanges, type RulesetChanges} from '../../../src/agent/api/ruleset-changes.ts';

function watchedChanges(): RulesetChanges & {change(): void} {
  let generation = 0;
  return {generation: () => generation, watching: () => true, bump: () => void generation++, close: () => {}, change: () => void generation++};
}

function cacheOver(changes: RulesetChanges) {
  let kernel = 'rules v1';
  const reads: string[] = [];
  let time = 1000;
  const cache = new AppliedRulesCache({
    read: async (family) => {
      reads.push(family);
      await new Promise((resolve) => setTimeout(resolve, 5));
      return kernel;
    },
    parse: (text) => ({text}) as unknown as ParsedRules,
    changes,
    now: () => time++,
  });
  return {cache, reads, setKernel: (text: string) => (kernel = text)};
}

describe('AppliedRulesCache', () => {
  it('reads once while the ruleset does not change, and again after a change', async () => {
    const changes = watchedChanges();
    const {cache, reads, setKernel} = cacheOver(changes);
    const first = await cache.get('IPv4');
    const second = await cache.get('IPv4');
    assert.equal(second, first);
    assert.deepEqual(reads, ['IPv4']);

    setKernel('rules v2');
    changes.change();
    const third = await cache.get('IPv4');
    assert.equal(third.text, 'rules v2');
    assert.ok(third.readAt > first.readAt, 'the answer says when the rules were read');
    assert.deepEqual(reads, ['IPv4', 'IPv4']);
  });

  it('shares one reading between requests that arrive together', async () => {
    const {cache, reads} = cacheOver(watchedChanges());
    const [a, b, c] = await Promise.all([cache.get('IPv4'), cache.get('IPv4'), cache.get('IPv6')]);
    assert.equal(a, b);
    assert.notEqual(a, c);
    assert.deepEqual(reads.sort(), ['IPv4', 'IPv6']);
  });

  it('reads the kernel for every request when nothing watches the ruleset', async () => {
    const {cache, reads} = cacheOver(unwatchedRulesetChanges());
    await cache.get('IPv4');
    await cache.get('IPv4');
    assert.deepEqual(reads, ['IPv4', 'IPv4']);
  });
});
