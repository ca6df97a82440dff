// Server-side apply, managedFields, media types and the self reviews over plain HTTP, as kube-apiserver answers them.
import {after, before, describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {startApiServer, type ApiServer} from '../../../src/lab/apiserver/server.ts';

let server: ApiServer;

async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.url}${path}`, {
    method,
    headers: {authorization: `Bearer ${server.adminToken}`, 'content-type': 'application/json', ...headers},
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  return {status: res.status, body: (await res.json()) as any, headers: res.headers};
}

const services = '/api/v1/namespaces/default/services';
const apply = (name: string, manager: string, spec: unknown, force = false) =>
  call(
    'PATCH',
    `${services}/${name}?fieldManager=${manager}${force ? '&force=true' : ''}`,
    {apiVersion: 'v1', kind: 'Service', metadata: {name, labels: {app: name}}, spec},
    {'content-type': 'application/apply-patch+yaml'},
  );

describe('server-side apply and managed fields', () => {
  before(async () => {
    server = await startApiServer({port: 0});
  });
  after(() => server?.stop());

  it('creates on first apply (201), records an Apply entry, and a same apply changes nothing', async () => {
    const spec = {selector: {app: 'a'}, ports: [{port: 80, targetPort: 8080}]};
    const created = await apply('a', 'alice', spec);
    assert.equal(created.status, 201);
    const [entry] = created.body.metadata.managedFields;
    assert.deepEqual(
      {manager: entry.manager, operation: entry.operation, apiVersion: entry.apiVersion, fieldsType: entry.fieldsType},
      {manager: 'alice', operation: 'Apply', apiVersion: 'v1', fieldsType: 'FieldsV1'},
    );
    assert.deepEqual(entry.fieldsV1['f:spec']['f:ports']['k:{"port":80,"protocol":"TCP"}'], {
      '.': {},
      'f:port': {},
      'f:protocol': {},
      'f:targetPort': {},
    });
    const again = await apply('a', 'alice', spec);
    assert.equal(again.status, 200);
    assert.equal(again.body.metadata.resourceVersion, created.body.metadata.resourceVersion, 'a no-op apply keeps the revision');
  });

  it('refuses changed fields owned by others with one cause per field, shares equal values, and forces', async () => {
    await apply('b', 'alice', {selector: {app: 'b'}, ports: [{port: 80, targetPort: 8080}], sessionAffinity: 'None'});
    const merge = await call(
      'PATCH',
      `${services}/b?fieldManager=bob-edit`,
      {spec: {sessionAffinity: 'ClientIP'}},
      {
        'content-type': 'application/merge-patch+json',
      },
    );
    assert.equal(merge.status, 200);
    const bob = merge.body.metadata.managedFields.find((e: any) => e.manager === 'bob-edit');
    assert.equal(bob.operation, 'Update');
    assert.deepEqual(Object.keys(bob.fieldsV1['f:spec']), ['f:sessionAffinity', 'f:sessionAffinityConfig']);

    const refused = await apply('b', 'carol', {selector: {app: 'b'}, ports: [{port: 80, targetPort: 9090}], sessionAffinity: 'None'});
    assert.equal(refused.status, 409);
    assert.equal(refused.body.reason, 'Conflict');
    assert.equal(
      refused.body.message,
      'Apply failed with 2 conflicts: conflicts with "alice":\n- .spec.ports[port=80,protocol="TCP"].targetPort\nconflicts with "bob-edit" using v1:\n- .spec.sessionAffinity',
    );
    assert.deepEqual(
      refused.body.details.causes.map((c: any) => [c.reason, c.message, c.field]),
      [
        ['FieldManagerConflict', 'conflict with "alice"', '.spec.ports[port=80,protocol="TCP"].targetPort'],
        ['FieldManagerConflict', 'conflict with "bob-edit" using v1', '.spec.sessionAffinity'],
      ],
    );

    const shared = await apply('b', 'carol', {selector: {app: 'b'}});
    assert.equal(shared.status, 200, 'equal values are shared, not conflicts');
    const forced = await apply('b', 'carol', {ports: [{port: 80, targetPort: 9090}]}, true);
    assert.equal(forced.status, 200);
    assert.equal(forced.body.spec.ports[0].targetPort, 9090);
    const alice = forced.body.metadata.managedFields.find((e: any) => e.manager === 'alice');
    assert.equal(alice.fieldsV1['f:spec']['f:ports']['k:{"port":80,"protocol":"TCP"}']['f:targetPort'], undefined);
  });

  it('removes a field its manager stops applying, unless another manager owns it', async () => {
    await apply('c', 'alice', {selector: {app: 'c', tier: 'web'}, ports: [{port: 80}]});
    const dropped = await apply('c', 'alice', {selector: {app: 'c'}, ports: [{port: 80}]});
    assert.deepEqual(dropped.body.spec.selector, {app: 'c'});
  });

  it('applies to the status subresource under an entry of its own', async () => {
    await apply('d', 'alice', {ports: [{port: 80}]});
    const r = await call(
      'PATCH',
      `${services}/d/status?fieldManager=balancer`,
      {apiVersion: 'v1', kind: 'Service', metadata: {name: 'd'}, status: {loadBalancer: {ingress: [{ip: '192.0.2.1'}]}}},
      {'content-type': 'application/apply-patch+yaml'},
    );
    assert.equal(r.status, 200);
    assert.deepEqual(r.body.status.loadBalancer.ingress, [{ip: '192.0.2.1'}]);
    const entry = r.body.metadata.managedFields.find((e: any) => e.manager === 'balancer');
    assert.deepEqual([entry.operation, entry.subresource], ['Apply', 'status']);
    assert.deepEqual(entry.fieldsV1, {'f:status': {'f:loadBalancer': {'f:ingress': {}}}});
    assert.ok(
      r.body.metadata.managedFields.some((e: any) => e.manager === 'alice'),
      "the spec's manager keeps its entry",
    );
  });

  it('needs a field manager for apply, as kube-apiserver', async () => {
    const r = await call(
      'PATCH',
      `${services}/a`,
      {apiVersion: 'v1', kind: 'Service', metadata: {name: 'a'}},
      {
        'content-type': 'application/apply-patch+yaml',
      },
    );
    assert.equal(r.status, 422);
    assert.match(r.body.message, /fieldManager: Required value: is required for apply patch/);
  });
});

describe('media types and self reviews', () => {
  before(async () => {
    server = await startApiServer({port: 0});
  });
  after(() => server?.stop());

  it('answers 406 to an Accept header without JSON, and JSON to protobuf-or-JSON', async () => {
    const only = await call('GET', services, undefined, {accept: 'application/vnd.kubernetes.protobuf'});
    assert.equal(only.status, 406);
    assert.equal(only.body.reason, 'NotAcceptable');
    assert.equal(only.body.message, 'only the following media types are accepted: application/json');
    const both = await call('GET', services, undefined, {accept: 'application/vnd.kubernetes.protobuf,application/json'});
    assert.equal(both.status, 200);
    assert.equal(both.headers.get('content-type'), 'application/json');
  });

  it('answers 415 to a body that is not Kubernetes protobuf', async () => {
    const r = await call('POST', services, 'not protobuf', {'content-type': 'application/vnd.kubernetes.protobuf'});
    assert.equal(r.status, 415);
    assert.equal(r.body.reason, 'UnsupportedMediaType');
  });

  it('lists the rules of a user in a namespace and says who the user is', async () => {
    const rules = await call('POST', '/apis/authorization.k8s.io/v1/selfsubjectrulesreviews', {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SelfSubjectRulesReview',
      spec: {namespace: 'default'},
    });
    assert.equal(rules.status, 201);
    assert.deepEqual(rules.body.status.resourceRules, [{verbs: ['*'], apiGroups: ['*'], resources: ['*']}]);
    assert.equal(rules.body.status.incomplete, false);
    const who = await call('POST', '/apis/authentication.k8s.io/v1/selfsubjectreviews', {
      apiVersion: 'authentication.k8s.io/v1',
      kind: 'SelfSubjectReview',
    });
    assert.equal(who.body.status.userInfo.username, 'admin');
  });

  it('validates fields: Strict refuses, Warn warns and drops the field', async () => {
    const body = {apiVersion: 'v1', kind: 'Service', metadata: {name: 'v'}, spec: {ports: [{port: 80, bogus: 1}]}};
    const strict = await call('POST', `${services}?fieldValidation=Strict`, body);
    assert.equal(strict.status, 400);
    assert.equal(
      strict.body.message,
      'Service in version "v1" cannot be handled as a Service: strict decoding error: unknown field "spec.ports[0].bogus"',
    );
    const warned = await call('POST', services, body);
    assert.equal(warned.status, 201);
    assert.equal(warned.headers.get('warning'), '299 - "unknown field \\"spec.ports[0].bogus\\""');
    assert.equal(warned.body.spec.ports[0].bogus, undefined, 'an unknown field is dropped, as kube-apiserver drops it');
  });
});
