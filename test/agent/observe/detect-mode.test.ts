// Finding kube-proxy's mode from what the node's tools print: recorded outputs of nft, iptables-save
// (nft and legacy), ip and ipvsadm, as kube-proxy's modes leave them; --observe-mode overriding;
// none and several found said plainly. The kernel test loads such rules into a namespace.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {test} from 'node:test';
import {detectKubeProxyMode, type DetectionHosts, iptablesLayout} from '../../../src/agent/observe/detect-mode.ts';
import {CommandHost} from '../../../src/agent/host/command-host.ts';
import type {Host} from '../../../src/agent/host/host.ts';
import {HostCommandError} from '../../../src/agent/host/host.ts';
import {ReadOnlyHost} from '../../../src/agent/host/read-only-host.ts';
import {createNetns, isRoot} from '../netns.ts';

/** iptables mode's nat table, as kube-proxy writes it (its proxier_test.go overall rules, shortened). */
const iptablesModeNat = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
`;

/** ipvs mode's nat table: ipset matches and KUBE-NODE-PORT. */
const ipvsModeNat = `*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODE-PORT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
`;

const emptyNat = '*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n';

const ipvsadmListing = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.1:443 rr
  -> 172.18.0.2:6443              Masq    1      0          0
UDP  10.96.0.10:53 rr
`;

interface Recorded {
  tables?: string;
  nat?: {nf_tables?: string; legacy?: string};
  kubeIpvs0?: boolean;
  ipvsadm?: string;
}

/** What detection asked nft, every test. */
const nftQuestions: string[] = [];

/** Hosts that answer with recorded outputs; a missing one fails as the tool would. */
function recordedHosts(recorded: Recorded): DetectionHosts {
  const failing = (command: string[]) => Promise.reject(new HostCommandError(command, 1, 'not recorded'));
  const node = {
    nft: (args: string[]) => {
      nftQuestions.push(args.join(' '));
      return recorded.tables !== undefined ? Promise.resolve(recorded.tables) : failing(['nft', ...args]);
    },
    ip: (args: string[]) =>
      recorded.kubeIpvs0 ? Promise.resolve('3: kube-ipvs0: <BROADCAST,NOARP> mtu 1500\n') : failing(['ip', ...args]),
    ipvsadm: (args: string[]) => (recorded.ipvsadm !== undefined ? Promise.resolve(recorded.ipvsadm) : failing(['ipvsadm', ...args])),
  } as unknown as Host;
  const iptables = (frontEnd: 'nf_tables' | 'legacy') => natHost(recorded.nat?.[frontEnd] ?? emptyNat);
  return {node, iptables: {nf_tables: iptables('nf_tables'), legacy: iptables('legacy')}};
}

/**
 * A front end whose nat table holds `nat` (iptables-save's text): it lists one chain as `iptables
 * -S CHAIN` does, and refuses to dump whole tables, which on a large node take seconds for what
 * detection asks.
 */
function natHost(nat: string): Host {
  return {
    iptablesListChain: async (_family: string, table: string, chain: string) => {
      if (table !== 'nat' || !new RegExp(`^:${chain} `, 'm').test(nat)) return undefined;
      const rules = nat.split('\n').filter((line) => line.startsWith(`-A ${chain} `));
      return [`-N ${chain}`, ...rules, ''].join('\n');
    },
    iptablesSave: () => assert.fail('detection dumped a whole table'),
  } as unknown as Host;
}

test('mode detection: each of kube-proxy modes from its traces in the kernel', async () => {
  const nftables = await detectKubeProxyMode(
    recordedHosts({
      tables: 'table ip filter {\n}\ntable ip kube-proxy {\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t}\n}\ntable ip6 kube-proxy {\n}\n',
    }),
    ['IPv4', 'IPv6'],
  );
  assert.equal(nftables.mode, 'nftables');
  assert.equal(nftables.finding, 'detected');
  assert.equal(nftables.summary, 'kube-proxy nftables (table ip kube-proxy, table ip6 kube-proxy)');

  const iptablesNft = await detectKubeProxyMode(
    recordedHosts({tables: 'table ip nat\ntable ip filter\n', nat: {nf_tables: iptablesModeNat}}),
    ['IPv4'],
  );
  assert.deepEqual([iptablesNft.mode, iptablesNft.frontEnd, iptablesNft.finding], ['iptables', 'nf_tables', 'detected']);
  assert.match(iptablesNft.summary, /KUBE-SERVICES in iptables-nft/);

  const iptablesLegacy = await detectKubeProxyMode(recordedHosts({tables: '', nat: {legacy: iptablesModeNat}}), ['IPv4']);
  assert.deepEqual([iptablesLegacy.mode, iptablesLegacy.frontEnd], ['iptables', 'legacy']);
  assert.match(iptablesLegacy.summary, /KUBE-SERVICES in iptables-legacy/);

  const ipvs = await detectKubeProxyMode(
    recordedHosts({tables: '', nat: {nf_tables: ipvsModeNat}, kubeIpvs0: true, ipvsadm: ipvsadmListing}),
    ['IPv4'],
  );
  assert.deepEqual([ipvs.mode, ipvs.frontEnd, ipvs.finding], ['ipvs', 'nf_tables', 'detected']);
  assert.match(ipvs.summary, /2 ipvs virtual servers with kube-ipvs0/);
  // nft 1.0 reads every rule of every table for `nft list tables`; the sets name the tables too,
  // and read tersely, without their elements.
  assert.deepEqual([...new Set(nftQuestions)], ['-t list sets']);
});

test('mode detection: none found and several found are said plainly; --observe-mode overrides', async () => {
  const none = await detectKubeProxyMode(recordedHosts({tables: 'table ip filter\n'}), ['IPv4']);
  assert.equal(none.finding, 'none found');
  assert.match(none.summary, /^no kube-proxy rules at all on this node/);

  // A switch from iptables to nftables mode that left the old chains.
  const half = await detectKubeProxyMode(recordedHosts({tables: 'table ip kube-proxy\n', nat: {nf_tables: iptablesModeNat}}), ['IPv4']);
  assert.equal(half.finding, 'several found');
  assert.equal(half.mode, 'nftables');
  assert.match(
    half.summary,
    /^more than one kube-proxy mode's rules on this node \(a half-done mode switch\?\): nftables \(table ip kube-proxy\); iptables \(KUBE-SERVICES in iptables-nft\)/,
  );

  // iptables chains in both front ends: also a half-done switch.
  const both = await detectKubeProxyMode(recordedHosts({tables: '', nat: {nf_tables: iptablesModeNat, legacy: iptablesModeNat}}), ['IPv4']);
  assert.equal(both.finding, 'several found');

  const overridden = await detectKubeProxyMode(recordedHosts({tables: 'table ip kube-proxy\n'}), ['IPv4'], 'iptables');
  assert.deepEqual([overridden.mode, overridden.finding], ['iptables', 'override']);
  assert.match(overridden.summary, /set by --observe-mode; found on the node: nftables \(table ip kube-proxy\)/);

  // A tool that cannot answer is named, and the others still count.
  const noNft = await detectKubeProxyMode(recordedHosts({nat: {legacy: iptablesModeNat}}), ['IPv4']);
  assert.equal(noNft.mode, 'iptables');
  assert.match(noNft.unreadable.join(), /nft -t list sets: nft -t list sets: exit 1: not recorded/);
});

test('iptablesLayout tells iptables mode from ipvs mode by KUBE-SERVICES, listing chains, not dumping the table', async () => {
  assert.equal(await iptablesLayout(natHost(iptablesModeNat), 'IPv4'), 'iptables');
  assert.equal(await iptablesLayout(natHost(ipvsModeNat), 'IPv4'), 'ipvs');
  // ipvs mode's KUBE-SERVICES before any set has members: its KUBE-NODE-PORT chain tells it.
  assert.equal(await iptablesLayout(natHost(ipvsModeNat.replace(/^-A KUBE-SERVICES .*match-set.*\n/gm, '')), 'IPv4'), 'ipvs');
  assert.equal(await iptablesLayout(natHost(emptyNat), 'IPv4'), undefined);
});

/** The namespace's hosts, and every command they ran. */
function kernelHosts(netns: string): DetectionHosts & {commands: string[]} {
  const commands: string[] = [];
  const onCommand = (command: string[]) => commands.push(command.slice(4).join(' '));
  const host = (iptablesVariant: 'default' | 'nft' | 'legacy') => new ReadOnlyHost(new CommandHost({netns, iptablesVariant, onCommand}));
  return {node: host('default'), iptables: {nf_tables: host('nft'), legacy: host('legacy')}, commands};
}

test('mode detection in a network namespace: iptables-nft, iptables-legacy, nftables, and a half-done switch', async (t) => {
  if (!isRoot) {
    t.skip('needs root: loads kube-proxy rules into a network namespace');
    return;
  }
  const netns = createNetns(t);
  const run = (command: string[], input?: string) =>
    execFileSync('ip', ['netns', 'exec', netns, ...command], {input, stdio: ['pipe', 'pipe', 'pipe']});
  const hosts = kernelHosts(netns);
  assert.equal((await detectKubeProxyMode(hosts, ['IPv4'])).finding, 'none found');

  run(['iptables-nft-restore', '--noflush'], iptablesModeNat);
  const nft = await detectKubeProxyMode(hosts, ['IPv4']);
  assert.deepEqual([nft.mode, nft.frontEnd, nft.finding], ['iptables', 'nf_tables', 'detected']);
  run(['iptables-nft', '-t', 'nat', '-F']);
  run(['iptables-nft', '-t', 'nat', '-X']);
  // iptables-nft leaves its (now empty) nat table behind: no kube-proxy rules in it.
  assert.equal((await detectKubeProxyMode(hosts, ['IPv4'])).finding, 'none found');

  run(['iptables-legacy-restore', '--noflush'], iptablesModeNat);
  const legacy = await detectKubeProxyMode(hosts, ['IPv4']);
  assert.deepEqual([legacy.mode, legacy.frontEnd, legacy.finding], ['iptables', 'legacy', 'detected']);

  run(['nft', '-f', '-'], 'table ip kube-proxy {\n chain services {\n }\n}\n');
  const half = await detectKubeProxyMode(hosts, ['IPv4']);
  assert.equal(half.finding, 'several found');
  assert.equal(half.mode, 'nftables');
  assert.match(half.summary, /nftables \(table ip kube-proxy\); iptables \(KUBE-SERVICES in iptables-legacy\)/);

  run(['iptables-legacy', '-t', 'nat', '-F']);
  run(['iptables-legacy', '-t', 'nat', '-X']);
  const nftables = await detectKubeProxyMode(hosts, ['IPv4']);
  assert.deepEqual([nftables.mode, nftables.finding], ['nftables', 'detected']);
  // Yes-or-no questions, each answered by listing a chain or the tables' names, never by a dump.
  assert.deepEqual(
    hosts.commands.filter((command) => /-save\b|nft (-j )?list (ruleset|table)\b/.test(command)),
    [],
    hosts.commands.join('\n'),
  );
});

test('an unsettled finding is looked at again: kube-proxy starting later settles it; another mode is said, with what to do', async () => {
  const {followKubeProxyMode} = await import('../../../src/agent/observe/observation.ts');
  const {memoryLogger} = await import('../../../src/agent/log.ts');
  const none = await detectKubeProxyMode(recordedHosts({tables: ''}), ['IPv4']);
  const later = (recorded: Recorded) => {
    const observation = {
      report: {detection: none, settings: [], problems: []},
      detectAgain: () => detectKubeProxyMode(recordedHosts(recorded), ['IPv4']),
    } as unknown as Parameters<typeof followKubeProxyMode>[0];
    return observation;
  };
  const wait = () => new Promise((resolve) => setTimeout(resolve, 60));

  const same = later({tables: '', nat: {nf_tables: iptablesModeNat}});
  const log = memoryLogger(0);
  const stop = followKubeProxyMode(same, 10, log);
  await wait();
  stop();
  assert.equal(same.report.detection.finding, 'detected');
  assert.match(same.report.detection.summary, /KUBE-SERVICES in iptables-nft/);
  assert.ok(log.lines.some((line) => line.includes('its rules are here now')));

  const other = later({tables: 'table ip kube-proxy\n'});
  const stopOther = followKubeProxyMode(other, 10, memoryLogger(0));
  await wait();
  stopOther();
  assert.equal(other.report.detection.mode, 'iptables');
  assert.match(
    other.report.detection.summary,
    /nftables \(table ip kube-proxy\), but this observer compares as iptables mode.*restart it to observe nftables mode/,
  );
});

test('a settled observer whose kube-proxy rules are gone looks again: kube-proxy in another mode makes it start again', async () => {
  const {followKubeProxyMode} = await import('../../../src/agent/observe/observation.ts');
  const {memoryLogger} = await import('../../../src/agent/log.ts');
  const iptablesFound = await detectKubeProxyMode(recordedHosts({tables: '', nat: {nf_tables: iptablesModeNat}}), ['IPv4']);
  assert.equal(iptablesFound.finding, 'detected');
  let looks = 0;
  const observation = {
    report: {detection: iptablesFound, settings: [], problems: []},
    detectAgain: () => {
      looks++;
      return detectKubeProxyMode(recordedHosts({tables: 'table ip kube-proxy\n'}), ['IPv4']);
    },
  } as unknown as Parameters<typeof followKubeProxyMode>[0];
  const wait = () => new Promise((resolve) => setTimeout(resolve, 60));
  let rulesGone = false;
  const changedTo: string[] = [];
  const log = memoryLogger(0);
  // A syncPeriod far longer than the test: only the quicker looks while the rules are gone can come.
  const stop = followKubeProxyMode(observation, 60_000, log, {
    rulesGone: () => rulesGone,
    rulesGoneLookMs: 10,
    onModeChanged: (mode) => changedTo.push(mode),
  });
  await wait();
  assert.equal(looks, 0, 'settled, with its rules there: the kernel is not asked again');
  rulesGone = true;
  await wait();
  stop();
  assert.deepEqual(changedTo, ['nftables'], 'told once');
  assert.match(observation.report.detection.summary, /compares as iptables mode.*it starts again to observe nftables mode/);
  assert.ok(log.lines.some((line) => line.includes('its mode changed; starting again to observe it')));
});
