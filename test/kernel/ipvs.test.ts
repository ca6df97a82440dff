// ipvs mode against the kernel: render each node's model, load the virtual servers, ipsets,
// kube-ipvs0 addresses and iptables layer into the node namespaces of a namespace cluster, send real
// TCP and UDP, and check what the endpoints saw, what the tracer predicted from the state read back,
// and that the state read back equals the desired one.
//
// This machine's kernel has no IP_VS, so on such a host the file boots a qemu guest with Debian's
// stock kernel (scripts/qemu/guest.ts) once and runs all its cases there in one go.
import assert from 'node:assert/strict';
import {after, before, describe, it, type TestContext} from 'node:test';
import {relative} from 'node:path';
import {fileURLToPath} from 'node:url';
import {
  diffIpvs,
  formatIpsetRestore,
  formatIpvsadmRestore,
  parseBoundAddresses,
  parseIpsetSave,
  parseIpvsadmSave,
  planIpvsSync,
  renderIpvs,
  traceIpvs,
  withJumpRules,
  type IpvsState,
} from '../../src/core/ipvs/index.ts';
import {buildProxyModel, type EndpointSliceInput, type ServiceInput} from '../../src/core/model/index.ts';
import type {TraceResult} from '../../src/core/trace/types.ts';
import {execInNamespace, type NodeDescription} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {probeFromNamespace} from '../../src/lab/workload/launch.ts';
import {guestUnavailableReason, hostHasIpvs, repoRoot, runInGuest} from '../../scripts/qemu/guest.ts';
import {demoPorts, findPod, kernelUnavailable, type KernelLab, nodeAddresses, nodeObject, restoreIptables, saveIptables, startKernelLab} from './namespace-lab.ts';

// node-0: pod-0-0 client, pod-0-1 and pod-0-2 servers, pod-0-3 talks to itself (hairpin)
// node-1: pod-1-0 server, pod-1-2 client
// client-0 and client-1 outside the cluster CIDR, routed through node-0
const servers = ['pod-0-1', 'pod-0-2', 'pod-0-3', 'pod-1-0'];
const loadBalancerIP = '10.250.0.30';
const externalIP = '10.250.0.20';
const clusterIPs = {web: '10.96.0.10', sticky: '10.96.0.11', empty: '10.96.0.12', external: '10.96.0.13', hairpin: '10.96.0.14', npCluster: '10.96.0.15', npLocal: '10.96.0.16', lb: '10.96.0.17'};
const nodePorts = {cluster: 30080, local: 30081, lb: 30082};

const httpPort = {name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http};
const dnsPort = {name: 'dns', protocol: 'UDP', port: 53, targetPort: demoPorts.udp};

function service(name: string, spec: NonNullable<ServiceInput['spec']>, status?: ServiceInput['status']): ServiceInput {
  return {apiVersion: 'v1', kind: 'Service', metadata: {name, namespace: 'default'}, spec: {type: 'ClusterIP', ports: [httpPort], ...spec, clusterIPs: [spec.clusterIP!]}, ...(status ? {status} : {})};
}

function slice(serviceName: string, pods: Array<{ip: string; node: string}>, udp = false): EndpointSliceInput {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name: `${serviceName}-1`, namespace: 'default', labels: {'kubernetes.io/service-name': serviceName}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: demoPorts.http}, ...(udp ? [{name: 'dns', protocol: 'UDP', port: demoPorts.udp}] : [])],
    endpoints: pods.map((pod) => ({addresses: [pod.ip], nodeName: pod.node, conditions: {ready: true, serving: true, terminating: false}})),
  };
}

interface Sender {
  name: string;
  namespace: string;
  ip: string;
  inInterface: string;
}

interface Target {
  protocol: 'tcp' | 'udp';
  ip: string;
  port: number;
}

/** Where this file's cases run: here (root, kernel with IP_VS), in a qemu guest, or nowhere (and why). */
const inGuest = process.env.PROXYCTL_IN_GUEST === '1';
const runHere = !kernelUnavailable && (inGuest || hostHasIpvs());

let lab: KernelLab | undefined;
const desiredStates = new Map<string, IpvsState>();
const appliedStates = new Map<string, IpvsState>();
const localAddresses = new Map<string, string[]>();
let clusterServices: ServiceInput[] = [];
let clusterSlices: EndpointSliceInput[] = [];

/** desiredFor renders what the proxy on `entry` wants for these objects. */
function desiredFor(entry: NodeDescription, slices: EndpointSliceInput[]): IpvsState {
  const model = buildProxyModel({services: clusterServices, endpointSlices: slices, node: nodeObject(entry)}, {family: 'IPv4', clusterCIDRs: [lab!.topology.clusterCIDR]});
  assert.deepEqual(model.problems, [], `model of ${entry.name}`);
  return renderIpvs(model);
}

function skipUnlessLab(t: TestContext): KernelLab | undefined {
  if (!lab) t.skip(kernelUnavailable ? `needs root: ${kernelUnavailable}` : 'runs in the qemu guest (see the guest case)');
  return lab;
}

function pod(name: string): Sender {
  const found = findPod(lab!.topology, name);
  return {name, namespace: found.namespace, ip: found.ip, inInterface: found.hostInterface};
}

function client(index: number): Sender {
  const found = lab!.topology.externalClients[index];
  return {name: found.name, namespace: found.namespace, ip: found.ip, inInterface: found.interface};
}

function node(index: number): NodeDescription {
  return lab!.topology.nodes[index];
}

async function send(sender: Sender, target: Target, count = 1, timeoutMs = 4000): Promise<ProbeResult[]> {
  return probeFromNamespace(sender.namespace, {protocol: target.protocol, host: target.ip, port: target.port, timeoutMs}, count);
}

/** applyIpvsState loads the state into the node's namespace the way ipvs mode's first sync does. */
async function applyIpvsState(entry: NodeDescription, state: IpvsState): Promise<void> {
  const inNode = (command: string[], input?: string) => execInNamespace(entry.namespace, command, input === undefined ? {} : {input});
  // kube-proxy's ipvs sysctls: conntrack for the iptables layer's masquerade, quick expiry of dead real servers.
  await inNode(['sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.ipv4.vs.conntrack=1', 'net.ipv4.vs.expire_nodest_conn=1', 'net.ipv4.vs.expire_quiescent_template=1']);
  await inNode(['ip', 'link', 'add', 'kube-ipvs0', 'type', 'dummy']);
  for (const address of state.boundAddresses) await inNode(['ip', 'addr', 'add', `${address}/32`, 'dev', 'kube-ipvs0']);
  await inNode(['ipset', 'restore'], formatIpsetRestore(state.sets, state.family));
  await inNode(['ipvsadm-restore'], formatIpvsadmRestore(state.virtualServers));
  await restoreIptables(entry, withJumpRules(state.iptables));
}

/** readIpvsState reads the node's state back with the tools an operator would use. */
async function readIpvsState(entry: NodeDescription): Promise<IpvsState> {
  const inNode = async (command: string[]) => (await execInNamespace(entry.namespace, command)).stdout;
  return {
    family: 'IPv4',
    virtualServers: parseIpvsadmSave(await inNode(['ipvsadm', '-Sn'])),
    sets: parseIpsetSave(await inNode(['ipset', 'save'])),
    boundAddresses: parseBoundAddresses(await inNode(['ip', '-j', 'addr', 'show', 'dev', 'kube-ipvs0'])),
    iptables: await saveIptables(entry),
  };
}

function trace(entry: NodeDescription, sender: Sender, target: Target): TraceResult {
  return traceIpvs(
    appliedStates.get(entry.name)!,
    {srcIP: sender.ip, dstIP: target.ip, dstPort: target.port, protocol: target.protocol === 'tcp' ? 'TCP' : 'UDP', origin: 'arriving', inInterface: sender.inInterface},
    {localAddresses: localAddresses.get(entry.name)!},
  );
}

function describeTrace(result: TraceResult): string {
  const branches = result.branches.map((branch) => `${branch.endpoint} p=${branch.probability.toFixed(3)} masq=${branch.masquerade}`).join('; ');
  return `trace verdict ${result.verdict} [${branches}] via ${result.hops.map((hop) => `${hop.table}/${hop.chain}->${hop.target}`).join(' ')}`;
}

/** assertTraceAgrees: the endpoint reached is a predicted branch with the right masquerade; refusals and drops were predicted. */
function assertTraceAgrees(predicted: TraceResult, results: ProbeResult[], sender: Sender, target: Target): void {
  const context = `${sender.name} -> ${target.protocol} ${target.ip}:${target.port}: ${describeTrace(predicted)}`;
  for (const result of results) {
    switch (result.outcome) {
      case 'reply': {
        assert.equal(predicted.verdict, 'DNAT', `the kernel delivered to ${result.reply.pod}; ${context}`);
        const endpoint = `${result.reply.podIP}:${target.protocol === 'tcp' ? demoPorts.http : demoPorts.udp}`;
        const branch = predicted.branches.find((candidate) => candidate.endpoint === endpoint);
        assert.ok(branch, `the kernel reached ${endpoint}, not a predicted branch; ${context}`);
        assert.equal(branch.masquerade, result.reply.clientIP !== sender.ip, `the endpoint saw ${result.reply.clientIP} (sent from ${sender.ip}); ${context}`);
        break;
      }
      case 'refused':
        assert.equal(predicted.verdict, 'REJECT', `the kernel refused; ${context}`);
        break;
      case 'timeout':
        assert.equal(predicted.verdict, 'DROP', `the kernel dropped; ${context}`);
        break;
      default:
        assert.fail(`unexpected outcome ${JSON.stringify(result)}; ${context}`);
    }
  }
}

function replies(results: ProbeResult[], what: string): Array<Extract<ProbeResult, {outcome: 'reply'}>> {
  for (const result of results) assert.equal(result.outcome, 'reply', `${what}: ${JSON.stringify(result)}`);
  return results as Array<Extract<ProbeResult, {outcome: 'reply'}>>;
}

describe('ipvs mode in a kernel with IP_VS', {concurrency: false, timeout: 900_000}, () => {
  if (!runHere && !kernelUnavailable) {
    it('runs every case of this file in a qemu guest booting Debian\'s kernel', {timeout: 1_500_000}, async (t) => {
      const unavailable = guestUnavailableReason();
      if (unavailable) {
        t.skip(`this kernel has no IP_VS and no qemu guest can boot: ${unavailable}`);
        return;
      }
      const file = relative(repoRoot, fileURLToPath(import.meta.url));
      const result = await runInGuest([process.execPath, '--test', '--test-reporter=spec', file], {memoryMiB: 2048, timeoutMs: 1_400_000});
      const summary = result.stdout.split('\n').filter((line) => /^ℹ (tests|pass|fail|skipped|duration_ms)/.test(line));
      for (const line of summary) t.diagnostic(`guest: ${line}`);
      assert.equal(result.exitCode, 0, `the guest's test run failed (exit ${result.exitCode}${result.timedOut ? ', timed out' : ''}):\n${result.stdout}\n${result.stderr}\n${result.exitCode === undefined ? result.consoleLog : ''}`);
      assert.match(result.stdout, /ℹ fail 0/, result.stdout);
      assert.match(result.stdout, /ℹ skipped 0/, `cases skipped in the guest:\n${result.stdout}`);
    });
    return;
  }

  before(async () => {
    if (!runHere) return;
    assert.ok(hostHasIpvs(), 'modprobe ip_vs failed in a kernel that should have it');
    lab = await startKernelLab({nodes: 2, podsPerNode: 4, externalClients: 2, externalRoutes: [`${externalIP}/32`, `${loadBalancerIP}/32`]}, servers);
    const at = (name: string) => {
      const found = findPod(lab!.topology, name);
      return {ip: found.ip, node: found.node};
    };
    const threeEndpoints = [at('pod-0-1'), at('pod-0-2'), at('pod-1-0')];
    const services: ServiceInput[] = [
      service('web', {clusterIP: clusterIPs.web, ports: [httpPort, dnsPort]}),
      service('sticky', {clusterIP: clusterIPs.sticky, sessionAffinity: 'ClientIP'}),
      service('empty', {clusterIP: clusterIPs.empty, ports: [httpPort, dnsPort]}),
      service('external', {clusterIP: clusterIPs.external, externalIPs: [externalIP]}),
      service('hairpin', {clusterIP: clusterIPs.hairpin}),
      service('np-cluster', {type: 'NodePort', clusterIP: clusterIPs.npCluster, ports: [{...httpPort, nodePort: nodePorts.cluster}], externalTrafficPolicy: 'Cluster'}),
      service('np-local', {type: 'NodePort', clusterIP: clusterIPs.npLocal, ports: [{...httpPort, nodePort: nodePorts.local}], externalTrafficPolicy: 'Local'}),
      service(
        'lb',
        {type: 'LoadBalancer', clusterIP: clusterIPs.lb, ports: [{...httpPort, nodePort: nodePorts.lb}], loadBalancerSourceRanges: [`${lab.topology.externalClients[0].ip}/32`]},
        {loadBalancer: {ingress: [{ip: loadBalancerIP}]}},
      ),
    ];
    const slices: EndpointSliceInput[] = [
      slice('web', threeEndpoints, true),
      slice('sticky', threeEndpoints),
      slice('external', [at('pod-0-2')]),
      slice('hairpin', [at('pod-0-3')]),
      slice('np-cluster', [at('pod-1-0')]),
      slice('np-local', [at('pod-0-1')]),
      slice('lb', [at('pod-0-1'), at('pod-1-0')]),
    ];
    clusterServices = services;
    clusterSlices = slices;
    for (const entry of lab.topology.nodes) {
      const desired = desiredFor(entry, slices);
      await applyIpvsState(entry, desired);
      desiredStates.set(entry.name, desired);
      appliedStates.set(entry.name, await readIpvsState(entry));
      localAddresses.set(entry.name, await nodeAddresses(entry));
    }
  });
  after(async () => {
    await lab?.close();
  });

  it('the state read back from the kernel equals the desired state', (t) => {
    if (!skipUnlessLab(t)) return;
    for (const entry of lab!.topology.nodes) {
      const diff = diffIpvs(desiredStates.get(entry.name)!, appliedStates.get(entry.name)!);
      assert.ok(diff.equal, `${entry.name}:\n${diff.text}`);
    }
  });

  it('pod -> ClusterIP reaches an endpoint and keeps the pod source IP', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const results = await send(sender, target, 6);
    for (const result of replies(results, 'pod to ClusterIP')) assert.equal(result.reply.clientIP, sender.ip);
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('traffic to a ClusterIP from outside the cluster CIDR is masqueraded', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const results = await send(sender, target, 6);
    const nodeIPs = localAddresses.get(node(0).name)!;
    for (const result of replies(results, 'external client to ClusterIP')) {
      assert.ok(nodeIPs.includes(result.reply.clientIP), `endpoint saw ${result.reply.clientIP}, not one of node-0's addresses ${nodeIPs.join(', ')}`);
    }
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('NodePort with externalTrafficPolicy Cluster is masqueraded to the node', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: node(0).ip, port: nodePorts.cluster};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'NodePort Cluster')) {
      assert.equal(result.reply.pod, 'pod-1-0');
      assert.equal(result.reply.clientIP, node(0).ip);
    }
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('NodePort with externalTrafficPolicy Local keeps the client source IP', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: node(0).ip, port: nodePorts.local};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'NodePort Local')) {
      assert.equal(result.reply.pod, 'pod-0-1');
      assert.equal(result.reply.clientIP, sender.ip);
    }
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('NodePort with externalTrafficPolicy Local on a node without a local endpoint reaches no endpoint', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: node(1).ip, port: nodePorts.local};
    const results = await send(sender, target, 1, 2000);
    // ipvs mode keeps the virtual server with no real server: the node's own stack answers.
    assert.notEqual(results[0].outcome, 'reply', JSON.stringify(results[0]));
    assertTraceAgrees(trace(node(1), sender, target), results, sender, target);
  });

  it('a service without endpoints is refused, TCP and UDP', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    for (const target of [
      {protocol: 'tcp', ip: clusterIPs.empty, port: 80},
      {protocol: 'udp', ip: clusterIPs.empty, port: 53},
    ] satisfies Target[]) {
      const results = await send(sender, target, 1, 3000);
      assert.equal(results[0].outcome, 'refused', `${target.protocol}: ${JSON.stringify(results[0])}`);
      assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
    }
  });

  it('externalIPs reach the endpoint from outside the cluster, masqueraded', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: externalIP, port: 80};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'externalIP')) {
      assert.equal(result.reply.pod, 'pod-0-2');
      assert.notEqual(result.reply.clientIP, sender.ip);
    }
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('a load-balancer IP admits clients in loadBalancerSourceRanges and drops the others', async (t) => {
    if (!skipUnlessLab(t)) return;
    const target: Target = {protocol: 'tcp', ip: loadBalancerIP, port: 80};
    const allowed = client(0);
    const reached = await send(allowed, target, 4);
    for (const result of replies(reached, 'allowed client to LB IP')) assert.ok(['pod-0-1', 'pod-1-0'].includes(result.reply.pod), result.reply.pod);
    assertTraceAgrees(trace(node(0), allowed, target), reached, allowed, target);

    const blocked = client(1);
    const dropped = await send(blocked, target, 1, 2000);
    assert.equal(dropped[0].outcome, 'timeout', JSON.stringify(dropped[0]));
    assertTraceAgrees(trace(node(0), blocked, target), dropped, blocked, target);
  });

  it('hairpin: a pod reaching itself through its service sees the node address', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-3');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.hairpin, port: 80};
    const results = await send(sender, target, 2);
    for (const result of replies(results, 'hairpin')) {
      assert.equal(result.reply.pod, 'pod-0-3');
      assert.notEqual(result.reply.clientIP, sender.ip, 'KUBE-LOOP-BACK masquerades hairpin traffic');
    }
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('session affinity ClientIP (persistence): 20 connections from one client reach one endpoint', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-1-2');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.sticky, port: 80};
    const results = replies(await send(sender, target, 20), 'sticky');
    assert.equal(new Set(results.map((result) => result.reply.pod)).size, 1, `reached ${results.map((result) => result.reply.pod).join(', ')}`);
    assertTraceAgrees(trace(node(1), sender, target), results, sender, target);
  });

  it('round robin spreads connections evenly over 3 endpoints', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const results = replies(await send(sender, target, 30), 'spread');
    const counts = new Map<string, number>();
    for (const result of results) counts.set(result.reply.pod, (counts.get(result.reply.pod) ?? 0) + 1);
    assert.deepEqual([...counts.keys()].sort(), ['pod-0-1', 'pod-0-2', 'pod-1-0']);
    for (const [name, count] of counts) assert.equal(count, 10, `${name} got ${count} of 30 (rr)`);
    const predicted = trace(node(0), sender, target);
    assert.equal(predicted.branches.length, 3, describeTrace(predicted));
    assertTraceAgrees(predicted, results, sender, target);
  });

  it('UDP reaches an endpoint of the UDP port and keeps the pod source IP', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-1-2');
    const target: Target = {protocol: 'udp', ip: clusterIPs.web, port: 53};
    const results = replies(await send(sender, target, 6), 'UDP');
    for (const result of results) {
      assert.equal(result.reply.clientIP, sender.ip);
      assert.ok(['pod-0-1', 'pod-0-2', 'pod-1-0'].includes(result.reply.pod), result.reply.pod);
    }
    assertTraceAgrees(trace(node(1), sender, target), results, sender, target);
  });
  // Last: it changes the state the cases above rely on.
  it('an incremental sync swaps one endpoint; the removed one drains at weight 0 and gets no new connections', async (t) => {
    if (!skipUnlessLab(t)) return;
    const entry = node(0);
    const at = (name: string) => ({ip: findPod(lab!.topology, name).ip, node: findPod(lab!.topology, name).node});
    const slices = clusterSlices.map((candidate) => (candidate.metadata?.name === 'web-1' ? slice('web', [at('pod-0-1'), at('pod-0-2')], true) : candidate));
    const desired = desiredFor(entry, slices);
    const plan = planIpvsSync(desired, await readIpvsState(entry));
    const removed = `TCP ${clusterIPs.web}:80 -> ${at('pod-1-0').ip}:${demoPorts.http}`;
    assert.ok(plan.draining.includes(removed), `draining ${plan.draining.join(', ')}`);
    assert.deepEqual([plan.bind, plan.unbind], [[], []]);
    assert.ok(plan.ipvsadm.trim().split('\n').length <= 2 && plan.ipvsadm.includes('-w 0'), `only the changed real servers:\n${plan.ipvsadm}`);
    // ipvsadm -R adds to the table; ipvsadm-restore would clear it first.
    await execInNamespace(entry.namespace, ['ipvsadm', '-R'], {input: plan.ipvsadm});
    if (plan.ipset) await execInNamespace(entry.namespace, ['ipset', 'restore'], {input: plan.ipset});

    const after = await readIpvsState(entry);
    const web = after.virtualServers.find((server) => server.address === clusterIPs.web && server.port === 80)!;
    assert.deepEqual(web.realServers.map((real) => `${real.address}:${real.weight}`).sort(), [`${at('pod-0-1').ip}:1`, `${at('pod-0-2').ip}:1`, `${at('pod-1-0').ip}:0`].sort());
    assert.equal(planIpvsSync(desired, after).changes, 0, 'nothing left to change while the endpoint drains');
    const sender = pod('pod-0-0');
    const results = replies(await send(sender, {protocol: 'tcp', ip: clusterIPs.web, port: 80}, 10), 'after the incremental sync');
    assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].sort(), ['pod-0-1', 'pod-0-2']);

    // Both of the service's ports (TCP 80 and UDP 53) drained pod-1-0.
    const drop = planIpvsSync(desired, after, {drained: new Set(plan.draining)});
    await execInNamespace(entry.namespace, ['ipvsadm', '-R'], {input: drop.ipvsadm});
    const diff = diffIpvs(desired, await readIpvsState(entry));
    assert.ok(diff.equal, `once drained, the kernel holds exactly the desired state:\n${diff.text}`);
  });
});
