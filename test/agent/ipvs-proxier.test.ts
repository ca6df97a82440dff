// IpvsProxier against an in-memory node (virtual servers, sets, kube-ipvs0 and iptables): which
// commands each sync runs and what they change. Full sync at start, then only the changed
// virtual/real servers and set entries; removed real servers drain at weight 0 while ipvsadm -Lnc
// shows live connections; excludeCIDRs protect foreign virtual servers; --cleanup keeps what is
// foreign. The same against a real kernel: test/kernel/ipvs-agent.test.ts.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {memoryLogger} from '../../src/agent/log.ts';
import {cleanupProxyRules} from '../../src/agent/sync/cleanup.ts';
import {IpvsProxier} from '../../src/agent/sync/ipvs-proxier.ts';
import {liveConnections} from '../../src/agent/sync/ipvs-host.ts';
import {ipvsRulesBackend} from '../../src/agent/api/rules/ipvs.ts';
import {diffIpvs, renderIpvs} from '../../src/core/ipvs/index.ts';
import {buildProxyModel} from '../../src/core/model/index.ts';
import {HostCommandError} from '../../src/agent/host/host.ts';
import {createAgentRuntime} from '../../src/agent/api/runtime.ts';
import {unwatchedRulesetChanges} from '../../src/agent/applied/ruleset-changes.ts';
import {IpvsHost} from './ipvs-memory-host.ts';
import {MemoryObjects, node, service, slice} from './sync/cluster.ts';
import {everyListReceived, periodic, proxierOptions, requested} from './sync/proxier-fixture.ts';

function start(options: {objects: MemoryObjects; host?: IpvsHost; excludeCIDRs?: string[]; scheduler?: string; now?: () => number}) {
  const host = options.host ?? new IpvsHost();
  host.sysctls.set('net.ipv4.vs.conntrack', '0');
  const settings = proxierOptions({
    host,
    objects: options.objects,
    model: {nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16']},
    ipvs: {
      scheduler: options.scheduler ?? 'rr',
      excludeCIDRs: options.excludeCIDRs ?? [],
      strictARP: false,
      tcpTimeout: 900_000,
      tcpFinTimeout: 5000,
      udpTimeout: 0,
    },
    log: memoryLogger(2),
    clock: {now: options.now ?? (() => Date.now()), setTimer: () => undefined, clearTimer: () => undefined},
  });
  const proxier = everyListReceived(new IpvsProxier(settings));
  return {host, proxier, log: settings.log, metrics: settings.metrics};
}

function objectsWithWeb(ips = ['10.244.2.5', '10.244.2.6']) {
  return new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('dns', '10.96.0.53', {protocol: 'UDP', port: 53})],
    slices: [slice('web-1', 'web', ips), slice('dns-1', 'dns', ['10.244.2.3'], {protocol: 'UDP'})],
  });
}

function desiredOf(objects: MemoryObjects) {
  const model = buildProxyModel(
    {services: objects.services(), endpointSlices: objects.endpointSlices(), node: node()},
    {family: 'IPv4', nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16']},
  );
  return renderIpvs(model, {scheduler: 'rr'});
}

function webReals(host: IpvsHost): string[] {
  return host.servers
    .get('TCP 10.96.0.10:80')!
    .realServers.map((real) => `${real.address}:${real.weight}`)
    .sort();
}

test('ipvs proxier: the first sync prepares the node and writes the whole state with ipvsadm -R, never a table clear', async () => {
  const objects = objectsWithWeb();
  const {host, proxier} = start({objects});
  await proxier.start();
  assert.ok(host.device, 'kube-ipvs0 created');
  assert.equal(host.sysctls.get('net.ipv4.vs.conntrack'), '1');
  assert.equal(host.sysctls.get('net.ipv4.vs.expire_nodest_conn'), '1');
  assert.equal(host.sysctls.get('net.ipv4.ip_forward'), '1');
  assert.ok(host.calls.includes('ipvsadm --set 900 5 0'), host.calls.join('\n'));

  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'full');
  const diff = diffIpvs(desiredOf(objects), await host.applied());
  assert.ok(diff.equal, diff.text);
  assert.ok(host.addresses.has('10.96.0.10') && host.addresses.has('10.96.0.53'));
  assert.ok(!host.calls.some((call) => /ipvsadm (-C|--clear)|ipvsadm-restore/.test(call)), 'the table is never cleared');
  // The iptables layer went in with --noflush, with the jumps from the built-in chains.
  const restore = host.restores.at(-1)!;
  assert.equal(restore.options.noflush, true);
  assert.match(restore.rules, /-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/);
  assert.deepEqual(webReals(host), ['10.244.2.5:1', '10.244.2.6:1']);
});

test('ipvs proxier: an endpoint change writes only that real server and its set entries; a drained one goes', async () => {
  const objects = objectsWithWeb();
  // On this node, so that each endpoint has its KUBE-LOOP-BACK entry (kube-proxy writes none for remote ones).
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5', '10.244.2.6'], {nodeName: 'node-1'}));
  const {host, proxier, log} = start({objects});
  await proxier.start();
  await proxier.syncRules(requested);
  const readsBefore = host.calls.filter((call) => call === 'ipvsadm -Sn').length;

  // 10.244.2.6 leaves while a connection to it lives; 10.244.2.7 joins.
  host.connections = 'TCP 14:58  ESTABLISHED 10.244.1.9:40000   10.96.0.10:80      10.244.2.6:8080\n';
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5', '10.244.2.7'], {nodeName: 'node-1'}));
  const [partial] = await proxier.syncRules(requested);
  assert.deepEqual([partial.kind, partial.changedServicePorts], ['partial', 1]);
  assert.equal(host.calls.filter((call) => call === 'ipvsadm -Sn').length, readsBefore, 'a partial sync does not read the kernel');
  assert.deepEqual(
    host.inputsOf('ipvsadm -R').at(-1)!.trim().split('\n').sort(),
    ['-a -t 10.96.0.10:80 -r 10.244.2.7:8080 -m -w 1', '-e -t 10.96.0.10:80 -r 10.244.2.6:8080 -m -w 0'].sort(),
  );
  assert.deepEqual(
    host.inputsOf('ipset restore').at(-1)!.trim().split('\n').sort(),
    ['add KUBE-LOOP-BACK 10.244.2.7,tcp:8080,10.244.2.7 -exist', 'del KUBE-LOOP-BACK 10.244.2.6,tcp:8080,10.244.2.6 -exist'].sort(),
  );
  assert.deepEqual(webReals(host), ['10.244.2.5:1', '10.244.2.6:0', '10.244.2.7:1']);
  assert.deepEqual(proxier.draining().get('IPv4'), ['TCP 10.96.0.10:80 -> 10.244.2.6:8080']);

  // Still live: it stays at weight 0. A connection that finished (TIME_WAIT) does not hold it.
  await proxier.syncRules(requested);
  assert.deepEqual(webReals(host), ['10.244.2.5:1', '10.244.2.6:0', '10.244.2.7:1']);
  host.connections = 'TCP 01:58  TIME_WAIT   10.244.1.9:40000   10.96.0.10:80      10.244.2.6:8080\n';
  await proxier.syncRules(requested);
  assert.deepEqual(webReals(host), ['10.244.2.5:1', '10.244.2.7:1']);
  assert.equal(host.inputsOf('ipvsadm -R').at(-1)!.trim(), '-d -t 10.96.0.10:80 -r 10.244.2.6:8080');
  assert.deepEqual(proxier.draining().get('IPv4'), []);
  assert.ok(
    log.lines.some((line) => line.includes('real server deleted')),
    log.lines.join('\n'),
  );

  // Without connections a removed real server goes at once, without a weight-0 step.
  host.connections = '';
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5']));
  await proxier.syncRules(requested);
  assert.equal(host.inputsOf('ipvsadm -R').at(-1)!.trim(), '-d -t 10.96.0.10:80 -r 10.244.2.7:8080');
  assert.deepEqual(webReals(host), ['10.244.2.5:1']);
});

test('ipvs proxier: a drain ends at the bound even with live connections; UDP real servers are not drained', async () => {
  let now = 1_000_000;
  const objects = objectsWithWeb();
  const {host, proxier} = start({objects, now: () => now});
  await proxier.start();
  await proxier.syncRules(requested);
  host.connections =
    'TCP 14:58  ESTABLISHED 10.244.1.9:40000   10.96.0.10:80      10.244.2.6:8080\nUDP 04:58  UDP         10.244.1.9:40001   10.96.0.53:53      10.244.2.3:8080\n';
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5']));
  objects.slicesByName.set('dns-1', slice('dns-1', 'dns', ['10.244.2.4'], {protocol: 'UDP'}));
  await proxier.syncRules(requested);
  assert.deepEqual(webReals(host), ['10.244.2.5:1', '10.244.2.6:0']);
  assert.deepEqual(
    host.servers.get('UDP 10.96.0.53:53')!.realServers.map((real) => real.address),
    ['10.244.2.4'],
    'UDP goes at once',
  );
  assert.ok(
    host.conntrackDeletes.some((filter) => filter.protocol === 'UDP' && filter.origDst === '10.96.0.53' && filter.dstNat === '10.244.2.3'),
    'stale UDP entries to the old endpoint deleted',
  );
  now += 15 * 60_000;
  await proxier.syncRules(requested);
  assert.deepEqual(webReals(host), ['10.244.2.5:1']);
});

test('ipvs proxier: a deleted UDP service loses its virtual server, set entries and address, and its conntrack entries', async () => {
  const objects = objectsWithWeb();
  const {host, proxier} = start({objects});
  await proxier.start();
  await proxier.syncRules(requested);
  objects.servicesByName.delete('dns');
  objects.slicesByName.delete('dns-1');
  await proxier.syncRules(requested);
  assert.ok(!host.servers.has('UDP 10.96.0.53:53'));
  assert.ok(!host.addresses.has('10.96.0.53'));
  assert.ok(![...host.sets.values()].some((set) => set.entries.some((entry) => entry.startsWith('10.96.0.53,'))));
  assert.ok(
    host.conntrackDeletes.some((filter) => filter.protocol === 'UDP' && filter.origDst === '10.96.0.53' && filter.dport === 53),
    JSON.stringify(host.conntrackDeletes),
  );
  assert.ok(host.servers.has('TCP 10.96.0.10:80'), 'web untouched');
});

test('ipvs proxier: a periodic sync repairs drift and counts it; virtual servers in excludeCIDRs stay', async () => {
  const objects = objectsWithWeb();
  const host = new IpvsHost();
  await host.ipvsadm(['-R'], '-A -t 192.0.2.10:80 -s rr\n-A -t 198.51.100.10:80 -s rr\n');
  const {proxier, metrics, log} = start({objects, host, excludeCIDRs: ['192.0.2.0/24']});
  await proxier.start();
  await proxier.syncRules(requested);
  assert.ok(host.servers.has('TCP 192.0.2.10:80'), 'excluded: kept');
  assert.ok(!host.servers.has('TCP 198.51.100.10:80'), 'not ours, not excluded: deleted, as kube-proxy does');

  await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.2.5:8080\n');
  host.addresses.delete('10.96.0.53');
  const [result] = await proxier.syncRules(periodic);
  assert.deepEqual([result.kind, result.drift], ['full', true]);
  assert.deepEqual(webReals(host), ['10.244.2.5:1', '10.244.2.6:1']);
  assert.ok(host.addresses.has('10.96.0.53'));
  assert.equal((await metrics.registry.getSingleMetric('proxyctl_drift_repairs_total')!.get()).values[0].value, 1);
  assert.ok(log.lines.some((line) => line.includes('ipvs state changed behind our back')));
  const [again] = await proxier.syncRules(periodic);
  assert.equal(again.drift, false);
});

test('ipvs proxier: a failed write makes the next sync full, reading the kernel again', async () => {
  const objects = objectsWithWeb();
  const {host, proxier, metrics} = start({objects});
  await proxier.start();
  await proxier.syncRules(requested);
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.5']));
  const original = host.ipvsadm.bind(host);
  let fail = true;
  host.ipvsadm = async (args: string[], input?: string) => {
    if (args[0] === '-R' && fail) {
      fail = false;
      throw new HostCommandError(['ipvsadm', '-R'], 1, 'Memory allocation problem');
    }
    return original(args, input);
  };
  await assert.rejects(proxier.syncRules(requested), /partial sync: .*Memory allocation problem/);
  assert.equal(
    (await metrics.registry.getSingleMetric('kubeproxy_sync_proxy_rules_iptables_restore_failures_total')!.get()).values[0].value,
    1,
  );
  const [result] = await proxier.syncRules(requested);
  assert.equal(result.kind, 'full');
  assert.deepEqual(webReals(host), ['10.244.2.5:1']);
});

test('ipvs proxier: the API backend diffs and traces the applied state', async () => {
  const objects = objectsWithWeb();
  const {host, proxier} = start({objects});
  await proxier.start();
  await proxier.syncRules(requested);
  const backend = ipvsRulesBackend({scheduler: 'rr'});
  const model = proxier.appliedModels().get('IPv4')!;
  const desired = backend.parse(backend.render(model));
  const applied = backend.parse(await backend.readApplied!(host, 'IPv4'));
  assert.equal(backend.diff(desired, applied).equal, true, backend.diff(desired, applied).text);
  await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.2.5:8080\n');
  const drifted = backend.diff(desired, backend.parse(await backend.readApplied!(host, 'IPv4')), 'default/web');
  assert.equal(drifted.equal, false);
  assert.deepEqual(
    drifted.groups.map((group) => [group.servicePort, group.added]),
    [['default/web:p', ['-a -t 10.96.0.10:80 -r 10.244.2.5:8080 -m -w 1']]],
  );
  assert.equal(backend.diff(desired, backend.parse(await backend.readApplied!(host, 'IPv4')), 'default/dns').equal, true);
  const trace = backend.trace(applied, {srcIP: '10.244.1.9', dstIP: '10.96.0.10', protocol: 'TCP', dstPort: 80, srcPort: 40000} as never, {
    localAddresses: ['10.240.0.11'],
  });
  assert.equal(trace.servicePort, 'default/web:p');
});

test('ipvs cleanup: removes our virtual servers, KUBE- sets, kube-ipvs0 and the iptables layer; foreign state stays', async () => {
  const objects = objectsWithWeb();
  const {host, proxier} = start({objects});
  await proxier.start();
  await proxier.syncRules(requested);
  await proxier.stop();
  await host.ipvsadm(['-R'], '-A -t 192.0.2.10:80 -s rr\n');
  await host.ipset(['restore'], 'create foreign hash:ip family inet\n');
  host.tamper('IPv4', 'nat', ':DOCKER - [0:0]');
  const result = await cleanupProxyRules(host, memoryLogger(), ['IPv4']);
  assert.deepEqual(result.errors, []);
  assert.deepEqual([...host.servers.keys()], ['TCP 192.0.2.10:80']);
  assert.deepEqual([...host.sets.keys()], ['foreign']);
  assert.equal(host.device, false);
  for (const table of ['nat', 'filter'] as const) {
    const save = await host.iptablesSave('IPv4', table);
    assert.ok(!/KUBE-/.test(save), save);
  }
  assert.match(await host.iptablesSave('IPv4', 'nat'), /:DOCKER/);
});

test('liveConnections counts connections that may still carry data, by real server', () => {
  const listing = [
    'IPVS connection entries',
    'pro expire state       source             virtual            destination',
    'TCP 14:58  ESTABLISHED 10.244.1.9:40000   10.96.0.10:80      10.244.2.6:8080',
    'TCP 00:58  FIN_WAIT    10.244.1.9:40002   10.96.0.10:80      10.244.2.6:8080',
    'TCP 01:58  TIME_WAIT   10.244.1.9:40001   10.96.0.10:80      10.244.2.5:8080',
    'IP  05:00  NONE        10.244.1.9:0       10.96.0.10:80      10.244.2.5:8080',
  ].join('\n');
  assert.deepEqual([...liveConnections(listing)], [['TCP 10.96.0.10:80 -> 10.244.2.6:8080', 2]]);
});

test('ipvs proxier: at start, iptables mode chains go; the chains ipvs mode shares stay until its first sync rewrites them', async () => {
  const host = new IpvsHost();
  for (const line of [
    ':KUBE-SERVICES - [0:0]',
    ':KUBE-SVC-AAAA - [0:0]',
    ':KUBE-NODEPORTS - [0:0]',
    ':KUBE-MARK-MASQ - [0:0]',
    ':DOCKER - [0:0]',
  ])
    host.tamper('IPv4', 'nat', line);
  host.tamper('IPv4', 'nat', '-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAA');
  host.tamper('IPv4', 'nat', '-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS');
  host.tamper('IPv4', 'nat', '-A KUBE-SVC-AAAA -j KUBE-MARK-MASQ');
  host.tamper('IPv4', 'nat', '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES');
  const {proxier} = start({objects: objectsWithWeb(), host});
  await proxier.start();
  const nat = await host.iptablesSave('IPv4', 'nat');
  assert.ok(!/KUBE-SVC-AAAA|KUBE-NODEPORTS/.test(nat), nat);
  assert.match(nat, /:KUBE-SERVICES/);
  assert.match(nat, /-A PREROUTING .* -j KUBE-SERVICES/);
  assert.match(nat, /:DOCKER/);
  await proxier.syncRules(requested);
  const synced = await host.iptablesSave('IPv4', 'nat');
  assert.equal(
    synced.match(/-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/g)?.length,
    1,
    'the jump is not added twice',
  );
  assert.match(synced, /-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT/);
});

test('agent API in ipvs mode: status, rules.desired/applied, diff and trace answer from the ipvs state', async () => {
  const objects = objectsWithWeb();
  const {host, proxier} = start({objects});
  await proxier.start();
  await proxier.syncRules(requested);
  const runtime = createAgentRuntime({
    nodeName: 'node-1',
    version: 'test',
    families: ['IPv4'],
    proxier,
    host,
    backend: ipvsRulesBackend({scheduler: 'rr'}),
    changes: unwatchedRulesetChanges(),
    log: memoryLogger(),
    nodeAddresses: async () => ['10.240.0.11'],
  });
  try {
    const status = await runtime.status({});
    assert.deepEqual([status.mode, status.services, status.endpoints], ['ipvs', 2, 3]);
    const desired = await runtime['rules.desired']({});
    assert.match(desired.text, /# service default\/web:p\n-A -t 10\.96\.0\.10:80 -s rr\n/);
    assert.match((await runtime['rules.applied']({})).text, /-a -t 10\.96\.0\.10:80 -r 10\.244\.2\.5:8080 -m -w 1/);
    assert.equal((await runtime.diff({})).equal, true, (await runtime.diff({})).text);

    const packet = {srcIP: '10.244.1.9', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'} as const;
    const clean = await runtime.trace({packet});
    assert.deepEqual([clean.servicePort, clean.drifted, clean.branches.length], ['default/web:p', false, 2]);

    // A real server removed behind the agent's back: diff names it, trace says the service drifted.
    await host.ipvsadm(['-R'], '-d -t 10.96.0.10:80 -r 10.244.2.5:8080\n');
    const diff = await runtime.diff({service: 'default/web'});
    assert.deepEqual(
      diff.groups.map((group) => [group.servicePort, group.added]),
      [['default/web:p', ['-a -t 10.96.0.10:80 -r 10.244.2.5:8080 -m -w 1']]],
    );
    const drifted = await runtime.trace({packet, service: 'default/web'});
    assert.equal(drifted.drifted, true);
    assert.equal(drifted.branches.length, 1);
  } finally {
    runtime.close();
  }
});

test('ipvs proxier: the scheduler option reaches every virtual server', async () => {
  const {host, proxier} = start({objects: objectsWithWeb(), scheduler: 'wlc'});
  await proxier.start();
  await proxier.syncRules(requested);
  assert.deepEqual([...new Set([...host.servers.values()].map((server) => server.scheduler))], ['wlc']);
});
