// npm run release: everything a cluster operator installs, built into dist/release/ from this
// checkout, without Docker (docs/release.md):
// - kubectl-proxyctl-vVERSION-OS-ARCH.tar.gz per platform: the plugin's bundle and Node;
// - proxyctl.yaml, the krew manifest for them, checked as krew checks one;
// - proxyctl-agent-vVERSION-linux-amd64.oci.tar, the agent image (OCI archive);
// - manifests/, the project's manifests with the agent image set to PROXYCTL_IMAGE;
// - SHA256SUMS and release.json (what was built, sizes, digests, the Node of each archive).
// npm run build comes first (the release script of package.json runs it).
//
// Flags, for tests and partial builds: --out DIR, --platform OS/ARCH (repeatable), --no-image.
// Environment: PROXYCTL_IMAGE (default proxyctl-agent:VERSION), PROXYCTL_RELEASE_URL (where the
// archives will be downloaded from, for the krew manifest), SOURCE_DATE_EPOCH (default: the
// commit's date), PROXYCTL_RELEASE_CACHE (the Node runtimes' npm packs, default .cache/node-runtimes).
import {execFileSync} from 'node:child_process';
import {mkdir, mkdtemp, readFile, rm, writeFile} from 'node:fs/promises';
import {basename, join, resolve} from 'node:path';
import {parseArgs} from 'node:util';
import {fileURLToPath} from 'node:url';
import {bundleAgent} from './bundle-agent.ts';
import {buildAgentImage, ensureImageTools} from './release/agent-image.ts';
import {sha256OfFile} from './release/deterministic-tar.ts';
import {krewManifest, krewManifestProblems} from './release/krew-manifest.ts';
import {writeManifests} from './release/manifest-images.ts';
import {fetchNodeRuntime, platformName, platforms} from './release/node-runtime.ts';
import {writePluginArchive} from './release/plugin-archive.ts';

const root = fileURLToPath(new URL('..', import.meta.url));
const started = performance.now();
const {values} = parseArgs({
  options: {out: {type: 'string'}, platform: {type: 'string', multiple: true}, 'no-image': {type: 'boolean'}},
});
const packageJson = JSON.parse(await readFile(join(root, 'package.json'), 'utf8')) as {version: string};
const nodeVersion = (JSON.parse(await readFile(join(root, 'node_modules/node/package.json'), 'utf8')) as {version: string}).version;
const version = packageJson.version;
const outDir = resolve(values.out ?? join(root, 'dist/release'));
const image = process.env.PROXYCTL_IMAGE || `proxyctl-agent:${version}`;
const baseUrl = process.env.PROXYCTL_RELEASE_URL || `https://github.com/proxyctl/proxyctl/releases/download/v${version}`;
const cacheDir = resolve(process.env.PROXYCTL_RELEASE_CACHE || join(root, '.cache/node-runtimes'));
const epoch = Number(
  process.env.SOURCE_DATE_EPOCH || execFileSync('git', ['-C', root, 'log', '-1', '--format=%ct'], {encoding: 'utf8'}).trim(),
);
const chosen = platforms.filter((p) => !values.platform || values.platform.includes(platformName(p)));
if (chosen.length === 0) throw new Error(`--platform ${values.platform}: none of ${platforms.map(platformName).join(', ')}`);

// The image's tools first: a machine that cannot build it says so before the archives take their time.
if (!values['no-image']) ensureImageTools();
await rm(outDir, {recursive: true, force: true});
await mkdir(outDir, {recursive: true});
const workDir = await mkdtemp(join(outDir, '.work-'));
const step = (what: string) => console.error(`release: ${what} (${((performance.now() - started) / 1000).toFixed(1)} s)`);

const archives = [];
const runtimes = new Map<string, Awaited<ReturnType<typeof fetchNodeRuntime>>>();
for (const platform of chosen) {
  const runtime = await fetchNodeRuntime(platform, nodeVersion, cacheDir, workDir);
  if (runtime.note) console.error(`release: ${runtime.note}`);
  runtimes.set(platformName(platform), runtime);
  archives.push(await writePluginArchive({root, version, runtime, stageDir: join(workDir, 'stage'), outDir, epoch}));
  step(`${archives.at(-1)!.name}`);
}

const manifestFile = join(outDir, 'proxyctl.yaml');
await writeFile(manifestFile, krewManifest({version, homepage: 'https://github.com/proxyctl/proxyctl', baseUrl, archives}));
const problems = await krewManifestProblems(manifestFile, await readFile(manifestFile, 'utf8'), (uri) => join(outDir, basename(uri)));
if (problems.length > 0) throw new Error(`proxyctl.yaml: krew would refuse it:\n  ${problems.join('\n  ')}`);
step('proxyctl.yaml (krew manifest, checked)');

const manifests = await writeManifests(join(root, 'manifests'), join(outDir, 'manifests'), image);
step(`manifests/ with image ${image}: ${manifests.map((m) => `${m.file} (${m.images})`).join(', ')}`);

let agentImage;
if (!values['no-image']) {
  const amd64 = runtimes.get('linux/amd64') ?? (await fetchNodeRuntime(platforms[0], nodeVersion, cacheDir, workDir));
  const agentBundle = await bundleAgent();
  agentImage = await buildAgentImage({root, version, image, runtime: amd64, agentBundle, workDir, outDir, epoch});
  step(`${agentImage.name} ${agentImage.digest}`);
}

const files = [...archives.map((a) => ({name: a.name, sha256: a.sha256}))];
if (agentImage) files.push({name: agentImage.name, sha256: await sha256OfFile(agentImage.file)});
await writeFile(join(outDir, 'SHA256SUMS'), files.map((f) => `${f.sha256}  ${f.name}\n`).join(''));
const seconds = (performance.now() - started) / 1000;
const facts = {
  version,
  sourceDateEpoch: epoch,
  image,
  archives: archives.map(({platform, nodeVersion: node, name, sha256, bytes}) => ({
    platform: platformName(platform),
    node,
    name,
    sha256,
    bytes,
  })),
  agentImage: agentImage && {
    name: agentImage.name,
    digest: agentImage.digest,
    bytes: agentImage.bytes,
    unpackedBytes: agentImage.unpackedBytes,
  },
  manifests,
  seconds,
};
await writeFile(join(outDir, 'release.json'), `${JSON.stringify(facts, null, 2)}\n`);
await rm(workDir, {recursive: true, force: true});

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
for (const a of facts.archives) console.log(`${a.name}: ${mib(a.bytes)} (Node ${a.node})`);
if (facts.agentImage)
  console.log(
    `${facts.agentImage.name}: ${mib(facts.agentImage.bytes)}, ${mib(facts.agentImage.unpackedBytes)} unpacked (goal <= 150 MiB), ${facts.agentImage.digest}`,
  );
console.log(`npm run release: ${seconds.toFixed(0)} s (goal <= 300 s), into ${outDir}`);
