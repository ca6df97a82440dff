// What an observer reads of the kernel for its answers: the reading and the whole-node comparison
// it prepared stay valid until kube-proxy's rules or the desired model change. A periodic model
// rebuild that changed nothing must not make the next trace read and compare the whole node again
// (at 10,000 services that is seconds of iptables-save, parsing and diffing per trace).
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {createAgentRuntime} from '../../../src/agent/api/runtime.ts';
import {iptablesRulesBackend} from '../../../src/agent/api/rules/iptables.ts';
import {spelledAsSaved} from '../../../src/agent/api/rules/iptables-chains.ts';
import {watchedChanges} from '../api/watched-changes.ts';
import type {Host} from '../../../src/agent/host/host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {ObservingProxier} from '../../../src/agent/observe/observing-proxier.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {renderIptables} from '../../../src/core/iptables/render.ts';
import {RecordingHost} from '../recording-host.ts';
import {MemoryObjects, node, service, slice} from '../sync/cluster.ts';
import {everyListReceived, periodic, proxierOptions, requested} from '../sync/proxier-fixture.ts';

/** When the last whole-node drift check read the kernel, once there is one (status starts one when there is none). */
async function driftCheckedAt(runtime: {status(params: object): Promise<{drift: {checkedAt: string | null}}>}): Promise<string> {
  for (let tries = 0; tries < 200; tries++) {
    const {checkedAt} = (await runtime.status({})).drift;
    if (checkedAt !== null) return checkedAt;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error('no drift check within 2 s');
}

/** The host the observer reads through, counting its iptables-save readings. */
function countingSaves(node: RecordingHost): {host: Host; saves: () => number} {
  let saves = 0;
  const host = new Proxy(node, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (property !== 'iptablesSave') return typeof value === 'function' ? value.bind(target) : value;
      return (...args: Parameters<Host['iptablesSave']>) => {
        saves++;
        return target.iptablesSave(...args);
      };
    },
  }) as unknown as Host;
  return {host, saves: () => saves};
}

test('observer: traces reuse the reading and the comparison across rebuilds that change nothing; a change of either is compared again', async (t) => {
  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('db', '10.96.0.20')],
    slices: [slice('web-1', 'web', ['10.244.2.5', '10.244.2.6']), slice('db-1', 'db', ['10.244.2.7'])],
  });
  // kube-proxy's rules for these objects, as iptables-save prints them once loaded.
  const kubeProxyRules = spelledAsSaved(
    renderIptables(
      buildProxyModel(
        {services: objects.services(), endpointSlices: objects.endpointSlices(), node: node()},
        {family: 'IPv4', nodeName: 'node-1'},
      ),
      {includeJumps: true},
    ),
    'IPv4',
  );
  const kernel = new RecordingHost();
  await kernel.iptablesRestore('IPv4', kubeProxyRules, {noflush: false});
  const {host, saves} = countingSaves(kernel);

  const proxier = everyListReceived(new ObservingProxier(proxierOptions({objects})));
  t.after(() => proxier.stop());
  await proxier.syncRules(requested);
  const clock = {time: 1000};
  const changes = watchedChanges(clock);
  // Whole-node comparisons of the desired rules with a reading (and the service-filtered ones diff asks for).
  let diffs = 0;
  const observerBackend = iptablesRulesBackend({keepDesired: true});
  const runtime = createAgentRuntime({
    nodeName: 'node-1',
    version: 'test',
    families: ['IPv4'],
    proxier,
    host,
    backend: {...observerBackend, diff: (...args) => (diffs++, observerBackend.diff(...args))},
    changes,
    log: memoryLogger(),
    nodeAddresses: async () => ['10.240.0.11'],
    now: () => clock.time++,
  });
  t.after(() => runtime.close());

  const packet = {srcIP: '10.244.1.9', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'} as const;
  const first = await runtime.trace({packet, service: 'default/web'});
  assert.deepEqual([first.verdict, first.drifted], ['DNAT', false]);
  assert.equal(saves(), 1, 'the first trace reads the kernel');
  const checked = await driftCheckedAt(runtime);
  assert.equal(saves(), 1, 'the drift check compared the same reading');
  assert.equal(diffs, 1, 'trace and drift check share one comparison');

  // The periodic rebuild: nothing changed in the cluster, so neither the model nor the answers prepared from it.
  const modelBefore = proxier.appliedModels().get('IPv4');
  await proxier.syncRules(periodic);
  assert.equal(proxier.appliedModels().get('IPv4'), modelBefore, 'a rebuild that changed nothing keeps the model');
  const again = await runtime.trace({packet, service: 'default/web'});
  assert.deepEqual([again.verdict, again.drifted], ['DNAT', false]);
  await new Promise((resolve) => setTimeout(resolve, 20));
  const status = await runtime.status({});
  assert.equal(status.drift.checkedAt, checked, 'the drift check still stands');
  assert.equal(saves(), 1, 'the second trace reads nothing');
  assert.equal(diffs, 1, 'and compares nothing again');

  // A changed EndpointSlice: a new model, compared again with the same reading (kube-proxy's rules did not change).
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5']));
  await proxier.syncRules(requested);
  assert.notEqual(proxier.appliedModels().get('IPv4'), modelBefore);
  const stale = await runtime.trace({packet, service: 'default/web'});
  assert.equal(stale.drifted, true, 'kube-proxy still has the endpoint that left');
  assert.equal(saves(), 1, 'the kernel is not read again for a new model');
  assert.equal(diffs, 2, 'the new model is compared once');

  // The drift check after that sync (in the background) is done before kube-proxy's rules change.
  for (let tries = 0; (await runtime.status({})).drift.services.join() !== 'default/web:p'; tries++) {
    assert.ok(tries < 200, 'the drift check finds the endpoint that left');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.equal(saves(), 1);

  // A foreign change: the next trace reads the kernel.
  changes.foreignChange();
  await new Promise((resolve) => setTimeout(resolve, 5));
  await runtime.trace({packet, service: 'default/web'});
  assert.equal(saves(), 2, 'a foreign change makes the next trace read the kernel');
});
