// kubectl proxyctl trace --rules as a user runs it (the built CLI) over saved rules of each kind:
// kube-proxy's own rules, ipvs mode's dumps in several files, and files it must refuse.
import assert from 'node:assert/strict';
import {mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, describe, it} from 'node:test';
import {kubeProxyCases} from '../fixtures/kube-proxy/fixtures.ts';
import {describeRun, root, runPlugin} from './agent-cluster.ts';

const overall = kubeProxyCases('iptables').find((fixture) => fixture.name === 'overall')!;
const dir = mkdtempSync(join(tmpdir(), 'pxtracerules-'));
after(() => rmSync(dir, {recursive: true, force: true}));

const trace = (rules: string[], ...extra: string[]) => runPlugin(['trace', ...rules.flatMap((file) => ['--rules', file]), ...extra]);

/** A pod's packet to ns1/svc1's ClusterIP in kube-proxy's overall case, traced over `file`. */
const podToSvc1 = (file: string) => trace([file], '--src', '10.0.0.2', '--dst', '172.30.0.41:80', '--node-ip', '192.168.0.2', '-o', 'json');

describe('kubectl proxyctl trace --rules', () => {
  it("over a node's dump of kube-proxy's rules: the packet is DNATed to the endpoint, no warning", async () => {
    const run = await podToSvc1(join(overall.dir, 'node.legacy.iptables-save'));
    assert.equal(run.code, 0, describeRun(run));
    const result = JSON.parse(run.stdout);
    assert.equal(result.verdict, 'DNAT');
    assert.deepEqual(
      result.branches.map((branch: {endpoint: string}) => branch.endpoint),
      ['10.180.0.1:80'],
    );
    assert.equal(run.stderr, '');
  });

  it("over kube-proxy's restore input without jumps: a warning says why nothing matches", async () => {
    const run = await podToSvc1(join(overall.dir, 'kube-proxy.rules'));
    assert.equal(run.code, 0, describeRun(run));
    assert.equal(JSON.parse(run.stdout).verdict, 'ACCEPT');
    assert.match(
      run.stderr,
      /^warning: .*kube-proxy\.rules: no jump from nat PREROUTING or OUTPUT into KUBE-SERVICES: this looks like iptables-restore input/,
    );
  });

  it("over ipvs mode's dumps given as several files", async () => {
    const parts = await Promise.all(
      ['ipvsadm', 'ipset', 'iptables'].map(async (part) => {
        const run = await runPlugin([
          'render',
          '-f',
          join(root, 'examples/cluster.yaml'),
          '--mode',
          'ipvs',
          '--part',
          part,
          '--cluster-cidr',
          '10.244.0.0/16',
        ]);
        const path = join(dir, `ipvs-${part}.txt`);
        writeFileSync(path, run.stdout);
        return path;
      }),
    );
    const run = await trace(parts, '--src', '10.244.1.9', '--dst', '10.96.0.80:80', '--node-ip', '10.240.0.11', '-o', 'json');
    assert.equal(run.code, 0, describeRun(run));
    const result = JSON.parse(run.stdout);
    assert.equal(result.verdict, 'DNAT');
    assert.ok(result.branches.length > 0);
  });

  it('refuses a file of no known format, naming the line (exit 2)', async () => {
    const path = join(dir, 'notes.txt');
    writeFileSync(path, '# my notes\n\nnothing here is a rule\n');
    const run = await trace([path], '--src', '10.0.0.2', '--dst', '172.30.0.41:80');
    assert.equal(run.code, 2, describeRun(run));
    assert.match(
      run.stderr,
      /^error: --rules .*notes\.txt line 3: cannot read "nothing here is a rule": expected iptables-save, nft list ruleset/,
    );
  });
});
