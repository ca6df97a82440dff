// Same inputs, same image: the OCI archive made from the same root filesystem twice, its files'
// mtimes changed in between (as a fresh mmdebstrap run and fresh copies change them), has the same
// manifest digest and the same bytes. The root filesystem here is small and made by the test; the
// release runs the same packing on the one make-rootfs.sh builds.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import {chmodSync, linkSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {describe, it} from 'node:test';
import {packAgentImage} from '../../scripts/release/agent-image.ts';
import {sha256OfFile} from '../../scripts/release/deterministic-tar.ts';

const haveUmoci = spawnSync('sh', ['-c', 'command -v umoci']).status === 0;

describe('the agent image build', {skip: haveUmoci ? undefined : 'needs umoci: apt-get install umoci'}, () => {
  it('gives the same digest and bytes from the same files, whatever their mtimes', async () => {
    const base = mkdtempSync(join(tmpdir(), 'proxyctl-oci-'));
    try {
      const rootfs = join(base, 'rootfs');
      mkdirSync(join(rootfs, 'usr/sbin'), {recursive: true});
      mkdirSync(join(rootfs, 'app'));
      writeFileSync(join(rootfs, 'usr/sbin/tool'), '#!/bin/true\n');
      chmodSync(join(rootfs, 'usr/sbin/tool'), 0o755);
      linkSync(join(rootfs, 'usr/sbin/tool'), join(rootfs, 'usr/sbin/tool-too'));
      symlinkSync('tool', join(rootfs, 'usr/sbin/tool-link'));
      writeFileSync(join(rootfs, 'app/main.js'), 'console.log(1)\n');
      const builds = [];
      for (const [i, mtime] of [new Date(2001, 1, 1), new Date()].entries()) {
        for (const file of ['usr/sbin/tool', 'app/main.js', 'app', 'usr']) utimesSync(join(rootfs, file), mtime, mtime);
        const out = join(base, `out-${i}`);
        mkdirSync(out);
        const work = join(base, `work-${i}`);
        mkdirSync(work);
        const image = await packAgentImage(
          {root: '', version: '9.9.9', image: 'proxyctl-agent:9.9.9', workDir: work, outDir: out, epoch: 1_700_000_000},
          rootfs,
        );
        builds.push({digest: image.digest, sha256: await sha256OfFile(image.file)});
      }
      assert.match(builds[0].digest, /^sha256:[a-f0-9]{64}$/);
      assert.deepEqual(builds[1], builds[0]);
    } finally {
      rmSync(base, {recursive: true, force: true});
    }
  });
});
