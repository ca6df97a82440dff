// Seeded random mutations of valid Services and EndpointSlices, sent through the API server's HTTP
// API as create, replace and every patch type. Each answer must be a 2xx, or a 4xx Status that
// names the field (details.causes[].field) when the body was at fault; never a 5xx. The same seed
// replays the same requests (PROXYCTL_FUZZ_SEED=N).
import assert from 'node:assert/strict';
import type {ApiServer} from '../../../src/lab/apiserver/server.ts';

/** mulberry32: a small seeded generator, so that a failing run can be replayed from its seed. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The seed of this run: PROXYCTL_FUZZ_SEED, else a fresh one. */
export function fuzzSeed(): number {
  const fixed = process.env.PROXYCTL_FUZZ_SEED;
  return fixed !== undefined && fixed !== '' ? Number(fixed) : Math.floor(Math.random() * 2 ** 31);
}

/** The valid objects the mutations start from: a LoadBalancer with most fields set, and a slice. */
export const validService = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: {name: 'web', labels: {app: 'web'}, annotations: {note: 'x'}},
  spec: {
    type: 'LoadBalancer',
    selector: {app: 'web'},
    ports: [
      {name: 'http', protocol: 'TCP', port: 80, targetPort: 8080},
      {name: 'dns', protocol: 'UDP', port: 53, targetPort: 'dns'},
    ],
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
    {
      addresses: ['10.244.1.5'],
      conditions: {ready: true, serving: true, terminating: false},
      nodeName: 'node-0',
      zone: 'a',
      hints: {forZones: [{name: 'a'}]},
      targetRef: {kind: 'Pod', name: 'p', namespace: 'default'},
    },
    {addresses: ['10.244.2.5'], conditions: {ready: false}},
  ],
  ports: [{name: 'http', protocol: 'TCP', port: 8080}],
};

type Json = null | boolean | number | string | Json[] | {[key: string]: Json};

const oddStrings = [
  '',
  'x',
  '127.0.0.1',
  '0.0.0.0',
  '::1',
  '169.254.169.254',
  '224.0.0.1',
  'fe80::1',
  '10.96.0.0/12',
  '1.2.3.4/33',
  'not an ip',
  'TCP',
  'UDP',
  'SCTP',
  'tcp',
  'None',
  'LoadBalancer',
  'NodePort',
  'ExternalName',
  'Local',
  'ClientIP',
  'IPv6',
  '-1',
  '80',
  'a'.repeat(300),
  'ü',
  '${x}',
  '__proto__',
];
const oddNumbers = [0, -1, 1, 80, 1.5, 65535, 65536, 30000, 32767, 2 ** 31, -(2 ** 53), 1e308, 86400, 86401];
const oddKeys = [
  'port',
  'ports',
  'name',
  'protocol',
  'addresses',
  'conditions',
  'ready',
  'nodeName',
  'ip',
  'x',
  'constructor',
  '__proto__',
];

export interface FuzzCase {
  /** What was sent, to print when the answer is wrong. */
  request: string;
  status: number;
  body: {kind?: string; reason?: string; message?: string; details?: {causes?: Array<{field?: string}>}};
}

export class ObjectFuzzer {
  readonly seed: number;
  readonly #random: () => number;
  readonly #server: ApiServer;
  #serial = 0;
  /** How many answers had each status code. */
  readonly statuses = new Map<number, number>();
  /** Objects the fuzzing created (to delete them afterwards). */
  readonly created: Array<{path: string}> = [];

  constructor(server: ApiServer, seed: number) {
    this.seed = seed;
    this.#random = seededRandom(seed);
    this.#server = server;
  }

  #pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.#random() * items.length)];
  }

  #value(depth = 0): Json {
    switch (Math.floor(this.#random() * (depth > 2 ? 5 : 7))) {
      case 0:
        return this.#pick(oddStrings);
      case 1:
        return this.#pick(oddNumbers);
      case 2:
        return this.#random() < 0.5;
      case 3:
        return null;
      case 4:
        return this.#pick(oddStrings) + String(this.#pick(oddNumbers));
      case 5:
        return Array.from({length: Math.floor(this.#random() * 3)}, () => this.#value(depth + 1));
      default:
        return Object.fromEntries(
          Array.from({length: Math.floor(this.#random() * 3)}, () => [this.#pick(oddKeys), this.#value(depth + 1)]),
        );
    }
  }

  /** Every path into the object (arrays by index), the root's fields included. */
  #paths(value: Json, prefix: Array<string | number> = []): Array<Array<string | number>> {
    if (value === null || typeof value !== 'object') return [];
    const keys: Array<string | number> = Array.isArray(value) ? value.map((_, i) => i) : Object.keys(value);
    return keys.flatMap((key) => [[...prefix, key], ...this.#paths((value as any)[key], [...prefix, key])]);
  }

  /** One random change somewhere in a copy of `object`: a value replaced, removed, added or wrapped. */
  mutate(object: Json): Json {
    const copy = structuredClone(object) as {[key: string]: Json};
    const paths = this.#paths(copy).filter((path) => !(path[0] === 'metadata' && (path[1] === 'name' || path[1] === 'namespace')));
    const path = this.#pick(paths);
    const parent = path.slice(0, -1).reduce<any>((node, key) => node[key], copy);
    const key = path[path.length - 1];
    switch (Math.floor(this.#random() * 5)) {
      case 0:
        if (Array.isArray(parent)) parent.splice(key as number, 1);
        else delete parent[key];
        break;
      case 1:
        parent[key] = [parent[key], this.#value()];
        break;
      case 2:
        if (parent[key] !== null && typeof parent[key] === 'object' && !Array.isArray(parent[key]))
          parent[key][this.#pick(oddKeys)] = this.#value();
        else parent[key] = this.#value();
        break;
      case 3:
        if (Array.isArray(parent[key]))
          parent[key] = Array.from({length: 101 + Math.floor(this.#random() * 5)}, (_, i) => structuredClone(parent[key][0] ?? i));
        else parent[key] = this.#value();
        break;
      default:
        parent[key] = this.#value();
    }
    return copy;
  }

  async #send(method: string, path: string, body: unknown, contentType = 'application/json'): Promise<FuzzCase> {
    const text = JSON.stringify(body);
    const response = await fetch(`${this.#server.url}${path}`, {
      method,
      headers: {authorization: `Bearer ${this.#server.adminToken}`, 'content-type': contentType},
      body: text,
    });
    const answer = await response.text();
    let parsed: FuzzCase['body'] = {};
    try {
      parsed = JSON.parse(answer);
    } catch {
      parsed = {message: answer};
    }
    return {
      request: `${method} ${path} (${contentType}) ${text.length > 600 ? `${text.slice(0, 600)}...` : text}`,
      status: response.status,
      body: parsed,
    };
  }

  /**
   * One fuzzed request about a mutation of `valid` (a Service or EndpointSlice at `collection`):
   * a create under a new name, or a replace or patch of an object made from `valid` before.
   */
  async once(collection: string, valid: {metadata: {name: string}} & {[key: string]: Json}): Promise<FuzzCase> {
    const name = `fuzz-${this.#serial++}`;
    const base = {...structuredClone(valid), metadata: {...structuredClone(valid.metadata), name}} as {[key: string]: Json};
    const mutated = this.mutate(base) as {[key: string]: Json};
    const how = Math.floor(this.#random() * 4);
    if (how === 0) {
      const answer = await this.#send('POST', collection, mutated);
      if (answer.status < 300) this.created.push({path: `${collection}/${name}`});
      return answer;
    }
    // Replace and patch need an object to change: first the valid one.
    const made = await this.#send('POST', collection, base);
    if (made.status >= 300) return made;
    this.created.push({path: `${collection}/${name}`});
    const current = made.body as unknown as {[key: string]: Json} & {metadata: {[key: string]: Json}};
    if (how === 1)
      return this.#send('PUT', `${collection}/${name}`, {
        ...mutated,
        metadata: {...(mutated.metadata as object), resourceVersion: current.metadata.resourceVersion},
      });
    if (how === 2)
      return this.#send(
        'PATCH',
        `${collection}/${name}`,
        mutated,
        this.#random() < 0.5 ? 'application/merge-patch+json' : 'application/strategic-merge-patch+json',
      );
    const paths = this.#paths(current).filter((path) => path[0] !== 'metadata');
    const path = this.#pick(paths);
    const pointer = `/${path.map((part) => String(part).replaceAll('~', '~0').replaceAll('/', '~1')).join('/')}`;
    return this.#send(
      'PATCH',
      `${collection}/${name}`,
      [{op: this.#pick(['replace', 'add', 'remove']), path: pointer, value: this.#value()}],
      'application/json-patch+json',
    );
  }

  /**
   * run sends `iterations` fuzzed requests, Services and EndpointSlices in turn, checking each
   * answer, then that both accepted and refused ones came; `note` gets the seed and the counts.
   */
  async run(iterations: number, note: (line: string) => void): Promise<void> {
    note(`seed ${this.seed} (PROXYCTL_FUZZ_SEED=${this.seed} replays it)`);
    for (let i = 0; i < iterations; i++) {
      const [collection, valid] =
        i % 2 === 0
          ? ['/api/v1/namespaces/default/services', validService]
          : ['/apis/discovery.k8s.io/v1/namespaces/default/endpointslices', validSlice];
      this.check(await this.once(collection, valid as never));
    }
    note(`answers: ${this.summary()}`);
    this.assertMixed();
  }

  /** The answer is a 2xx, or a 4xx Status; a body the server refused (400, 422) names the field. */
  check(answer: FuzzCase): void {
    this.statuses.set(answer.status, (this.statuses.get(answer.status) ?? 0) + 1);
    const context = `seed ${this.seed} (replay with PROXYCTL_FUZZ_SEED=${this.seed}): ${answer.request}\nanswer ${answer.status}: ${JSON.stringify(answer.body).slice(0, 800)}`;
    assert.ok(answer.status >= 200 && answer.status < 500, `no 5xx for a client's mistake; ${context}`);
    if (answer.status < 300) return;
    assert.equal(answer.body.kind, 'Status', context);
    if (answer.status === 400 || answer.status === 422) {
      const fields = (answer.body.details?.causes ?? [])
        .map((cause) => cause.field)
        .filter((field) => typeof field === 'string' && field !== '');
      assert.ok(fields.length > 0, `a refused body names the field; ${context}`);
    }
  }

  /** The counts of answers by status code, for the test's diagnostics: "201 x 120, 422 x 80". */
  summary(): string {
    return [...this.statuses]
      .sort((a, b) => a[0] - b[0])
      .map(([status, count]) => `${status} x ${count}`)
      .join(', ');
  }

  /** Both kinds happened: mutations the server took and mutations it refused (else the fuzzing tests little). */
  assertMixed(): void {
    const count = (low: number, high: number) =>
      [...this.statuses].filter(([status]) => status >= low && status < high).reduce((sum, [, n]) => sum + n, 0);
    assert.ok(count(200, 300) > 0 && count(400, 500) > 0, `seed ${this.seed}: answers ${this.summary()}`);
  }

  /** Deletes what the fuzzing created. */
  async cleanUp(): Promise<void> {
    for (const {path} of this.created.splice(0)) await this.#send('DELETE', path, {});
  }
}
