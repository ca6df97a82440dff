// watchIpvsState, the change signal for ipvs mode's state, over a node's ipvs state in memory: a
// change by hand to each part (a real server, a set entry, an address on kube-ipvs0) is reported
// with the part it touched, and the applied rules follow it by reading that part alone, to the
// same state a whole reading gives. The same against a real kernel: test/kernel/ipvs-observe.test.ts.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {AppliedState} from '../../../src/agent/applied/applied-state.ts';
import {
  changedParts,
  ipsetHeaders,
  ipvsStateParts,
  type IpvsStateLook,
  type LatestIpvsLook,
  lookAtIpvsState,
  lookPeriod,
  watchIpvsState,
} from '../../../src/agent/applied/ipvs-changes.ts';
import {formatIpvsState, ipvsLinesNear, ipvsLinesWith, ipvsRulesBackend, parseIpvsStateText} from '../../../src/agent/api/rules/ipvs.ts';
import {type IpvsState, parseIpvsadmSave, type SpelledSince, virtualServerText} from '../../../src/core/ipvs/index.ts';
import {readIpvsKernelState} from '../../../src/agent/sync/ipvs-host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {IpvsHost} from '../ipvs-memory-host.ts';
import {watchedChanges} from './watched-changes.ts';
import type {ParsedRules} from '../../../src/agent/api/rules/backend.ts';

// What `ipset list -t` printed for two of ipvs mode's sets and one of another program's.
const terseListing = `Name: KUBE-CLUSTER-IP
Type: hash:ip,port
Revision: 7
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xf902c149
Size in memory: 264
References: 0
Number of entries: 1

Name: KUBE-LOOP-BACK
Type: hash:ip,port,ip
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x142e3698
Size in memory: 208
References: 0
Number of entries: 0

Name: other
Type: hash:ip
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xc06bc172
Size in memory: 216
References: 0
Number of entries: 0
`;

test("reads each KUBE- set's header from ipset list -t, and names what changed between two looks", () => {
  const headers = ipsetHeaders(terseListing);
  assert.deepEqual([...headers.keys()], ['KUBE-CLUSTER-IP', 'KUBE-LOOP-BACK']);
  assert.match(headers.get('KUBE-CLUSTER-IP')!, /^Name: KUBE-CLUSTER-IP\n[^]*Number of entries: 1$/);

  const before: IpvsStateLook = {servers: '-A -t 10.96.0.1:443 -s rr\n', sets: headers, addresses: 'kube-ipvs0 DOWN 10.96.0.1/32\n'};
  assert.equal(changedParts(before, {...before, sets: new Map(headers)}).size, 0);
  const oneMore = terseListing.replace('Number of entries: 1', 'Number of entries: 2');
  const touched = changedParts(before, {
    servers: `${before.servers}-A -t 10.96.0.2:80 -s rr\n`,
    sets: ipsetHeaders(oneMore.replace(/Name: KUBE-LOOP-BACK[^]*?\n\n/, '')),
    addresses: before.addresses,
  });
  const ipv4 = touched.get('IPv4')!;
  assert.equal(ipv4.get(ipvsStateParts.servers)?.whole, true);
  assert.deepEqual([...ipv4.get(ipvsStateParts.sets)!.sets].sort(), ['KUBE-CLUSTER-IP', 'KUBE-LOOP-BACK']);
  assert.equal(ipv4.has(ipvsStateParts.addresses), false);
  // IPv6's sets are KUBE-6-: a change to IPv4's touches no IPv6 set.
  assert.equal(touched.get('IPv6')?.has(ipvsStateParts.sets), false);
});

test('a look prints the servers only when their table changed, spelling them from it, and every time where it cannot be read', async () => {
  const host = await seededNode();
  const first = await lookAtIpvsState(host);
  const from = host.calls.length;
  const second = await lookAtIpvsState(host, first);
  assert.equal(host.calls.slice(from).includes('ipvsadm -Sn'), false);
  assert.equal(second.servers, first.servers);
  await host.ipvsadm(['-R'], '-a -t 10.96.0.11:53 -r 10.244.1.5:53 -m -w 1\n');
  const changedFrom = host.calls.length;
  const third = await lookAtIpvsState(host, second);
  assert.equal(host.calls.slice(changedFrom).includes('ipvsadm -Sn'), false, 'spelled from the table');
  assert.deepEqual(parseIpvsadmSave(third.servers), parseIpvsadmSave(await host.ipvsadm(['-Sn'])));
  const spelledChange = changedParts(second, third);
  assert.deepEqual(spelledChange.get('IPv4')?.get(ipvsStateParts.servers), {
    chains: new Set(),
    sets: new Set(),
    servers: new Set(['-t 10.96.0.11:53']),
    whole: false,
  });
  assert.equal(spelledChange.has('IPv6'), false, 'an IPv4 server touches no IPv6 state');
  // With session affinity the table's timeout is in the kernel's ticks: ipvsadm -Sn prints it.
  await host.ipvsadm(['-R'], '-E -t 10.96.0.11:53 -s rr -p 10800\n');
  const affinityFrom = host.calls.length;
  const affinity = await lookAtIpvsState(host, third);
  assert.deepEqual(host.calls.slice(affinityFrom).at(-1), 'ipvsadm -Sn');
  assert.match(affinity.servers, /-p 10800/);
  assert.equal(changedParts(third, affinity).get('IPv4')?.get(ipvsStateParts.servers)?.whole, true, 'printed whole: not named');

  host.ipvsTable = () => Promise.reject(new Error('/proc/net/ip_vs: no such file'));
  const unread = await lookAtIpvsState(host, affinity);
  assert.equal(unread.serverTable, undefined);
  const before = host.calls.length;
  await lookAtIpvsState(host, unread);
  assert.deepEqual(host.calls.slice(before), ['ipset list -t', 'ip -br addr show dev kube-ipvs0', 'ipvsadm -Sn']);
});

test("a look keeps the table's shape as a copy, only when it changed: the host reads each table into the same buffer", async () => {
  const host = await seededNode();
  // As CommandHost does: every table read into one buffer, written over by the next read.
  const shared = Buffer.alloc(64 * 1024);
  const readTable = host.ipvsTable.bind(host);
  host.ipvsTable = async () => {
    const table = await readTable();
    return shared.subarray(0, table.copy(shared));
  };
  const first = await lookAtIpvsState(host);
  assert.notEqual(first.serverTable!.buffer, shared.buffer, 'the first shape is a copy');
  const unchanged = await lookAtIpvsState(host, first);
  assert.equal(unchanged.serverTable, first.serverTable, 'a look that saw no change keeps the shape it was given');
  await host.ipvsadm(['-R'], '-a -t 10.96.0.11:53 -r 10.244.1.5:53 -m -w 1\n');
  const changed = await lookAtIpvsState(host, unchanged);
  assert.notEqual(changed.serverTable, first.serverTable);
  assert.deepEqual([...(changedParts(unchanged, changed).get('IPv4')?.get(ipvsStateParts.servers)?.servers ?? [])], ['-t 10.96.0.11:53']);
  const kept = changed.serverTable!.toString('latin1');
  await host.ipvsadm(['-R'], '-d -t 10.96.0.11:53 -r 10.244.1.5:53\n');
  const undone = await lookAtIpvsState(host, changed);
  assert.equal(changed.serverTable!.toString('latin1'), kept, 'the next read did not write over a kept shape');
  assert.equal(undone.serverTable!.toString('latin1'), first.serverTable!.toString('latin1'));
  assert.deepEqual(parseIpvsadmSave(undone.servers), parseIpvsadmSave(await host.ipvsadm(['-Sn'])));
});

test('a look names a server changed in place as its read passes it, and its result names only what changed besides', async () => {
  const host = await seededNode();
  // Servers after the first one's block, so that the table is read in many pieces after it.
  const more = Array.from(
    {length: 20},
    (_, index) => `-A -t 10.96.1.${index}:80 -s rr\n-a -t 10.96.1.${index}:80 -r 10.244.2.${index}:80 -m -w 1\n`,
  );
  await host.ipvsadm(['-R'], more.join(''));
  const first = await lookAtIpvsState(host);
  let bytesRead = 0;
  host.onTableRead = (read) => (bytesRead = read);
  const reports: {servers: string[]; text: string; bytesRead: number}[] = [];
  const report = (change: SpelledSince) => reports.push({servers: [...change.changedServers], text: change.text, bytesRead});

  await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n');
  const second = await lookAtIpvsState(host, first, report);
  const tableBytes = second.serverTable!.length;
  assert.equal(reports.length, 1);
  assert.deepEqual(reports[0].servers, ['-t 10.96.0.10:80']);
  assert.ok(reports[0].bytesRead < tableBytes / 4, `reported after ${reports[0].bytesRead} bytes of a shape of ${tableBytes}`);
  assert.deepEqual(parseIpvsadmSave(reports[0].text), parseIpvsadmSave(await host.ipvsadm(['-Sn'])));
  assert.equal(second.servers, reports[0].text, "the look's servers are those reported");
  assert.equal(changedParts(first, second).size, 0, 'the look names nothing more: it was reported');

  // Two servers changed: the first is reported as the read passes it, the other when the look ends.
  await host.ipvsadm(['-R'], '-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 1\n-d -t 10.96.1.19:80 -r 10.244.2.19:80\n');
  bytesRead = 0;
  const third = await lookAtIpvsState(host, second, report);
  assert.deepEqual(reports[1].servers, ['-t 10.96.0.10:80']);
  assert.deepEqual([...(changedParts(second, third).get('IPv4')?.get(ipvsStateParts.servers)?.servers ?? [])], ['-t 10.96.1.19:80']);
  assert.deepEqual(parseIpvsadmSave(third.servers), parseIpvsadmSave(await host.ipvsadm(['-Sn'])));

  // A read that gave bytes to the comparison and then failed: the servers are printed, and named whole.
  const readTable = host.ipvsTable.bind(host);
  host.ipvsTable = async (onRead) => {
    const table = await readTable();
    onRead?.(table.subarray(0, 300));
    throw new Error('the process kept in the namespace ended');
  };
  const failed = await lookAtIpvsState(host, third, report);
  assert.equal(failed.serverTable, undefined);
  assert.equal(failed.servers, await host.ipvsadm(['-Sn']));
  assert.equal(reports.length, 2, 'nothing changed');
  host.ipvsTable = readTable;

  // A server added is sure only once the table is read whole: the look names it when it ends.
  await host.ipvsadm(['-R'], '-A -t 10.96.2.1:80 -s rr\n');
  const fourth = await lookAtIpvsState(host, third, report);
  assert.equal(reports.length, 2);
  assert.deepEqual([...(changedParts(third, fourth).get('IPv4')?.get(ipvsStateParts.servers)?.servers ?? [])], ['-t 10.96.2.1:80']);
});

test('watchIpvsState counts a server the look reported as it read as changed then, and the follow reads it from what was reported', async () => {
  const host = await seededNode();
  await host.ipvsadm(['-R'], Array.from({length: 20}, (_, index) => `-A -t 10.96.1.${index}:80 -s rr\n`).join(''));
  const latest: LatestIpvsLook = {servers: undefined};
  const {backend, changes, applied, log} = await watchedNode(host, latest);
  try {
    const readAt = Date.now();
    await applied.get('IPv4');
    await new Promise((resolve) => setTimeout(resolve, 2));
    await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n');
    let changeCountedWhileReading = false;
    host.onTableRead = () => (changeCountedWhileReading ||= changes.lastForeignChangeAt() > readAt);
    assert.equal(await changes.settled(1000), true);
    host.onTableRead = undefined;
    assert.ok(changeCountedWhileReading, 'the change was counted before the look ended');
    assert.equal(log.lines.filter((line) => line.includes('ipvs state changed')).length, 1, 'and not again when it ended');
    assert.deepEqual(changes.foreignObjectsSince(readAt)?.get('IPv4')?.get(ipvsStateParts.servers)?.servers, new Set(['-t 10.96.0.10:80']));
    const from = host.calls.length;
    const followed = (await applied.get('IPv4')).rules as IpvsState;
    assert.equal(host.calls.slice(from).includes('ipvsadm -Sn'), false, "read from the look's text");
    assert.equal(formatIpvsState(followed), formatIpvsState(parseIpvsStateText(await backend.readApplied!(host, 'IPv4'))));
  } finally {
    applied.close();
  }
});

/** A node holding one service's ipvs state: two real servers, its set entries and its address. */
async function seededNode(): Promise<IpvsHost> {
  const host = new IpvsHost();
  await host.ipvsadm(
    ['-R'],
    '-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1\n-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 1\n' +
      '-A -t 10.96.0.11:53 -s rr\n-a -t 10.96.0.11:53 -r 10.244.1.4:53 -m -w 1\n',
  );
  await host.ipset(
    ['restore'],
    'create KUBE-CLUSTER-IP hash:ip,port\nadd KUBE-CLUSTER-IP 10.96.0.10,tcp:80\ncreate KUBE-LOOP-BACK hash:ip,port,ip\nadd KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2\n',
  );
  await host.ip(['link', 'add', 'kube-ipvs0', 'type', 'dummy']);
  await host.ip(['-batch', '-'], 'addr replace 10.96.0.10/32 dev kube-ipvs0\naddr replace 10.96.0.11/32 dev kube-ipvs0\n');
  return host;
}

/** The applied rules of `host`, read through the ipvs backend and followed as watchIpvsState reports changes. */
async function watchedNode(host: IpvsHost, latest?: LatestIpvsLook, wholeReadingEveryMs?: number) {
  const backend = ipvsRulesBackend({latestLook: latest});
  const log = memoryLogger(4);
  const changes = await watchIpvsState({
    host,
    log,
    iptables: watchedChanges({time: 0}),
    pollMs: 3_600_000,
    latest,
    wholeReadingEveryMs,
  });
  const applied = new AppliedState({
    read: (family) => backend.readApplied!(host, family),
    parse: (text) => backend.parse(text),
    follow: (family, rules, touched) => backend.follow!(host, family, rules, touched),
    format: (rules) => backend.format!(rules),
    changes,
    now: Date.now,
  });
  return {backend, changes, applied, log};
}

test('a change by hand to each part of the ipvs state is followed by reading that part alone', async () => {
  const host = await seededNode();
  const {backend, changes, applied} = await watchedNode(host);
  try {
    assert.equal(changes.watching(), true);
    const first = await applied.get('IPv4');
    assert.equal((first.rules as IpvsState).virtualServers[0].realServers.length, 2);
    assert.equal((first.rules as IpvsState).virtualServers.length, 2);

    /** The commands a request ran after `change`, and whether its rules are what a whole reading gives. */
    const afterChange = async (change: () => Promise<unknown>) => {
      await change();
      const from = host.calls.length;
      const rules = (await applied.get('IPv4')).rules as IpvsState;
      const ran = host.calls.slice(from);
      const whole = parseIpvsStateText(await backend.readApplied!(host, 'IPv4'));
      assert.equal(formatIpvsState(rules), formatIpvsState(whole));
      return ran;
    };
    // One look: the kernel's table of servers and two listings, nothing printed or read whole.
    const look = ['read /proc/net/ip_vs', 'ipset list -t', 'ip -br addr show dev kube-ipvs0'];

    assert.deepEqual(await afterChange(async () => {}), look, 'nothing changed: one look, the rules kept');
    host.activeConnections = 3;
    assert.deepEqual(await afterChange(async () => {}), look, 'only connection counts changed: the servers are not printed');
    const untouched = ((await applied.get('IPv4')).rules as IpvsState).virtualServers[1];
    assert.deepEqual(
      await afterChange(() => host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n')),
      [...look, 'ipvsadm -Sn'],
      'a real server deleted: the look spelled it from the table, and the servers are read again',
    );
    const servers = ((await applied.get('IPv4')).rules as IpvsState).virtualServers;
    assert.equal(servers[0].realServers.length, 1);
    assert.equal(servers[1], untouched, 'the server the change did not touch is the object the diff knows');
    assert.deepEqual(
      await afterChange(() => host.ipset(['restore'], 'del KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2\n')),
      [...look, 'ipset save KUBE-LOOP-BACK'],
      'a set entry deleted: that set read again',
    );
    assert.deepEqual(
      await afterChange(() => host.ip(['-batch', '-'], 'addr del 10.96.0.11/32 dev kube-ipvs0\n')),
      [...look, 'ip -j addr show dev kube-ipvs0'],
      'an address deleted: the addresses read again',
    );
    assert.deepEqual(
      await afterChange(() => host.ipset(['destroy', 'KUBE-LOOP-BACK'])),
      [...look, 'ipset save KUBE-LOOP-BACK'],
      'a set destroyed: gone from the rules',
    );
    assert.equal(((await applied.get('IPv4')).rules as IpvsState).sets.length, 1);
  } finally {
    applied.close();
  }
});

/** watchIpvsState over the given looks, with no timed ones (each is asked for by settled). */
function watchLooks(
  log: ReturnType<typeof memoryLogger>,
  options: Pick<Parameters<typeof watchIpvsState>[0], 'look' | 'wholeReadingEveryMs'>,
) {
  return watchIpvsState({host: new IpvsHost(), log, iptables: watchedChanges({time: 0}), pollMs: 3_600_000, ...options});
}

test('looks come every pollMs while quick; a slower look spaces them, but a change is still seen within 4 s while it can be', () => {
  assert.equal(lookPeriod(2000, 50), 2000, 'a quick look: every pollMs');
  assert.equal(lookPeriod(2000, 300), 3000, 'ten times the look');
  // From a change just after a look started to the end of the look that sees it: the period and one look.
  for (const tellingMs of [400, 800, 1200, 1333]) assert.ok(lookPeriod(2000, tellingMs) + tellingMs <= 4000, `${tellingMs} ms`);
  assert.equal(lookPeriod(2000, 1200), 2800);
  assert.equal(lookPeriod(2000, 3000), 6000, 'a look of 3 s: looking takes half the time, and a change waits longer');
});

test("the next look starts a period after the last one's start, so a long look does not add to the wait", async () => {
  const starts: number[] = [];
  const changes = await watchIpvsState({
    host: new IpvsHost(),
    log: memoryLogger(4),
    iptables: watchedChanges({time: 0}),
    pollMs: 400,
    // Each look takes 300 ms of waiting on commands, but told its answer in 1 ms.
    look: async () => {
      starts.push(performance.now());
      await new Promise((resolve) => setTimeout(resolve, 300));
      return {servers: '', sets: new Map(), addresses: '', tellingMs: 1};
    },
  });
  try {
    while (starts.length < 4) await new Promise((resolve) => setTimeout(resolve, 50));
  } finally {
    changes.close();
  }
  const gaps = starts.slice(1).map((start, i) => start - starts[i]);
  // Counted from each look's end, they would start at least 700 ms apart; below that, a loaded
  // machine's late timers are allowed for.
  for (const gap of gaps) assert.ok(gap >= 395 && gap < 690, `looks started ${gaps.map((ms) => ms.toFixed(0)).join(', ')} ms apart`);
});

test('a look that fails vouches for nothing until one succeeds, and readings from before it are not trusted', async () => {
  let failing = false;
  let looks = 0;
  const log = memoryLogger(4);
  const changes = await watchLooks(log, {
    look: async () => {
      looks++;
      if (failing) throw new Error("ipvsadm: Can't initialize ipvs: Protocol not available");
      return {servers: '', sets: new Map(), addresses: ''};
    },
  });
  try {
    assert.equal(looks, 1, 'one look before it resolves');
    assert.equal(changes.watching(), true);
    const readBefore = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 5));
    failing = true;
    assert.equal(await changes.settled(1000), false);
    assert.equal(looks, 2, 'settled looks again');
    assert.equal(changes.watching(), false);
    assert.equal(changes.foreignObjectsSince(readBefore), undefined);
    assert.equal(await changes.settled(1000), false);
    assert.equal(log.lines.filter((line) => line.includes('cannot look at the ipvs state')).length, 1, 'said once');
    failing = false;
    assert.equal(await changes.settled(1000), true);
    assert.equal(changes.watching(), true);
    assert.ok(changes.lastForeignChangeAt() > readBefore, 'a reading from before the failure is not current');
    assert.deepEqual(changes.foreignObjectsSince(Date.now()), new Map());
  } finally {
    changes.close();
  }
});

test("the state's lines that hold a name are its text's lines that do, found without putting the text together", async () => {
  const host = await seededNode();
  const state = await host.applied();
  state.virtualServers[0].servicePort = 'default/web:http';
  state.iptables = '*nat\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\nCOMMIT\n';
  const text = formatIpvsState(state);
  const linesOfText = (needle: string) => text.split('\n').filter((line) => line.includes(needle));
  // An address, an endpoint, a set's name across its lines' prefix, a comment, a section, words across a prefix and its entry.
  for (const needle of [
    '10.96.0.10',
    '10.244.1.2:8080',
    'KUBE-LOOP-BACK',
    '# service default/web',
    '####',
    'BACK 10.244',
    'add KUBE-',
    '-A KUBE-SERVICES',
    'nothing',
  ])
    assert.deepEqual([...ipvsLinesWith(state, needle)], linesOfText(needle), needle);
});

test("the state's lines near a drifted service's lines are those, of its text's lines that hold the name, in the pieces they name", async () => {
  const host = await seededNode();
  // Beside the seeded state: a look-alike real server (10.244.1.23) with its KUBE-LOOP-BACK entry, and another service's server.
  await host.ipvsadm(['-R'], '-A -t 10.96.0.12:80 -s rr\n-a -t 10.96.0.12:80 -r 10.244.1.23:8080 -m -w 1\n');
  await host.ipset(['restore'], 'add KUBE-LOOP-BACK 10.244.1.23,tcp:8080,10.244.1.23\nadd KUBE-CLUSTER-IP 10.96.0.12,tcp:80\n');
  const state = await host.applied();
  const textLines = formatIpvsState(state).split('\n');
  // A real server of 10.96.0.10:80 that the kernel lacks, as a diff gives it: the server, its
  // addresses' set entries and kube-ipvs0's address are near; 10.96.0.12:80 and 10.244.1.23 are not.
  const near = ['-a -t 10.96.0.10:80 -r 10.244.1.9:8080 -m -w 1', 'add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2'];
  const inNearPieces = (line: string) =>
    /^-[Aa] -t 10\.96\.0\.10:80 /.test(line) || /^add \S+ (10\.96\.0\.10|10\.244\.1\.9|10\.244\.1\.2),/.test(line) || line === '10.96.0.10';
  for (const needle of ['10.244.1.2', '10.96.0.10', '10.96.0.10:80', 'KUBE-LOOP-BACK', 'tcp:8080', '10.96.0.12', 'nothing']) {
    const found = [...ipvsLinesNear(state, needle, near)];
    const expected = textLines.filter((line) => line.includes(needle) && inNearPieces(line));
    assert.deepEqual(found.toSorted(), expected.toSorted(), needle);
  }
  assert.ok([...ipvsLinesNear(state, '10.244.1.2', near)].includes('add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2'));
  assert.ok(![...ipvsLinesNear(state, '10.244.1.2', near)].some((line) => line.includes('10.244.1.23')), 'not the look-alike address');
  assert.deepEqual([...ipvsLinesNear(state, '10.96.0.10', [])], [], 'nothing is near no lines');
});

test('a change to the servers is followed from the servers the look printed, without running ipvsadm again', async () => {
  const host = await seededNode();
  const latest: LatestIpvsLook = {servers: undefined};
  const {applied} = await watchedNode(host, latest);
  try {
    await applied.get('IPv4');
    assert.equal(latest.servers, await host.ipvsadm(['-Sn']), "the look's servers are handed on");
    await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n');
    const from = host.calls.length;
    const rules = (await applied.get('IPv4')).rules as IpvsState;
    assert.deepEqual(
      host.calls.slice(from),
      ['read /proc/net/ip_vs', 'ipset list -t', 'ip -br addr show dev kube-ipvs0'],
      'one look, which spelled the changed server from the table, and nothing read again',
    );
    assert.equal(formatIpvsState(rules), formatIpvsState(await host.applied()), "the followed servers are the kernel's");

    // The look names the servers it spelled, and the follow reads those alone from its text: the
    // others stay the objects the reading had.
    const dns = rules.virtualServers.find((server) => server.address === '10.96.0.11')!;
    const changes = [
      // "TCP 10.96.0.105:80" sorts before "TCP 10.96.0.10:80" (':' after '5').
      {
        what: 'a server added, sorted among the others',
        input: '-A -t 10.96.0.105:80 -s rr\n-a -t 10.96.0.105:80 -r 10.244.1.9:80 -m -w 1\n',
      },
      {what: 'a server deleted', input: '-D -t 10.96.0.10:80\n'},
      {
        what: "an IPv6 server added: not the IPv4 state's",
        input: '-A -t [fd00:10:96::1]:443 -s rr\n-a -t [fd00:10:96::1]:443 -r [fd00:10:244::5]:6443 -m -w 1\n',
      },
      {what: 'a real server added to a server', input: '-a -t 10.96.0.105:80 -r 10.244.1.8:80 -m -w 1\n'},
    ];
    for (const {what, input} of changes) {
      await host.ipvsadm(['-R'], input);
      const changeFrom = host.calls.length;
      const followed = (await applied.get('IPv4')).rules as IpvsState;
      assert.deepEqual(host.calls.slice(changeFrom), ['read /proc/net/ip_vs', 'ipset list -t', 'ip -br addr show dev kube-ipvs0'], what);
      assert.equal(formatIpvsState(followed), formatIpvsState(await host.applied()), `${what}: the kernel's servers`);
      assert.ok(followed.virtualServers.includes(dns), `${what}: the untouched server is the reading's object`);
    }
  } finally {
    applied.close();
  }
});

test('a diff of a followed reading finds what a whole diff finds: the servers the changes named, and those that differed before', async () => {
  const host = await seededNode();
  const latest: LatestIpvsLook = {servers: undefined};
  const {backend, applied} = await watchedNode(host, latest);
  try {
    // The desired state: the kernel's as it was seeded, in objects of its own (this node has no iptables layer).
    const desired = {...(await host.applied()), iptables: ''} as ParsedRules;
    const diffOf = async () => {
      const followed = (await applied.get('IPv4')).rules;
      const whole = backend.diff(desired, parseIpvsStateText(formatIpvsState(followed as IpvsState)) as ParsedRules);
      return {followed: backend.diff(desired, followed), whole};
    };
    const start = await diffOf();
    assert.equal(start.followed.equal, true, start.followed.text);
    await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n');
    const first = await diffOf();
    assert.deepEqual(first.followed.groups, first.whole.groups);
    assert.match(first.followed.text, /^--a -t 10\.96\.0\.10:80 -r 10\.244\.1\.3:8080/m);
    // Another server changes; the first one's drift, found by the diff before, is still found.
    await host.ipvsadm(['-R'], '-a -t 10.96.0.11:53 -r 10.244.1.6:53 -m -w 1\n');
    const second = await diffOf();
    assert.deepEqual(second.followed.groups, second.whole.groups);
    assert.match(second.followed.text, /^--a -t 10\.96\.0\.10:80 -r 10\.244\.1\.3:8080/m);
    assert.match(second.followed.text, /^\+-a -t 10\.96\.0\.11:53 -r 10\.244\.1\.6:53/m);
    // Both undone: no drift left.
    await host.ipvsadm(['-R'], '-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 1\n-d -t 10.96.0.11:53 -r 10.244.1.6:53\n');
    assert.equal((await diffOf()).followed.equal, true);
  } finally {
    applied.close();
  }
});

test("a whole reading given the latest look's output reads the kernel's servers, whether the look is current or stale", async () => {
  const host = await seededNode();
  const printed = await host.ipvsadm(['-Sn']);
  const whole = await readIpvsKernelState(host, 'IPv4');
  assert.deepEqual(await readIpvsKernelState(host, 'IPv4', printed), whole);
  // A look from before a change: the reading is the kernel's, not the look's.
  const looked = printed.replace('-a -t 10.96.0.11:53 -r 10.244.1.4:53 -m -w 1\n', '');
  assert.deepEqual(await readIpvsKernelState(host, 'IPv4', looked), whole);
  assert.equal(virtualServerText(whole.virtualServers[1]), '-A -t 10.96.0.11:53 -s rr\n-a -t 10.96.0.11:53 -r 10.244.1.4:53 -m -w 1');
});

test('every wholeReadingEveryMs a look makes readings from before it read the state whole, though nothing it sees changed', async () => {
  const log = memoryLogger(4);
  const changes = await watchLooks(log, {
    // Long enough that the first look, on a loaded machine, still comes before it is due.
    wholeReadingEveryMs: 300,
    look: async () => ({servers: '', sets: new Map(), addresses: ''}),
  });
  try {
    const readAt = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 5));
    assert.equal(await changes.settled(1000), true);
    assert.deepEqual(changes.foreignObjectsSince(readAt), new Map(), 'a look that saw nothing vouches for the reading');
    await new Promise((resolve) => setTimeout(resolve, 320));
    assert.equal(await changes.settled(1000), true);
    assert.equal(changes.foreignObjectsSince(readAt), undefined, 'the reading is read whole again');
    assert.ok(changes.lastForeignChangeAt() > readAt, 'the drift check that follows a change starts');
    assert.equal(log.lines.filter((line) => line.includes('read whole again')).length, 1);
    assert.deepEqual(changes.foreignObjectsSince(Date.now()), new Map(), 'a reading after it is vouched for again');
  } finally {
    changes.close();
  }
});

test('work started by a reported change reads the rules as the looks left them, where a request looks once more', async () => {
  const host = await seededNode();
  const latest: LatestIpvsLook = {servers: undefined};
  const {changes, applied, log} = await watchedNode(host, latest);
  try {
    await applied.get('IPv4');
    const changedAt = Date.now();
    await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.1.3:8080\n');
    assert.equal(await changes.settled(1000), true, 'a look sees the change');
    assert.deepEqual(
      [...(changes.foreignObjectsSince(changedAt)?.get('IPv4')?.get(ipvsStateParts.servers)?.servers ?? [])],
      ['-t 10.96.0.10:80'],
      'and reports the server it changed',
    );
    assert.ok(
      log.lines.some((line) => line.includes('ipvs state changed') && line.includes('IPv4 ipvs virtual servers -t 10.96.0.10:80')),
      'and logs it by name',
    );
    const from = host.calls.length;
    const reported = (await applied.get('IPv4', {settle: false})).rules as IpvsState;
    assert.deepEqual(host.calls.slice(from), [], 'no look, and nothing read: the look printed the servers');
    assert.equal(formatIpvsState(reported), formatIpvsState(await host.applied()), "what the look saw is the kernel's");
    const requestFrom = host.calls.length;
    await applied.get('IPv4');
    assert.deepEqual(
      host.calls.slice(requestFrom),
      ['read /proc/net/ip_vs', 'ipset list -t', 'ip -br addr show dev kube-ipvs0'],
      'a request looks again',
    );
  } finally {
    applied.close();
  }
});

test('once wholeReadingEveryMs has passed, the next reading is a whole one, and catches what the looks could not see', async () => {
  const host = await seededNode();
  const {applied} = await watchedNode(host, undefined, 300);
  try {
    await applied.get('IPv4');
    // An entry deleted and another added to the same set: its header (count, size) stays as it was.
    const sets = await host.ipset(['save']);
    const entry = /^add (KUBE-CLUSTER-IP) (\S+)$/m.exec(sets);
    assert.ok(entry, sets);
    await host.ipset(['restore'], `del ${entry[1]} ${entry[2]}\nadd ${entry[1]} 10.96.9.9,tcp:80\n`);
    const from = host.calls.length;
    const looked = (await applied.get('IPv4')).rules as IpvsState;
    assert.ok(!host.calls.slice(from).includes('ipset save'), 'a look cannot tell that change');
    assert.notEqual(formatIpvsState(looked), formatIpvsState(await host.applied()));
    await new Promise((resolve) => setTimeout(resolve, 300));
    const wholeFrom = host.calls.length;
    const whole = (await applied.get('IPv4')).rules as IpvsState;
    assert.ok(host.calls.slice(wholeFrom).includes('ipset save'), `read whole: ${host.calls.slice(wholeFrom).join('; ')}`);
    assert.equal(formatIpvsState(whole), formatIpvsState(await host.applied()), "the whole reading is the kernel's");
  } finally {
    applied.close();
  }
});
