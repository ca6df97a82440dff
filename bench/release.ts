// The release as a user gets it (npm run release first: this reads dist/release/): the plugin
// archives' sizes, `kubectl proxyctl --version` from the unpacked linux/amd64 archive next to
// `node -e 0` from the same archive's Node, the agent image's size, and how long the release took.
import {execFileSync, spawnSync} from 'node:child_process';
import {existsSync, mkdtempSync, readFileSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {kubectlPluginFloor, median} from './plugin.ts';
import {figure, heading, mib, skipped} from './report.ts';

const releaseDir = fileURLToPath(new URL('../dist/release/', import.meta.url));

interface ReleaseFacts {
  archives: {platform: string; node: string; name: string; bytes: number}[];
  agentImage?: {name: string; bytes: number; unpackedBytes: number; digest: string};
  seconds: number;
}

export async function benchRelease(): Promise<void> {
  const factsFile = join(releaseDir, 'release.json');
  if (!existsSync(factsFile)) {
    skipped('release', 'no dist/release/release.json: run `npm run release` first');
    return;
  }
  const facts = JSON.parse(readFileSync(factsFile, 'utf8')) as ReleaseFacts;
  heading('plugin archives', 'kubectl-proxyctl-vVERSION-OS-ARCH.tar.gz as npm run release wrote them (bundle + Node runtime, gzip -6)');
  for (const archive of facts.archives)
    figure({name: `${archive.platform} archive`, value: mib(archive.bytes), unit: 'MiB', note: `Node ${archive.node}`});

  const amd64 = facts.archives.find((a) => a.platform === 'linux/amd64');
  if (amd64) {
    const dir = mkdtempSync(join(tmpdir(), 'proxyctl-bench-release-'));
    try {
      execFileSync('tar', ['-xzf', join(releaseDir, amd64.name), '-C', dir]);
      // A user's PATH with the archive and no Node; the system's tools after it for the launcher's readlink.
      const env = {PATH: `${dir}:/usr/bin:/bin`, HOME: dir, NO_COLOR: '1'};
      heading(
        '--version from the unpacked linux/amd64 archive',
        `a new process each run, p50 of 11 after one warm-up, the archive's own Node (${amd64.node}); the compile cache in the system's temporary directory`,
      );
      const floor = await median([join(dir, 'node/bin/node'), '-e', '0'], env);
      figure({name: "node -e 0 (the archive's Node)", value: floor.p50, unit: 'ms', note: `min ${floor.min.toFixed(0)} ms`});
      const version = await median([join(dir, 'kubectl-proxyctl'), '--version'], env);
      figure({
        name: 'kubectl-proxyctl --version',
        value: version.p50,
        unit: 'ms',
        floor: {name: 'node -e 0', value: floor.p50},
        note: `min ${version.min.toFixed(0)} ms; goal <= 150 ms ${version.p50 <= 150 ? 'met' : 'NOT met'}`,
      });
      if (spawnSync('kubectl', ['version', '--client'], {env, stdio: 'ignore'}).status === 0) {
        const kubectlFloor = await kubectlPluginFloor(env);
        const viaKubectl = await median(['kubectl', 'proxyctl', '--version'], env);
        figure({
          name: 'kubectl proxyctl --version',
          value: viaKubectl.p50,
          unit: 'ms',
          floor: {name: kubectlFloor.name, value: kubectlFloor.p50},
          note: `min ${viaKubectl.min.toFixed(0)} ms; goal <= 150 ms ${viaKubectl.p50 <= 150 ? 'met' : 'NOT met'}`,
        });
      } else skipped('kubectl proxyctl --version', 'kubectl is not installed');
    } finally {
      rmSync(dir, {recursive: true, force: true});
    }
  }

  heading('agent image and release time', 'the OCI archive npm run release wrote; the release: build, 4 archives, krew manifest, image');
  if (facts.agentImage) {
    figure({
      name: 'agent image, unpacked (one layer)',
      value: mib(facts.agentImage.unpackedBytes),
      unit: 'MiB',
      note: `goal <= 150 MiB ${mib(facts.agentImage.unpackedBytes) <= 150 ? 'met' : 'NOT met'}`,
    });
    figure({name: 'agent image archive (gzip layer)', value: mib(facts.agentImage.bytes), unit: 'MiB', note: facts.agentImage.digest});
  } else skipped('agent image', 'the last release was built with --no-image');
  figure({
    name: 'scripts/release.ts (after npm run build)',
    value: facts.seconds * 1000,
    unit: 'ms',
    note: `goal <= 300 s ${facts.seconds <= 300 ? 'met' : 'NOT met'}`,
  });
}
