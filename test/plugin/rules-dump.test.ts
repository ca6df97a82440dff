// Saved rules for trace --rules and diff --rules: the format of each file is found from its text,
// ipvs mode's three dumps are one state in one file or in several, a file of no known format is
// refused naming its line, and restore input without the built-in chains' jumps is warned about.
import assert from 'node:assert/strict';
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, describe, it} from 'node:test';
import {renderIptables} from '../../src/core/iptables/index.ts';
import {buildProxyModel, parseManifests} from '../../src/core/model/index.ts';
import {DumpError, readDumpFiles, readRulesDump, splitDump, traceDump} from '../../src/plugin/lib/rules-dump.ts';
import {renderRules} from '../../src/plugin/lib/render-rules.ts';

const root = new URL('../../', import.meta.url).pathname;
const dir = mkdtempSync(join(tmpdir(), 'pxdump-'));
after(() => rmSync(dir, {recursive: true, force: true}));

function file(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

function exampleModel() {
  const parsed = parseManifests(readFileSync(join(root, 'examples/cluster.yaml'), 'utf8'), 'cluster.yaml');
  return buildProxyModel(
    {services: parsed.services as never, endpointSlices: parsed.endpointSlices as never, node: parsed.nodes[0] as never},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
  );
}

const dumps = (name: string) => join(root, 'test/core/iptables/dumps', name);

describe('format detection', () => {
  it('reads iptables-save of either front end as iptables mode, with no warning when the jumps are there', () => {
    for (const name of ['node-a.nft.txt', 'node-a.legacy.txt']) {
      const parts = readDumpFiles([dumps(name)]);
      assert.deepEqual(
        parts.map((part) => part.format),
        ['iptables-save'],
        name,
      );
      const dump = readRulesDump(parts);
      assert.equal(dump.mode, 'iptables', name);
      assert.deepEqual(dump.warnings, [], name);
      assert.equal(dump.mode === 'iptables' && dump.ruleset.frontEnd, name.includes('nft') ? 'nf_tables' : 'legacy');
    }
  });

  it('reads nft list ruleset as text and as JSON into the same table', () => {
    const text = readRulesDump(readDumpFiles([join(root, 'test/plugin/dumps/example.nft-list.txt')]));
    const json = readRulesDump(readDumpFiles([join(root, 'test/plugin/dumps/example.nft-list.json')]));
    assert.equal(text.mode, 'nftables');
    assert.equal(json.mode, 'nftables');
    assert.deepEqual(text.parts[0].format, 'nft list ruleset');
    assert.deepEqual(json.parts[0].format, 'nft -j list ruleset');
    if (text.mode !== 'nftables' || json.mode !== 'nftables') return;
    assert.deepEqual([...text.ruleset.chains.keys()].sort(), [...json.ruleset.chains.keys()].sort());
    assert.deepEqual([...text.ruleset.sets.keys()].sort(), [...json.ruleset.sets.keys()].sort());
    const packet = {srcIP: '10.244.1.9', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP' as const, origin: 'arriving' as const};
    const fromText = traceDump(text, packet, ['10.240.0.11']);
    const fromJson = traceDump(json, packet, ['10.240.0.11']);
    assert.equal(fromText.verdict, 'DNAT');
    assert.deepEqual(fromText.branches.map((branch) => branch.endpoint).sort(), fromJson.branches.map((branch) => branch.endpoint).sort());
  });

  it("reads ipvs mode's dumps in one file or in several as one state", () => {
    const all = renderRules(exampleModel(), 'ipvs');
    const one = readRulesDump(readDumpFiles([file('ipvs-all.txt', all)]));
    assert.equal(one.mode, 'ipvs');
    assert.deepEqual([...new Set(one.parts.map((part) => part.format))].sort(), [
      'ipset save',
      'iptables-save',
      'ipvsadm-save -n',
      'kube-ipvs0 addresses',
    ]);
    const several = readRulesDump(
      readDumpFiles(
        (['ipvsadm', 'ipset', 'iptables'] as const).map((part) => file(`ipvs-${part}.txt`, renderRules(exampleModel(), 'ipvs', part))),
      ),
    );
    assert.equal(several.mode, 'ipvs');
    if (one.mode !== 'ipvs' || several.mode !== 'ipvs') return;
    assert.deepEqual(several.state.virtualServers, one.state.virtualServers);
    assert.deepEqual(several.state.sets, one.state.sets);
    assert.ok(one.state.virtualServers.length > 0);
    assert.deepEqual(one.warnings, []);
  });

  it('refuses a file of no known format, naming the file and the line', () => {
    const path = file('notes.txt', '*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\nthis is not a rule\n');
    assert.throws(
      () => readDumpFiles([path]),
      (error: unknown) =>
        error instanceof DumpError && error.line === 4 && error.message.startsWith(`${path} line 4: cannot read "this is not a rule"`),
    );
    assert.throws(() => splitDump('empty.txt', '\n\n'), /empty\.txt line 1: empty/);
  });

  it("names the line a format's reader refused", () => {
    const path = file(
      'bad-rule.txt',
      '# Generated by iptables-save v1.8.9\n*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j ACCEPT\n-A NOCHAIN -j ACCEPT\nCOMMIT\n',
    );
    assert.throws(
      () => readRulesDump(readDumpFiles([path])),
      (error: unknown) => error instanceof DumpError && error.line === 5 && /chain NOCHAIN is not declared/.test(error.message),
    );
  });

  it('refuses an ipvsadm line whose weight is no number (two dumps glued on one line), naming it', () => {
    const glued = '-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1create KUBE-CLUSTER-IP hash:ip,port\n';
    assert.throws(
      () => readRulesDump(readDumpFiles([file('glued.txt', glued)])),
      (error: unknown) => error instanceof DumpError && error.line === 2 && /weight "1create" is no whole number/.test(error.message),
    );
  });

  it("warns that restore input without the built-in chains' jumps is no node's dump", () => {
    const dump = readRulesDump(readDumpFiles([file('restore.txt', renderIptables(exampleModel()))]));
    assert.equal(dump.mode, 'iptables');
    assert.equal(dump.warnings.length, 1);
    assert.match(dump.warnings[0], /no jump from nat PREROUTING or OUTPUT into KUBE-SERVICES: this looks like iptables-restore input/);
    const withJumps = readRulesDump(readDumpFiles([file('with-jumps.txt', renderIptables(exampleModel(), {includeJumps: true}))]));
    assert.deepEqual(withJumps.warnings, []);
  });
});
