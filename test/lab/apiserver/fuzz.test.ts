// Random mutations of valid Services and EndpointSlices through the HTTP API (object-fuzzer.ts):
// never a 5xx, and every refused body names its field. The seed is printed with any failure;
// PROXYCTL_FUZZ_SEED=N replays a run. test/kernel/api-fuzz.test.ts does the same beside live agents.
import {after, before, describe, it} from 'node:test';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';
import {fuzzSeed, ObjectFuzzer} from './object-fuzzer.ts';

export const validService = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: {name: 'web', labels: {app: 'web'}, annotations: {note: 'x'}},
  spec: {
    type: 'LoadBalancer',
    selector: {app: 'web'},
    ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}, {name: 'dns', protocol: 'UDP', port: 53, targetPort: 'dns'}],
    externalIPs: ['192.0.2.10'],
    loadBalancerSourceRanges: ['10.0.0.0/8'],
    sessionAffinity: 'ClientIP',
    sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}},
    externalTrafficPolicy: 'Local',
    internalTrafficPolicy: 'Cluster',
  },
};

export const validSlice = {
  apiVersion: 'discovery.k8s.io/v1',
  kind: 'EndpointSlice',
  metadata: {name: 'web-1', labels: {'kubernetes.io/service-name': 'fuzzed'}},
  addressType: 'IPv4',
  endpoints: [
    {addresses: ['10.244.1.5'], conditions: {ready: true, serving: true, terminating: false}, nodeName: 'node-0', zone: 'a', hints: {forZones: [{name: 'a'}]}, targetRef: {kind: 'Pod', name: 'p', namespace: 'default'}},
    {addresses: ['10.244.2.5'], conditions: {ready: false}},
  ],
  ports: [{name: 'http', protocol: 'TCP', port: 8080}],
};

const iterations = 600;

describe('fuzzed Services and EndpointSlices through the API', () => {
  let server: ApiServer;
  before(async () => {
    server = await startApiServer({port: 0});
  });
  after(() => server.stop());

  it(`${iterations} mutations: 2xx, or a 4xx Status naming the field; never a 5xx`, async (t) => {
    const fuzzer = new ObjectFuzzer(server, fuzzSeed());
    t.diagnostic(`seed ${fuzzer.seed} (PROXYCTL_FUZZ_SEED=${fuzzer.seed} replays it)`);
    for (let i = 0; i < iterations; i++) {
      const [collection, valid] = i % 2 === 0 ? ['/api/v1/namespaces/default/services', validService] : ['/apis/discovery.k8s.io/v1/namespaces/default/endpointslices', validSlice];
      fuzzer.check(await fuzzer.once(collection, valid as never));
    }
    t.diagnostic(`answers: ${fuzzer.summary()}`);
    fuzzer.assertMixed();
    await fuzzer.cleanUp();
  });
});
