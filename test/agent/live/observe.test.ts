// The observing agent, live: on one namespace node, a proxyctl-agent in iptables mode stands in for
// kube-proxy, and a second proxyctl-agent --observe runs beside it in the same namespace, each a
// real process against the embedded API server. The observer finds iptables mode on its own,
// reports no drift; a rule deleted by hand makes `kubectl proxyctl diff` name the service port and
// exit 1; and the observer, logging every command it runs (--v 4), ran none that writes. Needs root.
import assert from 'node:assert/strict';
import {spawn} from 'node:child_process';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {after, describe, it} from 'node:test';
import {freeLoopbackPorts} from '../../../src/lab/agent-process.ts';
import {execInNamespace} from '../../../src/lab/netns/index.ts';
import type {StatusResult} from '../../../src/protocol/methods.ts';
import {AgentChild, type LiveCluster, liveClusterSuite, savedRules, serviceObject, until} from './live-cluster.ts';

const plugin = fileURLToPath(new URL('../../../bin/kubectl-proxyctl', import.meta.url));

/** The commands the observer may run (its --v 4 "run" lines): each only reads the node. */
const readCommand =
  /command="(ip netns exec \S+ )?(iptables(-nft|-legacy)?-save( -t \w+)?|ip6?tables(-nft|-legacy)? --version|ip6?tables(-nft|-legacy)? -w 5 -W 100000 -t \w+ -S \S+|nft (-[jt] )?list .*|nfacct (get|list)\b.*|sysctl -n .*|ip (-j )?(link|addr) show.*|ipvsadm -[LS].*)"/;

function runPlugin(args: string[]): Promise<{code: number | null; stdout: string; stderr: string}> {
  return new Promise((resolve) => {
    const child = spawn(plugin, args, {stdio: ['ignore', 'pipe', 'pipe'], env: {...process.env, KUBECONFIG: '/nonexistent'}});
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.on('exit', (code) => resolve({code, stdout, stderr}));
  });
}

describe('live observing agent beside a stand-in for kube-proxy', {concurrency: false, timeout: 180_000}, () => {
  let observer: AgentChild | undefined;
  let apiUrl = '';
  let dir = '';
  const {live} = liveClusterSuite(
    {nodes: 1, podsPerNode: 2, externalClients: 0, servers: {'pod-0-1': {app: 'web'}}, agent: {syncPeriod: '120s', minSyncPeriod: '1s'}},
    async (c) => {
      c.server.store.create('services', serviceObject('web', {app: 'web'}), 'default');
      await until('the stand-in to write the web rules', async () => (await savedRules(c.node(0))).includes('default/web:http'));
      dir = await mkdtemp(join(tmpdir(), 'pxa-observe-'));
      const kubeconfig = join(dir, 'kubeconfig');
      await writeFile(kubeconfig, c.server.kubeconfig(), {mode: 0o600});
      const [healthz, metrics, api] = await freeLoopbackPorts(3);
      apiUrl = `ws://127.0.0.1:${api}/`;
      observer = new AgentChild(c.node(0), kubeconfig, [healthz, metrics], {
        verbosity: 4,
        extraFlags: ['--observe', `--api-bind-address=127.0.0.1:${api}`],
      });
      observer.start();
      await observer.waitSynced();
    },
  );

  after(async () => {
    await observer?.kill('SIGTERM');
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it('finds kube-proxy iptables mode on its own and reports no drift', async (t) => {
    const c = live(t);
    if (!c) return;
    await until('the observer to check for drift', async () => {
      const {stdout} = await runPlugin(['status', '--agent-url', apiUrl, '-o', 'json']);
      return (JSON.parse(stdout) as {agents: StatusResult[]}).agents[0]?.drift.checkedAt != null;
    });
    const {stdout} = await runPlugin(['status', '--agent-url', apiUrl, '-o', 'json']);
    const status = (JSON.parse(stdout) as {agents: StatusResult[]}).agents[0];
    assert.equal(status.observe?.observing, 'kube-proxy iptables');
    assert.equal(status.observe?.finding, 'detected');
    assert.deepEqual(status.drift.services, []);
    assert.ok(status.observe?.problems.some((problem) => problem.startsWith('ConfigMap kube-system/kube-proxy: cannot read it')));
    const text = await runPlugin(['status', '--agent-url', apiUrl]);
    assert.match(text.stdout, /observe: kube-proxy iptables/);
    const diff = await runPlugin(['diff', '--agent-url', apiUrl]);
    assert.equal(diff.code, 0, diff.stdout + diff.stderr);
    // An observer watches with xtables-monitor until nft monitor listens (a proxying agent does not).
    assert.equal(observer!.logged(/xtables-monitor listens until nft monitor does/).length, 1);
  });

  it('a rule deleted by hand: diff names the service port and exits 1', async (t) => {
    const c = live(t);
    if (!c) return;
    const jump = (await execInNamespace(c.node(0).namespace, ['iptables-save', '-t', 'nat'])).stdout
      .split('\n')
      .find((line) => line.startsWith('-A KUBE-SERVICES') && line.includes('default/web:http cluster IP'));
    assert.ok(jump, 'the stand-in wrote the web service jump');
    const words = [...jump.slice(3).matchAll(/"([^"]*)"|(\S+)/g)].map((match) => match[1] ?? match[2]);
    await execInNamespace(c.node(0).namespace, ['iptables', '-t', 'nat', '-D', ...words]);
    const diff = await runPlugin(['diff', '--agent-url', apiUrl]);
    assert.equal(diff.code, 1, diff.stdout + diff.stderr);
    assert.match(
      diff.stdout,
      /default\/web:http: rule kube-proxy should have written is missing: -t nat -A KUBE-SERVICES .*default\/web:http cluster IP/,
    );
    const json = await runPlugin(['diff', '--agent-url', apiUrl, '-o', 'json']);
    const groups = (JSON.parse(json.stdout) as {groups: Array<{servicePort: string; explanations?: Array<{kind: string}>}>}).groups;
    assert.deepEqual(
      groups.filter((group) => group.explanations).map((group) => [group.servicePort, group.explanations![0].kind]),
      [['default/web:http', 'missing-rule']],
    );
    await until(
      'the drift to be logged',
      () => observer!.logged(/service port drifted .*servicePort=default\/web:http/).length > 0,
      10_000,
    );
  });

  it('the observer ran no command that writes', async (t) => {
    const c = live(t);
    if (!c) return;
    const commands = observer!.logged(/ run command=/);
    assert.ok(commands.length > 0, 'the observer logs its commands at --v 4');
    assert.deepEqual(
      commands.filter((line) => !readCommand.test(line)),
      [],
      'every command the observer ran only reads',
    );
    assert.deepEqual(observer!.logged(/refused/), []);
  });
});
