// A plugin archive for one platform: kubectl-proxyctl (a launcher) and LICENSE at its root, the
// plugin's bundle and what oclif reads (dist/plugin/, package.json, oclif.manifest.json), the
// bundled example, and the platform's Node runtime under node/. Why Node and a bundle rather than
// a single executable: docs/release.md.
import {chmod, copyFile, cp, mkdir, stat} from 'node:fs/promises';
import {join} from 'node:path';
import {sha256OfFile, writeTar} from './deterministic-tar.ts';
import type {NodeRuntime} from './node-runtime.ts';

export interface PluginArchive {
  platform: NodeRuntime['platform'];
  nodeVersion: string;
  file: string;
  name: string;
  sha256: string;
  bytes: number;
}

export const pluginArchiveName = (version: string, runtime: Pick<NodeRuntime, 'platform'>) =>
  `kubectl-proxyctl-v${version}-${runtime.platform.os}-${runtime.platform.arch}.tar.gz`;

/** writePluginArchive stages the archive's tree under `stageDir` and writes it into `outDir`. */
export async function writePluginArchive(options: {
  root: string;
  version: string;
  runtime: NodeRuntime;
  stageDir: string;
  outDir: string;
  epoch: number;
}): Promise<PluginArchive> {
  const {root, version, runtime, stageDir, outDir, epoch} = options;
  const stage = join(stageDir, `${runtime.platform.os}-${runtime.platform.arch}`);
  await mkdir(join(stage, 'node/bin'), {recursive: true});
  await copyFile(join(root, 'scripts/release/kubectl-proxyctl.sh'), join(stage, 'kubectl-proxyctl'));
  await chmod(join(stage, 'kubectl-proxyctl'), 0o755);
  await copyFile(join(root, 'LICENSE'), join(stage, 'LICENSE'));
  for (const file of ['package.json', 'oclif.manifest.json']) await copyFile(join(root, file), join(stage, file));
  await cp(join(root, 'dist/plugin'), join(stage, 'dist/plugin'), {recursive: true});
  await cp(join(root, 'examples'), join(stage, 'examples'), {recursive: true});
  await copyFile(join(runtime.dir, 'bin/node'), join(stage, 'node/bin/node'));
  await chmod(join(stage, 'node/bin/node'), 0o755);
  await copyFile(join(runtime.dir, 'LICENSE'), join(stage, 'node/LICENSE'));
  const name = pluginArchiveName(version, runtime);
  const file = join(outDir, name);
  await writeTar({from: stage, to: file, epoch, gzip: true});
  return {
    platform: runtime.platform,
    nodeVersion: runtime.version,
    file,
    name,
    sha256: await sha256OfFile(file),
    bytes: (await stat(file)).size,
  };
}
