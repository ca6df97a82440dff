// The agent image as an operator's node runs it: the OCI archive from the release script, its
// config (entrypoint, labels) read as a runtime reads it, its layer unpacked into a root
// filesystem, and its entrypoint run chrooted, proxying node-0 of a lab that has no agents; the
// plugin then gets the agent's status, and a pod reaches a Service through the rules it wrote.
// podman loads the archive when it is installed; it cannot run containers on this machine (see
// docs/release.md), hence the chroot.
import assert from 'node:assert/strict';
import {spawn, spawnSync} from 'node:child_process';
import {mkdirSync, mkdtempSync, readFileSync, writeFileSync} from 'node:fs';
import {createServer} from 'node:net';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {buildRelease, isRoot, needsBuild, type Release, root, run, type UnpackedPlugin, unpackPlugin} from './release-fixture.ts';

const haveTools = ['mmdebstrap', 'umoci'].every((tool) => spawnSync('sh', ['-c', `command -v ${tool}`]).status === 0);
const skip =
  needsBuild ??
  (!isRoot
    ? 'needs root: mmdebstrap, chroot and the lab'
    : !haveTools
      ? 'needs mmdebstrap and umoci: apt-get install mmdebstrap umoci'
      : undefined);

interface ImageConfig {
  config: {Entrypoint: string[]; Env: string[]; Labels: Record<string, string>};
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const {port} = server.address() as {port: number};
      server.close(() => resolve(port));
    });
  });
}

/** The image as a runtime sees it: index -> manifest -> config and layers, the layers unpacked in order. */
function unpackImage(archive: string, into: string): ImageConfig {
  const layout = join(into, 'layout');
  const rootfs = join(into, 'rootfs');
  mkdirSync(layout);
  mkdirSync(rootfs);
  assert.equal(spawnSync('tar', ['-xf', archive, '-C', layout]).status, 0);
  const blob = (digest: string) => join(layout, 'blobs', ...digest.split(':'));
  const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as {manifests: {digest: string}[]};
  const manifest = JSON.parse(readFileSync(blob(index.manifests[0].digest), 'utf8')) as {
    config: {digest: string};
    layers: {digest: string; mediaType: string}[];
  };
  for (const layer of manifest.layers) {
    assert.equal(layer.mediaType, 'application/vnd.oci.image.layer.v1.tar+gzip');
    const untar = spawnSync('tar', ['-xzf', blob(layer.digest), '-C', rootfs, '--numeric-owner'], {encoding: 'utf8'});
    assert.equal(untar.status, 0, untar.stderr);
  }
  return JSON.parse(readFileSync(blob(manifest.config.digest), 'utf8')) as ImageConfig;
}

describe('the agent image', {skip}, () => {
  let release: Release;
  let plugin: UnpackedPlugin;
  let work: string;
  let config: ImageConfig;
  const image = `registry.example/proxyctl/proxyctl-agent:test-${process.pid}`;
  before(async () => {
    release = await buildRelease(['--platform', 'linux/amd64'], {PROXYCTL_IMAGE: image});
    plugin = unpackPlugin(join(release.dir, release.facts.archives[0].name));
    work = mkdtempSync(join(tmpdir(), 'proxyctl-image-'));
    config = unpackImage(join(release.dir, release.facts.agentImage!.name), work);
  });

  it('has the entrypoint, environment and labels the DaemonSet expects, and the manifests name it', () => {
    assert.deepEqual(config.config.Entrypoint, [
      '/usr/local/bin/node',
      '--max-semi-space-size=8',
      '--expose-gc',
      '/app/dist/src/agent/main.js',
    ]);
    assert.ok(config.config.Env.includes('MALLOC_TRIM_THRESHOLD_=1048576'), config.config.Env.join(' '));
    assert.equal(config.config.Labels['org.opencontainers.image.title'], 'proxyctl-agent');
    assert.equal(config.config.Labels['org.opencontainers.image.version'], release.facts.version);
    const daemonset = readFileSync(join(release.dir, 'manifests/daemonset.yaml'), 'utf8');
    assert.match(daemonset, new RegExp(`^\\s+image: ${image.replaceAll('.', '\\.')}$`, 'm'));
    for (const tool of ['usr/sbin/iptables', 'usr/sbin/nft', 'usr/sbin/ipset', 'sbin/ipvsadm', 'usr/sbin/conntrack', 'bin/ip'])
      assert.equal(spawnSync('test', ['-e', join(work, 'rootfs', tool)]).status, 0, `${tool} is not in the image`);
  });

  it('loads into podman under the reference PROXYCTL_IMAGE names', {
    skip: spawnSync('sh', ['-c', 'command -v podman']).status === 0 ? undefined : 'podman is not installed',
  }, async () => {
    const load = await run('podman', ['load', '-i', join(release.dir, release.facts.agentImage!.name)]);
    assert.equal(load.code, 0, load.stderr);
    try {
      const inspect = await run('podman', ['image', 'inspect', image, '--format', '{{json .Config.Entrypoint}}']);
      assert.equal(inspect.code, 0, inspect.stderr);
      assert.deepEqual(JSON.parse(inspect.stdout), config.config.Entrypoint);
    } finally {
      await run('podman', ['rmi', '-f', image]);
    }
  });

  it('runs its entrypoint chrooted, proxies a lab node, and answers kubectl proxyctl status', async () => {
    const name = `img${process.pid}`;
    const launcher = join(root, 'bin/kubectl-proxyctl');
    const rootfs = join(work, 'rootfs');
    let agent: ReturnType<typeof spawn> | undefined;
    try {
      const up = await run(launcher, ['lab', 'up', '--name', name, '--nodes', '1', '--pods-per-node', '2', '--no-agents'], {
        timeout: 180_000,
      });
      assert.equal(up.code, 0, up.stderr);
      const state = JSON.parse(readFileSync(`/run/proxyctl-lab/${name}/state.json`, 'utf8')) as {
        kubeconfig: string;
        topology: {clusterCIDR: string; nodes: {name: string; namespace: string; pods: {namespace: string}[]}[]};
      };
      const node = state.topology.nodes[0];
      const pod = node.pods[0].namespace;
      const before = await run('ip', ['netns', 'exec', pod, 'curl', '-s', '-m', '2', 'http://10.96.0.10/']);
      assert.notEqual(before.code, 0, 'the Service answered before any agent ran');
      mkdirSync(join(rootfs, 'etc/proxyctl'), {recursive: true});
      writeFileSync(join(rootfs, 'etc/proxyctl/kubeconfig'), readFileSync(state.kubeconfig));
      const [healthz, metrics, api] = [await freePort(), await freePort(), await freePort()];
      const args = [
        ...[...['--netns', node.namespace, '--hostname-override', node.name, '--kubeconfig', '/etc/proxyctl/kubeconfig']],
        ...['--cluster-cidr', state.topology.clusterCIDR, '--healthz-bind-address', `127.0.0.1:${healthz}`],
        ...['--metrics-bind-address', `127.0.0.1:${metrics}`, '--api-bind-address', `127.0.0.1:${api}`],
      ];
      // A private mount namespace, gone with the process, as a runtime makes one: the image's root
      // is a mount point (`ip netns exec` remounts / as a slave), with /proc, /sys, /dev and the
      // lab's /run/netns (the namespaces' nsfs mounts) inside.
      const mounts = ['proc', 'sys', 'dev', 'run/netns']
        .map((fs) => `mkdir -p ${rootfs}/${fs} && mount --rbind /${fs} ${rootfs}/${fs}`)
        .join(' && ');
      const script = `mount --bind ${rootfs} ${rootfs} && ${mounts} && exec chroot ${rootfs} "$@"`;
      const env = Object.fromEntries(
        config.config.Env.map((entry) => [entry.slice(0, entry.indexOf('=')), entry.slice(entry.indexOf('=') + 1)]),
      );
      agent = spawn(
        'unshare',
        ['--mount', '--propagation', 'private', '--fork', 'sh', '-c', script, 'sh', ...config.config.Entrypoint, ...args],
        {
          env,
          stdio: ['ignore', 'pipe', 'pipe'],
          detached: true,
        },
      );
      let log = '';
      agent.stdout?.on('data', (chunk: Buffer) => (log += chunk));
      agent.stderr?.on('data', (chunk: Buffer) => (log += chunk));
      let synced = false;
      for (let i = 0; i < 120 && !synced && agent.exitCode === null; i++) {
        const answer = await fetch(`http://127.0.0.1:${healthz}/healthz`).then(
          (r) => r.text(),
          () => '',
        );
        synced = /lastUpdated/.test(answer);
        if (!synced) await new Promise((r) => setTimeout(r, 500));
      }
      assert.ok(synced, `the image's agent did not sync:\n${log}`);
      // The rules may land a moment after the first sync is reported.
      let served = await run('ip', ['netns', 'exec', pod, 'curl', '-s', '-m', '2', 'http://10.96.0.10/']);
      for (let i = 0; i < 10 && served.code !== 0; i++) {
        await new Promise((r) => setTimeout(r, 500));
        served = await run('ip', ['netns', 'exec', pod, 'curl', '-s', '-m', '2', 'http://10.96.0.10/']);
      }
      assert.equal(served.code, 0, `a pod on ${node.name} did not reach demoapp through the image's rules: ${served.stderr}\n${log}`);
      assert.match(served.stdout, /"pod"/);
      const status = await plugin.kubectlProxyctl(['status', '--agent-url', `ws://127.0.0.1:${api}`], {KUBECONFIG: state.kubeconfig});
      assert.equal(status.code, 0, `${status.stderr}\n${log}`);
      assert.match(status.stdout, new RegExp(node.name));
      assert.match(status.stdout, /iptables/);
    } finally {
      if (agent?.pid && agent.exitCode === null) {
        const exited = new Promise((resolve) => agent?.once('exit', resolve));
        process.kill(-agent.pid, 'SIGTERM');
        await exited;
      }
      await run(launcher, ['lab', 'down', '--name', name], {timeout: 60_000});
    }
  });

  after(async () => {
    for (const dir of [release?.dir, work, plugin && join(plugin.dir, '..')]) if (dir) await run('rm', ['-rf', dir]);
  });
});
