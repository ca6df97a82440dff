// kube-proxy's own published rules (test/fixtures/kube-proxy) against proxyctl's idea of them:
// diff --rules of each case's node dump, as iptables-save of either front end prints it, with
// the case's objects and node settings finds no drift; without any one rule, it names exactly
// the service port that rule belongs to.
import assert from 'node:assert/strict';
import {existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, describe, it} from 'node:test';
import {servicePortOfComment} from '../../src/core/iptables/ruleset.ts';
import {diffOffline} from '../../src/plugin/lib/offline-diff.ts';
import {readRulesDump, splitDump} from '../../src/plugin/lib/rules-dump.ts';
import {kubeProxyCaseModel, kubeProxyCases, type KubeProxyCase} from '../fixtures/kube-proxy/fixtures.ts';
import {describeRun, runPlugin} from './agent-cluster.ts';

const dir = mkdtempSync(join(tmpdir(), 'pxkpfix-'));
after(() => rmSync(dir, {recursive: true, force: true}));

const caseModel = kubeProxyCaseModel;

async function drift(fixture: KubeProxyCase, dumpText: string) {
  const offline = await caseModel(fixture);
  assert.deepEqual(offline.problems, []);
  const dump = readRulesDump(splitDump('node dump', dumpText), offline.model.family);
  return diffOffline(offline.model, dump, {serviceCIDRs: offline.serviceCIDRs});
}

for (const fixture of kubeProxyCases('iptables')) {
  describe(`kube-proxy iptables fixture ${fixture.name}`, () => {
    for (const frontEnd of ['nft', 'legacy']) {
      const dumpFile = join(fixture.dir, `node.${frontEnd}.iptables-save`);

      it(`iptables-${frontEnd}: diff --rules finds no drift (exit 0)`, async () => {
        const run = await runPlugin(['diff', '--rules', dumpFile, '-f', fixture.objects, ...fixture.flags]);
        assert.equal(run.code, 0, describeRun(run));
        assert.equal(run.stdout, '');
        assert.doesNotMatch(run.stderr, /no jump/);
      });

      it(`iptables-${frontEnd}: without any one rule of a service port, diff names exactly that port`, async () => {
        const lines = readFileSync(dumpFile, 'utf8').split('\n');
        let checked = 0;
        for (const [index, line] of lines.entries()) {
          const comment = /--comment (?:"([^"]*)"|(\S+))/.exec(line);
          const port = servicePortOfComment(comment?.[1] ?? comment?.[2]);
          if (!line.startsWith('-A ') || !port) continue;
          const result = await drift(fixture, lines.filter((_, other) => other !== index).join('\n'));
          assert.deepEqual(result.drifted, [port], `without: ${line}`);
          assert.equal(result.otherRulesDiffer, false, line);
          checked++;
        }
        assert.ok(checked > 10, `only ${checked} rules of service ports`);
      });
    }

    it("kube-proxy's rules as its test publishes them (restore input): the service rules match, and the missing jumps are named", async () => {
      const path = join(fixture.dir, 'kube-proxy.rules');
      const run = await runPlugin(['diff', '--rules', path, '-f', fixture.objects, ...fixture.flags, '-o', 'json']);
      assert.equal(run.code, 1, describeRun(run));
      const answer = JSON.parse(run.stdout);
      assert.deepEqual(answer.drifted, []);
      assert.equal(answer.otherRulesDiffer, true);
      assert.ok(answer.groups[0].missing.every((line: string) => / -A (PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) /.test(line)));
      assert.match(run.stderr, /no jump from nat PREROUTING or OUTPUT into KUBE-SERVICES: this looks like iptables-restore input/);
    });

    it('a rule kube-proxy does not write is named as unexpected under its service port', async () => {
      const text = readFileSync(join(fixture.dir, 'node.nft.iptables-save'), 'utf8');
      const sep = /^-A (KUBE-SEP-\w+) -s (\S+) -m comment --comment ("?)([^"\s]+)"? -j KUBE-MARK-MASQ$/m.exec(text);
      assert.ok(sep);
      const port = sep[4];
      const comment = `${sep[3]}${port}${sep[3]}`;
      const extra = text.replace(sep[0], `${sep[0]}\n-A ${sep[1]} -s 203.0.113.9/32 -m comment --comment ${comment} -j ACCEPT`);
      const path = join(dir, `${fixture.name}-extra.iptables-save`);
      writeFileSync(path, extra);
      const result = await drift(fixture, extra);
      assert.deepEqual(result.drifted, [port]);
      assert.deepEqual(result.groups[0].unexpected, [`-t nat -A ${sep[1]} -s 203.0.113.9/32 -m comment --comment ${comment} -j ACCEPT`]);
    });
  });
}

for (const fixture of kubeProxyCases('ipvs')) {
  describe(`kube-proxy ipvs fixture ${fixture.name}`, () => {
    const dumpFile = join(fixture.dir, 'kube-proxy.ipvs');

    it('ipvsadm-save -n and ipset save: diff --rules finds no drift (exit 0)', async () => {
      const run = await runPlugin(['diff', '--rules', dumpFile, '-f', fixture.objects, ...fixture.flags]);
      assert.equal(run.code, 0, describeRun(run));
      assert.equal(run.stdout, '');
      assert.match(run.stderr, /ipvs mode: no iptables-save output given; only the parts given are read/);
    });

    // Read back from Debian's kernel in the qemu guest, for the cases that have it.
    const nodeDump = join(fixture.dir, 'node.ipvs');
    if (existsSync(nodeDump)) {
      it('as a kernel printed it back (ipvsadm -Sn, ipset save): no drift', async () => {
        const result = await drift(fixture, readFileSync(nodeDump, 'utf8'));
        assert.equal(result.equal, true, result.text);
      });
    }

    it('without any one real server or set entry, diff names exactly its service port', async () => {
      const lines = readFileSync(dumpFile, 'utf8').split('\n');
      const ports = new Set((await caseModel(fixture)).model.servicePorts.map((port) => port.key));
      let checked = 0;
      for (const [index, line] of lines.entries()) {
        if (!/^(-a |add )/.test(line)) continue;
        const result = await drift(fixture, lines.filter((_, other) => other !== index).join('\n'));
        assert.equal(result.drifted.length, 1, `without: ${line}: ${JSON.stringify(result.groups)}`);
        assert.ok(ports.has(result.drifted[0]), line);
        assert.equal(result.otherRulesDiffer, false, line);
        checked++;
      }
      assert.ok(checked >= 6, `only ${checked} lines checked`);
    });
  });
}
