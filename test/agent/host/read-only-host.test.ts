// ReadOnlyHost: an observing agent's host passes reads on and refuses every write before it
// reaches the node, with an error naming the command.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {ReadOnlyHost, WriteRefusedError} from '../../../src/agent/host/read-only-host.ts';
import {RecordingHost} from '../recording-host.ts';

test('read-only host: every write is refused, named, and never reaches the node', async () => {
  const node = new RecordingHost();
  const refused: string[] = [];
  const host = new ReadOnlyHost(node, {onRefused: (error) => refused.push(error.message)});
  const writes: Array<[string, () => Promise<unknown>]> = [
    ['iptables-restore --noflush', () => host.iptablesRestore('IPv4', '*nat\nCOMMIT\n', {noflush: true})],
    ['ip6tables-restore', () => host.iptablesRestore('IPv6', '*nat\nCOMMIT\n', {noflush: false})],
    ['nft -f -', () => host.nft(['-f', '-'], 'flush ruleset')],
    ['nft add table ip kube-proxy', () => host.nft(['add', 'table', 'ip', 'kube-proxy'])],
    ['nft delete table ip kube-proxy', () => host.nft(['delete', 'table', 'ip', 'kube-proxy'])],
    ['nft flush ruleset', () => host.nft(['flush', 'ruleset'])],
    ['nft reset counters', () => host.nft(['reset', 'counters'])],
    ['ipset add KUBE-CLUSTER-IP', () => host.ipset(['add', 'KUBE-CLUSTER-IP', '10.96.0.1,tcp:443,10.96.0.1'])],
    ['ipset del KUBE-CLUSTER-IP', () => host.ipset(['del', 'KUBE-CLUSTER-IP', '10.96.0.1,tcp:443,10.96.0.1'])],
    ['ipset create KUBE-X', () => host.ipset(['create', 'KUBE-X', 'hash:ip'])],
    ['ipset destroy KUBE-X', () => host.ipset(['destroy', 'KUBE-X'])],
    ['ipset restore', () => host.ipset(['restore'], 'create KUBE-X hash:ip\n')],
    ['ipvsadm -R', () => host.ipvsadm(['-R'], '-A -t 10.96.0.1:443 -s rr\n')],
    ['ipvsadm -A -t 10.96.0.1:443', () => host.ipvsadm(['-A', '-t', '10.96.0.1:443', '-s', 'rr'])],
    ['ipvsadm -D -t 10.96.0.1:443', () => host.ipvsadm(['-D', '-t', '10.96.0.1:443'])],
    ['ipvsadm -C', () => host.ipvsadm(['-C'])],
    ['ipvsadm --set 900 120 300', () => host.ipvsadm(['--set', '900', '120', '300'])],
    ['conntrack -D -f ipv4 -p udp', () => host.conntrackDelete({family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.10'})],
    ['ip link add kube-ipvs0 type dummy', () => host.ip(['link', 'add', 'kube-ipvs0', 'type', 'dummy'])],
    ['ip link del kube-ipvs0', () => host.ip(['link', 'del', 'kube-ipvs0'])],
    ['ip addr add 10.96.0.1/32 dev kube-ipvs0', () => host.ip(['addr', 'add', '10.96.0.1/32', 'dev', 'kube-ipvs0'])],
    ['ip -batch -', () => host.ip(['-batch', '-'], 'address add 10.96.0.1/32 dev kube-ipvs0\n')],
    ['sysctl -w net.ipv4.conf.all.route_localnet=1', () => host.sysctlWrite('net.ipv4.conf.all.route_localnet', '1')],
    ['nfacct add ct_state_invalid_dropped_pkts', () => host.nfacct(['add', 'ct_state_invalid_dropped_pkts'])],
  ];
  for (const [command, write] of writes) {
    await assert.rejects(write(), (error: unknown) => {
      assert.ok(error instanceof WriteRefusedError, command);
      assert.ok(error.message.includes(command), `"${error.message}" names ${command}`);
      assert.match(error.message, /observe mode: refused to run/);
      return true;
    });
  }
  assert.equal(refused.length, writes.length, 'each refusal is told');
  assert.deepEqual(
    node.calls.filter((call) => !call.startsWith('iptables-save')),
    [],
    'no write reached the node',
  );
  assert.equal(node.sysctls.get('net.ipv4.conf.all.route_localnet'), '0');
});

test('read-only host: reads pass through', async () => {
  const node = new RecordingHost();
  const host = new ReadOnlyHost(node);
  await host.iptablesSave('IPv4', 'nat');
  await host.iptablesListChain('IPv4', 'nat', 'KUBE-SERVICES');
  await host.nft(['-j', 'list', 'table', 'ip', 'kube-proxy']);
  await host.nft(['list', 'tables']);
  await host.ipset(['save']);
  await host.ipset(['list', 'KUBE-CLUSTER-IP']);
  await host.ipvsadm(['-Sn']);
  await host.ipvsadm(['-Ln']);
  await host.ipvsadm(['-Lnc']);
  await host.ipvsadm(['-L', '-n', '-t', '10.96.0.1:443']);
  await host.ip(['-j', 'addr', 'show', 'dev', 'kube-ipvs0']);
  await host.ip(['link', 'show', 'kube-ipvs0']);
  await host.sysctlRead('net.ipv4.conf.all.route_localnet');
  node.sockets = 'tcp LISTEN 0 4096 0.0.0.0:22 0.0.0.0:*\n';
  assert.equal(await host.listeningSockets(), node.sockets, 'migrate-check reads the host sockets of an observed ipvs node');
  assert.deepEqual(node.calls, [
    'iptables-save IPv4 nat',
    'iptables -S IPv4 nat KUBE-SERVICES',
    'nft -j list table ip kube-proxy',
    'nft list tables',
    'ipset save',
    'ipset list KUBE-CLUSTER-IP',
    'ipvsadm -Sn',
    'ipvsadm -Ln',
    'ipvsadm -Lnc',
    'ipvsadm -L -n -t 10.96.0.1:443',
    'ip -j addr show dev kube-ipvs0',
    'ip link show kube-ipvs0',
    'ss -l',
  ]);
});
