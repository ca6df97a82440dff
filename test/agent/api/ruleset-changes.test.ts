// nft monitor as the signal that someone other than the agent changed the kernel's rules: the
// agent's own writers (told by process id) are not foreign, anyone else is, and a change is known
// as soon as the command that made it returned, however far behind the monitor's output lags.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {readFileSync} from 'node:fs';
import {randomBytes} from 'node:crypto';
import {type TestContext, test} from 'node:test';
import {AppliedState} from '../../../src/agent/applied/applied-state.ts';
import {iptablesBackend} from '../../../src/agent/api/rules/iptables.ts';
import {earlyWatcher, parseGenerationLine, parseMonitorEvent, watchNftRuleset} from '../../../src/agent/applied/ruleset-changes.ts';
import {CommandHost} from '../../../src/agent/host/command-host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {findChain, type IptablesRuleset} from '../../../src/core/iptables/ruleset.ts';
import {isRoot, until} from '../../plugin/agent-cluster.ts';
import {createNetns, inNetns} from '../netns.ts';

test('parseGenerationLine reads the generation and the process behind it', () => {
  assert.deepEqual(parseGenerationLine('# new generation 42 by process 1234 (iptables-restor)'), {
    generation: 42,
    pid: 1234,
    process: 'iptables-restor',
  });
  assert.deepEqual(parseGenerationLine('# new generation 7'), {generation: 7, pid: undefined, process: undefined});
  assert.equal(parseGenerationLine('add rule ip nat FOO counter packets 0 bytes 0 return'), undefined);
});

/** A fresh network namespace (deleted after the test) with nft monitor listening in it; undefined when the test was skipped. */
async function watchedNamespace(t: TestContext) {
  if (!isRoot) {
    t.skip('needs root: runs nft monitor and iptables in a fresh network namespace');
    return undefined;
  }
  const netns = `pxapi-${process.pid}-${randomBytes(3).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', netns]);
  t.after(() => execFileSync('ip', ['netns', 'del', netns]));
  const changes = await watchNftRuleset({netns, log: memoryLogger()});
  t.after(() => changes.close());
  await until('the monitor to listen', () => changes.watching());
  return {netns, changes, host: new CommandHost({netns})};
}

test('parseMonitorEvent names the chain or set of an ip or ip6 table an event changed, or the table', () => {
  const chain = (family: string, table: string, name: string) => ({family, table, object: {kind: 'chain', name}});
  const set = (family: string, table: string, name: string) => ({family, table, object: {kind: 'set', name}});
  assert.deepEqual(
    parseMonitorEvent('add rule ip nat KUBE-SVC-AAA counter packets 0 bytes 0 jump KUBE-SEP-B'),
    chain('IPv4', 'nat', 'KUBE-SVC-AAA'),
  );
  assert.deepEqual(parseMonitorEvent('delete rule ip6 filter KUBE-FORWARD handle 12'), chain('IPv6', 'filter', 'KUBE-FORWARD'));
  assert.deepEqual(parseMonitorEvent('create chain ip nat KUBE-SEP-B'), chain('IPv4', 'nat', 'KUBE-SEP-B'));
  assert.deepEqual(
    parseMonitorEvent('add chain ip nat PREROUTING { type nat hook prerouting priority dstnat; policy accept; }'),
    chain('IPv4', 'nat', 'PREROUTING'),
  );
  assert.deepEqual(parseMonitorEvent('add rule ip mangle KUBE-KUBELET-CANARY counter'), chain('IPv4', 'mangle', 'KUBE-KUBELET-CANARY'));
  // kube-proxy's nftables table: its chains, and its sets and maps by their elements.
  assert.deepEqual(
    parseMonitorEvent('delete rule ip kube-proxy service-ULMVA6XW-default/web/tcp/http handle 22525'),
    chain('IPv4', 'kube-proxy', 'service-ULMVA6XW-default/web/tcp/http'),
  );
  assert.deepEqual(
    parseMonitorEvent('delete element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto svc }'),
    set('IPv4', 'kube-proxy', 'service-ips'),
  );
  assert.deepEqual(parseMonitorEvent('add set ip filter blocked { type ipv4_addr; }'), set('IPv4', 'filter', 'blocked'));
  assert.deepEqual(parseMonitorEvent('add map ip6 kube-proxy service-nodeports { type inet_proto . inet_service : verdict; }'), {
    family: 'IPv6',
    table: 'kube-proxy',
    object: {kind: 'set', name: 'service-nodeports'},
  });
  assert.equal(parseMonitorEvent('delete set ip kube-proxy __map498'), 'none', "a rule's anonymous set: the rule has its own event");
  assert.equal(parseMonitorEvent('add table ip nat'), 'none', 'a table created holds nothing yet');
  assert.deepEqual(parseMonitorEvent('delete table ip nat'), {family: 'IPv4', table: 'nat'});
  assert.deepEqual(parseMonitorEvent('add flowtable ip kube-proxy ft { hook ingress priority 0; }'), {family: 'IPv4', table: 'kube-proxy'});
  assert.equal(parseMonitorEvent('add rule inet firewalld filter_INPUT accept'), 'none', 'a family no reading holds');
  assert.equal(parseMonitorEvent('# new generation 7 by process 12 (nft)'), 'none');
});

test('applied rules: a foreign change to a chain is followed by reading that chain alone, as iptables-save would print it; one to PREROUTING reads the tables', async (t) => {
  const watched = await watchedNamespace(t);
  if (!watched) return;
  const {netns, changes, host} = watched;
  const save = async () => (await host.iptablesSave('IPv4', 'filter')) + (await host.iptablesSave('IPv4', 'nat'));
  const reads: number[] = [];
  const cache = new AppliedState({
    read: async () => {
      reads.push(Date.now());
      return save();
    },
    parse: iptablesBackend.parse,
    patch: iptablesBackend.patch,
    format: iptablesBackend.format,
    follow: (family, rules, touched) => iptablesBackend.follow!(host, family, rules, touched),
    changes,
    now: Date.now,
  });
  const iptables = (...args: string[]) => execFileSync('ip', ['netns', 'exec', netns, 'iptables', '-w', ...args]);
  iptables('-t', 'nat', '-N', 'KUBE-SERVICES');
  iptables('-t', 'nat', '-A', 'PREROUTING', '-j', 'KUBE-SERVICES');
  await cache.get('IPv4');
  assert.equal(reads.length, 1);

  const since = Date.now();
  iptables('-t', 'nat', '-N', 'KUBE-SEP-AAAAAAAAAAAAAAAA');
  iptables(
    '-t',
    'nat',
    '-A',
    'KUBE-SEP-AAAAAAAAAAAAAAAA',
    '-p',
    'tcp',
    '-m',
    'comment',
    '--comment',
    'default/web:http',
    '-m',
    'tcp',
    '-j',
    'DNAT',
    '--to-destination',
    '10.244.1.5:8080',
  );
  iptables(
    '-t',
    'nat',
    '-A',
    'KUBE-SERVICES',
    '-d',
    '10.96.0.10/32',
    '-p',
    'tcp',
    '-m',
    'tcp',
    '--dport',
    '80',
    '-j',
    'KUBE-SEP-AAAAAAAAAAAAAAAA',
  );
  const followed = await cache.get('IPv4');
  assert.equal(reads.length, 1, 'the chains were read, not the tables');
  assert.deepEqual([...(changes.foreignObjectsSince(since)?.get('IPv4')?.get('nat')?.chains ?? [])].sort(), [
    'KUBE-SEP-AAAAAAAAAAAAAAAA',
    'KUBE-SERVICES',
  ]);
  // What a whole reading says of those chains, rule for rule.
  const whole = iptablesBackend.parse(await save()) as IptablesRuleset;
  for (const chain of ['KUBE-SERVICES', 'KUBE-SEP-AAAAAAAAAAAAAAAA'])
    assert.deepEqual(
      findChain(followed.rules as IptablesRuleset, 'nat', chain)?.rules.map((rule) => rule.text),
      findChain(whole, 'nat', chain)?.rules.map((rule) => rule.text),
      chain,
    );
  assert.equal(iptablesBackend.diff(iptablesBackend.parse(await save()), followed.rules).equal, true, 'no difference from a whole reading');

  iptables('-t', 'nat', '-I', 'PREROUTING', '1', '-s', '10.9.9.9/32', '-j', 'ACCEPT');
  await cache.get('IPv4');
  assert.equal(reads.length, 2, 'a change to PREROUTING reads the tables');
});

test("applied rules: the agent's own write is followed without a reading; a foreign iptables -A right after it makes the next request read the kernel", async (t) => {
  const watched = await watchedNamespace(t);
  if (!watched) return;
  const {netns, changes, host} = watched;
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

test('ruleset changes: a transaction that touches many objects of one table counts that table as touched whole, and names the objects of the others', async (t) => {
  const watched = await watchedNamespace(t);
  if (!watched) return;
  const {netns, changes} = watched;
  const since = Date.now();
  const chains = Array.from({length: 300}, (_, index) => `add chain ip big c${index}`);
  const script = [
    'add table ip big',
    ...chains,
    'add table ip small',
    'add chain ip small one',
    'add set ip small blocked { type ipv4_addr; }',
  ];
  execFileSync('ip', ['netns', 'exec', netns, 'nft', '-f', '-'], {input: `${script.join('\n')}\n`});
  await until('the monitor to report it', async () => (await changes.settled(1000)) && changes.lastForeignChangeAt() >= since);
  const touched = changes.foreignObjectsSince(since)?.get('IPv4');
  assert.deepEqual(touched?.get('big'), {chains: new Set(), sets: new Set(), servers: new Set(), whole: true});
  assert.deepEqual(touched?.get('small'), {chains: new Set(['one']), sets: new Set(['blocked']), servers: new Set(), whole: false});
});

/** A fresh network namespace for xtables-monitor and nft monitor, a way to change its ruleset, and a log; undefined when skipped. */
function earlyWatchedNamespace(t: TestContext) {
  if (!isRoot) {
    t.skip('needs root: runs xtables-monitor and nft monitor in a fresh network namespace');
    return undefined;
  }
  const netns = createNetns(t);
  return {netns, nft: (script: string) => inNetns(netns, ['nft', '-f', '-'], `${script}\n`), log: memoryLogger(2)};
}

test('until nft monitor listens, xtables-monitor tells that something changed, not what; then nft monitor names the changes', async (t) => {
  const namespace = earlyWatchedNamespace(t);
  if (!namespace) return;
  const {netns, nft, log} = namespace;
  // nft monitor as on a large node, where it reads the whole ruleset for seconds before it listens.
  const changes = await watchNftRuleset({netns, log, monitor: ['sh', '-c', 'sleep 6; exec nft monitor'], early: earlyWatcher});
  t.after(() => changes.close());
  assert.equal(changes.watching(), true, 'xtables-monitor listens once the watch is set up: a reading taken right away is vouched for');
  assert.ok(log.lines.some((line) => line.includes('xtables-monitor listens until nft monitor does')));
  assert.ok(!log.lines.some((line) => line.includes('the ruleset monitor listens')), 'nft monitor does not listen yet');

  assert.equal(await changes.settled(1000), true);
  const quiet = changes.lastForeignChangeAt();
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.equal(await changes.settled(1000), true);
  assert.equal(changes.lastForeignChangeAt(), quiet, 'nothing changed: readings stay trusted');
  assert.deepEqual(changes.foreignObjectsSince(quiet), new Map(), 'nothing touched since');

  const before = Date.now();
  nft('add table ip early');
  assert.equal(await changes.settled(1000), true);
  assert.ok(changes.lastForeignChangeAt() >= before, 'the change is known as soon as the command returned');
  assert.equal(changes.foreignObjectsSince(before), undefined, 'but not what it touched');

  await until('nft monitor to listen', () => log.lines.some((line) => line.includes('the ruleset monitor listens')), 15_000);
  assert.equal(changes.watching(), true);
  const later = Date.now();
  nft('add chain ip early named');
  assert.equal(await changes.settled(1000), true);
  assert.ok(changes.lastForeignChangeAt() >= later);
  assert.deepEqual(changes.foreignObjectsSince(later)?.get('IPv4')?.get('early')?.chains, new Set(['named']), 'now named');
  assert.equal(changes.foreignObjectsSince(before), undefined, 'the change before it listened stays unnamed');
});

test('nft monitor held back until the first reading is done: xtables-monitor stands in, and no nft runs until then', async (t) => {
  const namespace = earlyWatchedNamespace(t);
  if (!namespace) return;
  const {netns, nft, log} = namespace;
  let firstReadingDone!: () => void;
  const firstReading = new Promise<void>((resolve) => (firstReadingDone = resolve));
  const changes = await watchNftRuleset({netns, log, early: earlyWatcher, monitorAfter: firstReading});
  t.after(() => changes.close());
  // Held back: no nft monitor in the namespace (it would read the whole ruleset beside the first reading).
  const monitorsInNetns = () =>
    execFileSync('ip', ['netns', 'pids', netns], {encoding: 'utf8'})
      .split('\n')
      .filter((pid) => pid !== '')
      .filter((pid) => {
        try {
          return readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'nft';
        } catch {
          // Ended between the listing and the read.
          return false;
        }
      });
  assert.equal(changes.watching(), true, 'xtables-monitor vouches for readings while nft monitor is held back');
  await new Promise((resolve) => setTimeout(resolve, 500));
  assert.deepEqual(monitorsInNetns(), [], 'nft monitor started before the first reading was done');
  const before = Date.now();
  nft('add table ip heldback');
  assert.equal(await changes.settled(1000), true);
  assert.ok(changes.lastForeignChangeAt() >= before, 'a change while nft monitor is held back is known');
  assert.equal(changes.foreignObjectsSince(before), undefined, 'but not what it touched');

  firstReadingDone();
  await until('nft monitor to listen', () => log.lines.some((line) => line.includes('the ruleset monitor listens')), 15_000);
  assert.equal(monitorsInNetns().length, 1, 'one nft monitor once the first reading is done');
  const later = Date.now();
  nft('add chain ip heldback named');
  assert.equal(await changes.settled(1000), true);
  assert.deepEqual(changes.foreignObjectsSince(later)?.get('IPv4')?.get('heldback')?.chains, new Set(['named']), 'named once it listens');
});
