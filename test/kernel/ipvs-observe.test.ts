// The observing agent in ipvs mode against a kernel with IP_VS: a proxyctl-agent in ipvs mode
// stands in for kube-proxy on a namespace node, and a proxyctl-agent --observe beside it finds
// ipvs mode on its own (virtual servers with kube-ipvs0), reports no drift, looks past the
// connection counts traffic changes (the table read as a file where the agent runs in the node's
// namespace, as the DaemonSet does, and through a process kept in the node's namespace with --netns),
// names the service port whose real server was deleted by hand
// (spelling it from /proc/net/ip_vs, with no ipvsadm -Sn), notices by itself (its drift checks 10
// minutes apart) a set entry and an address deleted by hand, and runs only commands that read.
//
// This machine's kernel has no IP_VS: on such a host the file boots a qemu guest with Debian's
// stock kernel (scripts/qemu/guest.ts) and runs its cases there.
import assert from 'node:assert/strict';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, it, type TestContext} from 'node:test';
import {parseIpvsadmSave, serverTableBlocks, serverTableShape} from '../../src/core/ipvs/index.ts';
import {execInNamespace} from '../../src/lab/netns/index.ts';
import {freeLoopbackPorts} from '../../src/lab/agent-process.ts';
import {AgentClient} from '../../src/plugin/lib/agent-client.ts';
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

const inGuest = process.env.PROXYCTL_IN_GUEST === '1';
const runHere = !kernelUnavailable && (inGuest || hostHasIpvs());
const servers = {'pod-0-1': {app: 'web'}, 'pod-0-2': {app: 'web'}};
/** The stand-in: ipvs mode, a drift check only every 5 minutes, so that a deleted real server stays deleted. */
const standInConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
ipvs:
  scheduler: rr
  syncPeriod: 300s
  minSyncPeriod: 200ms
`;
/** The observer's commands (its --v 4 "run" lines) that only read. */
const readCommand =
  /command="(ip netns exec \S+ )?(iptables(-nft|-legacy)?-save( -t \w+)?|ip6?tables(-nft|-legacy)? --version|ip6?tables(-nft|-legacy)? -w 5 -W 100000 -t \w+ -S \S+|nft (-[jt] )?list .*|nfacct (get|list)\b.*|sysctl -n .*|ip (-j |-br )?(link|addr) show.*|ipvsadm -[LS].*|cat( \/proc\/net\/ip_vs)?|ipset (save|list).*)"/;

let cluster: LiveCluster | undefined;
let observer: AgentChild | undefined;
let client: AgentClient | undefined;
let dir: string | undefined;

function live(t: TestContext): LiveCluster | undefined {
  if (!cluster) t.skip(`needs root: ${kernelUnavailable}`);
  return cluster;
}

async function start(name: string, flags: string[]): Promise<AgentChild> {
  const [healthz, metrics] = await freeLoopbackPorts(2);
  const agent = new AgentChild(cluster!.node(0), join(dir!, 'kubeconfig'), [healthz, metrics], {verbosity: 4, extraFlags: flags});
  cluster!.agents.push(agent);
  agent.start();
  try {
    // Under software emulation Node takes long to start.
    await agent.waitSynced(120_000);
  } catch (error) {
    throw new Error(`${name}: ${(error as Error).message}; its log:\n${agent.lines.join('\n')}`);
  }
  return agent;
}

describe('observing agent in ipvs mode on a kernel with IP_VS', {concurrency: false, timeout: 1_200_000}, () => {
  if (!runHere && !kernelUnavailable) {
    itRunsInGuest(import.meta.url, {timeoutMs: 1_000_000});
    return;
  }

  before(async () => {
    if (!runHere) return;
    assert.ok(hostHasIpvs(), 'modprobe ip_vs failed in a kernel that should have it');
    dir = await mkdtemp(join(tmpdir(), 'pxk-ipvs-observe-'));
    await writeFile(join(dir, 'config.yaml'), standInConfig);
    cluster = await startLiveCluster({nodes: 1, podsPerNode: 3, externalClients: 0, servers, agentsOn: []});
    await writeFile(join(dir, 'kubeconfig'), cluster.server.kubeconfig(), {mode: 0o600});
    for (const name of ['web', 'api', 'db']) cluster.server.store.create('services', serviceObject(name, {app: 'web'}), 'default');
    await start('the stand-in for kube-proxy', ['--config', join(dir, 'config.yaml'), '--api-bind-address=']);
    const [api] = await freeLoopbackPorts(1);
    // Its periodic drift check 10 minutes apart: a change it notices within the test, it noticed by its own looks.
    observer = await start('the observer', ['--observe', `--api-bind-address=127.0.0.1:${api}`, '--ipvs-sync-period=10m']);
    client = await AgentClient.connect({url: `ws://127.0.0.1:${api}/`, timeoutMs: 30_000, label: 'the observer'});
  });
  after(async () => {
    client?.close();
    for (const agent of cluster?.agents ?? []) await agent.kill('SIGKILL');
    await cluster?.close();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it('finds kube-proxy ipvs mode on its own and reports no drift', async (t) => {
    if (!live(t)) return;
    const status = await client!.call('status', {});
    assert.equal(status.observe?.observing, 'kube-proxy ipvs');
    assert.equal(status.observe?.finding, 'detected', status.observe?.summary);
    assert.match(status.observe!.summary, /ipvs virtual servers with kube-ipvs0/);
    const diff = await client!.call('diff', {});
    assert.equal(diff.equal, true, diff.text);
  });

  it("traffic through a virtual server changes only the kernel's connection counts: the looks print no servers for it", async (t) => {
    const c = live(t);
    if (!c) return;
    const clusterIP = (c.server.store.get('services', 'default', 'web') as unknown as {spec: {clusterIP: string}}).spec.clusterIP;
    repliedPods(await c.probe(c.pod('pod-0-0').namespace, {protocol: 'tcp', host: clusterIP, port: 80, timeoutMs: 4000}, 4), 'web');
    const table = (await execInNamespace(c.node(0).namespace, ['cat', '/proc/net/ip_vs'])).stdout;
    const counts = [...table.matchAll(/^ {2}-> \S+ +\S+ +\d+ +(\d+) +(\d+)/gm)].map((match) => Number(match[1]) + Number(match[2]));
    assert.ok(
      counts.some((count) => count > 0),
      `the probes are counted in /proc/net/ip_vs:\n${table}`,
    );
    const from = observer!.lines.length;
    await until('two looks', () => observer!.logged(/ run command=.*ipset list -t/, from).length >= 2, 60_000);
    assert.deepEqual(observer!.logged(/ run command=.*ipvsadm -Sn/, from), []);
    // The table is read through the process the observer keeps in the node's namespace, with no command.
    assert.deepEqual(observer!.logged(/ run command=.*cat \/proc\/net\/ip_vs/, from), []);
    assert.equal(observer!.logged(/ run command="ip netns exec \S+ cat"/).length, 1, 'one anchor, started once');
  });

  it("in the agent's own namespace (the DaemonSet's) the table is read as a file, and holds what cat prints there", async (t) => {
    const c = live(t);
    if (!c) return;
    // A Node process inside the node's namespace, as the DaemonSet's agent is in the host's, reads it through CommandHost without --netns.
    const hostModule = new URL('../../src/agent/host/command-host.ts', import.meta.url).href;
    const program = `import {CommandHost} from ${JSON.stringify(hostModule)}; process.stdout.write(await new CommandHost().ipvsTable());`;
    const [read, printed] = await Promise.all([
      execInNamespace(c.node(0).namespace, [process.execPath, '--input-type=module', '-e', program], {timeoutMs: 120_000}),
      execInNamespace(c.node(0).namespace, ['cat', '/proc/net/ip_vs']),
    ]);
    assert.equal(serverTableShape(read.stdout), serverTableShape(printed.stdout));
    assert.equal(
      serverTableBlocks(read.stdout).size,
      parseIpvsadmSave((await execInNamespace(c.node(0).namespace, ['ipvsadm', '-Sn'])).stdout).length,
    );
  });

  it('a real server deleted by hand: diff names the service port', async (t) => {
    const c = live(t);
    if (!c) return;
    const clusterIP = (c.server.store.get('services', 'default', 'web') as unknown as {spec: {clusterIP: string}}).spec.clusterIP;
    const servers = parseIpvsadmSave((await execInNamespace(c.node(0).namespace, ['ipvsadm', '-Sn'])).stdout);
    const web = servers.find((server) => server.address === clusterIP && server.port === 80);
    assert.ok(web && web.realServers.length === 2, `web's virtual server with two real servers: ${JSON.stringify(servers)}`);
    const real = `${web.realServers[0].address}:${web.realServers[0].port}`;
    const from = observer!.lines.length;
    await execInNamespace(c.node(0).namespace, ['ipvsadm', '-d', '-t', `${clusterIP}:80`, '-r', real]);
    await until('the observer to see it', async () => !(await client!.call('diff', {})).equal, 20_000);
    assert.deepEqual(observer!.logged(/ run command=.*ipvsadm -Sn/, from), [], 'the changed server is spelled from the kernel table');
    const diff = await client!.call('diff', {});
    const group = diff.groups.find((candidate) => candidate.servicePort === 'default/web:http');
    assert.ok(group, `diff names default/web:http: ${diff.text}`);
    assert.ok(group.explanations && group.explanations.length > 0, JSON.stringify(group));
  });

  it('a set entry and an address deleted by hand: the observer logs each service port drifting, no request asking', async (t) => {
    const c = live(t);
    if (!c) return;
    const namespace = c.node(0).namespace;
    const clusterIP = (name: string) =>
      (c.server.store.get('services', 'default', name) as unknown as {spec: {clusterIP: string}}).spec.clusterIP;
    const from = observer!.lines.length;
    await execInNamespace(namespace, ['ip', 'addr', 'del', `${clusterIP('api')}/32`, 'dev', 'kube-ipvs0']);
    const address = await observer!.waitForLog(/service port drifted .*servicePort=default\/api:http/, {from, timeoutMs: 90_000});
    t.diagnostic(address);
    await execInNamespace(namespace, ['ipset', 'del', 'KUBE-CLUSTER-IP', `${clusterIP('db')},tcp:80`]);
    const entry = await observer!.waitForLog(/service port drifted .*servicePort=default\/db:http/, {from, timeoutMs: 90_000});
    t.diagnostic(entry);
    assert.match(
      observer!.logged(/agent api: ipvs state changed/, from).join('\n'),
      /ipvs kube-ipvs0 addresses[^]*ipvs sets KUBE-CLUSTER-IP/,
    );
  });

  it('the observer ran no command that writes', async (t) => {
    if (!live(t)) return;
    const commands = observer!.logged(/ run command=/);
    assert.ok(commands.length > 0);
    assert.deepEqual(
      commands.filter((line) => !readCommand.test(line)),
      [],
    );
    assert.deepEqual(observer!.logged(/refused/), []);
  });
});
