// The agent reads $KUBECONFIG as kubectl does: several files separated by ":", missing ones skipped.
import assert from 'node:assert/strict';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {test} from 'node:test';
import {loadKubeConfig} from '../../../src/agent/watch/kubernetes-client.ts';

test('the agent merges the files $KUBECONFIG lists and skips missing ones', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'pxapi-kubeconfig-'));
  t.after(() => rm(dir, {recursive: true, force: true}));
  const lab = join(dir, 'lab.kubeconfig');
  await writeFile(
    lab,
    'apiVersion: v1\nkind: Config\nclusters: [{name: lab, cluster: {server: "http://127.0.0.1:43959"}}]\nusers: [{name: a, user: {token: t}}]\ncontexts: [{name: lab, context: {cluster: lab, user: a}}]\ncurrent-context: lab\n',
  );
  const saved = process.env.KUBECONFIG;
  t.after(() => {
    if (saved === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = saved;
  });
  process.env.KUBECONFIG = `${join(dir, 'missing')}:${lab}`;
  assert.equal(loadKubeConfig().getCurrentCluster()?.server, 'http://127.0.0.1:43959');
  process.env.KUBECONFIG = join(dir, 'missing');
  assert.throws(() => loadKubeConfig(), /no kubeconfig: none of the files \$KUBECONFIG lists exists/);
});
