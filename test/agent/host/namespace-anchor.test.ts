// NamespaceAnchor against real namespaces: a namespace's /proc/net read through a process kept in
// it holds that namespace's devices and not the agent's; a file the namespace lacks fails as
// reading it there would; an anchor not (or no longer) inside gives no answer, so the caller reads
// by a command instead.
import assert from 'node:assert/strict';
import {execFileSync, spawn} from 'node:child_process';
import {once} from 'node:events';
import {readFileSync} from 'node:fs';
import test, {type TestContext} from 'node:test';
import {NamespaceAnchor} from '../../../src/agent/host/namespace-anchor.ts';
import {createNetns, inNetns, isRoot} from '../netns.ts';

const needsRoot = 'needs root: creates network namespaces and keeps a process in one';

/** A namespace with a veth pair named only there (both ends inside), and an anchor in it, ended after the test. */
function namespaceWithDevice(t: TestContext): {netns: string; device: string; anchor: NamespaceAnchor; commands: string[][]} {
  const netns = createNetns(t);
  const device = `pxv${netns.slice(4, 10)}`;
  inNetns(netns, ['ip', 'link', 'add', device, 'type', 'veth', 'peer', 'name', `${device}p`]);
  const commands: string[][] = [];
  const anchor = new NamespaceAnchor(netns, (command) => commands.push(command));
  t.after(() => anchor.close());
  return {netns, device, anchor, commands};
}

/** The device names in a /proc/net/dev text. */
function deviceNames(text: string): string[] {
  return [...text.matchAll(/^\s*([^\s:]+):/gm)].map((match) => match[1]).sort();
}

/** Reads until the anchor answers (it answers nothing until it is inside the namespace). */
async function readOnceInside(anchor: NamespaceAnchor, name: string): Promise<string> {
  const deadline = performance.now() + 10_000;
  for (;;) {
    const text = await anchor.readProcNet(name);
    if (text !== undefined) return text.toString('latin1');
    assert.ok(performance.now() < deadline, 'the anchor never answered from inside the namespace');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

test("the namespace's /proc/net, read through its anchor, is the namespace's and not the agent's", async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const {netns, device, anchor, commands} = namespaceWithDevice(t);
  const devices = await readOnceInside(anchor, 'dev');
  assert.match(devices, new RegExp(`^\\s*${device}:`, 'm'));
  assert.doesNotMatch(readFileSync('/proc/net/dev', 'latin1'), new RegExp(`^\\s*${device}:`, 'm'));
  assert.deepEqual(deviceNames(devices), deviceNames(inNetns(netns, ['cat', '/proc/net/dev'])));
  // Every later read goes through the same process: one command started, however many reads.
  for (let i = 0; i < 5; i++) assert.match((await anchor.readProcNet('dev'))!.toString('latin1'), new RegExp(device));
  assert.deepEqual(commands, [['ip', 'netns', 'exec', netns, 'cat']]);
});

test('a file the namespace does not have fails to read, as it would there', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const {anchor} = namespaceWithDevice(t);
  await readOnceInside(anchor, 'dev');
  await assert.rejects(anchor.readProcNet('no_such_file'), {code: 'ENOENT'});
});

test('an anchor that ended gives no answer, and is not started again at once', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const {anchor, commands} = namespaceWithDevice(t);
  await readOnceInside(anchor, 'dev');
  anchor.close();
  assert.equal(await anchor.readProcNet('dev'), undefined);
  assert.equal(commands.length, 1);
});

test('the anchor ends with the agent, whatever ends it', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const netns = createNetns(t);
  const anchorModule = new URL('../../../src/agent/host/namespace-anchor.ts', import.meta.url).href;
  // An agent that reads through an anchor, never closes it, and is then killed.
  const program =
    `import {NamespaceAnchor} from ${JSON.stringify(anchorModule)};` +
    `const anchor = new NamespaceAnchor(${JSON.stringify(netns)});` +
    `while ((await anchor.readProcNet('dev')) === undefined) await new Promise((resolve) => setTimeout(resolve, 20));` +
    `console.log('read'); setInterval(() => {}, 1000);`;
  const agent = spawn(process.execPath, ['--input-type=module', '-e', program], {stdio: ['ignore', 'pipe', 'inherit']});
  t.after(() => agent.kill('SIGKILL'));
  await once(agent.stdout!, 'data');
  assert.equal(
    execFileSync('ip', ['netns', 'pids', netns], {encoding: 'utf8'}).trim().split('\n').length,
    1,
    'the anchor is in the namespace',
  );
  agent.kill('SIGKILL');
  await once(agent, 'exit');
  const deadline = performance.now() + 5000;
  while (execFileSync('ip', ['netns', 'pids', netns], {encoding: 'utf8'}).trim() !== '') {
    assert.ok(performance.now() < deadline, 'the anchor outlived the agent');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
});

test('an anchor that cannot get into its namespace answers nothing, and is not started again at once', async (t) => {
  if (!isRoot) return t.skip(needsRoot);
  const commands: string[][] = [];
  const anchor = new NamespaceAnchor(`pxa-missing-${process.pid}`, (command) => commands.push(command));
  t.after(() => anchor.close());
  for (let i = 0; i < 10; i++) {
    assert.equal(await anchor.readProcNet('dev'), undefined);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.equal(commands.length, 1);
});
