// Random mutations of valid Services and EndpointSlices through the HTTP API (object-fuzzer.ts):
// never a 5xx, and every refused body names its field. The seed is printed with any failure;
// PROXYCTL_FUZZ_SEED=N replays a run. test/kernel/api-fuzz.test.ts does the same beside live agents.
import {after, before, describe, it} from 'node:test';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';
import {fuzzSeed, ObjectFuzzer} from './object-fuzzer.ts';

const iterations = 600;

describe('fuzzed Services and EndpointSlices through the API', () => {
  let server: ApiServer;
  before(async () => {
    server = await startApiServer({port: 0});
  });
  after(() => server.stop());

  it(`${iterations} mutations: 2xx, or a 4xx Status naming the field; never a 5xx`, async (t) => {
    const fuzzer = new ObjectFuzzer(server, fuzzSeed());
    await fuzzer.run(iterations, (line) => t.diagnostic(line));
    await fuzzer.cleanUp();
  });
});
