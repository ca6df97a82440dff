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
import {ipvsRulesBackend, parseIpvsStateText} from '../../src/agent/api/rules/ipvs.ts';
import {
  diffIpvs,
  formatIpvsadmRestore,
  type Ipset,
  type IpvsVirtualServer,
  parseIpvsadmSave,
  renderIpvs,
  virtualServerKey,
} from '../../src/core/ipvs/index.ts';
import {buildProxyModel, joinHostPort} from '../../src/core/model/index.ts';
import {HostCommandError, restoreInputText} from '../../src/agent/host/host.ts';
import {createAgentRuntime} from '../../src/agent/api/runtime.ts';
import {unwatchedRulesetChanges} from '../../src/agent/applied/ruleset-changes.ts';
import {RecordingHost} from './recording-host.ts';
import {MemoryObjects, node, service, slice} from './sync/cluster.ts';
import {everyListReceived, periodic, proxierOptions, requested} from './sync/proxier-fixture.ts';

/** A node's ipvs state in memory, driven by the same commands the kernel tools take. */
class IpvsHost extends RecordingHost {
  readonly servers = new Map<string, IpvsVirtualServer>();
  readonly sets = new Map<string, Ipset>();
  readonly addresses = new Set<string>();
  device = false;
  /** What `ipvsadm -Lnc` prints. */
  connections = '';
  readonly inputs: {command: string; input: string}[] = [];

  override async ipvsadm(args: string[], input?: string): Promise<string> {
    this.calls.push(`ipvsadm ${args.join(' ')}`);
    if (args[0] === '-Sn') return formatIpvsadmRestore([...this.servers.values()]);
    if (args[0] === '-Lnc')
      return `IPVS connection entries\npro expire state       source             virtual            destination\n${this.connections}`;
    if (args[0] === '-R') {
      this.inputs.push({command: 'ipvsadm -R', input: input!});
      for (const line of input!.trim().split('\n')) this.#ipvsLine(line);
    }
    return '';
  }

  #ipvsLine(line: string): void {
    const words = line.split(/\s+/);
    const protocol = words[1] === '-u' ? 'UDP' : 'TCP';
    const [, address, port] = /^\[?(.*?)\]?:(\d+)$/.exec(words[2])!;
    const key = virtualServerKey({protocol, address, port: Number(port)});
    const option = (flag: string) => (words.includes(flag) ? words[words.indexOf(flag) + 1] : undefined);
    const server = this.servers.get(key);
    const real = option('-r');
    switch (words[0]) {
      case '-A':
        if (server) throw new HostCommandError(['ipvsadm', '-R'], 1, 'Service already exists');
        this.servers.set(key, parseIpvsadmSave(`${line}\n`)[0]);
        return;
      case '-E':
        Object.assign(server!, {
          scheduler: option('-s') ?? server!.scheduler,
          persistenceTimeout: option('-p') === undefined ? undefined : Number(option('-p')),
        });
        return;
      case '-D':
        if (!server) throw new HostCommandError(['ipvsadm', '-R'], 1, 'No such service');
        this.servers.delete(key);
        return;
    }
    const [, realAddress, realPort] = /^\[?(.*?)\]?:(\d+)$/.exec(real!)!;
    const index = server!.realServers.findIndex((candidate) => joinHostPort(candidate.address, candidate.port) === real);
    if (words[0] === '-a') server!.realServers.push({address: realAddress, port: Number(realPort), weight: Number(option('-w') ?? 1)});
    else if (words[0] === '-e') server!.realServers[index].weight = Number(option('-w'));
    else if (words[0] === '-d') server!.realServers.splice(index, 1);
  }

  override async ipset(args: string[], input?: string): Promise<string> {
    this.calls.push(`ipset ${args.join(' ')}`);
    if (args[0] === 'save') {
      return (
        [...this.sets.values()]
          .map((set) =>
            [`create ${set.name} ${set.type} family inet`, ...set.entries.map((entry) => `add ${set.name} ${entry}`)].join('\n'),
          )
          .join('\n') + '\n'
      );
    }
    if (args[0] === 'destroy') this.sets.delete(args[1]);
    if (args[0] === 'restore') {
      this.inputs.push({command: 'ipset restore', input: input!});
      for (const line of input!.trim().split('\n')) {
        const [op, name, value] = line.split(/\s+/);
        if (op === 'create' && !this.sets.has(name)) this.sets.set(name, {name, type: value, entries: []});
        const set = this.sets.get(name)!;
        if (op === 'add' && !set.entries.includes(value)) set.entries.push(value);
        if (op === 'del') set.entries = set.entries.filter((entry) => entry !== value);
        if (op === 'flush') set.entries = [];
        set.entries.sort();
      }
    }
    return '';
  }

  override async ip(args: string[], input?: string): Promise<string> {
    this.calls.push(`ip ${args.join(' ')}`);
    const command = args.join(' ');
    if (command === 'link show kube-ipvs0' || command === '-j addr show dev kube-ipvs0') {
      if (!this.device) throw new HostCommandError(['ip', ...args], 1, 'Device "kube-ipvs0" does not exist.');
      return command.startsWith('-j')
        ? JSON.stringify([{ifname: 'kube-ipvs0', addr_info: [...this.addresses].map((local) => ({local}))}])
        : '';
    }
    if (command === 'link add kube-ipvs0 type dummy') this.device = true;
    if (command === 'link del kube-ipvs0') {
      this.device = false;
      this.addresses.clear();
    }
    if (command === '-batch -') {
      this.inputs.push({command: 'ip -batch', input: input!});
      for (const line of input!.trim().split('\n')) {
        const [, op, cidr] = line.split(/\s+/);
        const address = cidr.split('/')[0];
        if (op === 'replace') this.addresses.add(address);
        else if (!this.addresses.delete(address)) throw new HostCommandError(['ip', '-batch', '-'], 1, 'Cannot assign requested address');
      }
    }
    return '';
  }

  /** Keeps the rules as iptables-save prints them (MARK as --set-xmark, the source match first), as the kernel does. */
  override async iptablesRestore(...args: Parameters<RecordingHost['iptablesRestore']>): Promise<void> {
    const [family, rules, options] = args;
    const printed = restoreInputText(rules)
      .replace(/-j MARK --or-mark (\S+)/g, '-j MARK --set-xmark $1/$1')
      .replace(/-j MARK --xor-mark (\S+)/g, '-j MARK --set-xmark $1/0x0')
      .replace(/(-m set --match-set \S+ \S+) (! -s \S+)/g, '$2 $1');
    return super.iptablesRestore(family, printed, options);
  }

  inputsOf(command: string): string[] {
    return this.inputs.filter((entry) => entry.command === command).map((entry) => entry.input);
  }

  /** The node's state for one family, as the API reads it. */
  async applied() {
    return parseIpvsStateText(await ipvsRulesBackend().readApplied!(this, 'IPv4'));
  }
}

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
