// The agent's WebSocket API under bad input, against the whole agent (rules in a fresh network
// namespace): every bad message gets a JSON-RPC error, the connection goes on, and the agent keeps
// answering others and keeps syncing rules. Root only.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import WebSocket from 'ws';
import {errorCodes} from '../../../src/protocol/jsonrpc.ts';
import {limits, protocolName} from '../../../src/protocol/version.ts';
import {inNetns, isRoot, startAgentCluster, until} from '../../plugin/agent-cluster.ts';

interface Answer {
  id?: number | string | null;
  result?: any;
  error?: {code: number; message: string; data?: any};
  method?: string;
}

class RawClient {
  readonly ws: WebSocket;
  readonly answers: Answer[] = [];
  private waiters: (() => void)[] = [];
  closed: {code: number} | undefined;

  private constructor(ws: WebSocket) {
    this.ws = ws;
    ws.on('message', (data) => {
      this.answers.push(JSON.parse(data.toString()));
      for (const wake of this.waiters.splice(0)) wake();
    });
    ws.on('close', (code) => {
      this.closed = {code};
      for (const wake of this.waiters.splice(0)) wake();
    });
    ws.on('error', () => {});
  }

  static open(url: string): Promise<RawClient> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, [protocolName]);
      ws.once('open', () => resolve(new RawClient(ws)));
      ws.once('error', reject);
    });
  }

  async next(count = 1, timeoutMs = 10_000): Promise<Answer[]> {
    const deadline = Date.now() + timeoutMs;
    while (this.answers.length < count) {
      if (this.closed) assert.fail(`connection closed (${this.closed.code}) after ${this.answers.length} of ${count} answers`);
      if (Date.now() > deadline) assert.fail(`${this.answers.length} of ${count} answers within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 100);
      });
    }
    return this.answers.splice(0, count);
  }

  async call(method: string, params?: unknown): Promise<Answer> {
    const id = Math.floor(Math.random() * 1e9);
    this.ws.send(JSON.stringify({jsonrpc: '2.0', id, method, ...(params === undefined ? {} : {params})}));
    const [answer] = await this.next();
    assert.equal(answer.id, id);
    return answer;
  }
}

test('agent API: bad input gets JSON-RPC errors; the connection, the agent and other clients go on', async (t) => {
  if (!isRoot) {
    t.skip('needs root: the agent writes rules in a fresh network namespace');
    return;
  }
  const cluster = await startAgentCluster(t);
  const client = await RawClient.open(cluster.agentUrl);
  t.after(() => client.ws.terminate());

  client.ws.send('this is not JSON {');
  let [answer] = await client.next();
  assert.equal(answer.error?.code, errorCodes.parseError);
  assert.equal(answer.id, null);

  client.ws.send(JSON.stringify([{jsonrpc: '2.0', id: 1, method: 'status'}]));
  [answer] = await client.next();
  assert.equal(answer.error?.code, errorCodes.invalidRequest);

  answer = await client.call('rules.everything');
  assert.equal(answer.error?.code, errorCodes.methodNotFound);
  assert.match(answer.error!.message, /method not found: "rules.everything" \(methods: status, /);

  answer = await client.call('trace', {
    packet: {srcIP: '10.244.1.9', dstIP: cluster.webClusterIP, dstPort: 70000, protocol: 'TCP', origin: 'arriving'},
  });
  assert.equal(answer.error?.code, errorCodes.invalidParams);
  assert.equal(answer.error?.data?.field, 'packet.dstPort');

  answer = await client.call('probe', {target: {ip: cluster.webClusterIP, port: 80, protocol: 'TCP'}, count: 1, extra: true});
  assert.equal(answer.error?.code, errorCodes.invalidParams);
  assert.match(answer.error!.message, /params\.extra: unknown field/);

  // Params above the protocol's limit, in a message the WebSocket still accepts.
  answer = await client.call('diff', {service: 'x'.repeat(limits.maxParamsBytes + 10)});
  assert.equal(answer.error?.code, errorCodes.invalidParams);
  assert.match(answer.error!.message, /at most 16384 bytes/);

  // 1,000 unknown calls at once: each is answered with an error, none goes unanswered.
  for (let i = 0; i < 1000; i++) client.ws.send(JSON.stringify({jsonrpc: '2.0', id: `u${i}`, method: `nothing.${i}`}));
  const burst = await client.next(1000, 30_000);
  assert.equal(new Set(burst.map((a) => a.id)).size, 1000);
  const unexpected = burst.filter((a) => a.error?.code !== errorCodes.methodNotFound && a.error?.code !== errorCodes.tooManyRequests);
  assert.deepEqual(unexpected, []);

  // After all that, the same connection still answers.
  answer = await client.call('status');
  assert.equal(answer.result?.node, 'node-1');
  assert.equal(answer.result?.ready, true, JSON.stringify(answer));

  // A frame above maxPayload closes that connection (1009) and no other.
  const huge = await RawClient.open(cluster.agentUrl);
  huge.ws.send(JSON.stringify({jsonrpc: '2.0', id: 1, method: 'status', params: {pad: 'x'.repeat(limits.maxPayloadBytes + 1)}}));
  await until('the oversized connection to close', () => huge.closed !== undefined);
  assert.equal(huge.closed!.code, 1009);
  answer = await client.call('status');
  assert.equal(answer.result?.node, 'node-1');

  // A client that asks for a lot and never reads: the agent answers others meanwhile.
  const slow = await RawClient.open(cluster.agentUrl);
  for (let i = 0; i < 16; i++) slow.ws.send(JSON.stringify({jsonrpc: '2.0', id: i, method: 'rules.applied'}));
  (slow.ws as unknown as {_socket: {pause(): void}})._socket.pause();
  answer = await client.call('rules.applied');
  assert.match(answer.result?.text, /default\/web:http/);

  // And the agent still does its job: a new service becomes rules.
  cluster.server.store.create(
    'services',
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'late', namespace: 'default'},
      spec: {selector: {app: 'late'}, ports: [{port: 81, protocol: 'TCP'}]},
    },
    'default',
  );
  await until('rules for the late service', () => inNetns(cluster.netns, ['iptables-save']).includes('default/late'));
  slow.ws.terminate();
  huge.ws.terminate();
});

test('agent API: sync waits for the sync it asked for and streams events to subscribers', async (t) => {
  if (!isRoot) {
    t.skip('needs root: the agent writes rules in a fresh network namespace');
    return;
  }
  const cluster = await startAgentCluster(t);
  const client = await RawClient.open(cluster.agentUrl);
  t.after(() => client.ws.terminate());
  const subscribed = await client.call('events.subscribe');
  assert.deepEqual(subscribed.result, {events: ['events.sync']});

  const id = 7;
  client.ws.send(JSON.stringify({jsonrpc: '2.0', id, method: 'sync', params: {full: true}}));
  // Events of syncs that were already under way may come first; the answer is the sync asked for.
  const messages: Answer[] = [];
  while (!messages.some((m) => m.id === id)) messages.push(...(await client.next()));
  const reply = messages.find((m) => m.id === id)!;
  // Subscribers hear of the sync before the caller gets its answer.
  const event = messages.filter((m) => m.method === 'events.sync').at(-1)!;
  assert.ok(event, 'an events.sync notification came with the sync');
  assert.equal(reply.result.kind, 'full');
  assert.ok(reply.result.rules.nat > 0, 'the kernel holds nat rules after the sync');
  assert.equal((event as any).params.ok, true);
  assert.equal((event as any).params.kind, 'full');

  const status = await client.call('status');
  assert.equal(status.result.lastSync.kind, 'full');
  assert.equal(status.result.services >= 2, true);
  assert.deepEqual(status.result.drift.services, []);
});
