// migrate-check's host-socket evidence against a real namespace. The node holds a ClusterIP, as
// ipvs mode's kube-ipvs0 does, and a process listens on 0.0.0.0: a connection to the ClusterIP on
// that port really reaches the process, and the evidence, read through an observing agent's
// read-only host (ss in the namespace), names the socket and the address. With kube-proxy's
// KUBE-IPVS-FILTER loaded (its sets and iptables layer, as ipvs mode writes them) the connection is
// refused, and the evidence says that no host socket answers. This kernel has neither IP_VS nor the
// dummy driver: the address is bound to lo (to the socket, a local address is a local address) and
// the virtual servers are the rendered ones; the rest is read from the namespace.
import assert from 'node:assert/strict';
import {execFileSync, spawn} from 'node:child_process';
import {once} from 'node:events';
import {test} from 'node:test';
import {hostSocketEvidence} from '../../src/agent/api/methods/behaviour.ts';
import {CommandHost} from '../../src/agent/host/command-host.ts';
import {ReadOnlyHost} from '../../src/agent/host/read-only-host.ts';
import {
  formatIpsetRestore,
  parseBoundAddresses,
  parseIpsetSave,
  renderIpvs,
  withJumpRules,
  type IpvsState,
} from '../../src/core/ipvs/index.ts';
import {buildProxyModel} from '../../src/core/model/index.ts';
import {node, service, slice} from '../core/model/cluster-objects.ts';
import {createNetns, inNetns, isRoot} from './netns.ts';

const clusterIP = '10.96.0.10';
const hostPort = 2222;

/** One connection from inside the namespace: "reply <text>" or the error code. */
function connect(netns: string, address: string, port: number): string {
  const script =
    `require('net').connect(${port}, '${address}').setTimeout(3000)` +
    `.on('data', (d) => { console.log('reply ' + d); process.exit(0); })` +
    `.on('timeout', () => { console.log('timeout'); process.exit(0); })` +
    `.on('error', (e) => { console.log(e.code); process.exit(0); });`;
  return execFileSync('ip', ['netns', 'exec', netns, process.execPath, '-e', script], {encoding: 'utf8'}).trim();
}

test('host sockets that answer on a ClusterIP only through kube-ipvs0, in a real namespace', async (t) => {
  if (!isRoot) {
    t.skip('needs root: makes a network namespace with a dummy device, a listener, ipsets and iptables rules');
    return;
  }
  const netns = createNetns(t);
  inNetns(netns, ['ip', 'link', 'set', 'lo', 'up']);
  inNetns(netns, ['ip', 'addr', 'add', `${clusterIP}/32`, 'dev', 'lo']);

  const listener = spawn(
    'ip',
    [
      'netns',
      'exec',
      netns,
      process.execPath,
      '-e',
      `require('net').createServer((s) => s.end('hello')).listen(${hostPort}, '0.0.0.0', () => console.log('listening'));`,
    ],
    {stdio: ['ignore', 'pipe', 'inherit']},
  );
  t.after(() => listener.kill());
  const [first] = await once(listener.stdout!, 'data');
  assert.equal(String(first).trim(), 'listening');

  const model = buildProxyModel(
    {
      services: [service('web', {clusterIP})],
      endpointSlices: [slice('web-1', 'web', [{ip: '10.244.1.5', node: 'node-1'}])],
      node: node('node-1'),
    },
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
  );
  const rendered = renderIpvs(model);
  const host = new ReadOnlyHost(new CommandHost({netns}));
  // What the agent reads of the node, but the virtual servers, which need IP_VS.
  const applied = async (): Promise<IpvsState> => ({
    ...rendered,
    boundAddresses: parseBoundAddresses(await host.ip(['-j', 'addr', 'show', 'dev', 'lo'])).filter((address) => address === clusterIP),
    sets: parseIpsetSave(await host.ipset(['save'])),
    iptables: await host.iptablesSave('IPv4'),
  });

  assert.equal(connect(netns, clusterIP, hostPort), 'reply hello', 'the host socket answers on the ClusterIP');
  const open = await hostSocketEvidence(host, [await applied()], 'nftables');
  assert.deepEqual(open, [
    `host socket 0.0.0.0:${hostPort}/TCP (${/"([^"]+)",pid=/.exec(await host.listeningSockets())?.[1]}, pid ${listener.pid}) answers on ${clusterIP} ` +
      'today, only because ipvs mode binds that address to kube-ipvs0; after the switch to nftables mode it would not',
  ]);

  // kube-proxy's filter (kubernetes#108460), loaded as ipvs mode loads it.
  inNetns(netns, ['ipset', 'restore'], formatIpsetRestore(rendered.sets, 'IPv4'));
  inNetns(netns, ['iptables-restore'], withJumpRules(rendered.iptables));
  assert.equal(connect(netns, clusterIP, hostPort), 'ECONNREFUSED', 'KUBE-IPVS-FILTER refuses it');
  assert.deepEqual(await hostSocketEvidence(host, [await applied()], 'nftables'), [
    "no host socket answers on the 1 service address bound to kube-ipvs0 (the node's KUBE-IPVS-FILTER refuses new connections on ports no " +
      'service uses): nothing that answers there today stops answering after the switch',
  ]);
  assert.deepEqual(host.refused, [], 'only reads');
});
