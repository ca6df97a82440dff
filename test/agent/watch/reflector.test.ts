// Reflector against a scripted client with a fake clock: list then watch, 410 relists, backoff when
// the API server is gone, the watchdog, and malformed events.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {memoryLogger} from '../../../src/agent/log.ts';
import type {KubernetesClient, ListResult} from '../../../src/agent/watch/kubernetes-client.ts';
import {ObjectStore} from '../../../src/agent/watch/object-store.ts';
import {Reflector} from '../../../src/agent/watch/reflector.ts';
import {FakeClock, settle} from '../fake-clock.ts';

interface OpenWatch {
  query: Record<string, string>;
  send(type: string, object: unknown): void;
  end(error?: unknown): void;
  aborted: boolean;
}

class ScriptedClient implements KubernetesClient {
  lists: Array<Record<string, string>> = [];
  watches: OpenWatch[] = [];
  listResults: Array<ListResult | Error> = [];
  watchFailures: Error[] = [];

  async list(_path: string, query: Record<string, string>): Promise<ListResult> {
    this.lists.push(query);
    const next = this.listResults.shift() ?? {items: [], resourceVersion: '1'};
    if (next instanceof Error) throw next;
    return next;
  }

  async watch(
    _path: string,
    query: Record<string, string>,
    onEvent: (type: string, object: unknown) => void,
    onDone: (error?: unknown) => void,
  ) {
    const failure = this.watchFailures.shift();
    if (failure) {
      onDone(failure);
      return {abort() {}};
    }
    let done = false;
    const watch: OpenWatch = {
      query,
      aborted: false,
      send: (type, object) => !done && onEvent(type, object),
      end: (error) => {
        if (done) return;
        done = true;
        onDone(error);
      },
    };
    this.watches.push(watch);
    return {
      abort: () => {
        watch.aborted = true;
        watch.end();
      },
    };
  }
}

const svc = (name: string, rv: string) => ({metadata: {name, namespace: 'default', resourceVersion: rv}});

function setup(options: {watchdogMs?: number} = {}) {
  const clock = new FakeClock();
  const client = new ScriptedClient();
  const store = new ObjectStore();
  const log = memoryLogger();
  let synced = 0;
  const reflector = new Reflector({
    name: 'services',
    path: '/api/v1/services',
    labelSelector: '!service.kubernetes.io/service-proxy-name',
    client,
    onReplace: (items) => store.replace('Service', items),
    onEvent: (type, object) => store.apply('Service', type, object),
    onSynced: () => synced++,
    log,
    clock,
    watchdogMs: options.watchdogMs ?? 600_000,
    backoffInitialMs: 1000,
    backoffMaxMs: 8000,
  });
  return {clock, client, store, log, reflector, synced: () => synced};
}

test('lists, then watches from the list resourceVersion, and applies events', async (t) => {
  const {client, clock, store, reflector, synced} = setup();
  t.after(() => reflector.stop());
  client.listResults.push({items: [svc('a', '5'), svc('b', '6')], resourceVersion: '10'});
  reflector.start();
  await settle();
  assert.equal(synced(), 1);
  assert.deepEqual(client.lists, [{limit: '500', labelSelector: '!service.kubernetes.io/service-proxy-name'}]);
  assert.equal(client.watches[0].query.resourceVersion, '10');
  assert.equal(client.watches[0].query.allowWatchBookmarks, 'true');
  client.watches[0].send('ADDED', svc('c', '11'));
  client.watches[0].send('DELETED', svc('a', '12'));
  client.watches[0].send('BOOKMARK', {metadata: {resourceVersion: '20'}});
  assert.deepEqual(
    store
      .services()
      .map((s: any) => s.metadata.name)
      .sort(),
    ['b', 'c'],
  );
  await clock.advance(5000);
  client.watches[0].end();
  await settle();
  assert.equal(client.watches[1].query.resourceVersion, '20', 'a closed watch resumes from the last resourceVersion seen');
  assert.equal(client.lists.length, 1);
});

test("a list comes in pages: each page is kept as it comes, the watch starts from the pages' resourceVersion", async (t) => {
  const clock = new FakeClock();
  const client = new ScriptedClient();
  const kept: string[] = [];
  let replaced: unknown[] = [];
  const reflector = new Reflector({
    name: 'services',
    path: '/api/v1/services',
    client,
    keep: (object) => {
      const name = (object as {metadata: {name: string}}).metadata.name;
      kept.push(`${name} while ${client.lists.length} asked`);
      return {kept: name};
    },
    onReplace: (items) => (replaced = items),
    onEvent: () => {},
    log: memoryLogger(),
    clock,
    watchdogMs: 600_000,
  });
  t.after(() => reflector.stop());
  client.listResults.push(
    {items: [svc('a', '5'), svc('b', '6')], resourceVersion: '10', continue: 'page-2'},
    {items: [svc('c', '7'), {metadata: {}}], resourceVersion: '10', continue: 'page-3'},
    {items: [svc('d', '8')], resourceVersion: '10'},
  );
  reflector.start();
  await settle();
  assert.deepEqual(client.lists, [{limit: '500'}, {limit: '500', continue: 'page-2'}, {limit: '500', continue: 'page-3'}]);
  assert.deepEqual(
    kept,
    ['a while 1 asked', 'b while 1 asked', 'c while 2 asked', 'd while 3 asked'],
    'each page kept before the next is asked for; the nameless object dropped',
  );
  assert.deepEqual(replaced, [{kept: 'a'}, {kept: 'b'}, {kept: 'c'}, {kept: 'd'}]);
  assert.equal(client.watches[0].query.resourceVersion, '10');
});

test('a list whose continuation expired (410) is listed again from the start', async (t) => {
  const {client, store, reflector} = setup();
  t.after(() => reflector.stop());
  client.listResults.push(
    {items: [svc('a', '5')], resourceVersion: '10', continue: 'page-2'},
    Object.assign(new Error('The provided continue parameter is too old'), {statusCode: 410}),
    {items: [svc('a', '5'), svc('b', '16')], resourceVersion: '20'},
  );
  reflector.start();
  await settle();
  assert.deepEqual(
    client.lists.map((query) => query.continue),
    [undefined, 'page-2', undefined],
  );
  assert.deepEqual(
    store.services().map((s: any) => s.metadata.name),
    ['a', 'b'],
  );
  assert.equal(client.watches[0].query.resourceVersion, '20');
});

test('a server that hands the same continue token back is not asked forever: the list fails and is retried', async (t) => {
  const {client, clock, store, reflector, log} = setup();
  t.after(() => reflector.stop());
  client.listResults.push(
    {items: [svc('a', '5')], resourceVersion: '10', continue: 'again'},
    {items: [svc('b', '6')], resourceVersion: '10', continue: 'again'},
    {items: [svc('a', '5'), svc('b', '6')], resourceVersion: '11'},
  );
  reflector.start();
  await settle();
  assert.equal(client.lists.length, 2);
  assert.ok(
    log.lines.some((line) => line.includes('the same continue token again')),
    log.lines.join('\n'),
  );
  await clock.advance(1000);
  await settle();
  assert.deepEqual(
    store.services().map((s: any) => s.metadata.name),
    ['a', 'b'],
  );
  assert.equal(client.watches[0].query.resourceVersion, '11');
});

test('an ERROR 410 event lists again, and the relist removes what vanished meanwhile', async (t) => {
  const {client, store, reflector} = setup();
  t.after(() => reflector.stop());
  client.listResults.push({items: [svc('a', '5'), svc('b', '6')], resourceVersion: '10'}, {items: [svc('b', '6')], resourceVersion: '30'});
  const deleted: string[] = [];
  store.onChange((_kind, type, object: any) => type === 'DELETED' && deleted.push(object.metadata.name));
  reflector.start();
  await settle();
  client.watches[0].send('ERROR', {kind: 'Status', code: 410, reason: 'Expired'});
  await settle();
  assert.equal(client.lists.length, 2);
  assert.deepEqual(deleted, ['a']);
  assert.equal(client.watches[1].query.resourceVersion, '30');
});

test('an ERROR event for a resourceVersion the server has not reached (its storage replaced) lists again', async (t) => {
  const {client, reflector} = setup();
  t.after(() => reflector.stop());
  client.listResults.push({items: [svc('a', '5')], resourceVersion: '10'}, {items: [], resourceVersion: '3'});
  reflector.start();
  await settle();
  client.watches[0].send('ERROR', {
    kind: 'Status',
    code: 504,
    reason: 'Timeout',
    message: 'Too large resource version: 10, current: 3',
    details: {causes: [{reason: 'ResourceVersionTooLarge', message: 'Too large resource version'}], retryAfterSeconds: 1},
  });
  await settle();
  assert.equal(client.lists.length, 2);
  assert.equal(client.watches[1].query.resourceVersion, '3');
});

test('a watch refused with 410 lists again', async (t) => {
  const {client, reflector} = setup();
  t.after(() => reflector.stop());
  client.watchFailures.push(Object.assign(new Error('Gone'), {statusCode: 410}));
  reflector.start();
  await settle();
  assert.equal(client.lists.length, 2);
});

test('API server unreachable: retries with a doubling backoff, capped', async (t) => {
  const {client, clock, reflector, log, synced} = setup();
  t.after(() => reflector.stop());
  for (let i = 0; i < 6; i++)
    client.listResults.push(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), {code: 'ECONNREFUSED'}));
  reflector.start();
  await settle();
  const listedAt: number[] = [];
  const start = clock.now();
  for (let second = 0; second <= 40; second++) {
    if (client.lists.length > listedAt.length) listedAt.push((clock.now() - start) / 1000);
    await clock.advance(1000);
  }
  assert.deepEqual(listedAt.slice(0, 7), [0, 1, 3, 7, 15, 23, 31]);
  assert.equal(synced(), 1, 'the seventh list succeeds');
  assert.ok(log.lines.some((line) => line.includes('API server request failed') && line.includes('ECONNREFUSED')));
});

test('the watchdog lists again after a silent watch', async (t) => {
  const {client, clock, reflector, log} = setup({watchdogMs: 60_000});
  t.after(() => reflector.stop());
  reflector.start();
  await settle();
  await clock.advance(30_000);
  client.watches[0].send('BOOKMARK', {metadata: {resourceVersion: '2'}});
  await clock.advance(59_000);
  assert.equal(client.lists.length, 1, 'a bookmark counts as a sign of life');
  await clock.advance(2_000);
  assert.equal(client.lists.length, 2);
  assert.equal(client.watches[0].aborted, true);
  assert.ok(log.lines.some((line) => line.includes('watch silent too long')));
});

test('malformed events are dropped and the watch goes on', async (t) => {
  const {client, store, reflector, log} = setup();
  t.after(() => reflector.stop());
  reflector.start();
  await settle();
  client.watches[0].send('ADDED', 'not an object');
  client.watches[0].send('ADDED', {metadata: {}});
  client.watches[0].send('WHATEVER', svc('x', '3'));
  client.watches[0].send('ADDED', svc('ok', '4'));
  assert.deepEqual(
    store.services().map((s: any) => s.metadata.name),
    ['ok'],
  );
  assert.equal(log.lines.filter((line) => line.includes('without an object name')).length, 2);
});

test('a server that ends every watch at once is not hammered', async (t) => {
  const {client, clock, reflector} = setup();
  t.after(() => reflector.stop());
  reflector.start();
  await settle();
  for (let i = 0; i < 5; i++) {
    client.watches.at(-1)!.end();
    await clock.advance(100);
  }
  assert.ok(client.watches.length <= 2, `${client.watches.length} watches in half a second`);
});

test('stop ends the loop and aborts the watch', async () => {
  const {client, reflector} = setup();
  reflector.start();
  await settle();
  await reflector.stop();
  assert.equal(client.watches[0].aborted, true);
});

test('API server gone while watching: the watch resumes from its resourceVersion, and a 410 then lists', async (t) => {
  const {client, clock, reflector, log} = setup();
  t.after(() => reflector.stop());
  client.listResults.push({items: [svc('a', '5')], resourceVersion: '10'});
  reflector.start();
  await settle();
  client.watches[0].send('MODIFIED', svc('a', '12'));
  // The connection breaks, then the next two watches are refused as undici reports it.
  const refused = () =>
    Object.assign(new TypeError('fetch failed'), {
      cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), {code: 'ECONNREFUSED'}),
    });
  // Before resuming, a one-item list asks the server how far its history goes: refused twice, then 40.
  client.listResults.push(refused(), refused(), {items: [svc('b', '40')], resourceVersion: '40'});
  client.watches[0].end(
    Object.assign(new TypeError('terminated'), {cause: Object.assign(new Error('other side closed'), {code: 'UND_ERR_SOCKET'})}),
  );
  await settle();
  await clock.advance(1000);
  await clock.advance(2000);
  await clock.advance(4000);
  assert.equal(client.lists.length, 4, 'the first list and three one-item checks');
  for (const check of client.lists.slice(1)) assert.equal(check.limit, '1');
  assert.equal(client.watches.length, 2);
  assert.equal(client.watches[1].query.resourceVersion, '12', 'resumed where the broken watch was');
  assert.ok(
    log.lines.some((line) => line.includes('ECONNREFUSED') && line.includes('watch from resourceVersion 12')),
    log.lines.join('\n'),
  );

  client.listResults.push({items: [svc('b', '40')], resourceVersion: '41'});
  client.watches[1].send('ERROR', {kind: 'Status', code: 410, reason: 'Expired'});
  await settle();
  assert.equal(client.lists.length, 5, 'history gone: list again');
  assert.equal(client.lists[4].limit, '500', 'a whole list, in pages');
  assert.equal(client.watches[2].query.resourceVersion, '41');
});

test('API server back with a younger history (new or restored storage): lists instead of resuming', async (t) => {
  const {client, clock, reflector, log} = setup();
  t.after(() => reflector.stop());
  client.listResults.push(
    {items: [svc('a', '5')], resourceVersion: '10'},
    {items: [], resourceVersion: '3'},
    {items: [svc('c', '2')], resourceVersion: '3'},
  );
  reflector.start();
  await settle();
  client.watches[0].end(
    Object.assign(new TypeError('fetch failed'), {cause: Object.assign(new Error('read ECONNRESET'), {code: 'ECONNRESET'})}),
  );
  await settle();
  client.watchFailures.push(Object.assign(new TypeError('fetch failed'), {cause: {code: 'ECONNREFUSED'}}));
  await clock.advance(1000);
  await settle();
  assert.equal(client.lists.length, 3, 'first list, the check, the full list');
  assert.equal(client.lists[2].limit, '500', 'a whole list, in pages');
  assert.ok(log.lines.some((line) => line.includes('history restarts before our resourceVersion')));
});

test('a watch refused for another reason lists again', async (t) => {
  const {client, clock, reflector} = setup();
  t.after(() => reflector.stop());
  client.watchFailures.push(Object.assign(new Error('Forbidden'), {statusCode: 403}));
  reflector.start();
  await settle();
  await clock.advance(1000);
  assert.equal(client.lists.length, 2);
});
