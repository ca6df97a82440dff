// kubectl proxyctl migrate-check --rules over ipvs mode's saved state, as a user runs it (the built
// CLI): kube-proxy's published ipvs fixtures (test/fixtures/kube-proxy/ipvs) read as a node's dump,
// the sentences the report says about kube-ipvs0's addresses and NodePorts on other node addresses,
// the evidence said for a dump, and bad ipvs input reported clearly with exit code 2.
import assert from 'node:assert/strict';
import {mkdtemp, readFile, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {kubeProxyCases} from '../fixtures/kube-proxy/fixtures.ts';
import {describeRun, root, runPlugin} from './agent-cluster.ts';

interface Report {
  equal: boolean;
  from: string;
  to: string;
  services: {servicePort: string; sentences: string[]}[];
  evidence: string[];
}

const onlyLocal = kubeProxyCases('ipvs').find((fixture) => fixture.name === 'only-local-load-balancing')!;
const fixtureDump = join(onlyLocal.dir, 'kube-proxy.ipvs');
const example = join(root, 'examples/cluster.yaml');
const settings = ['--cluster-cidr', '10.244.0.0/16', '--service-cidr', '10.96.0.0/12'];

const check = (dump: string[], objects: string, flags: string[], to = 'nftables', extra: string[] = []) =>
  runPlugin(['migrate-check', '--to', to, ...dump.flatMap((file) => ['--rules', file]), '-f', objects, ...flags, ...extra]);

const sentencesOf = (report: Report) => report.services.flatMap((service) => service.sentences);

describe("migrate-check --rules over kube-proxy's ipvs state", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'pxmigrate-ipvs-'));
  });
  after(() => rm(dir, {recursive: true, force: true}));

  it("only-local-load-balancing to nftables: kube-ipvs0 takes undefined ClusterIP ports today, the node's own connections to the eTP Local load-balancer IP change; the evidence says where to look", async () => {
    const run = await check([fixtureDump], onlyLocal.objects, onlyLocal.flags, 'nftables', ['-o', 'json']);
    assert.equal(run.code, 1, describeRun(run));
    // The fixture holds ipvsadm-save and ipset save only (kube-proxy's test publishes no iptables layer).
    assert.match(run.stderr, /warning: ipvs mode: no iptables-save output given; only the parts given are read/);
    const report = JSON.parse(run.stdout) as Report;
    assert.equal(report.from, 'ipvs mode');
    assert.equal(report.to, 'nftables mode');
    const sentences = sentencesOf(report);
    // Without the iptables layer no KUBE-IPVS-FILTER is known: the undefined port reaches the node's sockets today.
    assert.ok(
      sentences.includes(
        'ClusterIP 10.20.30.41 port 65535/TCP, which no service defines, from a pod on this node and the node itself, behaves differently: ' +
          'today it reaches the node itself untouched, where only a host socket on that address and port would answer; after the switch it ' +
          'is refused.',
      ),
      sentences.join('\n'),
    );
    // ipvs serves the node's own connections to an eTP Local load-balancer IP (bound to kube-ipvs0) from the local endpoint only;
    // nftables mode sends the node's own traffic to every endpoint, masqueraded, as kube-proxy's external chains do.
    assert.ok(
      sentences.includes(
        'Load-balancer IP 1.2.3.4 port 80/TCP, from the node itself, behaves differently: today it is sent to 10.180.0.1:80, not masqueraded; ' +
          'after the switch it is sent to 10.180.0.1:80 (50%), 10.180.1.1:80 (50%), masqueraded.',
      ),
      sentences.join('\n'),
    );
    // KUBE-IPVS-IPS names kube-ipvs0's addresses where the dump has no `ip addr` output.
    assert.ok(
      report.evidence.some((line) =>
        line.startsWith('nothing in the dump refuses connections to the 2 service addresses bound to kube-ipvs0 on ports no service uses'),
      ),
      report.evidence.join('\n'),
    );
    assert.ok(
      report.evidence.some((line) =>
        /the node answers ARP for the 1 load-balancer IPs bound to kube-ipvs0 today, and would not after/.test(line),
      ),
      report.evidence.join('\n'),
    );
  });

  it('a NodePort on a node address that is not the primary one answers today and would not after the switch', async () => {
    // kube-proxy's ipvs proxier writes a NodePort virtual server on every node address (TestNodePortIPv4: one per node IP);
    // here the fixture's node has two, 100.101.102.103 (its primary, --node-ip) and 100.101.102.104, with eTP Local's local endpoint.
    const nodePorts = ['100.101.102.103', '100.101.102.104']
      .map((address) => `-A -t ${address}:3001 -s rr\n-a -t ${address}:3001 -r 10.180.0.1:80 -m -w 1\n`)
      .join('');
    const dump = join(dir, 'two-node-addresses.ipvs');
    await writeFile(dump, `${await readFile(fixtureDump, 'utf8')}${nodePorts}`);
    const run = await check([dump], onlyLocal.objects, [...onlyLocal.flags, '--node-ip', '100.101.102.103']);
    assert.equal(run.code, 1, describeRun(run));
    assert.match(
      run.stdout,
      /NodePort 3001\/TCP on 100\.101\.102\.104, which is not a primary node IP, from [^:]+, answers today and would not after the switch: today it is sent to 10\.180\.0\.1:80, not masqueraded; after the switch it reaches the node itself untouched/,
    );
    // The primary address serves the NodePort in both modes; only the node's own connections change there (eTP Local, as above).
    assert.match(run.stdout, /NodePort 3001\/TCP on 100\.101\.102\.103, the primary node IP, from the node itself, behaves differently/);
    assert.doesNotMatch(run.stdout, /NodePort 3001\/TCP on 100\.101\.102\.103, the primary node IP, from a pod/);
  });

  it("a node's full ipvs state (render --mode ipvs): its own mode changes nothing; KUBE-IPVS-FILTER refuses undefined ports in both modes", async () => {
    const rendered = await runPlugin(['render', '-f', example, '--mode', 'ipvs', ...settings]);
    assert.equal(rendered.code, 0, describeRun(rendered));
    const dump = join(dir, 'node-1.ipvs');
    await writeFile(dump, rendered.stdout);

    const same = await check([dump], example, settings, 'ipvs');
    assert.equal(same.code, 0, describeRun(same));
    assert.match(same.stdout, /^Verdict\s+nothing would change/m);

    const run = await check([dump], example, settings, 'nftables', ['-o', 'json']);
    assert.equal(run.code, 1, describeRun(run));
    const report = JSON.parse(run.stdout) as Report;
    assert.ok(!sentencesOf(report).some((sentence) => /which no service defines/.test(sentence)), sentencesOf(report).join('\n'));
    assert.ok(
      report.evidence.some((line) =>
        /^the dump's KUBE-IPVS-FILTER refuses new connections to the \d+ service addresses bound to kube-ipvs0 on ports no service uses/.test(
          line,
        ),
      ),
      report.evidence.join('\n'),
    );
  });

  it('bad ipvs input: sets without virtual servers, the iptables layer alone, objects that do not match, an unknown format: exit 2', async () => {
    const part = async (name: string) => {
      const run = await runPlugin(['render', '-f', example, '--mode', 'ipvs', '--part', name, ...settings]);
      assert.equal(run.code, 0, describeRun(run));
      const file = join(dir, `only-${name}`);
      await writeFile(file, run.stdout);
      return file;
    };
    const setsOnly = await check([await part('ipset')], example, settings);
    assert.equal(setsOnly.code, 2, describeRun(setsOnly));
    assert.match(setsOnly.stderr, /--rules .*only-ipset holds ipvs mode's sets but no `ipvsadm-save -n` output/);

    const layerOnly = await check([await part('iptables')], example, settings);
    assert.equal(layerOnly.code, 2, describeRun(layerOnly));
    assert.match(layerOnly.stderr, /--rules .*only-iptables is the iptables layer of an ipvs-mode node/);

    const other = join(dir, 'other-objects.yaml');
    await writeFile(other, (await readFile(onlyLocal.objects, 'utf8')).replace('clusterIP: 10.20.30.41', 'clusterIP: 10.20.30.42'));
    const mismatch = await check([fixtureDump], other, onlyLocal.flags);
    assert.equal(mismatch.code, 2, describeRun(mismatch));
    assert.match(
      mismatch.stderr,
      /the objects do not match --rules .*kube-proxy\.ipvs: 1 of 1 ClusterIPs of service ports \(ns1\/svc1:p80\)/,
    );

    const junk = join(dir, 'junk');
    await writeFile(junk, `${await readFile(fixtureDump, 'utf8')}this is not a ruleset\n`);
    const unknown = await check([junk], onlyLocal.objects, onlyLocal.flags);
    assert.equal(unknown.code, 2, describeRun(unknown));
    assert.match(unknown.stderr, /--rules .*junk line \d+: cannot read "this is not a ruleset": expected iptables-save/);
  });
});
