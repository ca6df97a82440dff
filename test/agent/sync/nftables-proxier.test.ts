// The nftables proxier against a real kernel: a fresh network namespace, nft through CommandHost;
// checked with `nft -j list table` inside the namespace. Root only.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {AppliedState} from '../../../src/agent/applied/applied-state.ts';
import {watchNftRuleset} from '../../../src/agent/applied/ruleset-changes.ts';
import {nftablesRulesBackend} from '../../../src/agent/api/rules/nftables.ts';
import {CommandHost} from '../../../src/agent/host/command-host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {NftablesProxier} from '../../../src/agent/sync/nftables-proxier.ts';
import {type NftRuleset, parseNftablesJson, ruleText} from '../../../src/core/nftables/parse.ts';
import {createNetns, inNetns, isRoot} from '../netns.ts';
import {MemoryObjects, service, slice} from './cluster.ts';
import {everyListReceived, periodic, proxierOptions, requested} from './proxier-fixture.ts';

function endpointsOf(netns: string): string[] {
  const table = parseNftablesJson(inNetns(netns, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy']));
  return [...table.sets.values()]
    .filter((set) => set.name.startsWith('endpoint-targets-'))
    .flatMap((set) => set.elements.map((element) => element.value!))
    .sort();
}

test('nftables proxier: full then partial syncs, stale chains deleted later, drift and failures repaired, iptables mode cleaned up', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs nft in it');
    return;
  }
  const netns = createNetns(t);
  // Leftovers of iptables mode, and a foreign chain that must stay.
  inNetns(netns, ['iptables', '-t', 'nat', '-N', 'KUBE-SERVICES']);
  inNetns(netns, [
    'iptables',
    '-t',
    'nat',
    '-A',
    'PREROUTING',
    '-m',
    'comment',
    '--comment',
    'kubernetes service portals',
    '-j',
    'KUBE-SERVICES',
  ]);
  inNetns(netns, ['iptables', '-t', 'nat', '-N', 'DOCKER']);

  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('dns', '10.96.0.53', {protocol: 'UDP', port: 53})],
    slices: [slice('web-1', 'web', ['10.244.2.5']), slice('dns-1', 'dns', ['10.244.2.3'], {protocol: 'UDP'})],
  });
  let now = 1_000_000;
  const host = new CommandHost({netns});
  const options = proxierOptions({
    host,
    objects,
    clock: {
      now: () => now,
      setTimer: (callback: () => void, ms: number) => setTimeout(callback, ms),
      clearTimer: (timer: unknown) => clearTimeout(timer as NodeJS.Timeout),
    },
  });
  const {metrics} = options;
  const proxier = everyListReceived(new NftablesProxier(options));
  await proxier.start();
  t.after(() => proxier.stop());
  // What the agent API's applied state hears: each transaction, and each listing the drift check takes.
  const heard: string[] = [];
  proxier.onWrite({
    started: () => heard.push('started'),
    ended: (_family, written) => heard.push(`ended ${written?.kind ?? 'unknown'}`),
    reading: (_family, text) =>
      heard.push(
        `reading ${JSON.parse(text).nftables.some((entry: {map?: {name: string}}) => entry.map?.name === 'service-ips') ? 'of the table' : 'of nothing'}`,
      ),
  });

  const nat = inNetns(netns, ['iptables-save', '-t', 'nat']);
  assert.ok(!nat.includes('KUBE-SERVICES'), 'iptables mode rules removed at start');
  assert.match(nat, /:DOCKER/, 'foreign chains stay');

  const [first] = await proxier.syncRules(requested);
  assert.equal(first.kind, 'full');
  assert.deepEqual(endpointsOf(netns), ['10.244.2.3 . 8080', '10.244.2.5 . 8080']);
  // (The runner's own first sync may run beside this one.)
  assert.deepEqual([...new Set(heard.splice(0))], ['started', 'ended unknown'], 'a full sync lists nothing');

  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.6']));
  const [partial] = await proxier.syncRules(requested);
  assert.deepEqual([partial.kind, partial.changedServicePorts], ['partial', 1]);
  assert.deepEqual(endpointsOf(netns), ['10.244.2.3 . 8080', '10.244.2.6 . 8080']);

  // dns goes away: its chain is flushed now and deleted by a sync a second later.
  objects.servicesByName.delete('dns');
  await proxier.syncRules(requested);
  const dnsChain = () =>
    inNetns(netns, ['nft', 'list', 'chains', 'ip'])
      .split('\n')
      .find((line) => line.includes('default/dns/'));
  assert.ok(dnsChain(), 'flushed, still there');
  now += 2_000;
  const [unchanged] = await proxier.syncRules(requested);
  assert.equal(unchanged.kind, 'unchanged');
  assert.equal(dnsChain(), undefined, 'deleted once stale for a second');

  // Someone deletes the service map's elements; the next periodic sync sees it and rewrites.
  inNetns(netns, ['nft', 'flush', 'map', 'ip', 'kube-proxy', 'service-ips']);
  const [repaired] = await proxier.syncRules(periodic);
  assert.deepEqual([repaired.kind, repaired.drift], ['full', true]);
  assert.deepEqual(heard.slice(-3), ['reading of the table', 'started', 'ended unknown'], "the drift check's listing, then the repair");
  const toldBefore = heard.length;
  assert.equal(
    JSON.stringify(JSON.parse(await proxier.readApplied('IPv4'))),
    JSON.stringify(JSON.parse(inNetns(netns, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy']))),
  );
  assert.equal(heard.length, toldBefore, "a listing asked for is the caller's, not told");
  assert.match(inNetns(netns, ['nft', 'list', 'map', 'ip', 'kube-proxy', 'service-ips']), /10\.96\.0\.10 \. tcp \. 80 : goto service-/);
  assert.match(await metrics.registry.metrics(), /proxyctl_drift_repairs_total\{ip_family="IPv4"\} 1/);

  // A failed transaction (the table vanished under a partial sync) is followed by a full one.
  inNetns(netns, ['nft', 'delete', 'table', 'ip', 'kube-proxy']);
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.7']));
  await assert.rejects(proxier.syncRules(requested), /IPv4 partial sync/);
  const [recovered] = await proxier.syncRules(requested);
  assert.equal(recovered.kind, 'full');
  assert.deepEqual(endpointsOf(netns), ['10.244.2.7 . 8080']);
});

test("nftables proxier, kube-proxy's layout: a chain per endpoint, partial syncs, no false drift, drift repaired", async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs nft in it');
    return;
  }
  const netns = createNetns(t);
  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10')],
    slices: [slice('web-1', 'web', ['10.244.2.5', '10.244.2.6'])],
  });
  let now = 1_000_000;
  const options = proxierOptions({
    host: new CommandHost({netns}),
    objects,
    model: {nodeName: 'node-1', config: {nftablesLayout: 'kube-proxy' as const}},
    clock: {
      now: () => now,
      setTimer: (callback: () => void, ms: number) => setTimeout(callback, ms),
      clearTimer: (timer: unknown) => clearTimeout(timer as NodeJS.Timeout),
    },
  });
  const proxier = everyListReceived(new NftablesProxier(options));
  await proxier.start();
  t.after(() => proxier.stop());
  const table = () => parseNftablesJson(inNetns(netns, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy']));
  const endpointChains = () =>
    [...table().chains.values()]
      .filter((chain) => chain.name.startsWith('endpoint-') && chain.rules.length > 0)
      .map((chain) => ruleText(chain.rules.find((rule) => ruleText(rule).includes('dnat'))!))
      .sort();

  const [first] = await proxier.syncRules(requested);
  assert.equal(first.kind, 'full');
  const listed = table();
  assert.ok(listed.chains.has('filter-prerouting-pre-dnat') && !listed.chains.has('filter-prerouting'), "kube-proxy's base chains");
  assert.ok(![...listed.sets.keys()].some((name) => name.startsWith('endpoint-targets-')), 'no shared endpoint maps');
  assert.deepEqual(endpointChains(), ['meta l4proto tcp dnat to 10.244.2.5:8080', 'meta l4proto tcp dnat to 10.244.2.6:8080']);
  const serviceChain = [...listed.chains.values()].find((chain) => chain.name.startsWith('service-') && chain.name.includes('/'))!;
  assert.match(
    ruleText(serviceChain.rules.at(-1)!),
    /^numgen random mod 2 vmap \{ 0 : goto endpoint-\S+__10\.244\.2\.5\/8080, 1 : goto endpoint-\S+__10\.244\.2\.6\/8080 \}$/,
  );

  // An endpoint replaced: a partial sync; the old endpoint chain is flushed, deleted a second later.
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5', '10.244.2.7']));
  const [partial] = await proxier.syncRules(requested);
  assert.deepEqual([partial.kind, partial.changedServicePorts], ['partial', 1]);
  assert.deepEqual(endpointChains(), ['meta l4proto tcp dnat to 10.244.2.5:8080', 'meta l4proto tcp dnat to 10.244.2.7:8080']);
  assert.ok(table().chains.has([...table().chains.keys()].find((name) => name.endsWith('__10.244.2.6/8080'))!), 'flushed, still there');
  now += 2_000;
  await proxier.syncRules(requested);
  assert.ok(![...table().chains.keys()].some((name) => name.endsWith('__10.244.2.6/8080')), 'deleted once stale for a second');

  // The kernel's listing of kube-proxy's layout is what the proxier wrote: a periodic check finds no drift.
  const [checked] = await proxier.syncRules(periodic);
  assert.deepEqual([checked.kind, checked.drift], ['unchanged', false]);

  // A rule removed from an endpoint chain is drift: rewritten by the next periodic sync.
  const chain = [...table().chains.keys()].find((name) => name.endsWith('__10.244.2.7/8080'))!;
  inNetns(netns, ['nft', 'flush', 'chain', 'ip', 'kube-proxy', chain]);
  const [repaired] = await proxier.syncRules(periodic);
  assert.deepEqual([repaired.kind, repaired.drift], ['full', true]);
  assert.deepEqual(endpointChains(), ['meta l4proto tcp dnat to 10.244.2.5:8080', 'meta l4proto tcp dnat to 10.244.2.7:8080']);
});

test("nftables proxier with the API's applied state: the drift check reads the table only after someone else changed the ruleset, and shares the reading with requests", async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs nft and nft monitor in it');
    return;
  }
  const netns = createNetns(t);
  const objects = new MemoryObjects({services: [service('web', '10.96.0.10')], slices: [slice('web-1', 'web', ['10.244.2.5'])]});
  const host = new CommandHost({netns});
  const options = proxierOptions({host, objects});
  const proxier = everyListReceived(new NftablesProxier(options));
  const changes = await watchNftRuleset({netns, log: memoryLogger()});
  // Every listing of the table: the drift check reads it through the applied state, as requests do.
  const readings: string[] = [];
  const applied = new AppliedState({
    read: (family) => (readings.push('reading'), proxier.readApplied(family)),
    parse: (text) => nftablesRulesBackend().parse(text),
    changes,
    now: Date.now,
    spawns: host.onSpawn.bind(host),
  });
  t.after(() => applied.close());
  proxier.onWrite(applied);
  assert.ok(await changes.settled(10_000), 'nft monitor listens');
  await proxier.start();
  t.after(() => proxier.stop());

  const [first] = await proxier.syncRules(requested);
  assert.equal(first.kind, 'full');
  // Only the proxier's own transactions since it recreated the table: nothing to read.
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.6']));
  assert.equal((await proxier.syncRules(requested))[0].kind, 'partial');
  const [quiet] = await proxier.syncRules(periodic);
  assert.deepEqual([quiet.kind, quiet.drift, readings.length], ['unchanged', false, 0], 'no listing taken');

  // Someone else's transaction, even one that changes nothing of the proxy's: the next check reads.
  inNetns(netns, ['nft', 'add', 'table', 'inet', 'someone-else']);
  const [checked] = await proxier.syncRules(periodic);
  assert.deepEqual([checked.kind, checked.drift, readings.length], ['unchanged', false, 1], 'read once, no drift');
  const [quietAgain] = await proxier.syncRules(periodic);
  assert.deepEqual([quietAgain.drift, readings.length], [false, 1], 'the table as read, and nobody touched it since');

  // A foreign change to the proxy's table is read and repaired.
  inNetns(netns, ['nft', 'flush', 'map', 'ip', 'kube-proxy', 'service-ips']);
  const [repaired] = await proxier.syncRules(periodic);
  assert.deepEqual([repaired.kind, repaired.drift, readings.length], ['full', true, 2]);
  assert.match(inNetns(netns, ['nft', 'list', 'map', 'ip', 'kube-proxy', 'service-ips']), /10\.96\.0\.10 \. tcp \. 80 : goto service-/);
  const [afterRepair] = await proxier.syncRules(periodic);
  assert.deepEqual([afterRepair.drift, readings.length], [false, 2], 'the repair recreated the table: nothing to read');

  // A request that comes while the drift check reads shares its reading (and its parse).
  inNetns(netns, ['nft', 'delete', 'table', 'inet', 'someone-else']);
  const [request, [shared]] = await Promise.all([applied.get('IPv4'), proxier.syncRules(periodic)]);
  assert.deepEqual([shared.drift, readings.length], [false, 3], 'one reading for both');
  assert.ok((request.rules as NftRuleset).sets.has('service-ips'));
});
