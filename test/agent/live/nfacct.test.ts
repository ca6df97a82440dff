// kube-proxy's nfacct counters, live: a proxyctl-agent process on a namespace node creates the
// nfacct objects, writes the counting rules, and /metrics reports what real packets did: a
// connection to a NodePort on 127.0.0.1 counts in localhost_nps_accepted_pkts, and a packet
// conntrack calls INVALID, forwarded between two pods, is dropped and counted in
// ct_state_invalid_dropped_pkts. Needs root (namespaces) and python3 (the INVALID packet is
// hand-made on a raw socket).
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import {describe, it} from 'node:test';
import {execInNamespace} from '../../../src/lab/netns/index.ts';
import {
  demoPorts,
  type LiveCluster,
  liveClusterSuite,
  metricValue,
  repliedPods,
  savedRules,
  serviceObject,
  sleep,
  until,
} from './live-cluster.ts';

const localhostMetric = 'kubeproxy_iptables_localhost_nodeports_accepted_packets_total';
const invalidMetric = 'kubeproxy_iptables_ct_state_invalid_dropped_packets_total';
const hasPython = spawnSync('sh', ['-c', 'command -v python3'], {stdio: 'ignore'}).status === 0;

/** The packets an nfacct object of the node holds, as `nfacct get` prints them. */
async function nfacctPackets(c: LiveCluster, name: string): Promise<number> {
  const {stdout} = await execInNamespace(c.node(0).namespace, ['nfacct', 'get', name]);
  return Number(/pkts = (\d+)/.exec(stdout)?.[1]);
}

/** One metric's sample on the agent's /metrics page; fails when the page has none. */
async function sample(c: LiveCluster, name: string): Promise<number> {
  const page = await c.agents[0].metrics();
  assert.match(page, new RegExp(`^${name} \\d+`, 'm'), `${name} on /metrics`);
  return metricValue(page, name);
}

/** A TCP segment with SYN and FIN both set (a flag combination conntrack calls INVALID), checksummed, from src to dst:port. */
const invalidSegmentScript = `
import socket, struct, sys
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
header = struct.pack('!HHIIBBHHH', 40000, port, 1, 0, 5 << 4, 0x03, 64240, 0, 0)
pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack('!BBH', 0, socket.IPPROTO_TCP, len(header))
data = pseudo + header
total = sum(struct.unpack('!%dH' % (len(data) // 2), data))
while total >> 16: total = (total & 0xffff) + (total >> 16)
header = header[:16] + struct.pack('!H', ~total & 0xffff) + header[18:]
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
raw.sendto(header, (dst, 0))
`;

describe('live agent: kube-proxy nfacct counters and their metrics', {concurrency: false, timeout: 180_000}, () => {
  const {live} = liveClusterSuite({
    nodes: 1,
    podsPerNode: 2,
    externalClients: 0,
    servers: {'pod-0-1': {app: 'web'}},
    agent: {minSyncPeriod: '1s', syncPeriod: '3s'},
  });

  it('creates the nfacct objects and writes the counting rules, as kube-proxy does where the kernel has xt_nfacct', async (t) => {
    const c = live(t);
    if (!c) return;
    await until('the INVALID drop rule counting into ct_state_invalid_dropped_pkts', async () =>
      (await savedRules(c.node(0))).includes(
        '-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP',
      ),
    );
    assert.equal(await nfacctPackets(c, 'localhost_nps_accepted_pkts'), 0);
    assert.match(await savedRules(c.node(0)), /-j MASQUERADE --random-fully/);
  });

  it('a connection to a NodePort on 127.0.0.1 of the node counts once in localhost_nps_accepted_pkts, and /metrics says so', async (t) => {
    const c = live(t);
    if (!c) return;
    const created = c.server.store.create('services', serviceObject('web', {app: 'web'}, {type: 'NodePort'}), 'default') as unknown as {
      spec: {ports: Array<{nodePort: number}>};
    };
    const nodePort = created.spec.ports[0].nodePort;
    await until('the localhost NodePort rule', async () =>
      (await savedRules(c.node(0))).includes(`--dport ${nodePort} -m nfacct --nfacct-name  localhost_nps_accepted_pkts`),
    );
    const before = await sample(c, localhostMetric);
    repliedPods(
      await c.probe(c.node(0).namespace, {protocol: 'tcp', host: '127.0.0.1', port: nodePort, timeoutMs: 2000}),
      'node -> 127.0.0.1 NodePort',
    );
    // Only a connection's first packet passes the nat table.
    assert.equal(await nfacctPackets(c, 'localhost_nps_accepted_pkts'), before + 1);
    assert.equal(await sample(c, localhostMetric), before + 1);
    // The same NodePort on the node's own address is not counted.
    repliedPods(
      await c.probe(c.node(0).namespace, {protocol: 'tcp', host: c.node(0).ip, port: nodePort, timeoutMs: 2000}),
      'node -> node IP NodePort',
    );
    assert.equal(await sample(c, localhostMetric), before + 1);
  });

  it('a packet conntrack marks INVALID, forwarded from one pod to another, is dropped and counted in ct_state_invalid_dropped_pkts, and /metrics says so', async (t) => {
    const c = live(t);
    if (!c) return;
    if (!hasPython) return t.skip('needs python3 to send a hand-made TCP segment on a raw socket');
    const [client, server] = [c.pod('pod-0-0'), c.pod('pod-0-1')];
    const before = await sample(c, invalidMetric);
    await execInNamespace(client.namespace, ['python3', '-c', invalidSegmentScript, client.ip, server.ip, String(demoPorts.http)]);
    await until('the INVALID packet counted', async () => (await nfacctPackets(c, 'ct_state_invalid_dropped_pkts')) === before + 1, 5000);
    assert.equal(await sample(c, invalidMetric), before + 1);
    // Ordinary traffic between the same pods is not.
    repliedPods(await c.probe(client.namespace, {protocol: 'tcp', host: server.ip, port: demoPorts.http, timeoutMs: 2000}), 'pod -> pod');
    assert.equal(await sample(c, invalidMetric), before + 1);
  });

  it('the drift checks that followed (syncPeriod 3 s) read the counting rules back as written: nothing repaired', async (t) => {
    const c = live(t);
    if (!c) return;
    // Each sync period reads the rules at least once; two of them have passed by now.
    await sleep(7000);
    assert.equal(
      await c.agents[0].metric('proxyctl_drift_repairs_total', {ip_family: 'IPv4'}),
      0,
      c.agents[0].lines.filter((line) => line.includes('behind our back')).join('\n'),
    );
  });
});
