// The release's manifests: every YAML file under manifests/, in any directory below it, gets the
// agent image PROXYCTL_IMAGE names; other images and the rest of the text stay as they were.
import assert from 'node:assert/strict';
import {mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {describe, it} from 'node:test';
import {withAgentImage, writeManifests} from '../../scripts/release/manifest-images.ts';
import {root} from './release-fixture.ts';

const image = 'registry.example/team/proxyctl-agent:1.2.3';

describe('the agent image in the manifests', () => {
  const cases = [
    {name: 'a container image', line: '          image: proxyctl-agent:0.1.0', want: `          image: ${image}`},
    {name: 'quoted', line: '  image: "proxyctl-agent:0.1.0"', want: `  image: "${image}"`},
    {
      name: 'a list item, with a comment after it',
      line: '- image: ghcr.io/x/proxyctl-agent # the agent',
      want: `- image: ${image} # the agent`,
    },
    {name: 'by digest', line: `  image: proxyctl-agent@sha256:${'a'.repeat(64)}`, want: `  image: ${image}`},
    {name: 'another image stays', line: '  image: busybox:1.36', want: '  image: busybox:1.36'},
    {name: 'a name that only contains it stays', line: '  image: proxyctl-agent-debug:1', want: '  image: proxyctl-agent-debug:1'},
    {name: 'a comment naming it stays', line: '# set the image to proxyctl-agent:0.1.0', want: '# set the image to proxyctl-agent:0.1.0'},
  ];
  for (const {name, line, want} of cases) it(name, () => assert.equal(withAgentImage(line, image).text, want));

  it('covers every YAML file of the project, and directories added below manifests/ (observe/)', async () => {
    const from = mkdtempSync(join(tmpdir(), 'proxyctl-manifests-'));
    const to = join(from, 'out');
    try {
      mkdirSync(join(from, 'observe'));
      writeFileSync(join(from, 'daemonset.yaml'), readFileSync(join(root, 'manifests/daemonset.yaml')));
      writeFileSync(join(from, 'observe/daemonset.yaml'), 'spec:\n  containers:\n    - name: agent\n      image: proxyctl-agent:0.1.0\n');
      writeFileSync(join(from, 'Dockerfile'), 'FROM scratch\n');
      const written = await writeManifests(from, to, image);
      assert.deepEqual(written, [
        {file: 'daemonset.yaml', images: 1},
        {file: 'observe/daemonset.yaml', images: 1},
      ]);
      assert.match(
        readFileSync(join(to, 'observe/daemonset.yaml'), 'utf8'),
        /^ {6}image: registry\.example\/team\/proxyctl-agent:1\.2\.3$/m,
      );
      const original = readFileSync(join(root, 'manifests/daemonset.yaml'), 'utf8');
      assert.equal(readFileSync(join(to, 'daemonset.yaml'), 'utf8'), withAgentImage(original, image).text);
    } finally {
      rmSync(from, {recursive: true, force: true});
    }
  });

  it('refuses a PROXYCTL_IMAGE that is not an image reference, naming it', async () => {
    await assert.rejects(
      writeManifests(join(root, 'manifests'), join(tmpdir(), 'never'), 'not an image'),
      /PROXYCTL_IMAGE "not an image" is not an image reference/,
    );
  });
});
