// kubectl proxyctl migrate-check and diff --behaviour as a user runs them. Offline: the built CLI
// over a dump render wrote for the bundled example, in each mode; exit codes 0 nothing changes,
// 1 something would, 2 bad input. Live (root): a real agent in iptables mode, asked over its API.
import assert from 'node:assert/strict';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it, test} from 'node:test';
import {describeRun, inNetns, isRoot, root, runPlugin, startAgentCluster} from './agent-cluster.ts';

const example = join(root, 'examples/cluster.yaml');
const settings = ['--cluster-cidr', '10.244.0.0/16', '--service-cidr', '10.96.0.0/12'];

interface Report {
  node: string;
  from: string;
  to: string;
  equal: boolean;
  verdict: string;
  services: {servicePort: string; sentences: string[]}[];
  summary: {changedClasses: number; stopAnswering: number};
}

describe('kubectl proxyctl migrate-check --rules (offline)', () => {
  let dir: string;
  const dumps: Record<string, string> = {};
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'pxmigrate-'));
    for (const mode of ['iptables', 'nftables']) {
      const run = await runPlugin(['render', '-f', example, '--mode', mode, ...settings]);
      assert.equal(run.code, 0, describeRun(run));
      dumps[mode] = join(dir, `node-1.${mode}`);
      await writeFile(dumps[mode], run.stdout);
    }
  });
  after(() => rm(dir, {recursive: true, force: true}));

  const check = (to: string, dump: string, extra: string[] = []) =>
    runPlugin(['migrate-check', '--to', to, '--rules', dump, '-f', example, ...settings, ...extra]);

  it('iptables to nftables: NodePorts on 127.0.0.1 stop answering, exit 1', async () => {
    const run = await check('nftables', dumps.iptables);
    assert.equal(run.code, 1, describeRun(run));
    assert.match(run.stdout, /^Node\s+node-1: iptables mode -> nftables mode$/m);
    assert.match(run.stdout, /NodePort 30080\/TCP on 127\.0\.0\.1, from the node itself, answers today and would not after the switch/);
    assert.match(run.stdout, /ClusterIP 10\.96\.0\.10 port 65535\/TCP, which no service defines, .* after the switch it is refused\./);
    assert.match(run.stdout, /with a segment conntrack marks INVALID, .*today it is dropped; after the switch it goes on untouched/);
    assert.match(run.stdout, /localhost_nps_accepted_pkts/);
    assert.match(run.stdout, /^Verdict\s+\d+ of \d+ packet classes would behave differently after the switch to nftables mode/m);
  });

  it('-o json carries every changed class with both outcomes; --service limits it', async () => {
    const run = await check('nftables', dumps.iptables, ['--service', 'default/nginx', '-o', 'json']);
    assert.equal(run.code, 1, describeRun(run));
    const report = JSON.parse(run.stdout) as Report & {
      changes: {servicePort: string; changes: {before: {verdict: string}; after: {verdict: string}}[]}[];
    };
    assert.deepEqual(
      report.services.map((service) => service.servicePort),
      ['default/nginx:http'],
    );
    const loopback = report.changes[0].changes.find((change) => change.before.verdict === 'DNAT');
    assert.equal(loopback?.after.verdict, 'ACCEPT');
  });

  it('a mode against its own rendering: nothing changes, exit 0', async () => {
    for (const mode of ['iptables', 'nftables']) {
      const run = await check(mode, dumps[mode]);
      assert.equal(run.code, 0, describeRun(run));
      assert.match(run.stdout, /^Verdict\s+nothing would change: all \d+ packet classes of 5 service ports behave the same/m);
    }
  });

  it('nftables to iptables: undefined ClusterIP ports are no longer refused', async () => {
    const run = await check('iptables', dumps.nftables, ['-o', 'json']);
    assert.equal(run.code, 1, describeRun(run));
    const report = JSON.parse(run.stdout) as Report;
    const sentences = report.services.flatMap((service) => service.sentences);
    assert.ok(
      sentences.some((sentence) => /which no service defines.*today it is refused; after the switch it goes on untouched/.test(sentence)),
      sentences.join('\n'),
    );
  });

  it('bad input: unknown format, an empty file, rules of other objects, objects that do not match, exit 2', async () => {
    const junk = join(dir, 'junk');
    await writeFile(junk, 'this is not a ruleset\n');
    const unknown = await check('nftables', junk);
    assert.equal(unknown.code, 2, describeRun(unknown));
    assert.match(unknown.stderr, /--rules .*junk line 1: cannot read "this is not a ruleset": expected iptables-save, nft list ruleset/);

    const empty = join(dir, 'empty');
    await writeFile(empty, '\n');
    const nothing = await check('nftables', empty);
    assert.equal(nothing.code, 2, describeRun(nothing));
    assert.match(nothing.stderr, /--rules .*empty line 1: empty: expected iptables-save/);

    // nft's text listing is read as diff --rules reads it; a table without the services' rules matches no objects.
    const listing = join(dir, 'listing');
    await writeFile(listing, 'table ip kube-proxy {\n\tchain services {\n\t}\n}\n');
    const text = await check('nftables', listing);
    assert.equal(text.code, 2, describeRun(text));
    assert.match(text.stderr, /warning: .*listing: no base chain/);
    assert.match(text.stderr, /the objects do not match --rules .*listing/);

    const other = join(dir, 'other.yaml');
    const {readFile} = await import('node:fs/promises');
    await writeFile(other, (await readFile(example, 'utf8')).replaceAll('10.96.0.80', '10.96.0.81'));
    const mismatch = await runPlugin(['migrate-check', '--to', 'nftables', '--rules', dumps.iptables, '-f', other, ...settings]);
    assert.equal(mismatch.code, 2, describeRun(mismatch));
    assert.match(mismatch.stderr, /the objects do not match --rules .*default\/nginx:http/);

    const noObjects = await runPlugin(['migrate-check', '--to', 'nftables', '--rules', dumps.iptables]);
    assert.equal(noObjects.code, 2, describeRun(noObjects));
    assert.match(noObjects.stderr, /--rules needs -f OBJECTS/);
  });
});

test('kubectl proxyctl migrate-check and diff --behaviour against a real agent', async (t) => {
  if (!isRoot) {
    t.skip('needs root: the agent writes rules in a fresh network namespace');
    return;
  }
  const cluster = await startAgentCluster(t);
  const admin = ['--kubeconfig', cluster.kubeconfig];

  await t.test('migrate-check --to nftables on node-1: per-node report, exit 1', async () => {
    const run = await runPlugin(['migrate-check', '--to', 'nftables', 'node-1', ...admin]);
    assert.equal(run.code, 1, describeRun(run));
    assert.match(run.stdout, /^Node\s+node-1: iptables mode \(applied\) -> nftables mode$/m);
    assert.match(
      run.stdout,
      new RegExp(`ClusterIP ${cluster.webClusterIP.replaceAll('.', '\\.')} port 65535/TCP, which no service defines`),
    );
    assert.match(run.stdout, /^Verdict\s+/m);

    const table = await runPlugin(['migrate-check', '--to', 'nftables', '--all-nodes', ...admin]);
    assert.equal(table.code, 1, describeRun(table));
    assert.match(table.stdout, /^NODE\s+COMPARED\s+CHANGED CLASSES\s+STOP ANSWERING/);
    assert.match(table.stdout, /^node-1\s+iptables mode \(applied\) -> nftables mode\s+\d+/m);

    const json = await runPlugin(['migrate-check', '--to', 'nftables', 'node-1', '--service', 'default/web', '-o', 'json', ...admin]);
    assert.equal(json.code, 1, describeRun(json));
    const report = JSON.parse(json.stdout) as Report;
    assert.deepEqual(
      report.services.map((service) => service.servicePort),
      ['default/web:http'],
    );
  });

  await t.test('migrate-check --to ipvs where the kernel has no IP_VS: exit 2, named', async (t) => {
    let hasIpvs = true;
    try {
      inNetns(cluster.netns, ['ipvsadm', '-Ln']);
    } catch {
      hasIpvs = false;
    }
    if (hasIpvs) {
      t.skip('this kernel runs ipvs mode; the refusal is for kernels without IP_VS');
      return;
    }
    const run = await runPlugin(['migrate-check', '--to', 'ipvs', 'node-1', ...admin]);
    assert.equal(run.code, 2, describeRun(run));
    assert.match(run.stderr, /node node-1 cannot run ipvs mode/);
  });

  await t.test('diff --behaviour: in sync exits 0; a rule that lets a ClusterIP through is told in behaviour terms', async () => {
    const clean = await runPlugin(['diff', 'node-1', '--behaviour', ...admin]);
    assert.equal(clean.code, 0, describeRun(clean));
    assert.match(clean.stdout, /^Verdict\s+nothing would change/m);

    const bypass = ['-d', `${cluster.webClusterIP}/32`, '-p', 'tcp', '--dport', '80', '-j', 'RETURN'];
    inNetns(cluster.netns, ['iptables', '-t', 'nat', '-I', 'KUBE-SERVICES', '1', ...bypass]);
    try {
      const drifted = await runPlugin(['diff', 'node-1', '--behaviour', ...admin]);
      assert.equal(drifted.code, 1, describeRun(drifted));
      assert.match(
        drifted.stdout,
        new RegExp(
          `ClusterIP ${cluster.webClusterIP.replaceAll('.', '\\.')} port 80/TCP, from .*answers in the desired rules and would not in the applied rules`,
        ),
      );
    } finally {
      inNetns(cluster.netns, ['iptables', '-t', 'nat', '-D', 'KUBE-SERVICES', ...bypass]);
    }
  });
});
