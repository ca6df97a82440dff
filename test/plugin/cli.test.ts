// The CLI as a newcomer meets it, without a cluster: help written as `kubectl proxyctl ...`, the
// lab topic's own summary, lab exec's `-- COMMAND`, examples that name the lab's nodes, version as
// JSON, a mistyped command answered with the nearest real one, and every failure one line
// "error: ...". Runs the built CLI (npm run build first).
import assert from 'node:assert/strict';
import {mkdtemp, readFile, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {suggestCommands} from '../../src/plugin/hooks/command-not-found.ts';
import {describeRun, root, runPlugin} from './agent-cluster.ts';

interface Manifest {
  commands: Record<string, {examples?: ({command: string} | string)[]}>;
}

describe('kubectl proxyctl, the CLI itself', () => {
  let labDir: string;
  // No lab and no cluster here: failures must come from the command line alone.
  const env = () => ({PROXYCTL_LAB_DIR: labDir, KUBECONFIG: join(labDir, 'no-kubeconfig')});
  before(async () => {
    labDir = await mkdtemp(join(tmpdir(), 'pxapi-cli-'));
  });
  after(() => rm(labDir, {recursive: true, force: true}));

  it('help speaks of kubectl proxyctl; the lab topic has its own summary', async () => {
    const help = await runPlugin(['--help'], env());
    assert.match(help.stdout, /^USAGE\n {2}\$ kubectl proxyctl \[COMMAND\]$/m, describeRun(help));
    assert.match(help.stdout, /^ {2}lab {2}A small cluster on this machine/m);
    const lab = await runPlugin(['lab', '--help'], env());
    assert.match(lab.stdout, /^A small cluster on this machine/, describeRun(lab));
    const trace = await runPlugin(['trace', '--help'], env());
    assert.match(trace.stdout, /^ {2}\$ kubectl proxyctl trace \[SERVICE\]/m, describeRun(trace));
    for (const line of trace.stdout.split('\n').filter((text) => /^\s+\$ /.test(text)))
      assert.match(line, /^\s+\$ kubectl proxyctl /, line);
  });

  it('lab exec shows where the command goes: TARGET -- COMMAND', async () => {
    const help = await runPlugin(['lab', 'exec', '--help'], env());
    assert.match(help.stdout, /^ {2}\$ kubectl proxyctl lab exec \[--name NAME\] TARGET -- COMMAND \[ARG\.\.\.\]$/m, describeRun(help));
  });

  it("every example runs as kubectl proxyctl; those for a cluster name the lab's nodes (node-0, node-1)", async () => {
    const manifest = JSON.parse(await readFile(join(root, 'oclif.manifest.json'), 'utf8')) as Manifest;
    for (const [id, command] of Object.entries(manifest.commands)) {
      for (const example of command.examples ?? []) {
        const text = typeof example === 'string' ? example : example.command;
        assert.match(text, /(^|\| |&& )<%= config\.bin %> /, `${id}: ${text}`);
        // render reads a file, not the lab: its node names are the file's.
        if (id === 'render') continue;
        for (const node of text.match(/\bnode-\d+\b/g) ?? [])
          assert.ok(['node-0', 'node-1'].includes(node), `${id}: ${text}: the lab has node-0 and node-1`);
      }
    }
  });

  it('version -o json', async () => {
    const run = await runPlugin(['version', '-o', 'json'], env());
    assert.equal(run.code, 0, describeRun(run));
    const data = JSON.parse(run.stdout) as {version: string; protocol: string};
    assert.equal(data.version, JSON.parse(await readFile(join(root, 'package.json'), 'utf8')).version);
    assert.equal(data.protocol, 'proxyctl.v1');
    assert.equal((await runPlugin(['version'], env())).stdout, `${data.version}\n`);
  });

  it('a mistyped command: the nearest real one, one line, exit 2', async () => {
    for (const [typed, meant] of [
      ['trase', 'trace'],
      ['stauts', 'status'],
      ['lab stat', 'lab status'],
    ] as const) {
      const run = await runPlugin(typed.split(' '), env());
      assert.equal(run.code, 2, describeRun(run));
      assert.match(
        run.stderr,
        new RegExp(`^error: unknown command "${typed}" for "kubectl proxyctl": did you mean "kubectl proxyctl ${meant}"\\?\\n$`),
      );
    }
    const nothing = await runPlugin(['xyzzy'], env());
    assert.equal(nothing.code, 2, describeRun(nothing));
    assert.match(nothing.stderr, /^error: unknown command "xyzzy" for "kubectl proxyctl": see "kubectl proxyctl --help"/);
    assert.deepEqual(suggestCommands('dif', ['diff', 'render', 'status', 'sync', 'trace', 'lab exec']), ['diff']);
    assert.deepEqual(suggestCommands('sycn', ['diff', 'status', 'sync']), ['sync']);
  });

  it('trace SERVICE NODE points at --node; status -n at --agent-namespace', async () => {
    const trace = await runPlugin(['trace', 'demoapp', 'node-1'], env());
    assert.equal(trace.code, 2, describeRun(trace));
    assert.equal(trace.stderr, 'error: unexpected argument node-1: trace takes one SERVICE; to trace on node node-1, give --node node-1\n');
    const status = await runPlugin(['status', '-n', 'kube-system'], env());
    assert.equal(status.code, 2, describeRun(status));
    assert.match(status.stderr, /^error: status has no -n: the agents' namespace is --agent-namespace/);
  });

  it('lab commands fail as the others do: one line "error: ..."', async () => {
    const lab = await runPlugin(['lab', 'status', '--name', 'nothing-here'], env());
    assert.equal(lab.code, 1, `lab status: exit 1 when no such lab runs\n${describeRun(lab)}`);
    assert.match(
      lab.stderr,
      /^error: no lab named nothing-here is running; start one with `kubectl proxyctl lab up --name nothing-here`[^\n]*\n$/,
    );
    const agent = await runPlugin(['status'], env());
    assert.equal(agent.code, 2, describeRun(agent));
    assert.match(agent.stderr, /^error: no kubeconfig: none of the files \$KUBECONFIG lists exists [^\n]*\n$/);
  });
});
