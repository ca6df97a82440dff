// Who may ask the embedded API server what. As kube-apiserver by default (--anonymous-auth with
// RBAC): a request without a token is system:anonymous, which may read the health checks and
// /version only (system:public-info-viewer), so anything else is a 403; a wrong token is a 401.
// The kubeconfig the server writes names https://, because kubectl (client-go) sends its token only
// over TLS; the same port still answers plain HTTP with a token.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {parse as parseYaml} from 'yaml';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';

let server: ApiServer;

async function get(path: string, token?: string, base = server.url): Promise<{status: number; body: any}> {
  const response = await fetch(`${base}${path}`, {headers: token ? {authorization: `Bearer ${token}`} : {}});
  const text = await response.text();
  return {status: response.status, body: text.startsWith('{') ? JSON.parse(text) : text};
}

describe('authentication of the lab API server', () => {
  before(async () => {
    server = await startApiServer({port: 0});
  });
  after(() => server.stop());

  it('refuses anonymous requests for resources and discovery, as system:anonymous without RBAC grants', async () => {
    const list = await get('/api/v1/namespaces/default/services');
    assert.equal(list.status, 403, JSON.stringify(list.body));
    assert.equal(list.body.reason, 'Forbidden');
    assert.equal(
      list.body.message,
      'services is forbidden: User "system:anonymous" cannot list resource "services" in API group "" in the namespace "default"',
    );
    const create = await fetch(`${server.url}/api/v1/namespaces/default/services`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({metadata: {name: 'x'}, spec: {ports: [{port: 80}]}}),
    });
    assert.equal(create.status, 403);
    assert.equal((await get('/apis/discovery.k8s.io/v1/endpointslices')).status, 403);
    assert.equal((await get('/api')).status, 403, 'discovery is for authenticated users (system:discovery)');
    assert.equal(server.store.tryGet('services', 'default', 'x'), undefined, 'nothing was created');
  });

  it('answers the health checks and /version to anyone (system:public-info-viewer)', async () => {
    for (const path of ['/healthz', '/livez', '/readyz', '/version']) assert.equal((await get(path)).status, 200, path);
    assert.equal((await get('/healthz', 'not-a-token')).status, 200, 'a probe with a stale token still gets its answer');
  });

  it('a wrong token is a 401; the admin token reads everything over plain HTTP', async () => {
    const wrong = await get('/api/v1/services', 'not-a-token');
    assert.equal(wrong.status, 401);
    assert.equal(wrong.body.reason, 'Unauthorized');
    assert.equal((await get('/api/v1/services', server.adminToken)).status, 200);
    assert.equal((await get('/api', server.adminToken)).status, 200);
  });

  it('RBAC can open resources to system:unauthenticated, as on kube-apiserver', async () => {
    const admin = {authorization: `Bearer ${server.adminToken}`, 'content-type': 'application/json'};
    const post = (path: string, body: unknown) =>
      fetch(`${server.url}${path}`, {method: 'POST', headers: admin, body: JSON.stringify(body)});
    assert.equal(
      (
        await post('/apis/rbac.authorization.k8s.io/v1/clusterroles', {
          metadata: {name: 'read-nodes'},
          rules: [{apiGroups: [''], resources: ['nodes'], verbs: ['list']}],
        })
      ).status,
      201,
    );
    const binding = {
      metadata: {name: 'read-nodes'},
      roleRef: {apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'read-nodes'},
      subjects: [{kind: 'Group', name: 'system:unauthenticated', apiGroup: 'rbac.authorization.k8s.io'}],
    };
    assert.equal((await post('/apis/rbac.authorization.k8s.io/v1/clusterrolebindings', binding)).status, 201);
    assert.equal((await get('/api/v1/nodes')).status, 200);
  });

  it('the kubeconfig names the server over TLS, with the admin token', async () => {
    const config = parseYaml(server.kubeconfig());
    assert.equal(config.clusters[0].cluster.server, server.secureUrl);
    assert.match(server.secureUrl, /^https:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(config.users[0].user.token, server.adminToken);
  });

  it('unauthenticated: "reject" answers 401 to a request without a token, as --anonymous-auth=false', async () => {
    const strict = await startApiServer({port: 0, unauthenticated: 'reject'});
    try {
      const answer = await get('/api/v1/services', undefined, strict.url);
      assert.equal(answer.status, 401);
      assert.equal(answer.body.reason, 'Unauthorized');
      assert.equal((await get('/healthz', undefined, strict.url)).status, 200);
    } finally {
      await strict.stop();
    }
  });
});
