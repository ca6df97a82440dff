// kubectl proxyctl diff --rules FILE -f OBJECTS as a user runs it (the built CLI): saved rules of
// each mode against what should be programmed for the objects. Exit 0: they match; 1: they differ,
// each drifting service port named NAMESPACE/NAME:PORT; 2: bad input.
import assert from 'node:assert/strict';
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, describe, it} from 'node:test';
import {parse} from 'yaml';
import {describeRun, root, runPlugin} from './agent-cluster.ts';

const example = join(root, 'examples/cluster.yaml');
const node = ['--cluster-cidr', '10.244.0.0/16'];
const dir = mkdtempSync(join(tmpdir(), 'pxdiffrules-'));
after(() => rmSync(dir, {recursive: true, force: true}));

async function rendered(mode: string, part?: string): Promise<string> {
  const run = await runPlugin(['render', '-f', example, ...node, '--mode', mode, ...(part ? ['--part', part] : [])]);
  assert.equal(run.code, 0, describeRun(run));
  return run.stdout;
}

function saved(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

const diff = (rules: string[], ...extra: string[]) =>
  runPlugin(['diff', ...rules.flatMap((file) => ['--rules', file]), '-f', example, ...node, ...extra]);

describe('kubectl proxyctl diff --rules', () => {
  for (const mode of ['iptables', 'nftables', 'ipvs']) {
    it(`${mode}: the rules render wrote match their objects (exit 0, nothing printed)`, async () => {
      const run = await diff([saved(`${mode}.rules`, await rendered(mode))]);
      assert.equal(run.code, 0, describeRun(run));
      assert.equal(run.stdout, '');
    });
  }

  it('iptables: a removed endpoint rule names exactly its service port (exit 1)', async () => {
    const text = (await rendered('iptables'))
      .split('\n')
      .filter((line) => !line.includes('"default/nginx:http -> 10.244.1.20:80"'))
      .join('\n');
    const run = await diff([saved('iptables-tampered.rules', text)]);
    assert.equal(run.code, 1, describeRun(run));
    assert.match(run.stdout, /^default\/nginx:http: differs\n/);
    assert.doesNotMatch(run.stdout, /^default\/(demoapp|empty)|^kube-system/m);

    const json = await diff([saved('iptables-tampered.rules', text)], '-o', 'json');
    assert.equal(json.code, 1, describeRun(json));
    const answer = JSON.parse(json.stdout);
    assert.deepEqual(answer.drifted, ['default/nginx:http']);
    assert.equal(answer.mode, 'iptables');
    assert.equal(answer.equal, false);
  });

  it('ipvs: the three dumps in separate files; a removed ipset entry names its service port (exit 1)', async () => {
    const [ipvsadm, ipset, iptables] = await Promise.all(['ipvsadm', 'ipset', 'iptables'].map((part) => rendered('ipvs', part)));
    const files = [saved('ipvsadm.txt', ipvsadm), saved('ipset.txt', ipset), saved('iptables.txt', iptables)];
    assert.equal((await diff(files)).code, 0);
    const entry = ipset.split('\n').find((line) => line.startsWith('add KUBE-CLUSTER-IP 10.96.0.80,tcp:80'));
    assert.ok(entry, ipset);
    files[1] = saved('ipset-tampered.txt', ipset.replace(`${entry}\n`, ''));
    const run = await diff(files, '-o', 'yaml');
    assert.equal(run.code, 1, describeRun(run));
    const answer = parse(run.stdout);
    assert.deepEqual(answer.drifted, ['default/nginx:http']);
    assert.equal(answer.otherRulesDiffer, false);
  });

  it('nftables: the table as `nft list ruleset` printed it, as text and as JSON, matches (exit 0)', async () => {
    for (const name of ['example.nft-list.txt', 'example.nft-list.json']) {
      const run = await runPlugin(['diff', '--rules', join(root, 'test/plugin/dumps', name), '-f', example]);
      assert.equal(run.code, 0, `${name}: ${describeRun(run)}`);
    }
  });

  it('nftables: a verdict-map element missing from the listing names its service port (exit 1)', async () => {
    const listing = readFileSync(join(root, 'test/plugin/dumps/example.nft-list.txt'), 'utf8');
    const tampered = listing.replace(/\s*10\.96\.0\.80 \. tcp \. 80 : goto service-\S+ \}/, ' }').replace(/,\s*\}/, ' }');
    assert.notEqual(tampered, listing);
    const run = await runPlugin(['diff', '--rules', saved('nft-tampered.txt', tampered), '-f', example, '-o', 'json']);
    assert.equal(run.code, 1, describeRun(run));
    assert.deepEqual(JSON.parse(run.stdout).drifted, ['default/nginx:http']);
  });

  it("nftables, --nftables-layout kube-proxy: kube-proxy's own table as nft listed it matches its objects; a removed element names its port", async () => {
    // TestOverallNFTablesRules (kube-proxy's pkg/proxy/nftables) on its fake node.
    const fixtures = join(root, 'test/core/nftables/kube-proxy-fixtures');
    const fakeNode = [
      '--node-name',
      'test-node',
      '--node-ip',
      '192.168.0.2',
      '--cluster-cidr',
      '10.0.0.0/8',
      '--service-cidr',
      '172.30.0.0/16',
    ];
    const settings = [...fakeNode, '--nodeport-addresses', '192.168.0.2/32', '--masquerade-bit', '14', '--nftables-layout', 'kube-proxy'];
    const kubeProxyDiff = (file: string) => runPlugin(['diff', '--rules', file, '-f', join(fixtures, 'overall.yaml'), ...settings]);
    const listing = readFileSync(join(fixtures, 'overall.nft-list.txt'), 'utf8');
    const clean = await kubeProxyDiff(saved('kube-proxy.nft', listing));
    assert.equal(clean.code, 0, describeRun(clean));
    const element = '172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80,';
    assert.ok(listing.includes(element));
    const tampered = await kubeProxyDiff(saved('kube-proxy-tampered.nft', listing.replace(element, '')));
    assert.equal(tampered.code, 1, describeRun(tampered));
    assert.match(tampered.stdout, /^ns4\/svc4:p80: differs$/m);
    assert.doesNotMatch(tampered.stdout, /ns[12356]\/svc/);
  });

  it('refuses a file of no known format, naming the file and line (exit 2)', async () => {
    const path = saved('notes.txt', '*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\nnot a rule at all\n');
    const run = await diff([path]);
    assert.equal(run.code, 2, describeRun(run));
    assert.match(run.stderr, new RegExp(`${path.replaceAll('.', '\\.')} line 4: cannot read "not a rule at all"`));
  });

  it('refuses --mode that the files are not in, and --rules without -f (exit 2)', async () => {
    const path = saved('mode.rules', await rendered('iptables'));
    const wrongMode = await diff([path], '--mode', 'ipvs');
    assert.equal(wrongMode.code, 2, describeRun(wrongMode));
    assert.match(wrongMode.stderr, /--mode ipvs: the --rules files hold iptables mode's rules \(iptables-save\)/);
    const noObjects = await runPlugin(['diff', '--rules', path]);
    assert.equal(noObjects.code, 2, describeRun(noObjects));
    assert.match(noObjects.stderr, /--rules needs -f FILE/);
  });

  it('warns when the dump is restore input without the jumps into KUBE-SERVICES', async () => {
    const text = (await rendered('iptables'))
      .split('\n')
      .filter((line) => !/^-A (PREROUTING|OUTPUT) .*-j KUBE-SERVICES/.test(line))
      .join('\n');
    const run = await diff([saved('no-jumps.rules', text)]);
    assert.match(run.stderr, /warning: .*no jump from nat PREROUTING or OUTPUT into KUBE-SERVICES: this looks like iptables-restore input/);
  });
});
