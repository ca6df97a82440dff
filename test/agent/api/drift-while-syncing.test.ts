// The agent API's answers as syncs change the models. A whole-node diff asked for while a sync
// writes: its reading waits for the write and holds it, so it must be compared with the model that
// sync left, not the one before (otherwise every diff, and the drift check after each sync, that
// meets a write names the changed service as drifted). Status's counts follow the models, and
// status polled on a node whose rules cannot be read does not keep the agent reading them.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {createAgentRuntime} from '../../../src/agent/api/runtime.ts';
import {nftablesBackend} from '../../../src/agent/api/rules/nftables.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import type {RulesWriteListener} from '../../../src/agent/sync/types.ts';
import {buildProxyModel, type ProxyModel} from '../../../src/core/model/index.ts';
import {renderNftables} from '../../../src/core/nftables/render.ts';
import {RecordingHost} from '../recording-host.ts';
import {node, service, slice} from '../sync/cluster.ts';
import {watchedChanges} from './watched-changes.ts';

function modelWith(endpoint: string): ProxyModel {
  return buildProxyModel(
    {services: [service('web', '10.96.0.10')], endpointSlices: [slice('web-1', 'web', [endpoint])], node: node()},
    {family: 'IPv4', nodeName: 'node-1'},
  );
}

/**
 * The agent API over a proxier whose applied model is `model()` and whose kernel holds `kernel()`;
 * `listeners` hear of its writes, as the applied state does.
 */
function runtimeOver(
  t: {after(fn: () => void): void},
  parts: {
    model(): ProxyModel;
    kernel(): string;
    listeners?: Set<RulesWriteListener>;
    log?: ReturnType<typeof memoryLogger>;
    now?: () => number;
  },
) {
  const runtime = createAgentRuntime({
    nodeName: 'node-1',
    version: 'test',
    families: ['IPv4'],
    proxier: {
      appliedModels: () => new Map([['IPv4', parts.model()]]),
      status: () => ({initialized: true}),
      requestSync: () => {},
      onSync: () => () => {},
      onWrite: (listener) => (parts.listeners?.add(listener), () => parts.listeners?.delete(listener)),
      readApplied: async () => parts.kernel(),
    },
    host: new RecordingHost(),
    backend: nftablesBackend,
    changes: watchedChanges({time: 1000}),
    log: parts.log ?? memoryLogger(),
    now: parts.now,
  });
  t.after(() => runtime.close());
  return runtime;
}

test('agent API: a diff that waited for a sync compares the kernel with the model that sync left', async (t) => {
  let model = modelWith('10.244.2.5');
  let kernel = renderNftables(model);
  const listeners = new Set<RulesWriteListener>();
  const log = memoryLogger();
  const runtime = runtimeOver(t, {model: () => model, kernel: () => kernel, listeners, log});
  assert.equal((await runtime.diff({})).equal, true, 'the kernel holds the model');

  // A sync writes web's new endpoint; the diff asked for meanwhile waits for the write.
  for (const listener of listeners) listener.started('IPv4');
  const asked = runtime.diff({});
  await new Promise((resolve) => setTimeout(resolve, 10));
  // The write commits: the proxier's applied model is the new one before it tells of the end.
  model = modelWith('10.244.2.6');
  kernel = renderNftables(model);
  for (const listener of listeners) listener.ended('IPv4', undefined);
  const answer = await asked;
  assert.deepEqual([answer.equal, answer.text], [true, '']);
  assert.ok(!log.lines.some((line) => line.includes('differ from the desired')), 'no drift logged');
});

test("agent API: status counts the models' services and endpoints, again once a sync changes them", async (t) => {
  let model = modelWith('10.244.2.5');
  const runtime = runtimeOver(t, {model: () => model, kernel: () => renderNftables(model)});
  const counts = async () => {
    const status = await runtime.status({});
    return [status.services, status.endpoints];
  };
  assert.deepEqual(await counts(), [1, 1]);
  assert.deepEqual(await counts(), [1, 1], 'the same models, the same counts');
  model = buildProxyModel(
    {
      services: [service('web', '10.96.0.10'), service('db', '10.96.0.20')],
      endpointSlices: [slice('web-1', 'web', ['10.244.2.5', '10.244.2.6']), slice('db-1', 'db', ['10.244.2.7'])],
      node: node(),
    },
    {family: 'IPv4', nodeName: 'node-1'},
  );
  assert.deepEqual(await counts(), [2, 3], 'counted again for the new model');
});

test('agent API: status polled while the rules cannot be read starts a check only once each wait after a failure is over', async (t) => {
  const model = modelWith('10.244.2.5');
  let clock = 1_000_000;
  let reads = 0;
  let readable = false;
  const runtime = runtimeOver(t, {
    model: () => model,
    kernel: () => {
      reads++;
      if (!readable) throw new Error('nft list table ip kube-proxy: exit 1');
      return renderNftables(model);
    },
    now: () => clock,
  });
  // status answers at once and checks in the background.
  const poll = async (times = 1) => {
    for (let i = 0; i < times; i++) {
      await runtime.status({});
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  };
  await poll();
  assert.equal(reads, 1, 'the first status starts a check');
  await poll(20);
  assert.equal(reads, 1, 'none while the first wait (1 s) lasts');
  await assert.rejects(runtime.diff({}), /cannot read the rules on node node-1: nft list table/);
  assert.equal(reads, 2, 'a diff asked for reads at once all the same');
  clock += 1000;
  await poll(5);
  assert.equal(reads, 3, 'one once the wait is over');
  clock += 1999;
  await poll(5);
  assert.equal(reads, 3, 'the second wait is twice as long');
  clock += 1;
  readable = true;
  await poll();
  assert.equal(reads, 4);
  const status = await runtime.status({});
  assert.notEqual(status.drift.checkedAt, null, 'the check that could read the rules is the status');
  assert.deepEqual(status.drift.services, []);
  await poll(5);
  assert.equal(reads, 4, 'a current check is not redone');
});
