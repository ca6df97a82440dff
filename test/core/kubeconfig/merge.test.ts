// $KUBECONFIG with several files, merged as kubectl merges them: missing files skipped, the first
// file wins each cluster, user and context name and the current context, relative paths stay
// relative to their own file; nothing found is said plainly.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {findKubeconfig, KubeconfigError, mergeKubeconfigs} from '../../../src/core/kubeconfig/merge.ts';

const files: Record<string, string> = {
  '/home/me/.kube/config': `apiVersion: v1
kind: Config
clusters: [{name: prod, cluster: {server: https://prod.example:6443, certificate-authority: prod-ca.crt}}]
users: [{name: me, user: {client-certificate: certs/me.crt, client-key: /abs/me.key}}]
contexts: [{name: prod, context: {cluster: prod, user: me}}]
current-context: prod
`,
  '/run/lab/kubeconfig': `apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: http://127.0.0.1:43959}}, {name: prod, cluster: {server: https://other:6443}}]
users: [{name: admin, user: {token: t}}]
contexts: [{name: lab, context: {cluster: lab, user: admin, namespace: default}}]
current-context: lab
`,
  '/broken': 'clusters: [unclosed',
};
const readFile = (path: string): string => {
  if (path in files) return files[path];
  throw Object.assign(new Error(`ENOENT: no such file or directory, open '${path}'`), {code: 'ENOENT'});
};
const read = (path: string) => (path in files ? files[path] : undefined);

describe('kubeconfig files merged as kubectl merges them', () => {
  it('the first file wins each name and the current context; the later files add their own entries', () => {
    const merged = JSON.parse(mergeKubeconfigs(['/home/me/.kube/config', '/run/lab/kubeconfig'], read).text);
    assert.equal(merged['current-context'], 'prod');
    assert.deepEqual(
      merged.clusters.map((cluster: {name: string; cluster: {server: string}}) => `${cluster.name} ${cluster.cluster.server}`),
      ['prod https://prod.example:6443', 'lab http://127.0.0.1:43959'],
    );
    assert.deepEqual(
      merged.contexts.map((context: {name: string}) => context.name),
      ['prod', 'lab'],
    );
  });

  it('relative certificate paths are relative to the file that names them', () => {
    const merged = JSON.parse(mergeKubeconfigs(['/home/me/.kube/config'], read).text);
    assert.equal(merged.clusters[0].cluster['certificate-authority'], '/home/me/.kube/prod-ca.crt');
    assert.equal(merged.users[0].user['client-certificate'], '/home/me/.kube/certs/me.crt');
    assert.equal(merged.users[0].user['client-key'], '/abs/me.key');
  });

  it('$KUBECONFIG: missing files are skipped, empty parts ignored', () => {
    const found = findKubeconfig({env: {KUBECONFIG: '/missing::/run/lab/kubeconfig'}, readFile});
    assert.equal(found.kind, 'files');
    assert.deepEqual(found.kind === 'files' && found.files, ['/run/lab/kubeconfig']);
    assert.equal(JSON.parse(found.kind === 'files' ? found.text : '{}')['current-context'], 'lab');
  });

  it("no kubeconfig at all, or none of $KUBECONFIG's files: said plainly", () => {
    assert.throws(
      () => findKubeconfig({env: {HOME: '/nobody'}, readFile}),
      (error: Error) =>
        error instanceof KubeconfigError &&
        error.message === 'no kubeconfig: $KUBECONFIG is not set and /nobody/.kube/config does not exist',
    );
    assert.throws(
      () => findKubeconfig({env: {KUBECONFIG: '/a:/b'}, readFile}),
      /^KubeconfigError: no kubeconfig: none of the files \$KUBECONFIG lists exists \(\/a, \/b\)$/,
    );
    assert.throws(() => findKubeconfig({file: '/a', env: {KUBECONFIG: '/run/lab/kubeconfig'}, readFile}), /kubeconfig \/a does not exist/);
  });

  it('~/.kube/config, then the service account inside a cluster', () => {
    assert.equal(findKubeconfig({env: {HOME: '/home/me'}, readFile}).kind, 'files');
    assert.equal(findKubeconfig({env: {HOME: '/nobody', KUBERNETES_SERVICE_HOST: '10.96.0.1'}, readFile}).kind, 'in-cluster');
  });

  it('a file that is not YAML is named', () => {
    assert.throws(
      () => findKubeconfig({env: {KUBECONFIG: '/run/lab/kubeconfig:/broken'}, readFile}),
      /^KubeconfigError: kubeconfig \/broken: not YAML/,
    );
  });
});
