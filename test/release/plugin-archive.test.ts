// The linux/amd64 plugin archive as a user gets it: built by the release script, checked as krew
// checks its manifest, unpacked into an empty directory on a PATH that has no Node and no clone,
// and run: --version, render and trace --rules on the bundled example, and (root) status and trace
// against a lab.
import assert from 'node:assert/strict';
import {mkdirSync, readFileSync, symlinkSync, writeFileSync} from 'node:fs';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {krewManifestProblems} from '../../scripts/release/krew-manifest.ts';
import {buildRelease, isRoot, needsBuild, type Release, root, run, type UnpackedPlugin, unpackPlugin} from './release-fixture.ts';

const packageJson = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {version: string};

describe('the linux/amd64 plugin archive', {skip: needsBuild}, () => {
  let release: Release;
  let plugin: UnpackedPlugin;
  before(async () => {
    release = await buildRelease(['--platform', 'linux/amd64', '--no-image']);
    plugin = unpackPlugin(join(release.dir, release.facts.archives[0].name));
  });

  it('holds kubectl-proxyctl and LICENSE at its root, and Node for the platform', () => {
    const listing = readFileSync(join(plugin.dir, 'kubectl-proxyctl'), 'utf8');
    assert.match(listing, /^#!\/bin\/sh/);
    assert.match(readFileSync(join(plugin.dir, 'LICENSE'), 'utf8'), /Apache License/);
    assert.equal(release.facts.archives[0].platform, 'linux/amd64');
  });

  it('runs on a PATH with no node: kubectl proxyctl --version', async () => {
    const node = await run('/bin/sh', ['-c', 'command -v node'], {env: plugin.env, cwd: plugin.cwd});
    assert.notEqual(node.code, 0, `node is on the test PATH: ${node.stdout}`);
    const answer = await plugin.kubectlProxyctl(['--version']);
    assert.equal(answer.code, 0, answer.stderr);
    assert.equal(answer.stdout, `proxyctl/${packageJson.version} linux-x64 node-v${release.facts.archives[0].node}\n`);
    if (!plugin.throughKubectl) console.error('# kubectl is not installed: the launcher ran directly');
  });

  it("runs through a link to it, as krew's bin directory holds it", async () => {
    const krewBin = join(plugin.cwd, '..', 'krew-bin');
    mkdirSync(krewBin);
    symlinkSync(join(plugin.dir, 'kubectl-proxyctl'), join(krewBin, 'kubectl-proxyctl'));
    const tools = plugin.env.PATH!.split(':').slice(1).join(':');
    const answer = await run(join(krewBin, 'kubectl-proxyctl'), ['--version'], {
      env: {...plugin.env, PATH: `${krewBin}:${tools}`},
      cwd: plugin.cwd,
    });
    assert.equal(answer.code, 0, answer.stderr);
    assert.match(answer.stdout, /^proxyctl\/\S+ linux-x64 node-v/);
  });

  it('renders the bundled example, and trace --rules follows a packet through the rendered rules', async () => {
    const rules = join(plugin.cwd, 'rules.txt');
    const render = await plugin.kubectlProxyctl([
      'render',
      '-f',
      join(plugin.dir, 'examples/cluster.yaml'),
      '--cluster-cidr',
      '10.244.0.0/16',
    ]);
    assert.equal(render.code, 0, render.stderr);
    assert.match(render.stdout, /^-A KUBE-SERVICES .* -d 10\.96\.0\.10 --dport 80 -j KUBE-SVC-/m);
    writeFileSync(rules, render.stdout);
    const trace = await plugin.kubectlProxyctl(['trace', '--rules', rules, '--src', '10.244.1.5', '--dst', '10.96.0.10:80']);
    assert.equal(trace.code, 0, trace.stderr);
    assert.match(trace.stdout, /^Service\s+default\/demoapp:http$/m);
    assert.match(trace.stdout, /^Verdict\s+DNAT/m);
  });

  it('passes the checks krew makes of its manifest, and a wrong sha256 does not', async () => {
    const manifest = join(release.dir, 'proxyctl.yaml');
    const text = readFileSync(manifest, 'utf8');
    const archiveOf = (uri: string) => join(release.dir, uri.slice(uri.lastIndexOf('/') + 1));
    assert.deepEqual(await krewManifestProblems(manifest, text, archiveOf), []);
    const tampered = text.replace(release.facts.archives[0].sha256, 'f'.repeat(64));
    const problems = await krewManifestProblems(manifest, tampered, archiveOf);
    assert.equal(problems.length, 1);
    assert.match(problems[0], /os.*linux.*arch.*amd64.*sha256 f{64} does not match/);
  });

  it('answers status and trace against a lab', {skip: isRoot ? undefined : 'needs root: the lab builds network namespaces'}, async () => {
    const name = `rel${process.pid}`;
    const launcher = join(root, 'bin/kubectl-proxyctl');
    try {
      const up = await run(launcher, ['lab', 'up', '--name', name, '--nodes', '2', '--pods-per-node', '2'], {timeout: 180_000});
      assert.equal(up.code, 0, up.stderr);
      const env = {KUBECONFIG: `/run/proxyctl-lab/${name}/kubeconfig`};
      const status = await plugin.kubectlProxyctl(['status'], env);
      assert.equal(status.code, 0, status.stderr);
      assert.match(status.stdout, /node-0/);
      assert.match(status.stdout, /node-1/);
      const trace = await plugin.kubectlProxyctl(['trace', 'demoapp', '--node', 'node-0'], env);
      assert.equal(trace.code, 0, trace.stderr);
      assert.match(trace.stdout, /default\/demoapp/);
      assert.match(trace.stdout, /KUBE-SVC-/);
    } finally {
      await run(launcher, ['lab', 'down', '--name', name], {timeout: 60_000});
    }
  });

  after(async () => {
    if (release) await run('rm', ['-rf', release.dir]);
    if (plugin) await run('rm', ['-rf', join(plugin.dir, '..')]);
  });
});
