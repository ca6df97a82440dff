// What the release tests share: a release built by scripts/release.ts into a temporary directory,
// and a plugin archive unpacked as a user unpacks it, run from a PATH that has the archive's
// directory, kubectl and the two tools its launcher uses (readlink, dirname-free), and no Node.
import {execFile, spawnSync} from 'node:child_process';
import {mkdirSync, mkdtempSync, readFileSync, symlinkSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';

export const root = fileURLToPath(new URL('../../', import.meta.url));
export const isRoot = process.getuid?.() === 0;
export const built = spawnSync('test', ['-f', join(root, 'dist/plugin/kubectl-proxyctl.js')]).status === 0;
export const needsBuild = built ? undefined : 'needs the build: run `npm run build` first (the archive holds dist/plugin/)';
const nodeOfProject = join(root, 'node_modules/.bin/node');

export interface Answer {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function run(
  command: string,
  args: string[],
  options: {env?: NodeJS.ProcessEnv; cwd?: string; timeout?: number} = {},
): Promise<Answer> {
  return new Promise((resolve) => {
    execFile(
      command,
      args,
      {env: options.env ?? process.env, cwd: options.cwd, timeout: options.timeout ?? 120_000, maxBuffer: 1 << 26},
      (error, stdout, stderr) => resolve({code: error ? (typeof error.code === 'number' ? error.code : null) : 0, stdout, stderr}),
    );
  });
}

export interface Release {
  dir: string;
  facts: {
    version: string;
    image: string;
    archives: {platform: string; node: string; name: string; sha256: string; bytes: number}[];
    agentImage?: {name: string; digest: string; bytes: number; unpackedBytes: number};
  };
}

/** buildRelease runs `node scripts/release.ts --out TMP ...args` as npm run release does after the build. */
export async function buildRelease(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Release> {
  const dir = mkdtempSync(join(tmpdir(), 'proxyctl-release-'));
  const answer = await run(nodeOfProject, [join(root, 'scripts/release.ts'), '--out', dir, ...args], {
    env: {...process.env, ...env},
    timeout: 600_000,
  });
  if (answer.code !== 0) throw new Error(`scripts/release.ts ${args.join(' ')} exited ${answer.code}:\n${answer.stderr}`);
  return {dir, facts: JSON.parse(readFileSync(join(dir, 'release.json'), 'utf8'))};
}

export interface UnpackedPlugin {
  dir: string;
  /** The environment a user's shell would have: PATH = the archive's directory and a few tools, no Node, HOME elsewhere. */
  env: NodeJS.ProcessEnv;
  /** An empty working directory, far from the clone. */
  cwd: string;
  /** `kubectl proxyctl ARGS` through kubectl, or the launcher itself where kubectl is not installed. */
  kubectlProxyctl: (args: string[], extraEnv?: NodeJS.ProcessEnv) => Promise<Answer>;
  throughKubectl: boolean;
}

export function unpackPlugin(archive: string): UnpackedPlugin {
  const base = mkdtempSync(join(tmpdir(), 'proxyctl-user-'));
  const dir = join(base, 'plugin');
  const tools = join(base, 'tools');
  const cwd = join(base, 'work');
  for (const d of [dir, tools, cwd]) mkdirSync(d);
  const untar = spawnSync('tar', ['-xzf', archive, '-C', dir], {encoding: 'utf8'});
  if (untar.status !== 0) throw new Error(`tar -xzf ${archive}: ${untar.stderr}`);
  const kubectl = spawnSync('sh', ['-c', 'command -v kubectl'], {encoding: 'utf8'}).stdout.trim();
  for (const tool of ['readlink', ...(kubectl ? ['kubectl'] : [])]) {
    const path = spawnSync('sh', ['-c', `command -v ${tool}`], {encoding: 'utf8'}).stdout.trim();
    symlinkSync(path, join(tools, tool));
  }
  const env: NodeJS.ProcessEnv = {PATH: `${dir}:${tools}`, HOME: base, NO_COLOR: '1'};
  return {
    dir,
    env,
    cwd,
    throughKubectl: kubectl !== '',
    kubectlProxyctl: (args, extraEnv = {}) =>
      kubectl
        ? run(join(tools, 'kubectl'), ['proxyctl', ...args], {env: {...env, ...extraEnv}, cwd})
        : run(join(dir, 'kubectl-proxyctl'), args, {env: {...env, ...extraEnv}, cwd}),
  };
}
