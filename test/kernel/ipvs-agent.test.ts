// The agent in ipvs mode against a kernel with IP_VS: a real proxyctl-agent process
// (--proxy-mode ipvs --netns NODE) against the embedded API server, in a namespace cluster. A
// ClusterIP answers from a pod through IPVS; a removed endpoint drains at weight 0 while a
// connection to it lives, then goes; a deleted Service leaves no virtual server, set entry or
// kube-ipvs0 address; `--cleanup` leaves nothing of the agent's and keeps what is foreign.
//
// This machine's kernel has no IP_VS: on such a host the file boots a qemu guest with Debian's
// stock kernel (scripts/qemu/guest.ts) and runs its cases there.
import assert from 'node:assert/strict';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it, type TestContext} from 'node:test';
import {main as agentMain} from '../../src/agent/main.ts';
import {parseBoundAddresses, parseIpsetSave, parseIpvsadmSave} from '../../src/core/ipvs/index.ts';
import {execInNamespace, spawnInNamespace} from '../../src/lab/netns/index.ts';
import {hostHasIpvs} from '../../scripts/qemu/guest.ts';
import {itRunsInGuest} from './in-guest.ts';
import {
  AgentChild,
  kernelUnavailable,
  type LiveCluster,
  repliedPods,
  serviceObject,
  startLiveCluster,
  until,
} from '../agent/live/live-cluster.ts';
import {freeLoopbackPorts} from '../../src/lab/agent-process.ts';
import {AgentClient} from '../../src/plugin/lib/agent-client.ts';

const inGuest = process.env.PROXYCTL_IN_GUEST === '1';
const runHere = !kernelUnavailable && (inGuest || hostHasIpvs());

// node-0: pod-0-0 client, pod-0-1 and pod-0-2 web.
const servers = {'pod-0-1': {app: 'web'}, 'pod-0-2': {app: 'web'}};
/** A sync every 3 s compares with the kernel; FIN_WAIT entries expire after 2 s (ipvsadm --set). */
const config = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
ipvs:
  scheduler: rr
  syncPeriod: 3s
  minSyncPeriod: 200ms
  strictARP: true
  tcpFinTimeout: 2s
`;

let cluster: LiveCluster | undefined;
let dir: string | undefined;
let apiPort = 0;

function live(t: TestContext): LiveCluster | undefined {
  if (!cluster) t.skip(`needs root: ${kernelUnavailable}`);
  return cluster;
}

async function inNode(command: string[], input?: string): Promise<string> {
  return (await execInNamespace(cluster!.node(0).namespace, command, input === undefined ? {} : {input})).stdout;
}

async function virtualServers() {
  return parseIpvsadmSave(await inNode(['ipvsadm', '-Sn']));
}

async function boundAddresses(): Promise<string[]> {
  // No kube-ipvs0: no address.
  const stdout = await inNode(['ip', '-j', 'addr', 'show', 'dev', 'kube-ipvs0']).catch(() => '');
  return parseBoundAddresses(stdout);
}

function clusterIPOf(name: string): string {
  return (cluster!.server.store.get('services', 'default', name) as unknown as {spec: {clusterIP: string}}).spec.clusterIP;
}

function podIP(name: string): string {
  return cluster!.pod(name).ip;
}

describe('agent in ipvs mode on a kernel with IP_VS', {concurrency: false, timeout: 1_200_000}, () => {
  if (!runHere && !kernelUnavailable) {
    itRunsInGuest(import.meta.url, {timeoutMs: 1_000_000});
    return;
  }

  before(async () => {
    if (!runHere) return;
    assert.ok(hostHasIpvs(), 'modprobe ip_vs failed in a kernel that should have it');
    dir = await mkdtemp(join(tmpdir(), 'pxk-ipvs-agent-'));
    const file = join(dir, 'config.yaml');
    await writeFile(file, config);
    cluster = await startLiveCluster({nodes: 1, podsPerNode: 3, externalClients: 0, servers, agentsOn: []});
    // Started here rather than by startLiveCluster: under software emulation the agent's start
    // (Node loading TypeScript) takes longer than the lab's usual wait.
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(kubeconfig, cluster.server.kubeconfig(), {mode: 0o600});
    const [healthz, metrics, api] = await freeLoopbackPorts(3);
    apiPort = api;
    const agent = new AgentChild(cluster.node(0), kubeconfig, [healthz, metrics], {
      verbosity: 2,
      extraFlags: ['--config', file, `--api-bind-address=127.0.0.1:${api}`],
    });
    cluster.agents.push(agent);
    agent.start();
    try {
      await agent.waitSynced(120_000);
    } catch (error) {
      throw new Error(`${(error as Error).message}; the agent's log:\n${agent.lines.join('\n')}`);
    }
  });
  after(async () => {
    for (const agent of cluster?.agents ?? []) await agent.kill('SIGKILL');
    await cluster?.close();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it('runs the ipvs proxier (no fallback) and prepares the node: kube-ipvs0, sysctls, timeouts', async (t) => {
    const c = live(t);
    if (!c) return;
    const agent = c.agents[0];
    assert.deepEqual(agent.logged(/falling back/), [], agent.lines.join('\n'));
    await agent.waitForLog(/agent started.*mode=ipvs/);
    await inNode(['ip', 'link', 'show', 'kube-ipvs0']);
    for (const [name, value] of [
      ['net.ipv4.vs.conntrack', '1'],
      ['net.ipv4.vs.expire_nodest_conn', '1'],
      ['net.ipv4.vs.expire_quiescent_template', '1'],
      ['net.ipv4.conf.all.arp_ignore', '1'],
      ['net.ipv4.conf.all.arp_announce', '2'],
    ]) {
      assert.equal((await inNode(['sysctl', '-n', name])).trim(), value, name);
    }
    assert.match(await inNode(['ipvsadm', '-L', '--timeout']), /Timeout \(tcp tcpfin udp\): \d+ 2 \d+/, 'tcpFinTimeout 2s');
  });

  it('a ClusterIP answers from a pod through a virtual server with one real server per endpoint', async (t) => {
    const c = live(t);
    if (!c) return;
    c.server.store.create('services', serviceObject('web', {app: 'web'}), 'default');
    const vip = clusterIPOf('web');
    await until(
      'the virtual server of web with both pods',
      async () => {
        const server = (await virtualServers()).find((candidate) => candidate.address === vip && candidate.port === 80);
        return server?.realServers.length === 2;
      },
      30_000,
    );
    const server = (await virtualServers()).find((candidate) => candidate.address === vip && candidate.port === 80)!;
    assert.equal(server.scheduler, 'rr');
    assert.deepEqual(
      server.realServers.map((real) => `${real.address}:${real.port}:${real.weight}`).sort(),
      [`${podIP('pod-0-1')}:8080:1`, `${podIP('pod-0-2')}:8080:1`].sort(),
    );
    assert.ok((await boundAddresses()).includes(vip), 'the ClusterIP is on kube-ipvs0');
    const clusterSet = parseIpsetSave(await inNode(['ipset', 'save'])).find((set) => set.name === 'KUBE-CLUSTER-IP')!;
    assert.ok(clusterSet.entries.includes(`${vip},tcp:80`), clusterSet.entries.join(' '));
    const pods = repliedPods(
      await c.probe(c.pod('pod-0-0').namespace, {protocol: 'tcp', host: vip, port: 80, timeoutMs: 4000}, 6),
      'web from pod-0-0',
    );
    assert.deepEqual([...new Set(pods)].sort(), ['pod-0-1', 'pod-0-2'], 'rr spreads over both endpoints');
  });

  it("the plugin's API answers in ipvs mode: status, diff against the kernel, trace to both endpoints", async (t) => {
    const c = live(t);
    if (!c) return;
    const client = await AgentClient.connect({url: `ws://127.0.0.1:${apiPort}/`, timeoutMs: 60_000, label: 'the agent on node-0'});
    try {
      const status = await client.call('status', {});
      assert.equal(status.mode, 'ipvs');
      const diff = await client.call('diff', {});
      assert.equal(diff.equal, true, diff.text);
      const vip = clusterIPOf('web');
      const trace = await client.call('trace', {
        packet: {srcIP: podIP('pod-0-0'), dstIP: vip, dstPort: 80, protocol: 'TCP', origin: 'arriving'},
      });
      assert.equal(trace.servicePort, 'default/web:http');
      assert.equal(trace.drifted, false);
      assert.deepEqual(trace.branches.length, 2, JSON.stringify(trace.branches));
      assert.match((await client.call('rules.applied', {})).text, new RegExp(`-A -t ${vip.replaceAll('.', '\\.')}:80 -s rr`));
    } finally {
      client.close();
    }
  });

  it('a removed endpoint drains at weight 0 while a connection to it lives, and goes once it closes', async (t) => {
    const c = live(t);
    if (!c) return;
    const vip = clusterIPOf('web');
    // A connection that stays open: the demo server keeps an idle HTTP connection.
    const holder = spawnInNamespace(c.pod('pod-0-0').namespace, [
      process.execPath,
      '-e',
      `const s=require('node:net').connect(80,${JSON.stringify(vip)});s.on('connect',()=>console.log('open'));s.on('error',()=>{});setInterval(()=>{},1000)`,
    ]);
    t.after(() => holder.kill('SIGKILL'));
    let held: string | undefined;
    await until('the held connection in ipvsadm -Lnc', async () => {
      const line = (await inNode(['ipvsadm', '-Lnc']))
        .split('\n')
        .find((text) => text.includes(`${vip}:80`) && text.includes('ESTABLISHED'));
      held = line?.trim().split(/\s+/)[5];
      return held !== undefined;
    });
    const heldIP = held!.split(':')[0];
    const heldPod = heldIP === podIP('pod-0-1') ? 'pod-0-1' : 'pod-0-2';
    c.server.store.mutate('pods', 'default', heldPod, (object) => {
      object.metadata.labels = {app: 'retired'};
    });
    await until(`${heldPod}'s real server at weight 0`, async () => {
      const server = (await virtualServers()).find((candidate) => candidate.address === vip && candidate.port === 80);
      return server?.realServers.some((real) => real.address === heldIP && real.weight === 0) ?? false;
    });
    // Draining: new connections go to the other endpoint only, while the real server stays.
    const others = repliedPods(
      await c.probe(c.pod('pod-0-0').namespace, {protocol: 'tcp', host: vip, port: 80, timeoutMs: 4000}, 4),
      'web while draining',
    );
    assert.deepEqual([...new Set(others)], [heldPod === 'pod-0-1' ? 'pod-0-2' : 'pod-0-1']);
    const server = (await virtualServers()).find((candidate) => candidate.address === vip && candidate.port === 80)!;
    assert.ok(
      server.realServers.some((real) => real.address === heldIP),
      'still there while its connection lives',
    );

    holder.kill('SIGKILL');
    const ms = await until(
      `${heldPod}'s real server deleted`,
      async () => {
        const current = (await virtualServers()).find((candidate) => candidate.address === vip && candidate.port === 80);
        return current !== undefined && !current.realServers.some((real) => real.address === heldIP);
      },
      30_000,
    );
    t.diagnostic(`real server deleted ${ms} ms after its last connection closed`);
    assert.ok(c.agents[0].logged(/real server draining at weight 0/).length > 0);
  });

  it('a deleted Service leaves no virtual server, set entry or kube-ipvs0 address', async (t) => {
    const c = live(t);
    if (!c) return;
    const vip = clusterIPOf('web');
    c.server.store.delete('services', 'default', 'web');
    await until('web gone from IPVS, the sets and kube-ipvs0', async () => {
      const servers = await virtualServers();
      const sets = parseIpsetSave(await inNode(['ipset', 'save']));
      return (
        !servers.some((server) => server.address === vip) &&
        !(await boundAddresses()).includes(vip) &&
        !sets.some((set) => set.entries.some((entry) => entry.startsWith(`${vip},`)))
      );
    });
    // The kubernetes Service stays.
    assert.ok(
      (await virtualServers()).some((server) => server.port === 443),
      'the default kubernetes Service keeps its virtual server',
    );
  });

  it('--cleanup removes virtual servers, KUBE- sets, kube-ipvs0 and the iptables layer; foreign state stays', async (t) => {
    const c = live(t);
    if (!c) return;
    await c.agents[0].kill('SIGTERM');
    assert.ok((await virtualServers()).length > 0, 'the agent leaves its state when it stops');
    // Foreign state, added after the agent stopped (a running agent deletes virtual servers it does not want, as kube-proxy does).
    await inNode(['ipvsadm', '-A', '-t', '192.0.2.10:80', '-s', 'rr']);
    await inNode(['ipset', 'create', 'foreign-set', 'hash:ip']);
    await inNode(['iptables', '-t', 'nat', '-N', 'FOREIGN-CHAIN']);
    const namespace = c.node(0).namespace;
    // proxyctl-agent's main with the flags, in this process: a second Node start costs half a minute under emulation.
    assert.equal(await agentMain(['--cleanup', '--netns', namespace, '--v', '2']), 0);
    assert.deepEqual(
      (await virtualServers()).map((server) => `${server.address}:${server.port}`),
      ['192.0.2.10:80'],
    );
    const sets = parseIpsetSave(await inNode(['ipset', 'save']), '');
    assert.deepEqual(
      sets.map((set) => set.name),
      ['foreign-set'],
    );
    const link = await inNode(['ip', 'link', 'show', 'kube-ipvs0']).then(
      () => 'present',
      () => 'gone',
    );
    assert.equal(link, 'gone', 'kube-ipvs0 is gone');
    const saved = (await inNode(['iptables-save']))
      .split('\n')
      .filter((line) => /KUBE-/.test(line) && !/KUBE-(FIREWALL|KUBELET-CANARY|MARK-DROP)/.test(line));
    assert.deepEqual(saved, [], 'no KUBE- chain or rule of the proxy remains');
    assert.match(await inNode(['iptables-save', '-t', 'nat']), /:FOREIGN-CHAIN/);
  });
});
