// The iptables proxier against a recording host: when it syncs fully or partially, what it writes,
// how it recovers from failures and repairs drift, and what it tells conntrack, health and metrics.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {ProxierHealth} from '../../../src/agent/health/proxier-health.ts';
import {createAgentMetrics} from '../../../src/agent/health/metrics.ts';
import type {ServiceHealthTarget} from '../../../src/agent/health/service-health.ts';
import {savedTables} from '../../../src/agent/host/host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {coreIptablesRules} from '../../../src/agent/sync/iptables-rules.ts';
import {backgroundReadingMs, fullSyncPeriod, IptablesProxier} from '../../../src/agent/sync/proxier.ts';
import {FakeClock} from '../fake-clock.ts';
import {RecordingHost} from '../recording-host.ts';
import {MemoryObjects, service, slice} from './cluster.ts';
import {FakeRules, serviceChain} from './fake-rules.ts';
import {everyListReceived, periodic, proxierOptions, requested} from './proxier-fixture.ts';

const clusterModel = {nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16'], config: {}};

function setup(
  objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('api', '10.96.0.1')],
    slices: [slice('web-1', 'web', ['10.244.2.5']), slice('api-1', 'api', ['10.244.2.9'])],
  }),
  parts: {clock?: FakeClock; host?: RecordingHost} = {},
) {
  const clock = parts.clock ?? new FakeClock();
  const host = parts.host ?? new RecordingHost();
  const rules = new FakeRules();
  const metrics = createAgentMetrics();
  const health = new ProxierHealth(60_000, clock);
  const log = memoryLogger(2);
  const healthTargets: ServiceHealthTarget[][] = [];
  const proxier = everyListReceived(
    new IptablesProxier(
      proxierOptions({
        host,
        rules,
        objects,
        model: clusterModel,
        minSyncPeriod: 1_000,
        metrics,
        health,
        log,
        clock,
        serviceHealth: {sync: async (targets: ServiceHealthTarget[]) => void healthTargets.push(targets)},
      }),
    ),
  );
  return {clock, host, rules, metrics, health, log, proxier, objects, healthTargets};
}

/** A proxier writing core/iptables' real rules into a recording host, every initial list received. */
async function coreRulesProxier(objects: MemoryObjects, clock = new FakeClock()) {
  const host = new RecordingHost();
  const log = memoryLogger(2);
  const proxier = everyListReceived(
    new IptablesProxier(proxierOptions({host, rules: coreIptablesRules(), objects, model: clusterModel, minSyncPeriod: 1_000, log, clock})),
  );
  return {host, log, proxier, clock};
}

async function metricValue(
  metrics: ReturnType<typeof createAgentMetrics>,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  for (const metric of await metrics.registry.getMetricsAsJSON()) {
    for (const value of metric.values as Array<{metricName?: string; labels: Record<string, unknown>; value: number}>) {
      if ((value.metricName ?? metric.name) !== name) continue;
      if (Object.entries(labels).every(([key, wanted]) => String(value.labels[key]) === wanted)) return Number(value.value);
    }
  }
  return 0;
}

test('nothing is written before services, endpoint slices and the node are listed', async () => {
  const host = new RecordingHost();
  const proxier = new IptablesProxier(proxierOptions({host, rules: new FakeRules(), objects: new MemoryObjects(), minSyncPeriod: 1_000}));
  proxier.markSynced('Service');
  proxier.markSynced('EndpointSlice');
  assert.deepEqual(await proxier.syncRules(requested), []);
  assert.equal(host.restores.length, 0);
});

test('the first sync is full: one restore with --noflush that also adds the jump rules', async () => {
  const {host, proxier, metrics, rules} = setup();
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'full');
  assert.equal(host.restores.length, 1);
  assert.equal(host.restores[0].options.noflush, true, 'never flush tables that hold other rules');
  assert.equal(rules.renders[0].changedServicePorts, undefined);
  const save = await host.iptablesSave('IPv4', 'nat');
  assert.match(save, /-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/);
  assert.match(save, /-A KUBE-SERVICES -d 10.96.0.10\/32 .* -j KUBE-SVC-/);
  assert.match(save, /--to-destination 10.244.2.5:8080/);
  const input = host.restores[0].rules;
  const jumpAt = input.indexOf('-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES');
  assert.ok(jumpAt > input.indexOf('-A KUBE-SERVICES'), 'jumps are added in the same write, once the chains they lead to are filled');
  assert.ok(!host.calls.some((call) => call.startsWith('iptables -')), 'no command per jump rule');
  assert.equal(
    await metricValue(metrics, 'kubeproxy_sync_proxy_rules_iptables_total', {table: 'nat'}),
    6,
    '2 jumps + 2 service rules + 2 DNAT rules',
  );
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_full_proxy_rules_duration_seconds_count'), 1);
  proxier.requestSync({full: true});
  await proxier.syncRules(requested);
  assert.doesNotMatch(host.restores.at(-1)!.rules, /-I PREROUTING/, 'a jump rule in place is not added again');
  assert.equal((await host.iptablesSave('IPv4', 'nat')).match(/-A PREROUTING .*-j KUBE-SERVICES/g)?.length, 1);
});

test('on iptables-nft a full sync makes iptables read the whole nat table (a chain-less -Z first); a partial one does not', async () => {
  const {host, proxier, objects} = setup();
  await proxier.start();
  await proxier.syncRules(requested);
  assert.match(host.restores[0].rules, /^\*nat\n-Z\n:KUBE-SERVICES /m);
  assert.equal(host.restores[0].rules.match(/^-Z$/gm)?.length, 1, 'only in nat, once');
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.6']));
  proxier.onChange('EndpointSlice', objects.slicesByName.get('web-1'));
  await proxier.syncRules(requested);
  assert.doesNotMatch(host.restores[1].rules, /^-Z$/m);
  await proxier.stop();
});

test('on iptables-nft a partial sync after a burst (over 1,000 chains named) reads the whole nat table too', async () => {
  const {host, proxier, objects} = setup();
  await proxier.start();
  await proxier.syncRules(requested);
  for (let i = 0; i < 1100; i++) {
    const name = `burst-${i}`;
    objects.servicesByName.set(name, service(name, `10.96.${10 + (i >> 8)}.${i & 255}`));
    objects.slicesByName.set(`${name}-1`, slice(`${name}-1`, name, [`10.244.3.${1 + (i % 250)}`]));
    proxier.onChange('Service', objects.servicesByName.get(name));
  }
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'partial');
  assert.ok(host.restores[1].rules.includes(`:${serviceChain('default/burst-1099:p/TCP')} `));
  assert.match(host.restores[1].rules, /^\*nat\n-Z\n/m, 'the chain list would cost more than reading the whole table');
  assert.match(await host.iptablesSave('IPv4', 'nat'), new RegExp(serviceChain('default/burst-1099:p/TCP')), 'the burst is applied');
  await proxier.stop();
});

test('an endpoint change is a partial sync of that service port only', async () => {
  const {host, proxier, objects, rules, metrics} = setup();
  await proxier.syncRules(requested);
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.6']));
  proxier.onChange('EndpointSlice', objects.slicesByName.get('web-1'));
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'partial');
  assert.deepEqual([...rules.renders[1].changedServicePorts!], ['default/web:p/TCP']);
  assert.equal(
    rules.renders[1].previous?.servicePorts.find((port) => port.serviceName === 'web')?.clusterEndpoints[0].ip,
    '10.244.2.5',
    'the renderer is told what the kernel holds, to leave unchanged fixed chains alone',
  );
  assert.ok(
    !host.calls.slice(host.calls.lastIndexOf('iptables-restore IPv4 --noflush')).some((call) => call.startsWith('iptables-save')),
    'what a partial write left is known from its input, not read back',
  );
  const input = host.restores[1].rules;
  assert.ok(input.includes(`:${serviceChain('default/web:p/TCP')} `));
  assert.ok(!input.includes(`:${serviceChain('default/api:p/TCP')} `), 'the unchanged chain is not rewritten');
  assert.match(await host.iptablesSave('IPv4', 'nat'), /--to-destination 10.244.2.6:8080/);
  assert.ok(
    !host.calls.slice(host.calls.lastIndexOf('iptables-restore IPv4 --noflush')).some((call) => call.startsWith('iptables -C')),
    'jump rules are checked on full syncs',
  );
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_partial_proxy_rules_duration_seconds_count'), 1);
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_proxy_rules_endpoint_changes_total'), 1);
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_proxy_rules_endpoint_changes_pending'), 0);
});

test('a sync with nothing changed writes nothing', async () => {
  const {host, proxier} = setup();
  await proxier.syncRules(requested);
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'unchanged');
  assert.equal(host.restores.length, 1);
});

test('a deleted service loses its chain in the next (partial) sync', async () => {
  const {host, proxier, objects} = setup();
  await proxier.syncRules(requested);
  objects.servicesByName.delete('api');
  proxier.onChange('Service', undefined);
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'partial');
  const save = await host.iptablesSave('IPv4', 'nat');
  assert.ok(!save.includes(serviceChain('default/api:p/TCP')));
  assert.ok(save.includes(serviceChain('default/web:p/TCP')));
});

test('a failed restore is counted, reported, and followed by a full sync', async () => {
  const {host, proxier, objects, metrics} = setup();
  await proxier.syncRules(requested);
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.7']));
  proxier.onChange('EndpointSlice', objects.slicesByName.get('web-1'));
  host.failRestores.push('iptables-restore: line 3 failed');
  await assert.rejects(
    proxier.syncRules(requested),
    /IPv4 partial sync: iptables-restore -w 5 --noflush: exit 1: iptables-restore: line 3 failed/,
  );
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total'), 1);
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total'), 1);
  const [retry] = await proxier.syncRules({requested: false, periodic: false, retry: true});
  assert.equal(retry.kind, 'full');
  assert.match(await host.iptablesSave('IPv4', 'nat'), /--to-destination 10.244.2.7:8080/);
});

test('health: a queued change that cannot be applied for 2 x syncPeriod makes the proxy unhealthy', async () => {
  const {host, proxier, objects, health, clock} = setup();
  await proxier.syncRules(requested);
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.8']));
  proxier.onChange('EndpointSlice', objects.slicesByName.get('web-1'));
  host.failRestores.push('locked', 'locked');
  await assert.rejects(proxier.syncRules(requested));
  await clock.advance(61_000);
  await assert.rejects(proxier.syncRules(requested));
  assert.equal(health.state().healthy, false);
  await proxier.syncRules(requested);
  assert.equal(health.state().healthy, true);
});

test('drift: a periodic sync finds a deleted jump rule and rewrites everything', async () => {
  const {host, proxier, metrics, log} = setup();
  await proxier.syncRules(requested);
  host.tamper('IPv4', 'nat', '-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES');
  const [result] = await proxier.syncRules(periodic);
  assert.equal(result.drift, true);
  assert.equal(result.kind, 'full');
  assert.match(await host.iptablesSave('IPv4', 'nat'), /-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/);
  assert.equal(await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 1);
  assert.ok(log.lines.some((line) => line.includes('rules changed behind our back') && line.includes('rule missing: -A PREROUTING')));
});

test('drift under steady churn: the next partial write sees a tampered chain it did not touch, and a full sync repairs it', async () => {
  const {host, proxier, objects, clock, metrics} = setup();
  await proxier.syncRules(requested);
  const webChain = serviceChain('default/web:p/TCP');
  host.tamper('IPv4', 'nat', `-F ${webChain}`);
  // api's endpoints change every few seconds: every sync is a requested partial one, none periodic.
  for (let step = 1; step <= 12; step++) {
    await clock.advance(3000);
    objects.slicesByName.set('api-1', slice('api-1', 'api', [`10.244.3.${step}`]));
    proxier.onChange('EndpointSlice', objects.slicesByName.get('api-1'));
    const [result] = await proxier.syncRules(requested);
    if (result.drift) break;
  }
  assert.equal(
    await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}),
    1,
    'found within syncPeriod (30 s) of churn',
  );
  const [repair] = await proxier.syncRules(requested);
  assert.equal(repair.kind, 'full');
  assert.match(await host.iptablesSave('IPv4', 'nat'), new RegExp(`-A ${webChain} .*--to-destination 10.244.2.5:8080`), 'and repaired');
});

test('a full write is not read back; the next reading records each service chain rule by rule, so an edited rule is drift', async () => {
  const {host, proxier, clock, metrics} = setup();
  await proxier.syncRules(requested);
  assert.ok(
    !host.calls.slice(host.calls.lastIndexOf('iptables-restore IPv4 --noflush')).some((call) => call.startsWith('iptables-save')),
    'what a full write left is known from its input',
  );
  await clock.advance(30_000);
  assert.equal((await proxier.syncRules(periodic))[0].drift, false, 'the kernel holds what the input said, jump rules included');
  const webChain = serviceChain('default/web:p/TCP');
  const rule = (await host.iptablesSave('IPv4', 'nat')).split('\n').find((line) => line.startsWith(`-A ${webChain} `))!;
  host.tamper('IPv4', 'nat', `-F ${webChain}`);
  host.tamper('IPv4', 'nat', rule.replace('10.244.2.5:8080', '10.244.9.9:8080'));
  await clock.advance(30_000);
  const [result] = await proxier.syncRules(periodic);
  assert.equal(result.drift, true, 'same rule count, another destination');
  assert.equal(result.kind, 'full');
  assert.match(await host.iptablesSave('IPv4', 'nat'), new RegExp(`-A ${webChain} .*--to-destination 10.244.2.5:8080`));
  assert.equal(await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 1);
});

test('listeners hear of each write and of each reading the drift check takes, with the text it read; readApplied reads for its caller alone', async () => {
  const {host, proxier, clock} = setup();
  const heard: string[] = [];
  const readings: {text: string; startedAt: number}[] = [];
  proxier.onWrite({
    started: () => heard.push('started'),
    ended: (_family, written) => heard.push(`ended ${written?.kind ?? 'unknown'}`),
    reading: (_family, text, startedAt) => {
      heard.push('reading');
      readings.push({text, startedAt});
    },
  });
  await proxier.syncRules(requested);
  // The reading before the first full write, then the write, known from its input but not as text.
  assert.deepEqual(heard, ['reading', 'started', 'ended unknown']);
  await clock.advance(30_000);
  const checkStartedAt = clock.now();
  assert.equal((await proxier.syncRules(periodic))[0].drift, false);
  assert.deepEqual(heard.slice(3), ['reading'], "the drift check's reading");
  assert.equal(readings[1].startedAt, checkStartedAt);
  assert.equal(
    readings[1].text,
    savedTables(await host.iptablesSave('IPv4'), ['filter', 'nat']),
    'filter, then nat, as iptables-save prints them',
  );
  assert.match(readings[1].text, /^-A KUBE-SERVICES -d 10\.96\.0\.10\/32 /m);
  assert.equal(await proxier.readApplied('IPv4'), readings[1].text);
  assert.deepEqual(heard.slice(4), [], "a reading asked for is the caller's, not told again");
});

test('with the real renderer too, a full write is known from its input, jump rules included, and not read back', async () => {
  const {host, proxier} = await coreRulesProxier(
    new MemoryObjects({
      services: [service('web', '10.96.0.10', {type: 'NodePort', nodePort: 30080})],
      slices: [slice('web-1', 'web', ['10.244.2.5'])],
    }),
  );
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'full');
  assert.match(host.restores[0].rules, /^-I PREROUTING .*-j KUBE-SERVICES$/m, 'the jump rules are in the write');
  assert.ok(!host.calls.slice(host.calls.lastIndexOf('iptables-restore IPv4 --noflush')).some((call) => call.startsWith('iptables-save')));
});

test('drift: changes that alter no rule still get a drift check once per syncPeriod', async () => {
  const {host, proxier, clock, metrics} = setup();
  await proxier.syncRules(requested);
  host.tamper('IPv4', 'nat', `-F ${serviceChain('default/web:p/TCP')}`);
  await clock.advance(10_000);
  assert.equal((await proxier.syncRules(requested))[0].drift, false, 'not due yet, and nothing to write');
  await clock.advance(25_000);
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.drift, true);
  assert.equal(result.kind, 'full');
  assert.equal(await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 1);
});

test('drift: a rule slipped into KUBE-SERVICES is removed', async () => {
  const {host, proxier} = setup();
  await proxier.syncRules(requested);
  host.tamper('IPv4', 'nat', '-I KUBE-SERVICES -s 10.0.0.0/8 -j ACCEPT');
  const [result] = await proxier.syncRules(periodic);
  assert.equal(result.drift, true);
  assert.ok(!(await host.iptablesSave('IPv4', 'nat')).includes('-s 10.0.0.0/8 -j ACCEPT'));
});

/**
 * SlowReadingHost: iptables-save takes `readingMs` on the fake clock, as at 10,000 services (or
 * what `readingMs` tells from the output), and can be held until the test lets it answer; it
 * answers with the tables as they were when called.
 */
class SlowReadingHost extends RecordingHost {
  readonly #clock: FakeClock;
  readonly #readingMs: number | ((output: string) => number);
  #held: Promise<void> | undefined;
  #release: (() => void) | undefined;

  constructor(clock: FakeClock, readingMs: number | ((output: string) => number)) {
    super();
    this.#clock = clock;
    this.#readingMs = readingMs;
  }

  hold(): void {
    this.#held = new Promise((resolve) => (this.#release = resolve));
  }

  release(): void {
    this.#release?.();
    this.#held = undefined;
  }

  /** Readings still to fail. */
  failingReadings = 0;

  override async iptablesSave(family: 'IPv4' | 'IPv6', table?: 'filter' | 'nat'): Promise<string> {
    if (this.failingReadings > 0) {
      this.failingReadings--;
      throw new Error('iptables-save: exit 4: Another app is currently holding the xtables lock');
    }
    const text = await super.iptablesSave(family, table);
    await this.#held;
    await this.#clock.advance(typeof this.#readingMs === 'number' ? this.#readingMs : this.#readingMs(text));
    return text;
  }
}

/** The usual proxier over a host whose readings are slow enough to be taken in the background. */
function setupSlowReadings() {
  const clock = new FakeClock();
  const host = new SlowReadingHost(clock, 5 * backgroundReadingMs);
  return {...setup(undefined, {clock, host}), host};
}

/** Lets promises and I/O callbacks run until `done` holds. */
async function settledUntil(done: () => Promise<boolean>): Promise<void> {
  for (let turn = 0; turn < 100 && !(await done()); turn++) await new Promise((resolve) => setImmediate(resolve));
}

test('drift: a slow reading is taken in the background; the sync does not wait for it, and drift it finds is repaired by the next sync', async () => {
  const {proxier, metrics, log, host} = setupSlowReadings();
  await proxier.syncRules(requested);
  const webChain = serviceChain('default/web:p/TCP');
  host.tamper('IPv4', 'nat', `-F ${webChain}`);
  host.hold();
  const [result] = await proxier.syncRules(periodic);
  assert.deepEqual([result.kind, result.drift], ['unchanged', false], 'returned while iptables-save is still reading');
  assert.equal(await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 0);
  host.release();
  const found = async () => (await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'})) === 1;
  await settledUntil(found);
  assert.ok(await found(), 'the background check found the flushed chain');
  assert.ok(log.lines.some((line) => line.includes('rules changed behind our back')));
  const [repair] = await proxier.syncRules(requested);
  assert.deepEqual([repair.kind, repair.drift], ['full', true]);
  assert.match(await host.iptablesSave('IPv4', 'nat'), new RegExp(`-A ${webChain} .*--to-destination 10.244.2.5:8080`));
  await proxier.stop();
});

test('drift: a change while a slow background reading runs is written at once; that reading proves nothing, and the next check due is the sync reading the kernel itself', async () => {
  const {proxier, metrics, objects, clock, host} = setupSlowReadings();
  await proxier.syncRules(requested);
  const webChain = serviceChain('default/web:p/TCP');
  host.tamper('IPv4', 'nat', `-F ${webChain}`);
  host.hold();
  await proxier.syncRules(periodic);
  objects.slicesByName.set('api-1', slice('api-1', 'api', ['10.244.3.1']));
  proxier.onChange('EndpointSlice', objects.slicesByName.get('api-1'));
  const [change] = await proxier.syncRules(requested);
  assert.equal(change.kind, 'partial', 'written while the reading is held');
  assert.equal(host.restores.length, 2);
  host.release();
  await settledUntil(async () => false);
  assert.equal(
    await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}),
    0,
    'the reading overlapped a write: no conclusion from it',
  );
  await clock.advance(30_000);
  const saves = host.calls.filter((call) => call.startsWith('iptables-save')).length;
  const [checked] = await proxier.syncRules(requested);
  assert.equal(host.calls.filter((call) => call.startsWith('iptables-save')).length, saves + 1, 'the sync read the kernel itself');
  assert.deepEqual([checked.kind, checked.drift], ['full', true]);
  assert.equal(await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 1);
  await proxier.stop();
});

test('drift: a slow background reading that fails is logged, and the next check is the sync reading itself, so a failing reading fails syncs', async () => {
  const {proxier, log, clock, host} = setupSlowReadings();
  await proxier.syncRules(requested);
  host.failingReadings = 2;
  const [result] = await proxier.syncRules(periodic);
  assert.equal(result.kind, 'unchanged');
  await settledUntil(async () => log.lines.some((line) => line.includes('drift check failed')));
  assert.ok(log.lines.some((line) => line.includes('drift check failed') && line.includes('xtables lock')));
  await clock.advance(30_000);
  await assert.rejects(proxier.syncRules(requested), /xtables lock/);
  await proxier.stop();
});

test('drift: the first check after the first sync filled the empty tables is taken in the background when they grew too large to read quickly', async () => {
  // iptables-save's time as the kernel's rules grow: 200 ms to start, 0.1 ms a rule. The first
  // sync reads the tables empty, in 200 ms; 6,000 services later a reading takes 1.4 s.
  const clock = new FakeClock();
  const host = new SlowReadingHost(clock, (output) => 200 + 0.1 * output.split('\n').filter((line) => line.startsWith('-A ')).length);
  const count = 6000;
  const address = (prefix: string, i: number) => `${prefix}.${i >> 8}.${i & 255}`;
  const services = Array.from({length: count}, (_, i) => service(`s${i}`, address('10.96', i)));
  const slices = Array.from({length: count}, (_, i) => slice(`s${i}-1`, `s${i}`, [address('10.244', i)]));
  const {proxier, metrics} = setup(new MemoryObjects({services, slices}), {clock, host});
  await proxier.syncRules(requested);
  host.hold();
  let timer: NodeJS.Timeout | undefined;
  const stillReading = new Promise((resolve) => (timer = setTimeout(resolve, 1000, 'the sync waits for the reading')));
  const answer = await Promise.race([proxier.syncRules(periodic).then(([result]) => result.kind), stillReading]);
  clearTimeout(timer);
  assert.equal(answer, 'unchanged', 'the sync returned while iptables-save was still reading');
  host.release();
  await settledUntil(async () => false);
  assert.equal(
    await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}),
    0,
    'the background reading found the rules as written',
  );
  await proxier.stop();
});

test('a drift check reads every table in one iptables-save, not one per table', async () => {
  const {host, proxier} = setup();
  await proxier.syncRules(requested);
  const from = host.calls.length;
  await proxier.syncRules(periodic);
  assert.deepEqual(
    host.calls.slice(from).filter((call) => call.startsWith('iptables-save')),
    ['iptables-save IPv4'],
  );
});

test('drift: foreign rules do not count, and an untouched node is left alone', async () => {
  const {host, proxier, metrics} = setup();
  await proxier.syncRules(requested);
  host.tamper('IPv4', 'nat', ':DOCKER - [0:0]');
  host.tamper('IPv4', 'nat', '-A PREROUTING -j DOCKER');
  const [result] = await proxier.syncRules(periodic);
  assert.deepEqual(result, {family: 'IPv4', kind: 'unchanged', changedServicePorts: 0, drift: false});
  assert.equal(host.restores.length, 1);
  assert.equal(await metricValue(metrics, 'proxyctl_drift_repairs_total', {ip_family: 'IPv4'}), 0);
});

test('a full sync at least once an hour', async () => {
  const {proxier, clock} = setup();
  await proxier.syncRules(requested);
  await clock.advance(fullSyncPeriod - 1000);
  assert.equal((await proxier.syncRules(periodic))[0].kind, 'unchanged');
  await clock.advance(2000);
  assert.equal((await proxier.syncRules(periodic))[0].kind, 'full');
});

test('conntrack: UDP endpoint removed and UDP service deleted', async () => {
  const objects = new MemoryObjects({
    services: [service('dns', '10.96.0.53', {protocol: 'UDP', port: 53}), service('syslog', '10.96.0.14', {protocol: 'UDP', port: 514})],
    slices: [
      slice('dns-1', 'dns', ['10.244.2.3', '10.244.2.4'], {protocol: 'UDP'}),
      slice('syslog-1', 'syslog', ['10.244.2.20'], {protocol: 'UDP'}),
    ],
  });
  const {host, proxier} = setup(objects);
  await proxier.syncRules(requested);
  assert.deepEqual(host.conntrackDeletes, [], 'nothing to clean on the first sync');
  objects.slicesByName.set('dns-1', slice('dns-1', 'dns', ['10.244.2.3'], {protocol: 'UDP'}));
  objects.servicesByName.delete('syslog');
  await proxier.syncRules(requested);
  assert.deepEqual(host.conntrackDeletes, [
    {family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.53', dstNat: '10.244.2.4'},
    {family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.14', dport: 514},
  ]);
});

test('malformed objects never stop a sync; each problem is logged once per change', async () => {
  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('bad', '10.96.0.99', {type: 'NodePort', nodePort: 70000})],
    slices: [slice('web-1', 'web', ['10.244.2.5'])],
  });
  objects.slicesByName.set('junk', {
    kind: 'EndpointSlice',
    metadata: {name: 'junk', namespace: 'default'},
    addressType: 'IPv4',
    endpoints: 'not a list',
  });
  const {proxier, log, metrics, host} = setup(objects);
  await proxier.syncRules(requested);
  assert.equal(host.restores.length, 1);
  const skipped = () => log.lines.filter((line) => line.includes('object skipped'));
  assert.ok(
    skipped().some((line) => line.includes('object="Service default/bad"') && line.includes('70000')),
    skipped().join('\n'),
  );
  assert.ok(
    skipped().some((line) => line.includes('EndpointSlice default/junk')),
    skipped().join('\n'),
  );
  const count = skipped().length;
  await proxier.syncRules(requested);
  assert.equal(skipped().length, count, 'the same problem is not logged again');
  assert.ok((await metricValue(metrics, 'proxyctl_object_problems')) >= 2);
});

test('route_localnet is turned on for localhost NodePorts', async () => {
  const {host, proxier} = setup();
  await proxier.start();
  await proxier.stop();
  assert.equal(host.sysctls.get('net.ipv4.conf.all.route_localnet'), '1');
});

test('the runner coalesces a burst of changes into one sync after minSyncPeriod', async () => {
  const {host, proxier, objects, clock} = setup();
  await proxier.start();
  await clock.advance(0);
  assert.equal(host.restores.length, 1);
  for (let i = 0; i < 20; i++) {
    objects.slicesByName.set('web-1', slice('web-1', 'web', [`10.244.2.${100 + i}`]));
    proxier.onChange('EndpointSlice', objects.slicesByName.get('web-1'));
    await clock.advance(10);
  }
  await clock.advance(2000);
  assert.equal(host.restores.length, 2);
  assert.match(await host.iptablesSave('IPv4', 'nat'), /10.244.2.119:8080/);
  await proxier.stop();
});

test('network programming latency is measured from the last-change-trigger-time annotation', async () => {
  const {proxier, objects, clock, metrics} = setup();
  await proxier.syncRules(requested);
  const changed = slice('web-1', 'web', ['10.244.2.50'], {triggerTime: new Date(clock.now() - 2500).toISOString()});
  objects.slicesByName.set('web-1', changed);
  proxier.onChange('EndpointSlice', changed);
  await proxier.syncRules(requested);
  assert.equal(await metricValue(metrics, 'kubeproxy_network_programming_duration_seconds_sum', {ip_family: 'IPv4'}), 2.5);
});

test('eTP=Local services get health check targets with their local endpoint count', async () => {
  const objects = new MemoryObjects({
    services: [
      service('lb', '10.96.0.80', {type: 'LoadBalancer', nodePort: 30080, externalTrafficPolicy: 'Local', healthCheckNodePort: 32000}),
    ],
    slices: [
      slice('lb-1', 'lb', ['10.244.1.7', '10.244.1.8'], {nodeName: 'node-1'}),
      slice('lb-2', 'lb', ['10.244.2.7'], {nodeName: 'node-2'}),
    ],
  });
  const {proxier, healthTargets, metrics} = setup(objects);
  await proxier.syncRules(requested);
  assert.deepEqual(healthTargets.at(-1), [{namespace: 'default', name: 'lb', healthCheckNodePort: 32000, localEndpoints: 2}]);
  assert.equal(await metricValue(metrics, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', {traffic_policy: 'external'}), 0);
});

test("crossing kube-proxy's large-cluster threshold (1,000 endpoints) either way rewrites every service port's rules: a full sync", async () => {
  const ips = (count: number, third: number): string[] =>
    Array.from({length: count}, (_, index) => `10.244.${third + Math.floor(index / 250)}.${(index % 250) + 1}`);
  // web: 999 endpoints, api: 1, so 1,000 in all: comments kept.
  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('api', '10.96.0.1')],
    slices: [slice('web-1', 'web', ips(500, 10)), slice('web-2', 'web', ips(499, 20)), slice('api-1', 'api', ['10.244.2.9'])],
  });
  const {host, log, proxier, clock} = await coreRulesProxier(objects);
  /** The rules of api's endpoint chain in the kernel (api itself never changes below). */
  const apiEndpointRules = async (): Promise<string[]> => {
    const nat = await host.iptablesSave('IPv4', 'nat');
    const chain = /-A (KUBE-SEP-\S+) .*--to-destination 10\.244\.2\.9:8080/.exec(nat)![1];
    return nat.split('\n').filter((line) => line.startsWith(`-A ${chain} `));
  };
  const setWeb2 = (count: number): void => {
    objects.slicesByName.set('web-2', slice('web-2', 'web', ips(count, 20)));
    proxier.onChange('EndpointSlice', objects.slicesByName.get('web-2'));
  };

  assert.equal((await proxier.syncRules(requested))[0].kind, 'full');
  assert.match((await apiEndpointRules())[0], /--comment default\/api:p/);

  setWeb2(500);
  await clock.advance(2_000);
  const [up] = await proxier.syncRules(requested);
  assert.equal(up.kind, 'full', '1,001 endpoints: every rule loses its endpoint comment');
  assert.ok(
    (await apiEndpointRules()).every((rule) => !rule.includes('--comment')),
    `api's unchanged rules rewritten: ${(await apiEndpointRules()).join(' | ')}`,
  );

  setWeb2(499);
  await clock.advance(2_000);
  const [down] = await proxier.syncRules(requested);
  assert.equal(down.kind, 'full', 'back to 1,000: the comments come back everywhere');
  assert.ok((await apiEndpointRules()).every((rule) => rule.includes('--comment default/api:p')));

  // Below the threshold, an endpoint change stays partial.
  setWeb2(498);
  await clock.advance(2_000);
  assert.equal((await proxier.syncRules(requested))[0].kind, 'partial');
  assert.ok(log.lines.filter((line) => line.includes('large-cluster threshold')).length === 2, 'each crossing is logged');
});

test('a loadBalancerSourceRanges entry that is no CIDR is logged by name; the service is still written, its load-balancer IP closed', async () => {
  const lb = service('lb', '10.96.0.40', {type: 'LoadBalancer', nodePort: 30040}) as ReturnType<typeof service> & {
    spec: Record<string, unknown>;
    status?: unknown;
  };
  lb.spec.loadBalancerSourceRanges = ['192.0.2.0/24', '192.0.2.0/40'];
  lb.status = {loadBalancer: {ingress: [{ip: '203.0.113.40'}]}};
  const {host, log, proxier} = await coreRulesProxier(new MemoryObjects({services: [lb], slices: [slice('lb-1', 'lb', ['10.244.2.40'])]}));
  await proxier.syncRules(requested);
  const written = host.restores[0].rules;
  assert.match(written, /-A KUBE-SERVICES .*"default\/lb:p cluster IP".* -d 10\.96\.0\.40 .*-j KUBE-SVC-/);
  assert.match(written, /-A KUBE-NODEPORTS .* --dport 30040 -j KUBE-EXT-/);
  assert.match(written, /-A KUBE-PROXY-FIREWALL .* -d 203\.0\.113\.40 --dport 80 -j DROP/);
  assert.doesNotMatch(written, /-A KUBE-FW-\S+ .* -s /, 'the firewall chain admits no source');
  const skipped = log.lines.filter((line) => line.includes('object skipped') && line.includes('object="Service default/lb"'));
  assert.equal(skipped.length, 1, log.lines.join('\n'));
  assert.match(
    skipped[0],
    /spec\.loadBalancerSourceRanges\[1\]: \\?"192\.0\.2\.0\/40\\?" is not a CIDR; load-balancer IPs closed to every client/,
  );
});
