// CommandHost against the real iptables-restore in a fresh network namespace: an input written in
// pieces as it is made, what the command is told when a piece cannot be made, and when it refuses
// a line while pieces are still coming.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {readFileSync} from 'node:fs';
import test from 'node:test';
import {CommandHost, execaRunner} from '../../../src/agent/host/command-host.ts';
import {HostCommandError} from '../../../src/agent/host/host.ts';
import {createNetns, isRoot} from '../netns.ts';

const needsRoot = 'needs root: creates a network namespace and runs iptables-restore in it';

/** `count` chains of the nat table, declared and given one rule each: a big enough input to be written over many turns. */
function chainPieces(count: number, perPiece: number): Buffer[] {
  const pieces: Buffer[] = [];
  for (let first = 0; first < count; first += perPiece) {
    const lines: string[] = [];
    for (let i = first; i < Math.min(count, first + perPiece); i++)
      lines.push(`:KUBE-SEP-TEST${i} - [0:0]`, `-A KUBE-SEP-TEST${i} -j RETURN`);
    pieces.push(Buffer.from(`${lines.join('\n')}\n`));
  }
  return pieces;
}

function natChains(netns: string): string[] {
  return execFileSync('ip', ['netns', 'exec', netns, 'iptables-save', '-t', 'nat'], {encoding: 'utf8', maxBuffer: 64 * 1024 * 1024})
    .split('\n')
    .filter((line) => line.startsWith(':KUBE-'))
    .map((line) => line.slice(1).split(' ')[0]);
}

test('an input in pieces is restored whole, and the command is told when it has all of it before it ends', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const netns = createNetns(t);
  const host = new CommandHost({netns});
  const events: string[] = [];
  let made = 0;
  function* input(): Generator<Buffer> {
    // -Z: iptables-nft reads the whole table once instead of listing every chain declared.
    yield Buffer.from('*nat\n-Z\n');
    for (const piece of chainPieces(20_000, 1000)) {
      made++;
      yield piece;
    }
    yield Buffer.from('COMMIT\n');
  }
  await host.iptablesRestore('IPv4', input(), {noflush: true, inputTaken: () => events.push(`taken after ${made} pieces`)});
  events.push('ended');
  assert.deepEqual(events, ['taken after 20 pieces', 'ended']);
  assert.equal(natChains(netns).length, 20_000);
});

test('a piece that cannot be made stops the command before it commits anything', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const netns = createNetns(t);
  const host = new CommandHost({netns});
  let taken = false;
  function* input(): Generator<Buffer> {
    yield Buffer.from('*nat\n-Z\n');
    yield* chainPieces(2000, 500);
    throw new Error('the renderer failed');
  }
  await assert.rejects(host.iptablesRestore('IPv4', input(), {noflush: true, inputTaken: () => (taken = true)}), /the renderer failed/);
  assert.equal(taken, false);
  assert.deepEqual(natChains(netns), []);
});

test('a line refused while pieces are still coming fails with the line, and the agent goes on', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const netns = createNetns(t);
  const host = new CommandHost({netns});
  let taken = false;
  function* input(): Generator<Buffer> {
    yield Buffer.from('*nat\n-Z\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES --no-such-option\n');
    // More than the pipe holds, so that writing goes on after iptables-restore has exited.
    yield* chainPieces(40_000, 1000);
    yield Buffer.from('COMMIT\n');
  }
  const failure = await host
    .iptablesRestore('IPv4', input(), {noflush: true, inputTaken: () => (taken = true)})
    .catch((error: unknown) => error);
  assert.ok(failure instanceof HostCommandError, String(failure));
  assert.match(failure.message, /no-such-option/);
  assert.match(failure.message, /line:? 4/);
  assert.equal(taken, false);
  assert.deepEqual(natChains(netns), []);
  // The host still works.
  await host.iptablesRestore('IPv4', '*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n', {noflush: true});
  assert.deepEqual(natChains(netns), ['KUBE-SERVICES']);
});

test('one chain listed as iptables -S prints it; a chain or table that is not there is no chain, through either front end', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs iptables in it');
    return;
  }
  const netns = createNetns(t);
  const run = (command: string[]) => execFileSync('ip', ['netns', 'exec', netns, ...command]);
  for (const variant of ['nft', 'legacy'] as const) {
    const host = new CommandHost({netns, iptablesVariant: variant});
    assert.equal(await host.iptablesListChain('IPv4', 'mangle', 'KUBE-SERVICES'), undefined, `${variant}: no chain in a table never used`);
    run([`iptables-${variant}`, '-t', 'nat', '-N', 'KUBE-SERVICES']);
    run([`iptables-${variant}`, '-t', 'nat', '-A', 'KUBE-SERVICES', '-d', '10.96.0.1/32', '-p', 'tcp', '-j', 'RETURN']);
    const listed = await host.iptablesListChain('IPv4', 'nat', 'KUBE-SERVICES');
    assert.match(listed ?? '', /^-N KUBE-SERVICES\n-A KUBE-SERVICES -d 10\.96\.0\.1\/32 -p tcp -j RETURN\n/, variant);
    assert.equal(await host.iptablesListChain('IPv4', 'nat', 'KUBE-NODE-PORT'), undefined, `${variant}: no such chain`);
  }
});

/** The process's state letter in /proc (R, S, Z ...), read while the event loop is blocked. */
function processState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
}

/** Keeps the event loop busy for `ms`, as a large render does. */
function busyFor(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until);
}

test('a spooled output is the same as a piped one, and the command ends while the agent is busy', async () => {
  // 8 MB of output, exit status 3 and a line on stderr: all carried over.
  const command = ['sh', '-c', 'head -c 8000000 /dev/zero | tr "\\0" a; echo done >&2; exit 3'];
  const pids: Record<'spooled' | 'piped', number> = {spooled: 0, piped: 0};
  const states: Record<'spooled' | 'piped', string> = {spooled: '', piped: ''};
  for (const way of ['spooled', 'piped'] as const) {
    const running = execaRunner(command, {spool: way === 'spooled', started: (pid) => (pids[way] = pid)});
    busyFor(2000);
    states[way] = processState(pids[way]);
    const result = await running;
    assert.equal(result.exitCode, 3);
    assert.equal(result.stderr, 'done\n');
    assert.equal(result.stdout.length, 8_000_000);
    assert.ok(/^a+$/.test(result.stdout), `${way}: the output is not what the command wrote`);
  }
  // Z: it ended and waits to be reaped; through a pipe nobody reads it waits to write (S).
  assert.equal(states.spooled, 'Z', 'the spooled command did not finish while the event loop was busy');
  assert.equal(states.piped, 'S', 'the piped command was not held at a full pipe: the comparison shows nothing');
});

test('a spooled command runs with the environment of the agent, as a piped one does', async () => {
  // `ip netns exec` finds iptables-save through PATH.
  for (const spool of [true, false]) {
    const result = await execaRunner(['sh', '-c', 'printf %s "$PATH"'], {spool});
    assert.equal(result.stdout, process.env.PATH);
  }
});

test('a command that cannot start is no exit status, spooled or not', async () => {
  for (const spool of [true, false]) {
    const result = await execaRunner(['/nonexistent/proxyctl-no-such-command'], {spool});
    assert.equal(result.exitCode, undefined);
    assert.match(result.stderr, /ENOENT/);
  }
});

test('the dumps and the small reads repeated every few seconds are spooled; writes and restores are not', async () => {
  const ran: string[] = [];
  const host = new CommandHost({
    runner: async (command, options = {}) => {
      ran.push(`${options.spool ? 'spooled' : 'piped'}: ${command.join(' ')}`);
      return {exitCode: 0, stdout: '', stderr: ''};
    },
  });
  await host.ipvsadm(['-Sn']);
  await host.ipset(['list', '-t']);
  await host.ip(['-br', 'addr', 'show', 'dev', 'kube-ipvs0']);
  await host.nfacct(['list']);
  await host.ip(['link', 'add', 'kube-ipvs0', 'type', 'dummy']);
  await host.ip(['-batch', '-'], 'addr add 10.96.0.10/32 dev kube-ipvs0\n');
  await host.nfacct(['add', 'localhost_nps_accepted_pkts']);
  assert.deepEqual(ran, [
    'spooled: ipvsadm -Sn',
    'spooled: ipset list -t',
    'spooled: ip -br addr show dev kube-ipvs0',
    'spooled: nfacct list',
    'piped: ip link add kube-ipvs0 type dummy',
    'piped: ip -batch -',
    'piped: nfacct add localhost_nps_accepted_pkts',
  ]);
});
