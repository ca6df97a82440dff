// networking.k8s.io/v1 ServiceCIDRs on the embedded API server: discovered, listed, watched, got,
// created and deleted through the same machinery as every resource, with the default `kubernetes`
// one naming the server's service range, and kube-apiserver's validation messages.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';

let server: ApiServer;
const base = '/apis/networking.k8s.io/v1/servicecidrs';

async function send(method: string, path: string, body?: unknown): Promise<{status: number; body: any}> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: {authorization: `Bearer ${server.adminToken}`, 'content-type': 'application/json'},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return {status: response.status, body: await response.json()};
}

describe('ServiceCIDRs', () => {
  before(async () => {
    server = await startApiServer({port: 0, serviceCIDR: '10.96.0.0/12,fd00:10:96::/112'});
  });
  after(() => server.stop());

  it('are discovered under networking.k8s.io/v1, cluster-scoped, with a status subresource', async () => {
    const groups = (await send('GET', '/apis')).body;
    assert.ok(groups.groups.some((group: any) => group.name === 'networking.k8s.io' && group.preferredVersion.version === 'v1'));
    const resources = (await send('GET', '/apis/networking.k8s.io/v1')).body.resources;
    const main = resources.find((resource: any) => resource.name === 'servicecidrs');
    assert.equal(main.kind, 'ServiceCIDR');
    assert.equal(main.namespaced, false);
    assert.deepEqual([...main.verbs].sort(), ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch']);
    assert.ok(resources.some((resource: any) => resource.name === 'servicecidrs/status'));
  });

  it("the default `kubernetes` one holds the server's service range, Ready", async () => {
    const list = (await send('GET', base)).body;
    assert.equal(list.kind, 'ServiceCIDRList');
    assert.deepEqual(
      list.items.map((item: any) => item.metadata.name),
      ['kubernetes'],
    );
    const own = (await send('GET', `${base}/kubernetes`)).body;
    assert.deepEqual(own.spec.cidrs, ['10.96.0.0/12', 'fd00:10:96::/112']);
    assert.equal(own.status.conditions.find((condition: any) => condition.type === 'Ready')?.status, 'True');
  });

  it('a watch sees one created and deleted', async () => {
    const list = (await send('GET', base)).body;
    const controller = new AbortController();
    const response = await fetch(`${server.url}${base}?watch=1&resourceVersion=${list.metadata.resourceVersion}`, {
      headers: {authorization: `Bearer ${server.adminToken}`},
      signal: controller.signal,
    });
    const created = await send('POST', base, {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'ServiceCIDR',
      metadata: {name: 'extra'},
      spec: {cidrs: ['10.200.0.0/16']},
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    assert.equal((await send('DELETE', `${base}/extra`)).status, 200);
    const reader = response.body!.getReader();
    let text = '';
    while (text.split('\n').filter(Boolean).length < 2) text += new TextDecoder().decode((await reader.read()).value);
    controller.abort();
    const events = text
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line));
    assert.deepEqual(
      events.map((event) => `${event.type} ${event.object.metadata.name} ${event.object.spec.cidrs}`),
      ['ADDED extra 10.200.0.0/16', 'DELETED extra 10.200.0.0/16'],
    );
  });

  it('are validated as kube-apiserver validates them', async () => {
    const create = (cidrs: unknown) => send('POST', base, {metadata: {name: 'bad'}, spec: {cidrs}});
    const cases: Array<[unknown, string]> = [
      [[], 'spec.cidrs: Required value: at least one CIDR required'],
      [
        ['10.0.0.0/8', 'fd00::/64', '11.0.0.0/8'],
        'spec.cidrs: Invalid value: {"cidrs":["10.0.0.0/8","fd00::/64","11.0.0.0/8"]}: may only hold up to 2 values',
      ],
      [['10.0.0.1'], 'spec.cidrs[0]: Invalid value: "10.0.0.1": must be a valid CIDR value'],
      [['10.0.0.0/8', '11.0.0.0/8'], 'may specify no more than one IP for each IP family'],
    ];
    for (const [cidrs, words] of cases) {
      const answer = await create(cidrs);
      assert.equal(answer.status, 422, JSON.stringify(answer.body));
      assert.ok(answer.body.message.includes(words), answer.body.message);
    }
    const typed = await create('10.0.0.0/8');
    assert.equal(typed.status, 400);
    assert.equal(typed.body.details.causes[0].field, 'spec.cidrs');
    const response = await fetch(`${server.url}${base}/kubernetes`, {
      method: 'PATCH',
      headers: {authorization: `Bearer ${server.adminToken}`, 'content-type': 'application/merge-patch+json'},
      body: JSON.stringify({spec: {cidrs: ['10.100.0.0/16']}}),
    });
    const immutable = (await response.json()) as any;
    assert.equal(response.status, 422);
    assert.match(immutable.message, /spec\.cidrs: Invalid value: \[\]string\{"10\.100\.0\.0\/16"\}: field is immutable/);
  });
});
