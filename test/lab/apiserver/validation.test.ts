// What the embedded API server refuses, as kube-apiserver does, over HTTP: a field of the wrong
// JSON type anywhere is a 400 BadRequest naming the field (never a 500), and the values a proxy
// must not be handed (bad source ranges and load-balancer IPs, loopback or link-local endpoints,
// too many ports in a slice) are a 422 Invalid naming the field.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';

let server: ApiServer;

interface Answer {
  status: number;
  body: {
    kind?: string;
    reason?: string;
    message?: string;
    details?: {causes?: Array<{field?: string; message: string; reason?: string}>};
    [key: string]: unknown;
  };
}

async function send(method: string, path: string, body: unknown, contentType = 'application/json'): Promise<Answer> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: {authorization: `Bearer ${server.adminToken}`, 'content-type': contentType},
    body: JSON.stringify(body),
  });
  return {status: response.status, body: (await response.json()) as Answer['body']};
}

const services = '/api/v1/namespaces/default/services';
const slices = '/apis/discovery.k8s.io/v1/namespaces/default/endpointslices';
const service = (name: string, spec: Record<string, unknown> = {}, rest: Record<string, unknown> = {}) => ({
  apiVersion: 'v1',
  kind: 'Service',
  metadata: {name},
  spec: {selector: {app: name}, ports: [{port: 80, targetPort: 8080}], ...spec},
  ...rest,
});
const slice = (name: string, rest: Record<string, unknown> = {}) => ({
  apiVersion: 'discovery.k8s.io/v1',
  kind: 'EndpointSlice',
  metadata: {name, labels: {'kubernetes.io/service-name': 'web'}},
  addressType: 'IPv4',
  endpoints: [{addresses: ['10.244.1.5'], conditions: {ready: true}, nodeName: 'node-1'}],
  ports: [{name: 'http', port: 8080, protocol: 'TCP'}],
  ...rest,
});

/** The answer is a Status of that code and reason whose causes name `field`; returns the message. */
function assertRefused(answer: Answer, code: number, reason: string, field: string): string {
  assert.equal(answer.status, code, JSON.stringify(answer.body));
  assert.equal(answer.body.kind, 'Status');
  assert.equal(answer.body.reason, reason);
  assert.deepEqual(
    answer.body.details?.causes?.map((cause) => cause.field),
    [field],
    JSON.stringify(answer.body),
  );
  assert.ok(
    !/TypeError|ReferenceError|undefined|is not a function|Cannot read/.test(answer.body.message ?? ''),
    `no JavaScript internals: ${answer.body.message}`,
  );
  return answer.body.message!;
}

describe('the lab API server refuses what kube-apiserver refuses', () => {
  before(async () => {
    server = await startApiServer({port: 0});
  });
  after(() => server.stop());

  it('wrong JSON types in a Service: 400 naming the field, worded as kube-apiserver', async () => {
    const cases: Array<[string, unknown, string, string]> = [
      [
        'externalIPs a string',
        service('a', {externalIPs: '1.2.3.4'}),
        'spec.externalIPs',
        'json: cannot unmarshal string into Go struct field ServiceSpec.spec.externalIPs of type []string',
      ],
      [
        'spec a string',
        {metadata: {name: 'a'}, spec: 'x'},
        'spec',
        'json: cannot unmarshal string into Go struct field Service.spec of type v1.ServiceSpec',
      ],
      [
        'ports a string',
        service('a', {ports: 'x'}),
        'spec.ports',
        'json: cannot unmarshal string into Go struct field ServiceSpec.spec.ports of type []v1.ServicePort',
      ],
      ['port a string', service('a', {ports: [{port: '80'}]}), 'spec.ports[0].port', 'of type int32'],
      [
        'timeoutSeconds a fraction',
        service('a', {sessionAffinity: 'ClientIP', sessionAffinityConfig: {clientIP: {timeoutSeconds: 1.5}}}),
        'spec.sessionAffinityConfig.clientIP.timeoutSeconds',
        'json: cannot unmarshal number 1.5 into Go struct field ClientIPConfig.spec.sessionAffinityConfig.clientIP.timeoutSeconds of type int32',
      ],
      [
        'targetPort a bool',
        service('a', {ports: [{port: 80, targetPort: true}]}),
        'spec.ports[0].targetPort',
        'of type intstr.IntOrString',
      ],
      [
        'a label value a number',
        {metadata: {name: 'a', labels: {app: 5}}, spec: {ports: [{port: 80}]}},
        'metadata.labels[app]',
        'Go struct field ObjectMeta.metadata.labels of type string',
      ],
      ['metadata a list', {metadata: ['a'], spec: {ports: [{port: 80}]}}, 'metadata', 'of type v1.ObjectMeta'],
      [
        'ingress a string',
        service('a', {}, {status: {loadBalancer: {ingress: '1.2.3.4'}}}),
        'status.loadBalancer.ingress',
        'of type []v1.LoadBalancerIngress',
      ],
    ];
    for (const [what, body, field, words] of cases) {
      const message = assertRefused(await send('POST', services, body), 400, 'BadRequest', field);
      assert.ok(message.startsWith('Service in version "v1" cannot be handled as a Service: '), `${what}: ${message}`);
      assert.ok(message.includes(words), `${what}: ${message}`);
    }
  });

  it('wrong JSON types in an EndpointSlice, through POST, PUT and every patch type', async () => {
    assertRefused(
      await send('POST', slices, slice('s', {endpoints: [{addresses: ['10.244.1.5'], conditions: {ready: 'yes'}}]})),
      400,
      'BadRequest',
      'endpoints[0].conditions.ready',
    );
    assertRefused(
      await send('POST', slices, slice('s', {endpoints: [{addresses: ['10.244.1.5'], nodeName: 5}]})),
      400,
      'BadRequest',
      'endpoints[0].nodeName',
    );
    assertRefused(await send('POST', slices, slice('s', {ports: [{port: 80.5}]})), 400, 'BadRequest', 'ports[0].port');
    assertRefused(
      await send('POST', '/apis/discovery.k8s.io/v1beta1/namespaces/default/endpointslices', {
        ...slice('s'),
        apiVersion: 'discovery.k8s.io/v1beta1',
        endpoints: [{addresses: '10.244.1.5'}],
      }),
      400,
      'BadRequest',
      'endpoints[0].addresses',
    );
    const created = await send('POST', slices, slice('s'));
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const put = structuredClone(created.body) as any;
    put.endpoints[0].conditions.serving = 'no';
    assertRefused(await send('PUT', `${slices}/s`, put), 400, 'BadRequest', 'endpoints[0].conditions.serving');
    assertRefused(await send('PATCH', `${slices}/s`, {addressType: 4}, 'application/merge-patch+json'), 400, 'BadRequest', 'addressType');
    assertRefused(
      await send('PATCH', `${slices}/s`, {ports: [{name: 'http', port: 'x'}]}, 'application/strategic-merge-patch+json'),
      400,
      'BadRequest',
      'ports[0].port',
    );
    assertRefused(
      await send('PATCH', `${slices}/s`, [{op: 'replace', path: '/endpoints', value: {}}], 'application/json-patch+json'),
      400,
      'BadRequest',
      'endpoints',
    );
    // Nothing of the refused writes was kept.
    const kept = (await (await fetch(`${server.url}${slices}/s`, {headers: {authorization: `Bearer ${server.adminToken}`}})).json()) as any;
    assert.equal(kept.metadata.resourceVersion, (created.body as any).metadata.resourceVersion);
  });

  it('null is read as Go reads it: an absent field, or the zero value in a list', async () => {
    const created = await send(
      'POST',
      services,
      service('nulls', {externalIPs: null, sessionAffinity: null}, {metadata: {name: 'nulls', labels: null, creationTimestamp: null}}),
    );
    assert.equal(created.status, 201, JSON.stringify(created.body));
    assert.equal((created.body as any).spec.sessionAffinity, 'None', 'defaulted as if absent');
    const zeroPort = await send('POST', services, service('zero', {ports: [null]}));
    assertRefused(zeroPort, 422, 'Invalid', 'spec.ports[0].port');
  });

  it('loadBalancerSourceRanges and the annotation before it: CIDRs only, LoadBalancers only', async () => {
    const lb = (name: string, ranges: unknown) => service(name, {type: 'LoadBalancer', loadBalancerSourceRanges: ranges});
    const message = assertRefused(
      await send('POST', services, lb('lb', ['10.0.0.0/8', '1.2.3.4'])),
      422,
      'Invalid',
      'spec.LoadBalancerSourceRanges[1]',
    );
    assert.match(message, /Invalid value: "1\.2\.3\.4": must be a valid CIDR value, \(e\.g\. 10\.9\.8\.0\/24 or 2001:db8::\/64\)/);
    assertRefused(await send('POST', services, lb('lb', ['300.0.0.0/8'])), 422, 'Invalid', 'spec.LoadBalancerSourceRanges[0]');
    assert.equal(
      (await send('POST', services, lb('lb', [' 10.0.0.0/8 ', 'fd00::/64']))).status,
      201,
      'space-padded entries are accepted, as kube-apiserver accepts them',
    );
    assertRefused(
      await send('POST', services, service('cip', {loadBalancerSourceRanges: ['10.0.0.0/8']})),
      422,
      'Invalid',
      'spec.LoadBalancerSourceRanges',
    );
    const annotated = service(
      'annotated',
      {type: 'LoadBalancer'},
      {metadata: {name: 'annotated', annotations: {'service.beta.kubernetes.io/load-balancer-source-ranges': '10.0.0.0/8, nonsense'}}},
    );
    assertRefused(
      await send('POST', services, annotated),
      422,
      'Invalid',
      'metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]',
    );
  });

  it('status.loadBalancer.ingress[].ip must be an IP, on /status as on create', async () => {
    assert.equal((await send('POST', services, service('ingress', {type: 'LoadBalancer'}))).status, 201);
    const status = (ip: string) => ({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'ingress'},
      status: {loadBalancer: {ingress: [{ip}]}},
    });
    const message = assertRefused(
      await send('PATCH', `${services}/ingress/status`, status('0.0.0.256'), 'application/merge-patch+json'),
      422,
      'Invalid',
      'status.loadBalancer.ingress[0].ip',
    );
    assert.match(message, /must be a valid IP address/);
    assertRefused(
      await send(
        'PATCH',
        `${services}/ingress/status`,
        {status: {loadBalancer: {ingress: [{hostname: '192.0.2.1'}]}}},
        'application/merge-patch+json',
      ),
      422,
      'Invalid',
      'status.loadBalancer.ingress[0].hostname',
    );
    assert.equal((await send('PATCH', `${services}/ingress/status`, status('192.0.2.10'), 'application/merge-patch+json')).status, 200);
  });

  it('endpoint addresses a proxy must not forward to: unspecified, loopback, link-local, link-local multicast', async () => {
    const cases: Array<[string, string, string]> = [
      ['IPv4', '0.0.0.0', 'may not be unspecified'],
      ['IPv4', '127.0.0.1', 'may not be in the loopback range'],
      ['IPv4', '127.8.9.10', 'may not be in the loopback range'],
      ['IPv4', '169.254.169.254', 'may not be in the link-local range'],
      ['IPv4', '224.0.0.251', 'may not be in the link-local multicast range'],
      ['IPv6', '::', 'may not be unspecified'],
      ['IPv6', '::1', 'may not be in the loopback range'],
      ['IPv6', 'fe80::1', 'may not be in the link-local range'],
      ['IPv6', 'ff02::1', 'may not be in the link-local multicast range'],
    ];
    for (const [addressType, address, words] of cases) {
      const answer = await send('POST', slices, slice('special', {addressType, endpoints: [{addresses: [address]}]}));
      assert.match(assertRefused(answer, 422, 'Invalid', 'endpoints[0].addresses[0]'), new RegExp(words), `${address}`);
    }
    const fine = await send('POST', slices, slice('ordinary', {addressType: 'IPv6', endpoints: [{addresses: ['fd00:10:244::5']}]}));
    assert.equal(fine.status, 201, JSON.stringify(fine.body));
  });

  it('a slice holds at most 100 ports and 1000 endpoints', async () => {
    const ports = Array.from({length: 101}, (_, i) => ({name: `p${i}`, port: 1000 + i, protocol: 'TCP'}));
    assert.match(
      assertRefused(await send('POST', slices, slice('ports', {ports})), 422, 'Invalid', 'ports'),
      /Too many: 101: must have at most 100 items/,
    );
    assert.equal((await send('POST', slices, slice('ports', {ports: ports.slice(0, 100)}))).status, 201);
    const endpoints = Array.from({length: 1001}, (_, i) => ({addresses: [`10.244.${Math.floor(i / 250)}.${(i % 250) + 1}`]}));
    assert.match(
      assertRefused(await send('POST', slices, slice('many', {endpoints})), 422, 'Invalid', 'endpoints'),
      /Too many: 1001: must have at most 1000 items/,
    );
  });

  it("DELETE with preconditions: 409 when the uid or resourceVersion is not the stored object's, as kube-apiserver words it", async () => {
    const created = await send('POST', services, service('guarded'));
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const {uid, resourceVersion} = created.body.metadata as {uid: string; resourceVersion: string};
    const cases: Array<[Record<string, string>, string]> = [
      [{uid: 'not-its-uid'}, `Precondition failed: UID in precondition: not-its-uid, UID in object meta: ${uid}`],
      [
        {resourceVersion: '1'},
        `Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: ${resourceVersion}`,
      ],
    ];
    for (const [preconditions, words] of cases) {
      const answer = await send('DELETE', `${services}/guarded`, {apiVersion: 'v1', kind: 'DeleteOptions', preconditions});
      assert.equal(answer.status, 409, JSON.stringify(answer.body));
      assert.equal(answer.body.reason, 'Conflict');
      assert.equal(answer.body.message, `Operation cannot be fulfilled on services "guarded": ${words}`);
    }
    const kept = await send('GET', `${services}/guarded`, undefined);
    assert.equal(kept.status, 200, 'a refused DELETE leaves the object');
    const deleted = await send('DELETE', `${services}/guarded`, {
      apiVersion: 'v1',
      kind: 'DeleteOptions',
      preconditions: {uid, resourceVersion},
    });
    assert.equal(deleted.status, 200, JSON.stringify(deleted.body));
  });
});
