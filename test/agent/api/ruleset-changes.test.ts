// nft monitor as the signal that someone other than the agent changed the kernel's rules: the
// agent's own writers (told by process id) are not foreign, anyone else is, and a change is known
// as soon as the command that made it returned, however far behind the monitor's output lags.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {randomBytes} from 'node:crypto';
import {test} from 'node:test';
import {AppliedState} from '../../../src/agent/applied/applied-state.ts';
import {iptablesBackend} from '../../../src/agent/api/rules/iptables.ts';
import {parseGenerationLine, watchNftRuleset} from '../../../src/agent/applied/ruleset-changes.ts';
import {CommandHost} from '../../../src/agent/host/command-host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {findChain, type IptablesRuleset} from '../../../src/core/iptables/ruleset.ts';
import {isRoot, until} from '../../plugin/agent-cluster.ts';

test('parseGenerationLine reads the generation and the process behind it', () => {
  assert.deepEqual(parseGenerationLine('# new generation 42 by process 1234 (iptables-restor)'), {
    generation: 42,
    pid: 1234,
    process: 'iptables-restor',
  });
  assert.deepEqual(parseGenerationLine('# new generation 7'), {generation: 7, pid: undefined, process: undefined});
  assert.equal(parseGenerationLine('add rule ip nat FOO counter packets 0 bytes 0 return'), undefined);
});

test("applied rules: the agent's own write is followed without a reading; a foreign iptables -A right after it makes the next request read the kernel", async (t) => {
  if (!isRoot) {
    t.skip('needs root: runs nft monitor and iptables in a fresh network namespace');
    return;
  }
  const netns = `pxapi-${process.pid}-${randomBytes(3).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', netns]);
  t.after(() => execFileSync('ip', ['netns', 'del', netns]));
  const changes = await watchNftRuleset({netns, log: memoryLogger()});
  t.after(() => changes.close());
  await until('the monitor to listen', () => changes.watching());

  const host = new CommandHost({netns});
  const reads: number[] = [];
  const cache = new AppliedState({
    read: async () => {
      reads.push(Date.now());
      return (await host.iptablesSave('IPv4', 'filter')) + (await host.iptablesSave('IPv4', 'nat'));
    },
    parse: iptablesBackend.parse,
    patch: iptablesBackend.patch,
    format: iptablesBackend.format,
    changes,
    now: Date.now,
  });
  const iptables = (...args: string[]) => execFileSync('ip', ['netns', 'exec', netns, 'iptables', '-w', ...args]);
  iptables('-t', 'nat', '-N', 'KUBE-SERVICES');
  iptables('-t', 'nat', '-A', 'KUBE-SERVICES', '-j', 'RETURN');
  const first = await cache.get('IPv4');
  assert.equal(reads.length, 1);
  assert.equal(await cache.get('IPv4'), first, 'nothing changed: the same reading');
  assert.equal(reads.length, 1);

  // The agent's own write, with its process id told to the monitor as the agent does.
  const writers: (() => void)[] = [];
  const stop = host.onSpawn((pid) => writers.push(changes.ownWriter(pid)));
  cache.started('IPv4');
  await host.iptablesRestore('IPv4', '*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j RETURN\nCOMMIT\n', {
    noflush: true,
  });
  stop();
  const writtenAt = Date.now();
  cache.ended('IPv4', {
    kind: 'chains',
    tables: [
      {
        table: 'nat',
        declared: ['KUBE-SVC-AAAAAAAAAAAAAAAA'],
        chains: ['KUBE-SVC-AAAAAAAAAAAAAAAA'],
        rules: ['-A KUBE-SVC-AAAAAAAAAAAAAAAA -j RETURN'],
      },
    ],
    writtenAt,
  });
  writers.forEach((ended) => ended());
  const afterOwn = await cache.get('IPv4');
  assert.equal(reads.length, 1, 'the own write was not read back');
  assert.equal(afterOwn.readAt, writtenAt, 'the answer says when its rules were last known: the write');
  assert.equal(findChain(afterOwn.rules as IptablesRuleset, 'nat', 'KUBE-SVC-AAAAAAAAAAAAAAAA')?.rules.length, 1);
  assert.match(afterOwn.text, /-A KUBE-SVC-AAAAAAAAAAAAAAAA -j RETURN/);
  // Settling waits for the monitor's report of the own write: still nothing foreign.
  assert.equal(await cache.get('IPv4'), afterOwn);
  assert.equal(reads.length, 1);

  // A foreign change, asked about the moment the command returns: no waiting for the monitor's output.
  const before = Date.now();
  iptables('-t', 'nat', '-I', 'KUBE-SERVICES', '1', '-s', '10.9.9.9/32', '-j', 'ACCEPT');
  const afterForeign = await cache.get('IPv4');
  assert.equal(reads.length, 2, 'the foreign change made the cache read the kernel');
  assert.ok(afterForeign.readAt >= before);
  assert.equal(
    findChain(afterForeign.rules as IptablesRuleset, 'nat', 'KUBE-SERVICES')?.rules[0].text,
    '-A KUBE-SERVICES -s 10.9.9.9/32 -j ACCEPT',
  );
  assert.equal(findChain(afterForeign.rules as IptablesRuleset, 'nat', 'KUBE-SVC-AAAAAAAAAAAAAAAA')?.rules.length, 1);
  assert.equal(await cache.get('IPv4'), afterForeign, 'read once for the change');
});

test('a monitor that takes long to listen (nft reads a large ruleset first) is trusted once it listens', async (t) => {
  // `ip monitor` listens on netlink as nft monitor does, here only after 11 s: past the first look.
  const changes = await watchNftRuleset({log: memoryLogger(), monitor: ['sh', '-c', 'sleep 11; exec ip monitor link']});
  t.after(() => changes.close());
  assert.equal(changes.watching(), false, 'not listening yet');
  await until('the monitor to be seen listening', () => changes.watching(), 30_000);
});
