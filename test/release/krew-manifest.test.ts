// krew's rules for a plugin manifest (pkg/index/validation), as the release checks them: each rule
// broken once in a manifest that otherwise passes, and the archive checks krew's install makes
// (sha256, bin in place and executable).
import assert from 'node:assert/strict';
import {chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {parse, stringify} from 'yaml';
import {sha256OfFile, writeTar} from '../../scripts/release/deterministic-tar.ts';
import {krewManifest, krewManifestProblems} from '../../scripts/release/krew-manifest.ts';
import {platforms} from '../../scripts/release/node-runtime.ts';

describe('the krew manifest checks', () => {
  let base: string;
  let archive: string;
  let good: string;
  before(async () => {
    base = mkdtempSync(join(tmpdir(), 'proxyctl-krew-'));
    const tree = join(base, 'tree');
    mkdirSync(tree);
    writeFileSync(join(tree, 'kubectl-proxyctl'), '#!/bin/sh\n');
    chmodSync(join(tree, 'kubectl-proxyctl'), 0o755);
    writeFileSync(join(tree, 'LICENSE'), 'Apache\n');
    archive = join(base, 'kubectl-proxyctl.tar.gz');
    await writeTar({from: tree, to: archive, epoch: 0, gzip: true});
    const sha256 = await sha256OfFile(archive);
    good = krewManifest({
      version: '0.1.0',
      homepage: 'https://example.invalid/proxyctl',
      baseUrl: 'https://example.invalid/download/',
      archives: platforms.map((platform) => ({
        platform,
        nodeVersion: '24.0.0',
        file: archive,
        name: 'kubectl-proxyctl.tar.gz',
        sha256,
        bytes: 1,
      })),
    });
  });
  after(() => rmSync(base, {recursive: true, force: true}));

  const problemsOf = (text: string, file = 'proxyctl.yaml') => krewManifestProblems(join(base, file), text, () => archive);
  const changed = (change: (m: any) => void) => {
    const manifest = parse(good);
    change(manifest);
    return stringify(manifest);
  };

  it('takes the manifest the release writes: one platform per archive, uri under the base URL', async () => {
    assert.deepEqual(await problemsOf(good), []);
    const manifest = parse(good);
    assert.equal(manifest.spec.platforms.length, 4);
    assert.equal(manifest.spec.platforms[0].uri, 'https://example.invalid/download/kubectl-proxyctl.tar.gz');
    assert.equal(manifest.spec.version, 'v0.1.0');
  });

  const broken: {rule: string; text: () => string; file?: string; want: RegExp}[] = [
    {rule: 'name matches the file', text: () => good, file: 'other.yaml', want: /plugin should be named "other"/},
    {rule: 'apiVersion', text: () => changed((m) => (m.apiVersion = 'krew.googlecontainertools.github.com/v1alpha1')), want: /apiVersion/},
    {rule: 'kind', text: () => changed((m) => (m.kind = 'Thing')), want: /kind "Thing" is not Plugin/},
    {
      rule: 'semver with v',
      text: () => changed((m) => (m.spec.version = '0.1.0')),
      want: /version "0\.1\.0" is not semver starting with "v"/,
    },
    {rule: 'short description', text: () => changed((m) => delete m.spec.shortDescription), want: /short description/},
    {rule: 'a platform', text: () => changed((m) => (m.spec.platforms = [])), want: /should have a platform/},
    {rule: 'selector', text: () => changed((m) => delete m.spec.platforms[1].selector), want: /nil selector/},
    {
      rule: 'selector keys',
      text: () => changed((m) => (m.spec.platforms[0].selector.matchLabels.distro = 'debian')),
      want: /key "distro" not supported/,
    },
    {rule: 'uri', text: () => changed((m) => delete m.spec.platforms[2].uri), want: /URI has to be set/},
    {rule: 'sha256 form', text: () => changed((m) => (m.spec.platforms[0].sha256 = 'ABC')), want: /sha256 value ABC is not valid/},
    {rule: 'bin', text: () => changed((m) => delete m.spec.platforms[3].bin), want: /bin has to be set/},
    {rule: 'files', text: () => changed((m) => (m.spec.platforms[0].files = [])), want: /without specifying file operations/},
    {
      rule: 'bin in the archive',
      text: () => changed((m) => (m.spec.platforms[0].bin = 'kubectl-other')),
      want: /bin kubectl-other is not in/,
    },
    {
      rule: 'bin executable',
      text: () => changed((m) => (m.spec.platforms[0].bin = 'LICENSE')),
      want: /bin LICENSE in .* is not executable/,
    },
  ];
  for (const {rule, text, file, want} of broken)
    it(`refuses a manifest that breaks: ${rule}`, async () => {
      const problems = await problemsOf(text(), file);
      assert.ok(
        problems.some((p) => want.test(p)),
        problems.join('\n'),
      );
    });
});
