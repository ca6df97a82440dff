// kubectl proxyctl end to end: the built CLI against the embedded API server and a real agent whose
// rules live in a fresh network namespace, through a real port-forward and through --agent-url.
// Exit codes are part of the contract: 0 ok, 1 diff differs, 2 error. Root only.
import assert from 'node:assert/strict';
import {writeFile} from 'node:fs/promises';
import {createServer} from 'node:http';
import type {AddressInfo} from 'node:net';
import {join} from 'node:path';
import {execFile} from 'node:child_process';
import {test} from 'node:test';
import {KubeConfig} from '@kubernetes/client-node';
import {kubernetesAccessReviewer} from '../../src/agent/api/access.ts';
import type {AgentApiHandlers} from '../../src/agent/api/handlers.ts';
import {startAgentApi} from '../../src/agent/api/server.ts';
import {memoryLogger} from '../../src/agent/log.ts';
import {
  clientIP,
  describeRun,
  endpointIPs,
  inNetns,
  isRoot,
  nodeIP,
  pluginBin,
  root,
  runPlugin,
  startAgentCluster,
  until,
  type PluginRun,
} from './agent-cluster.ts';

test('kubectl proxyctl against a real agent', async (t) => {
  if (!isRoot) {
    t.skip('needs root: the agent writes rules in a fresh network namespace');
    return;
  }
  const cluster = await startAgentCluster(t);
  const admin = ['--kubeconfig', cluster.kubeconfig];

  await t.test('status through the port-forward and through --agent-url', async () => {
    const forwarded = await runPlugin(['status', ...admin]);
    assert.equal(forwarded.code, 0, describeRun(forwarded));
    const [head, row] = forwarded.stdout.trim().split('\n');
    assert.match(head, /^NODE\s+MODE\s+READY\s+VERSION\s+LAST SYNC/);
    assert.match(row, /^node-1\s+iptables\s+true\s+0\.1\.0\s+/);

    const direct = await runPlugin(['status', '--agent-url', cluster.agentUrl, '-o', 'json']);
    assert.equal(direct.code, 0, describeRun(direct));
    const data = JSON.parse(direct.stdout) as {agents: {node: string; ready: boolean; services: number; drift: {services: string[]}}[]};
    assert.equal(data.agents[0].node, 'node-1');
    assert.equal(data.agents[0].ready, true);
    assert.deepEqual(data.agents[0].drift.services, []);
  });

  await t.test('trace from a pod: the predicted endpoints are the ones the probe reaches', async () => {
    const run = await runPlugin(['trace', 'default/web', '--from', 'default/client', '--probe', '30', '-o', 'json', ...admin]);
    assert.equal(run.code, 0, describeRun(run));
    const answer = JSON.parse(run.stdout) as {
      node: string;
      verdict: string;
      packet: {srcIP: string; dstIP: string};
      branches: {endpoint: string; probability: number}[];
      probe: {answers: {endpoint: string; count: number}[]; failures: unknown[]};
      drifted: boolean;
      readAt: string;
    };
    assert.equal(answer.node, 'node-1');
    assert.equal(answer.verdict, 'DNAT');
    assert.equal(answer.packet.srcIP, clientIP);
    assert.equal(answer.packet.dstIP, cluster.webClusterIP);
    assert.equal(answer.drifted, false);
    assert.deepEqual(
      answer.branches.map((b) => b.endpoint).sort(),
      endpointIPs.map((ip) => `${ip}:8080`),
    );
    assert.deepEqual(answer.probe.failures, []);
    assert.deepEqual(answer.probe.answers.map((a) => a.endpoint).sort(), endpointIPs, 'every predicted endpoint answered, and no other');

    const text = await runPlugin(['trace', 'web', '--from', 'client', '--probe', ...admin]);
    assert.equal(text.code, 0, describeRun(text));
    assert.match(text.stdout, /^Node\s+node-1 \(rules read from the kernel \d+s ago\)/);
    assert.match(text.stdout, /Verdict\s+DNAT/);
    assert.match(text.stdout, /Service\s+default\/web:http/);
    for (const [i, ip] of endpointIPs.entries())
      assert.match(text.stdout, new RegExp(`${ip.replaceAll('.', '\\.')}:8080\\s+50\\.0%\\s+web-${i + 1}\\s+node-1`));
    assert.match(text.stdout, /Probe\s+20 connections from pod default\/client/);
  });

  await t.test('trace from the node itself and to a service without endpoints (REJECT)', async () => {
    const local = await runPlugin(['trace', 'web', '--node', 'node-1', '-o', 'json', ...admin]);
    assert.equal(local.code, 0, describeRun(local));
    const answer = JSON.parse(local.stdout) as {packet: {srcIP: string; origin: string}; verdict: string};
    assert.deepEqual([answer.packet.srcIP, answer.packet.origin, answer.verdict], [nodeIP, 'local', 'DNAT']);

    const empty = await runPlugin(['trace', 'empty', '--node', 'node-1', '--probe', '5', ...admin]);
    assert.equal(empty.code, 0, describeRun(empty));
    assert.match(empty.stdout, /Verdict\s+REJECT/);
    assert.match(empty.stdout, /has no endpoints/);
    assert.match(empty.stdout, /connection refused: 5/);
  });

  await t.test('a tampered rule: diff shows it and exits 1, sync repairs it, diff exits 0', async () => {
    const clean = await runPlugin(['diff', 'node-1', ...admin]);
    assert.equal(clean.code, 0, describeRun(clean));
    assert.equal(clean.stdout, '');

    const rule = cluster
      .nat()
      .split('\n')
      .find((line) => line.startsWith('-A KUBE-SERVICES') && line.includes('default/web:http cluster IP'));
    assert.ok(rule, 'the web service rule in KUBE-SERVICES');
    inNetns(cluster.netns, ['iptables', '-t', 'nat', '-D', ...splitRule(rule.replace(/^-A /, ''))]);

    const drifted = await runPlugin(['diff', 'node-1', ...admin]);
    assert.equal(drifted.code, 1, describeRun(drifted));
    const changed = drifted.stdout.split('\n').filter((line) => /^[-+]-t (nat|filter) /.test(line));
    assert.deepEqual(changed, [`--t nat ${rule}`], 'exactly the deleted rule, as missing from the kernel');
    assert.match(drifted.stdout, /default\/web:http/);

    const table = await runPlugin(['diff', '--all-nodes', ...admin]);
    assert.equal(table.code, 1, describeRun(table));
    assert.match(table.stdout, /^node-1\s+iptables\s+default\/web:http\s+/m);

    const trace = await runPlugin(['trace', 'web', '--node', 'node-1', ...admin]);
    assert.equal(trace.code, 0, describeRun(trace));
    assert.match(trace.stdout, /the rules applied on node node-1 for default\/web:http differ from the desired ones/);

    const sync = await runPlugin(['sync', 'node-1', ...admin]);
    assert.equal(sync.code, 0, describeRun(sync));
    assert.match(
      sync.stdout.replace(/$/, `\n${cluster.log.lines.slice(-8).join('\n')}`),
      /^node-1\s+iptables\s+full\s+\d+(ms|\.\ds)\s+[1-9]\d* nat, [1-9]\d* filter\s+repaired 1 service: default\/web:http$/m,
    );
    assert.ok(cluster.nat().includes(rule), 'the rule is back');
    const again = await runPlugin(['sync', 'node-1', '-o', 'json', ...admin]);
    assert.equal(again.code, 0, describeRun(again));
    const answer = JSON.parse(again.stdout) as {kind: string; driftBefore: {services: string[]; checkedAt: string | null}};
    assert.deepEqual(answer.driftBefore.services, [], 'nothing left to repair');
    assert.ok(answer.driftBefore.checkedAt, 'the check read the kernel');
    const quiet = await runPlugin(['sync', 'node-1', ...admin]);
    assert.match(quiet.stdout, /^node-1\s+iptables\s+partial\s+\S+\s+[1-9]\d* nat, [1-9]\d* filter\s+none found$/m, describeRun(clean));

    const repaired = await runPlugin(['diff', 'node-1', ...admin]);
    assert.equal(repaired.code, 0, describeRun(repaired));
  });

  await t.test('a user without pods/portforward is refused by the API server, in one line', async () => {
    const run = await runPlugin(['status', 'node-1', '--kubeconfig', cluster.viewerKubeconfig]);
    assert.equal(run.code, 2, describeRun(run));
    assert.equal(run.stdout, '');
    assert.equal(run.stderr.trim().split('\n').length, 1);
    assert.match(
      run.stderr,
      /^error: the API server refused to port-forward to pod kube-system\/proxyctl-agent-abcde \(403 Forbidden\): your user needs create on pods\/portforward in namespace kube-system/,
    );
  });

  await t.test('no agent on the node, a missing service, an unreachable agent, another protocol version: one line, exit 2', async () => {
    const noAgent = await runPlugin(['diff', 'node-9', ...admin]);
    assert.equal(noAgent.code, 2, describeRun(noAgent));
    assert.match(noAgent.stderr, /^error: no proxyctl agent runs on node node-9 \(.*run on node-1\)/);

    const missing = await runPlugin(['trace', 'default/nothing', '--node', 'node-1', ...admin]);
    assert.equal(missing.code, 2, describeRun(missing));
    assert.match(missing.stderr, /^error: service default\/nothing not found/);

    const unreachable = await runPlugin(['sync', '--agent-url', 'ws://127.0.0.1:1/']);
    assert.equal(unreachable.code, 2, describeRun(unreachable));
    assert.match(unreachable.stderr, /^error: cannot reach the agent at ws:\/\/127\.0\.0\.1:1\/: connection refused/);

    const future = createServer((_req, res) => res.end());
    future.on('upgrade', (_req, socket) =>
      socket.end('HTTP/1.1 400 Bad Request\r\nx-proxyctl-protocol: proxyctl.v2\r\ncontent-length: 0\r\nconnection: close\r\n\r\n'),
    );
    await new Promise<void>((resolve) => future.listen(0, '127.0.0.1', resolve));
    t.after(() => future.close());
    const mismatch = await runPlugin(['status', '--agent-url', `ws://127.0.0.1:${(future.address() as AddressInfo).port}/`]);
    assert.equal(mismatch.code, 2, describeRun(mismatch));
    assert.match(mismatch.stderr, /^error: the agent at .* speaks proxyctl\.v2, this plugin speaks proxyctl\.v1/);
  });

  await t.test(
    "-n and the context name the Services' namespace, --agent-namespace the agents'; failures under -o json exit 2",
    async () => {
      const named = await runPlugin(['trace', 'web', '-n', 'default', '--node', 'node-1', '-o', 'json', ...admin]);
      assert.equal(named.code, 0, describeRun(named));
      assert.equal((JSON.parse(named.stdout) as {servicePort: string}).servicePort, 'default/web:http');

      const elsewhere = await runPlugin(['trace', 'web', '-n', 'other', '--node', 'node-1', '-o', 'json', ...admin]);
      assert.equal(elsewhere.code, 2, describeRun(elsewhere));
      assert.match(elsewhere.stderr, /^error: service other\/web not found/);

      const inOther = join(cluster.dir, 'other-namespace.kubeconfig');
      const exported = JSON.parse(exportedKubeconfig(cluster.kubeconfig)) as {contexts: {context: {namespace?: string}}[]};
      for (const context of exported.contexts) context.context.namespace = 'other';
      await writeFile(inOther, JSON.stringify(exported));
      const fromContext = await runPlugin(['trace', 'web', '--node', 'node-1', '--kubeconfig', inOther]);
      assert.equal(fromContext.code, 2, describeRun(fromContext));
      assert.match(fromContext.stderr, /^error: service other\/web not found/, "the context's namespace is the default");
      const flagWins = await runPlugin(['diff', 'node-1', '--service', 'web', '-n', 'default', '--kubeconfig', inOther]);
      assert.equal(flagWins.code, 0, describeRun(flagWins));

      const noAgents = await runPlugin(['trace', 'web', '--agent-namespace', 'elsewhere', '--node', 'node-1', '-o', 'json', ...admin]);
      assert.equal(noAgents.code, 2, describeRun(noAgents));
      assert.match(
        (JSON.parse(noAgents.stdout) as {errors: {error: string}[]}).errors[0].error,
        /no proxyctl agent runs on node node-1 \(pods labelled .* in namespace elsewhere/,
      );
      const oldMeaning = await runPlugin(['status', '-n', 'kube-system', ...admin]);
      assert.equal(oldMeaning.code, 2, `-n no longer names the agents' namespace\n${describeRun(oldMeaning)}`);
    },
  );

  await t.test('diff --service: a bare name, a port, an unknown service (exit 2, one line)', async () => {
    for (const service of ['web', 'web:http', 'default/web', 'default/web:80']) {
      const run = await runPlugin(['diff', 'node-1', '--service', service, ...admin]);
      assert.equal(run.code, 0, `${service}\n${describeRun(run)}`);
    }
    const unknown = await runPlugin(['diff', 'node-1', '--service', 'nothing', ...admin]);
    assert.equal(unknown.code, 2, describeRun(unknown));
    assert.match(unknown.stderr, /^error: service default\/nothing not found/);
    assert.equal(unknown.stderr.trim().split('\n').length, 1);
    const direct = await runPlugin(['diff', '--agent-url', cluster.agentUrl, '--service', 'web:http'], {
      KUBECONFIG: join(cluster.dir, 'none'),
    });
    assert.equal(direct.code, 0, `straight to the agent without a kubeconfig: the name is taken as given\n${describeRun(direct)}`);
    const noPort = await runPlugin(['diff', 'node-1', '--service', 'web:9999', ...admin]);
    assert.equal(noPort.code, 2, describeRun(noPort));
    assert.match(noPort.stderr, /^error: service default\/web has no port 9999 \(ports: http=80\/TCP\)/);
  });

  await t.test('kubeconfig as kubectl reads it: $KUBECONFIG with several files, none at all, a server that does not answer', async () => {
    const merged = await runPlugin(['status'], {
      KUBECONFIG: `${join(cluster.dir, 'missing.kubeconfig')}::${cluster.kubeconfig}:${cluster.viewerKubeconfig}`,
    });
    assert.equal(merged.code, 0, describeRun(merged));
    assert.match(merged.stdout, /^node-1\s+iptables\s+true\s/m);

    const none = await runPlugin(['status'], {KUBECONFIG: '', HOME: cluster.dir, KUBERNETES_SERVICE_HOST: ''});
    assert.equal(none.code, 2, describeRun(none));
    assert.match(
      none.stderr,
      new RegExp(
        `^error: no kubeconfig: \\$KUBECONFIG is not set and ${cluster.dir}/\\.kube/config does not exist: pass --kubeconfig FILE`,
      ),
    );

    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const config = JSON.parse(exportedKubeconfig(cluster.kubeconfig)) as {clusters: {cluster: {server: string}}[]};
    config.clusters[0].cluster.server = `http://127.0.0.1:${port}`;
    const dead = join(cluster.dir, 'dead.kubeconfig');
    await writeFile(dead, JSON.stringify(config));
    const unreachable = await runPlugin(['trace', 'web', '--kubeconfig', dead]);
    assert.equal(unreachable.code, 2, describeRun(unreachable));
    assert.equal(
      unreachable.stderr,
      `error: cannot reach the API server at http://127.0.0.1:${port} to read service default/web: connection refused (nothing listens there): check --kubeconfig / --context\n`,
    );
  });

  await t.test(
    'colour: on a terminal, but not with NO_COLOR, FORCE_COLOR=0 or TERM=dumb; never on a pipe; FORCE_COLOR=1 forces it',
    async () => {
      const colour = /\u001b\[\d+m/;
      // A real terminal: script(1) gives the plugin a pseudo-terminal as stdout and stderr.
      const inTerminal = (env: Record<string, string>) =>
        new Promise<string>((resolve) =>
          execFile(
            'script',
            ['-qc', `${pluginBin} status --kubeconfig ${cluster.kubeconfig}`, '/dev/null'],
            {env: {...process.env, NO_COLOR: '', FORCE_COLOR: '', ...env}},
            (_error, stdout) => resolve(stdout),
          ),
        );
      const tty = await inTerminal({TERM: 'xterm'});
      assert.match(tty, colour, tty);
      assert.match(tty, /node-1/);
      for (const env of [{TERM: 'xterm', NO_COLOR: '1'}, {TERM: 'xterm', FORCE_COLOR: '0'}, {TERM: 'dumb'}] as Record<string, string>[]) {
        const text = await inTerminal(env);
        assert.match(text, /node-1/, text);
        assert.doesNotMatch(text, env.TERM === 'dumb' ? /\u001b/ : colour, `${JSON.stringify(env)}: ${JSON.stringify(text)}`);
      }

      const forced = await runPlugin(['status', ...admin], {NO_COLOR: '', FORCE_COLOR: '1'});
      assert.match(forced.stdout, colour, describeRun(forced));
      for (const env of [
        {NO_COLOR: '', FORCE_COLOR: ''},
        {NO_COLOR: '', FORCE_COLOR: '0'},
        {NO_COLOR: '1', FORCE_COLOR: '1'},
      ]) {
        const run = await runPlugin(['status', ...admin], env);
        assert.equal(run.code, 0, describeRun(run));
        assert.doesNotMatch(run.stdout, colour, JSON.stringify(env));
      }
    },
  );

  await t.test('offline trace over a saved dump needs no cluster', async () => {
    const dump = join(cluster.dir, 'node-1.iptables-save');
    await writeFile(dump, inNetns(cluster.netns, ['iptables-save']));
    const run = await runPlugin(
      ['trace', '--rules', dump, '--src', clientIP, '--dst', `${cluster.webClusterIP}:80/tcp`, '--node-ip', nodeIP, '-o', 'json'],
      {KUBECONFIG: '/nonexistent'},
    );
    assert.equal(run.code, 0, describeRun(run));
    const result = JSON.parse(run.stdout) as {verdict: string; branches: {endpoint: string}[]};
    assert.equal(result.verdict, 'DNAT');
    assert.deepEqual(
      result.branches.map((b) => b.endpoint).sort(),
      endpointIPs.map((ip) => `${ip}:8080`),
    );

    const text = await runPlugin(['trace', '--rules', dump, '--src', clientIP, '--dst', `${cluster.emptyClusterIP}:80`]);
    assert.equal(text.code, 0, describeRun(text));
    assert.match(text.stdout, /Verdict\s+REJECT/);

    const bad = await runPlugin(['trace', '--rules', dump, '--src', clientIP, '--dst', '10.96.0.10']);
    assert.equal(bad.code, 2, describeRun(bad));
    assert.match(bad.stderr, /^error: --dst 10\.96\.0\.10: must be IP:PORT\[\/PROTO\]/);
  });

  await t.test('kubectl finds the plugin on PATH: kubectl proxyctl status', async () => {
    const run = await new Promise<PluginRun>((resolve) =>
      execFile(
        'kubectl',
        ['proxyctl', 'status', '--kubeconfig', cluster.kubeconfig],
        {env: {...process.env, NO_COLOR: '1', PATH: `${root}bin:${process.env.PATH}`}},
        (error, stdout, stderr) => resolve({code: error ? Number(error.code) : 0, stdout, stderr}),
      ),
    );
    assert.equal(run.code, 0, describeRun(run));
    assert.match(run.stdout, /^node-1\s+iptables\s+true\s/m);
  });

  await t.test('an agent that checks tokens: TokenReview and SubjectAccessReview decide, the refusal is one line', async (st) => {
    const admin = new KubeConfig();
    admin.loadFromFile(cluster.kubeconfig);
    const status = {
      node: 'node-1',
      mode: 'iptables',
      version: '0.1.0',
      ready: true,
      lastSync: null,
      services: 0,
      endpoints: 0,
      drift: {services: [], checkedAt: null},
      syncFailures: 0,
      rulesReadAt: null,
    } as const;
    const unused = async () => {
      throw new Error('not used in this test');
    };
    const handlers = {
      status: async () => status,
      'rules.desired': unused,
      'rules.applied': unused,
      diff: unused,
      trace: unused,
      probe: unused,
      sync: unused,
      onSync: () => () => {},
    } as unknown as AgentApiHandlers;
    const api = await startAgentApi({
      host: '127.0.0.1',
      port: 0,
      handlers,
      auth: kubernetesAccessReviewer(admin),
      nodeName: 'node-1',
      log: memoryLogger(),
    });
    st.after(() => api.stop());

    const anonymous = await runPlugin(['status', '--agent-url', api.url], {KUBECONFIG: '/nonexistent'});
    assert.equal(anonymous.code, 2, describeRun(anonymous));
    assert.match(anonymous.stderr, /^error: the agent at .* refused the connection \(HTTP 401\): this proxyctl agent needs a bearer token/);

    const viewer = await runPlugin(['status', '--agent-url', api.url, '--kubeconfig', cluster.viewerKubeconfig]);
    assert.equal(viewer.code, 2, describeRun(viewer));
    assert.match(viewer.stderr, /^error: the agent at .* refused the connection \(HTTP 403\): user viewer may not get nodes\/proxy node-1/);

    const allowed = await runPlugin(['status', '--agent-url', api.url, '--token', cluster.server.adminToken]);
    assert.equal(allowed.code, 0, describeRun(allowed));
    assert.match(allowed.stdout, /^node-1\s+iptables\s+true/m);
  });

  await until('the agent to be still serving', async () => (await runPlugin(['status', '--agent-url', cluster.agentUrl])).code === 0);
});

function exportedKubeconfig(path: string): string {
  const config = new KubeConfig();
  config.loadFromFile(path);
  return config.exportConfig();
}

/** splitRule turns iptables-save's rule text into arguments, honouring its double quotes. */
function splitRule(text: string): string[] {
  return [...text.matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((match) =>
    match[1] !== undefined ? match[1].replace(/\\(.)/g, '$1') : match[2],
  );
}
