// kubectl proxyctl render as a user runs it: the built CLI on the bundled example, its output loaded
// by the tool each mode names into a fresh network namespace. Exit codes: 0 printed, 2 bad input
// or bad flags. The loading tests need root (network namespaces); the rest do not.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {parseIpsetSave, parseIpvsadmSave} from '../../src/core/ipvs/index.ts';
import type {ProxyModel} from '../../src/core/model/index.ts';
import {describeRun, isRoot, root, runPlugin} from './agent-cluster.ts';

const example = join(root, 'examples/cluster.yaml');
const exampleServices = ['default/demoapp', 'default/empty', 'default/nginx', 'kube-system/dns'];
const exampleClusterIPs = ['10.96.0.10', '10.96.0.53', '10.96.0.80', '10.96.0.99'];
/** default/empty has no endpoints: its ClusterIP is rejected instead of DNATed. */
const emptyClusterIP = '10.96.0.99';
const withEndpoints = exampleClusterIPs.filter((ip) => ip !== emptyClusterIP);
const escaped = (text: string) => text.replaceAll('.', '\\.');
const needsRoot = isRoot ? false : 'needs root: loads the rules into a fresh network namespace';

async function render(args: string[]): Promise<string> {
  const run = await runPlugin(['render', '-f', example, ...args]);
  assert.equal(run.code, 0, describeRun(run));
  assert.equal(run.stderr, '', describeRun(run));
  return run.stdout;
}

/** load feeds `input` to a command run inside the namespace and fails with its stderr. */
function load(netns: string, command: string[], input: string): string {
  return execFileSync('ip', ['netns', 'exec', netns, ...command], {input, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe']});
}

describe('kubectl proxyctl render', () => {
  const netnsPrefix = `pxrender-${process.pid}-`;
  let serial = 0;
  const made: string[] = [];
  const freshNetns = () => {
    const name = `${netnsPrefix}${serial++}`;
    execFileSync('ip', ['netns', 'add', name]);
    made.push(name);
    return name;
  };
  let scratch: string;
  before(async () => {
    scratch = await mkdtemp(join(tmpdir(), 'pxrender-'));
  });
  after(async () => {
    for (const name of made) execFileSync('ip', ['netns', 'del', name]);
    await rm(scratch, {recursive: true, force: true});
  });

  it('iptables mode: the output loads with iptables-restore into a fresh namespace', {skip: needsRoot}, async () => {
    const rules = await render(['--mode', 'iptables', '--cluster-cidr', '10.244.0.0/16']);
    const netns = freshNetns();
    load(netns, ['iptables-restore'], rules);
    const nat = load(netns, ['iptables-save', '-t', 'nat'], '');
    for (const ip of withEndpoints)
      assert.match(nat, new RegExp(`-A KUBE-SERVICES -d ${escaped(ip)}/32 .*-j KUBE-SVC-`), `a KUBE-SERVICES rule for ${ip}`);
    assert.match(nat, /-A PREROUTING .*-j KUBE-SERVICES/);
    const filter = load(netns, ['iptables-save', '-t', 'filter'], '');
    assert.match(filter, new RegExp(`-A KUBE-SERVICES -d ${escaped(emptyClusterIP)}/32 .*has no endpoints.* -j REJECT`));
  });

  it('nftables mode: the output loads with nft -f into a fresh namespace', {skip: needsRoot}, async () => {
    const script = await render(['--mode', 'nftables', '--cluster-cidr', '10.244.0.0/16']);
    const netns = freshNetns();
    load(netns, ['nft', '-f', '-'], script);
    const serviceIPs = load(netns, ['nft', 'list', 'map', 'ip', 'kube-proxy', 'service-ips'], '');
    for (const ip of withEndpoints)
      assert.match(serviceIPs, new RegExp(`${escaped(ip)} \\. (tcp|udp) \\. \\d+ : goto service-`), `a service-ips element for ${ip}`);
    const noEndpoints = load(netns, ['nft', 'list', 'map', 'ip', 'kube-proxy', 'no-endpoint-services'], '');
    assert.match(noEndpoints, new RegExp(`${escaped(emptyClusterIP)} \\. tcp \\. 80 comment "default/empty:http" : goto reject-chain`));
  });

  it("nftables mode, --nftables-layout kube-proxy: kube-proxy's own layout loads with nft -f", {skip: needsRoot}, async () => {
    const script = await render(['--mode', 'nftables', '--cluster-cidr', '10.244.0.0/16', '--nftables-layout', 'kube-proxy']);
    const netns = freshNetns();
    load(netns, ['nft', '-f', '-'], script);
    const chains = load(netns, ['nft', 'list', 'chains', 'ip'], '');
    assert.match(chains, /chain filter-prerouting-pre-dnat \{/, "kube-proxy's base chains");
    assert.match(chains, /chain endpoint-[A-Z2-7]{8}-default\/demoapp\/tcp\/http__10\.244\.\d+\.\d+\/\d+ \{/, 'a chain per endpoint');
    assert.doesNotMatch(load(netns, ['nft', 'list', 'ruleset'], ''), /endpoint-targets-/, 'no shared endpoint maps');
  });

  it('ipvs mode: each part loads with its own tool; the ipvsadm part reads back as the servers', {skip: needsRoot}, async () => {
    const all = await render(['--mode', 'ipvs', '--cluster-cidr', '10.244.0.0/16']);
    const headings = all.split('\n').filter((line) => line.startsWith('# ===='));
    assert.deepEqual(
      headings.map((line) => /--part (\w+)/.exec(line)?.[1]),
      ['ipset', 'iptables', 'addresses', 'ipvsadm'],
      'one section per part, in load order',
    );

    const sets = await render(['--mode', 'ipvs', '--part', 'ipset', '--cluster-cidr', '10.244.0.0/16']);
    assert.ok(all.includes(sets), 'the ipset part is printed whole in the full output');
    const netns = freshNetns();
    load(netns, ['ipset', 'restore'], sets);
    const saved = parseIpsetSave(load(netns, ['ipset', 'save'], ''));
    const clusterIPSet = saved.find((set) => set.name === 'KUBE-CLUSTER-IP');
    assert.deepEqual(clusterIPSet?.entries, [
      '10.96.0.10,tcp:80',
      '10.96.0.53,tcp:53',
      '10.96.0.53,udp:53',
      '10.96.0.80,tcp:80',
      '10.96.0.99,tcp:80',
    ]);
    // The iptables layer matches those sets by name: it loads only once they exist.
    load(netns, ['iptables-restore'], await render(['--mode', 'ipvs', '--part', 'iptables', '--cluster-cidr', '10.244.0.0/16']));
    assert.match(load(netns, ['iptables-save', '-t', 'nat'], ''), /-A KUBE-SERVICES .*--match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT/);

    // This kernel has no IP_VS, so ipvsadm cannot load the servers: read them back as ipvsadm would print them.
    const servers = parseIpvsadmSave(await render(['--mode', 'ipvs', '--part', 'ipvsadm', '--cluster-cidr', '10.244.0.0/16']));
    const demoapp = servers.find((server) => server.address === '10.96.0.10' && server.port === 80);
    assert.equal(demoapp?.protocol, 'TCP');
    assert.equal(demoapp?.scheduler, 'rr');
    assert.deepEqual(
      demoapp?.realServers.map((real) => `${real.address}:${real.port}`),
      ['10.244.0.10:8080', '10.244.0.11:8080', '10.244.1.10:8080'],
    );
    const empty = servers.find((server) => server.address === '10.96.0.99');
    assert.deepEqual(empty?.realServers, [], 'a service without endpoints keeps its virtual server, with no real servers');
    assert.ok(
      servers.some((server) => server.port === 30080),
      'the NodePort has virtual servers on the node address',
    );

    const addresses = await render(['--mode', 'ipvs', '--part', 'addresses']);
    assert.deepEqual(addresses.trim().split('\n'), [
      'link add kube-ipvs0 type dummy',
      ...exampleClusterIPs.map((ip) => `addr add ${ip}/32 dev kube-ipvs0`),
    ]);
  });

  it('-o json prints the ProxyModel with every service', async () => {
    const model = JSON.parse(await render(['-o', 'json'])) as ProxyModel;
    assert.equal(model.family, 'IPv4');
    const services = new Set(model.servicePorts.map((port) => port.key.replace(/:[^:]*$/, '')));
    assert.deepEqual([...services].sort(), exampleServices);
  });

  it('a bad object: exit 2 naming the file, the object and the field; the rest is still rendered', async () => {
    const file = join(scratch, 'bad.yaml');
    await writeFile(
      file,
      [
        'apiVersion: v1',
        'kind: Service',
        'metadata: {name: web, namespace: shop}',
        'spec: {type: ClusterIP, clusterIP: 10.96.1.1, ports: [{name: http, protocol: TCP, port: 70000, targetPort: 8080}]}',
        '---',
        'apiVersion: v1',
        'kind: Service',
        'metadata: {name: ok, namespace: shop}',
        'spec: {type: ClusterIP, clusterIP: 10.96.1.2, ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]}',
      ].join('\n'),
    );
    for (const mode of ['iptables', 'nftables', 'ipvs']) {
      const run = await runPlugin(['render', '-f', file, '--mode', mode]);
      assert.equal(run.code, 2, describeRun(run));
      assert.match(run.stderr, new RegExp(`${escaped(file)}: .*shop/web.*field spec\\.ports\\[0\\]\\.port`), describeRun(run));
      assert.ok(run.stdout.includes('10.96.1.2'), `${mode}: the valid service is still rendered`);
      assert.ok(!run.stdout.includes('10.96.1.1'), `${mode}: the bad one is not`);
    }
  });

  it('iptables mode records the node addresses it used; trace --rules over the output takes them, and warns without any', async () => {
    const rules = await render(['--cluster-cidr', '10.244.0.0/16']);
    assert.equal(rules.split('\n')[0], '# node addresses (for -m addrtype LOCAL): 10.240.0.11');
    const file = join(scratch, 'node-1.rules');
    await writeFile(file, rules);
    // nginx: NodePort 30080, externalTrafficPolicy Local, its pod on node-1.
    const nodePort = ['trace', '--rules', file, '--src', '192.168.50.2', '--dst', '10.240.0.11:30080/tcp', '-o', 'json'];
    const run = await runPlugin(nodePort);
    assert.equal(run.code, 0, describeRun(run));
    const seen = JSON.parse(run.stdout) as {verdict: string; servicePort?: string; warnings: string[]};
    assert.deepEqual([seen.verdict, seen.servicePort], ['DNAT', 'default/nginx:http']);
    assert.ok(!seen.warnings.some((warning) => warning.includes('no address of the node')), seen.warnings.join('\n'));

    const bare = join(scratch, 'node-1.bare.rules');
    await writeFile(bare, rules.split('\n').slice(1).join('\n'));
    const blind = await runPlugin(nodePort.map((arg) => (arg === file ? bare : arg)));
    assert.equal(blind.code, 0, describeRun(blind));
    const unseen = JSON.parse(blind.stdout) as {servicePort?: string; warnings: string[]};
    assert.equal(unseen.servicePort, undefined);
    assert.ok(
      unseen.warnings.some((warning) =>
        /no address of the node was given, so -m addrtype LOCAL matched only loopback: 10\.240\.0\.11/.test(warning),
      ),
      unseen.warnings.join('\n'),
    );
    const text = await runPlugin(nodePort.slice(0, -2).map((arg) => (arg === file ? bare : arg)));
    assert.match(text.stdout, /no address of the node was given/, describeRun(text));
  });

  it('valid input that renders to nothing, or that kube-apiserver would refuse: a warning on stderr naming the object, exit 0', async () => {
    const empty = join(scratch, 'empty.yaml');
    await writeFile(empty, '# nothing here\n');
    const none = await runPlugin(['render', '-f', empty]);
    assert.equal(none.code, 0, describeRun(none));
    assert.match(none.stderr, new RegExp(`^warning: no Service or EndpointSlice in ${escaped(empty)}`, 'm'));

    const file = join(scratch, 'odd.yaml');
    await writeFile(
      file,
      [
        'apiVersion: v1',
        'kind: Service',
        'metadata: {name: web, namespace: shop}',
        'spec: {type: NodePort, clusterIP: 10.96.1.1, ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 80}]}',
        '---',
        'apiVersion: v1',
        'kind: Service',
        'metadata: {name: six, namespace: shop}',
        'spec: {type: ClusterIP, clusterIP: "fd00::10", clusterIPs: ["fd00::10"], ipFamilies: [IPv6], ports: [{name: http, protocol: TCP, port: 80}]}',
        '---',
        'apiVersion: discovery.k8s.io/v1',
        'kind: EndpointSlice',
        'metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}',
        'addressType: IPv4',
        'ports: [{name: https, protocol: TCP, port: 8443}]',
        'endpoints: [{addresses: [10.244.1.5]}]',
        '---',
        'apiVersion: discovery.k8s.io/v1',
        'kind: EndpointSlice',
        'metadata: {name: web-dns, namespace: shop, labels: {kubernetes.io/service-name: web}}',
        'addressType: FQDN',
        'ports: [{name: http, protocol: TCP, port: 8080}]',
        'endpoints: [{addresses: [web.example.com]}]',
      ].join('\n'),
    );
    const run = await runPlugin(['render', '-f', file]);
    assert.equal(run.code, 0, describeRun(run));
    const warnings = run.stderr.trim().split('\n');
    const expected = [
      /^warning: .*odd\.yaml: Service shop\/web port http: nodePort 80 is outside the default node-port range 30000-32767/,
      /^warning: .*odd\.yaml: Service shop\/six has no IPv4 cluster IP \(fd00::10\): it is not in these rules; render it with --ip-family ipv6$/,
      /^warning: .*odd\.yaml: EndpointSlice shop\/web-1: port "https" matches no port of Service shop\/web \("http"\)/,
      /^warning: .*odd\.yaml: EndpointSlice shop\/web-dns has addressType FQDN, which kube-proxy does not proxy/,
    ];
    assert.equal(warnings.length, expected.length, describeRun(run));
    for (const pattern of expected)
      assert.ok(
        warnings.some((line) => pattern.test(line)),
        `${pattern}\n${describeRun(run)}`,
      );
    assert.ok(run.stdout.includes('10.96.1.1'), 'the rules are printed all the same');
    const six = await runPlugin(['render', '-f', file, '--ip-family', 'ipv6']);
    assert.match(six.stderr, /Service shop\/web has no IPv6 cluster IP \(10\.96\.1\.1\)/);
  });

  it('an unreadable file: exit 2 naming it', async () => {
    const run = await runPlugin(['render', '-f', join(scratch, 'missing.yaml')]);
    assert.equal(run.code, 2, describeRun(run));
    assert.match(run.stderr, /cannot read .*missing\.yaml: no such file/);
  });

  it('bad flags: exit 2 with a message naming the flag and what it takes', async () => {
    const mode = await runPlugin(['render', '-f', example, '--mode', 'userspace']);
    assert.equal(mode.code, 2, describeRun(mode));
    assert.match(mode.stderr, /--mode=userspace to be one of: iptables, nftables, ipvs/);
    assert.equal(mode.stdout, '');

    const part = await runPlugin(['render', '-f', example, '--mode', 'nftables', '--part', 'ipset']);
    assert.equal(part.code, 2, describeRun(part));
    assert.match(part.stderr, /--part ipset: only ipvs mode has parts/);
    assert.equal(part.stdout, '');

    const unknownPart = await runPlugin(['render', '-f', example, '--mode', 'ipvs', '--part', 'routes']);
    assert.equal(unknownPart.code, 2, describeRun(unknownPart));
    assert.match(unknownPart.stderr.replace(/\s*\n\s*›\s*/g, ' '), /--part=routes to be one of: ipvsadm, ipset, iptables, addresses/);
  });
});
