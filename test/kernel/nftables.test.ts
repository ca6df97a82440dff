// nftables mode against the kernel: render each node's table, load it with `nft -f` into the node
// namespaces of a namespace cluster, send real TCP and UDP from pods and external clients, and
// check what the endpoints saw. Each case also traces the table read back with `nft -j list` and
// checks the tracer predicted what the kernel did. The same cases as iptables mode, plus what
// nftables mode does differently (unknown ports and unallocated ClusterIPs, NodePorts on the
// primary IP only) and partial transactions.
import assert from 'node:assert/strict';
import {after, before, describe, it, type TestContext} from 'node:test';
import {changedServicePorts, buildProxyModel, type EndpointSliceInput, type ProxyModel, type ServiceInput} from '../../src/core/model/index.ts';
import {diffNftables} from '../../src/core/nftables/diff.ts';
import {parseNftablesJson, parseNftablesScript, type NftRuleset} from '../../src/core/nftables/parse.ts';
import {renderNftables, renderNftablesSync, type NftablesState} from '../../src/core/nftables/render.ts';
import {traceNftables} from '../../src/core/nftables/trace.ts';
import {createNamespace, deleteNamespace, execInNamespace, newNamespacePrefix} from '../../src/lab/netns/index.ts';
import type {TraceResult} from '../../src/core/trace/types.ts';
import type {NodeDescription} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {probeFromNamespace} from '../../src/lab/workload/launch.ts';
import {demoPorts, findPod, kernelUnavailable, type KernelLab, nodeAddresses, nodeObject, startKernelLab} from './namespace-lab.ts';

// node-0: pod-0-0 client, pod-0-1 and pod-0-2 servers, pod-0-3 talks to itself (hairpin)
// node-1: pod-1-0 server, pod-1-2 client
// client-0 (10.240.0.100) and client-1 (10.240.0.101) outside the cluster CIDR, routed through node-0
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

/** A sender: a namespace, its address, and where its packets enter a node. */
interface Sender {
  name: string;
  namespace: string;
  ip: string;
  /** The interface of the entry node the packet arrives on. */
  inInterface: string;
}

interface Target {
  protocol: 'tcp' | 'udp';
  ip: string;
  port: number;
}

let lab: KernelLab | undefined;
const savedRules = new Map<string, string>();
const syncStates = new Map<string, {model: ProxyModel; state: NftablesState; applied: NftRuleset}>();
const serviceCIDR = '10.96.0.0/16';
let services: ServiceInput[] = [];
let slices: EndpointSliceInput[] = [];
const localAddresses = new Map<string, string[]>();

function skipUnlessLab(t: TestContext): KernelLab | undefined {
  if (!lab) t.skip(`needs root: ${kernelUnavailable}`);
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

async function send(sender: Sender, target: Target, count = 1, timeoutMs = 2000): Promise<ProbeResult[]> {
  return probeFromNamespace(sender.namespace, {protocol: target.protocol, host: target.ip, port: target.port, timeoutMs}, count);
}

/** trace walks the rules read back from the entry node for the connection's first packet. */
function trace(entry: NodeDescription, sender: Sender, target: Target): TraceResult {
  const ruleset = parseNftablesJson(savedRules.get(entry.name)!);
  return traceNftables(
    ruleset,
    {srcIP: sender.ip, dstIP: target.ip, dstPort: target.port, protocol: target.protocol === 'tcp' ? 'TCP' : 'UDP', origin: 'arriving', inInterface: sender.inInterface},
    {localAddresses: localAddresses.get(entry.name)!},
  );
}

function describeTrace(result: TraceResult): string {
  const branches = result.branches.map((branch) => `${branch.endpoint} p=${branch.probability.toFixed(3)} masq=${branch.masquerade}`).join('; ');
  return `trace verdict ${result.verdict} [${branches}] via ${result.hops.map((hop) => `${hop.table}/${hop.chain}->${hop.target}`).join(' ')}`;
}

/**
 * assertTraceAgrees checks the kernel's outcome against the tracer: the endpoint reached is one
 * of the predicted branches, the source was rewritten exactly when that branch masquerades, and
 * refusals and drops are the predicted REJECT and DROP.
 */
function assertTraceAgrees(predicted: TraceResult, results: ProbeResult[], sender: Sender, target: Target): void {
  const context = `${sender.name} -> ${target.protocol} ${target.ip}:${target.port}: ${describeTrace(predicted)}`;
  for (const result of results) {
    switch (result.outcome) {
      case 'reply': {
        assert.equal(predicted.verdict, 'DNAT', `the kernel delivered to ${result.reply.pod}; ${context}`);
        const endpoint = `${result.reply.podIP}:${target.protocol === 'tcp' ? demoPorts.http : demoPorts.udp}`;
        const branch = predicted.branches.find((candidate) => candidate.endpoint === endpoint);
        assert.ok(branch, `the kernel reached ${endpoint}, not a predicted branch; ${context}`);
        const rewritten = result.reply.clientIP !== sender.ip;
        assert.equal(branch.masquerade, rewritten, `the endpoint saw ${result.reply.clientIP} (sent from ${sender.ip}); ${context}`);
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


/**
 * assertSameTable: the table the kernel lists holds exactly the chains, rules and elements the
 * scripts wrote (what clients added to affinity sets at run time aside).
 */
function assertSameTable(expected: NftRuleset, listed: NftRuleset, what: string): void {
  const chains = (ruleset: NftRuleset) =>
    Object.fromEntries([...ruleset.chains.values()].map((chain) => [chain.name, {hook: chain.hook, priority: chain.priority, rules: chain.rules.map((rule) => (rule.comment ? `${rule.text} comment "${rule.comment}"` : rule.text))}]));
  const sets = (ruleset: NftRuleset) =>
    Object.fromEntries(
      [...ruleset.sets.values()].map((set) => [set.name, set.name.startsWith('affinity-') ? [] : set.elements.map((element) => `${element.key}${element.comment ? ` comment ${element.comment}` : ''}${element.value !== undefined ? ` : ${element.value}` : ''}`).sort()]),
    );
  assert.deepEqual(chains(listed), chains(expected), `${what}: chains and rules`);
  assert.deepEqual(sets(listed), sets(expected), `${what}: sets and maps`);
}

/** loadNftables applies a script to the node's namespace as one `nft -f` transaction. */
async function loadNftables(entry: NodeDescription, script: string): Promise<void> {
  await execInNamespace(entry.namespace, ['nft', '-f', '-'], {input: script});
}

async function listNftables(entry: NodeDescription): Promise<string> {
  return (await execInNamespace(entry.namespace, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy'])).stdout;
}

/** conntrackEntries: the node's connection-tracking entries toward one address and port. */
async function conntrackEntries(entry: NodeDescription, target: Target): Promise<string> {
  const {stdout} = await execInNamespace(entry.namespace, ['sh', '-c', `conntrack -L -p ${target.protocol} -d ${target.ip} --dport ${target.port} 2>/dev/null || true`]);
  return stdout.trim();
}

describe('nftables rules in the kernel', {concurrency: false, timeout: 120_000}, () => {
  before(async () => {
    if (kernelUnavailable) return;
    lab = await startKernelLab({nodes: 2, podsPerNode: 4, externalClients: 2, externalRoutes: [`${externalIP}/32`, `${loadBalancerIP}/32`]}, servers);
    const at = (name: string) => {
      const found = findPod(lab!.topology, name);
      return {ip: found.ip, node: found.node};
    };
    const threeEndpoints = [at('pod-0-1'), at('pod-0-2'), at('pod-1-0')];
    services = [
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
    slices = [
      slice('web', threeEndpoints, true),
      slice('sticky', threeEndpoints),
      slice('external', [at('pod-0-2')]),
      slice('hairpin', [at('pod-0-3')]),
      slice('np-cluster', [at('pod-1-0')]),
      slice('np-local', [at('pod-0-1')]),
      slice('lb', [at('pod-0-1'), at('pod-1-0')]),
    ];
    // Every node gets the rules its own proxy would write; node-1's differ for Local policies.
    for (const entry of lab.topology.nodes) {
      const model = buildProxyModel({services, endpointSlices: slices, node: nodeObject(entry)}, {family: 'IPv4', clusterCIDRs: [lab.topology.clusterCIDR]});
      assert.deepEqual(model.problems, [], `model of ${entry.name}`);
      const sync = renderNftablesSync(model, {serviceCIDRs: [serviceCIDR], recreateTable: true});
      await loadNftables(entry, sync.script);
      syncStates.set(entry.name, {model, state: sync.state, applied: parseNftablesScript(sync.script)});
      savedRules.set(entry.name, await listNftables(entry));
      localAddresses.set(entry.name, await nodeAddresses(entry));
    }
  });
  after(async () => {
    await lab?.close();
  });

  it('the kernel lists the table exactly as the script wrote it', (t) => {
    if (!skipUnlessLab(t)) return;
    for (const entry of lab!.topology.nodes) assertSameTable(syncStates.get(entry.name)!.applied, parseNftablesJson(savedRules.get(entry.name)!), entry.name);
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
      assert.equal(result.reply.clientIP, node(0).ip, 'forwarded to node-1, so masqueraded to node-0 own address on the node network');
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

  it('NodePort with externalTrafficPolicy Local on a node without a local endpoint is dropped', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: node(1).ip, port: nodePorts.local};
    const results = await send(sender, target, 1, 1500);
    assert.equal(results[0].outcome, 'timeout', JSON.stringify(results[0]));
    assertTraceAgrees(trace(node(1), sender, target), results, sender, target);
  });

  it('a service without endpoints is refused at once, TCP and UDP', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    for (const target of [
      {protocol: 'tcp', ip: clusterIPs.empty, port: 80},
      {protocol: 'udp', ip: clusterIPs.empty, port: 53},
    ] satisfies Target[]) {
      const results = await send(sender, target, 1, 3000);
      assert.equal(results[0].outcome, 'refused', `${target.protocol}: ${JSON.stringify(results[0])}`);
      assert.ok(results[0].ms < 1000, `${target.protocol} refusal took ${results[0].ms} ms`);
      assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
    }
  });

  it('externalIPs reach the endpoint from outside the cluster', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = client(0);
    const target: Target = {protocol: 'tcp', ip: externalIP, port: 80};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'externalIP')) {
      assert.equal(result.reply.pod, 'pod-0-2');
      assert.notEqual(result.reply.clientIP, sender.ip, 'externalTrafficPolicy Cluster masquerades external traffic');
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
    const dropped = await send(blocked, target, 1, 1500);
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
      assert.equal(result.reply.clientIP, node(0).podGateway, 'masqueraded to the node address on the pod link');
    }
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('session affinity ClientIP: 20 connections from one client reach one endpoint', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-1-2');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.sticky, port: 80};
    const results = replies(await send(sender, target, 20), 'sticky');
    assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].length, 1, `reached ${results.map((result) => result.reply.pod).join(', ')}`);
    assertTraceAgrees(trace(node(1), sender, target), results, sender, target);
  });

  it('connections spread over 3 endpoints', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const total = 150;
    const results = replies(await send(sender, target, total), 'spread');
    const counts = new Map<string, number>();
    for (const result of results) counts.set(result.reply.pod, (counts.get(result.reply.pod) ?? 0) + 1);
    assert.deepEqual([...counts.keys()].sort(), ['pod-0-1', 'pod-0-2', 'pod-1-0']);
    // Each share's standard deviation is about 3.8 % of 150; 20 %-47 % is more than 3.5 of them.
    for (const [name, count] of counts) assert.ok(count >= total * 0.2 && count <= total * 0.47, `${name} got ${count} of ${total}`);
    const predicted = trace(node(0), sender, target);
    assert.equal(predicted.branches.length, 3, describeTrace(predicted));
    for (const branch of predicted.branches) assert.ok(Math.abs(branch.probability - 1 / 3) < 0.01, describeTrace(predicted));
    assertTraceAgrees(predicted, results, sender, target);
  });

  it('UDP reaches an endpoint of the UDP port and keeps the pod source IP', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-1-2');
    const target: Target = {protocol: 'udp', ip: clusterIPs.web, port: 53};
    const results = replies(await send(sender, target, 6), 'UDP');
    for (const result of results) {
      assert.equal(result.reply.protocol, 'udp');
      assert.equal(result.reply.clientIP, sender.ip);
      assert.ok(['pod-0-1', 'pod-0-2', 'pod-1-0'].includes(result.reply.pod), result.reply.pod);
    }
    assertTraceAgrees(trace(node(1), sender, target), results, sender, target);
  });

  it('a port no service defines on a ClusterIP is rejected by the node', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 81};
    const results = await send(sender, target, 1, 3000);
    assert.equal(results[0].outcome, 'refused', JSON.stringify(results[0]));
    // Forwarded packets would leave a connection entry on the node; rejected ones never do.
    assert.equal(await conntrackEntries(node(0), target), '', 'the node forwarded the packet instead of rejecting it');
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('an address of the service CIDR that is no ClusterIP is dropped', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: '10.96.0.200', port: 80};
    const results = await send(sender, target, 1, 1500);
    assert.equal(results[0].outcome, 'timeout', JSON.stringify(results[0]));
    assertTraceAgrees(trace(node(0), sender, target), results, sender, target);
  });

  it('NodePorts answer on the primary node IP only', async (t) => {
    if (!skipUnlessLab(t)) return;
    const sender = pod('pod-0-0');
    const primary: Target = {protocol: 'tcp', ip: node(0).ip, port: nodePorts.cluster};
    const reached = replies(await send(sender, primary, 2), 'NodePort on the primary IP');
    for (const result of reached) assert.equal(result.reply.pod, 'pod-1-0');
    assertTraceAgrees(trace(node(0), sender, primary), reached, sender, primary);

    // The pod gateway address is the node's too, but not its primary IP: nothing DNATs, and no
    // process listens there, so the node itself refuses.
    const gateway: Target = {protocol: 'tcp', ip: node(0).podGateway, port: nodePorts.cluster};
    const refused = await send(sender, gateway, 1, 3000);
    assert.equal(refused[0].outcome, 'refused', JSON.stringify(refused[0]));
    const predicted = trace(node(0), sender, gateway);
    assert.equal(predicted.verdict, 'ACCEPT', describeTrace(predicted));
  });

  it('a partial sync after one endpoint change touches only that service, traffic elsewhere undisturbed', async (t) => {
    if (!skipUnlessLab(t)) return;
    const entry = node(0);
    const before = syncStates.get(entry.name)!;
    const at = (name: string) => ({ip: findPod(lab!.topology, name).ip, node: findPod(lab!.topology, name).node});
    const changedSlices = slices.map((candidate) => (candidate.metadata?.name === 'np-cluster-1' ? slice('np-cluster', [at('pod-1-0'), at('pod-0-2')]) : candidate));
    const model = buildProxyModel({services, endpointSlices: changedSlices, node: nodeObject(entry)}, {family: 'IPv4', clusterCIDRs: [lab!.topology.clusterCIDR]});
    const changed = changedServicePorts(before.model, model);
    assert.deepEqual([...changed], ['default/np-cluster:http/TCP']);
    const sync = renderNftablesSync(model, {existing: before.state, changedServicePorts: changed, serviceCIDRs: [serviceCIDR]});
    assert.equal(sync.kind, 'partial');
    const objects = sync.script.split('\n').filter((line) => line.length > 0);
    for (const line of objects) {
      const servicePortChain = /(?:chain|rule) ip kube-proxy (\S*\/\S*)/.exec(line)?.[1];
      if (servicePortChain) assert.match(servicePortChain, /-default\/np-cluster\/tcp\/http$/, line);
      else assert.match(line, /^(add|delete) element ip kube-proxy (endpoint-targets-tcp-\d+|hairpin-endpoints) /, line);
    }

    // Traffic to another service keeps flowing while the transaction is applied.
    const sender = pod('pod-0-0');
    const other: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const during = send(sender, other, 40, 2000);
    await loadNftables(entry, sync.script);
    replies(await during, 'traffic to web during the partial sync');
    const applied = parseNftablesScript(sync.script, before.applied);
    syncStates.set(entry.name, {model, state: sync.state, applied});
    savedRules.set(entry.name, await listNftables(entry));
    assertSameTable(applied, parseNftablesJson(savedRules.get(entry.name)!), 'after the partial sync');
    // A full render of the new model differs from the kernel only in endpoint-map keys, which diff ignores.
    const drift = diffNftables(parseNftablesScript(renderNftables(model, {serviceCIDRs: [serviceCIDR]})), parseNftablesJson(savedRules.get(entry.name)!));
    assert.equal(drift.text, '');
    assert.ok(drift.equal);

    const target: Target = {protocol: 'tcp', ip: entry.ip, port: nodePorts.cluster};
    const results = replies(await send(client(0), target, 30), 'NodePort after the change');
    assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].sort(), ['pod-0-2', 'pod-1-0']);
    assertTraceAgrees(trace(entry, client(0), target), results, client(0), target);
  });
});

describe('nftables IPv6 table in the kernel', {timeout: 60_000}, () => {
  it('loads and lists exactly as written: ip6 addresses, bracketed DNAT, affinity, firewall', async (t) => {
    if (kernelUnavailable) {
      t.skip(`needs root: ${kernelUnavailable}`);
      return;
    }
    const v6Port = {name: 'http', protocol: 'TCP', port: 80, targetPort: 8080};
    const v6Service = (name: string, clusterIP: string, spec: Partial<NonNullable<ServiceInput['spec']>> = {}, status?: ServiceInput['status']): ServiceInput => ({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name, namespace: 'default'},
      spec: {type: 'ClusterIP', clusterIP, clusterIPs: [clusterIP], ipFamilies: ['IPv6'], ports: [v6Port], ...spec},
      ...(status ? {status} : {}),
    });
    const v6Slice = (name: string, ips: Array<[string, string]>): EndpointSliceInput => ({
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {name: `${name}-1`, namespace: 'default', labels: {'kubernetes.io/service-name': name}},
      addressType: 'IPv6',
      ports: [{name: 'http', protocol: 'TCP', port: 8080}],
      endpoints: ips.map(([ip, nodeName]) => ({addresses: [ip], nodeName})),
    });
    const model = buildProxyModel(
      {
        services: [
          v6Service('web6', 'fd00::10'),
          v6Service('sticky6', 'fd00::11', {sessionAffinity: 'ClientIP', type: 'LoadBalancer', loadBalancerSourceRanges: ['2001:db8::/64'], ports: [{...v6Port, nodePort: 30001}]}, {loadBalancer: {ingress: [{ip: '2001:db8:1::1'}]}}),
        ],
        endpointSlices: [v6Slice('web6', [['fd00:10:244:1::5', 'node-1']]), v6Slice('sticky6', [['fd00:10:244:1::6', 'node-1'], ['fd00:10:244:2::6', 'node-2']])],
        node: {apiVersion: 'v1', kind: 'Node', metadata: {name: 'node-1'}, status: {addresses: [{type: 'InternalIP', address: 'fd00:10:240::11'}]}},
      },
      {family: 'IPv6', clusterCIDRs: ['fd00:10:244::/48']},
    );
    assert.deepEqual(model.problems, []);
    const script = renderNftablesSync(model, {serviceCIDRs: ['fd00::/108']}).script;
    const namespace = `${newNamespacePrefix()}nft6`;
    await createNamespace(namespace);
    try {
      await execInNamespace(namespace, ['nft', '-f', '-'], {input: script});
      const listed = (await execInNamespace(namespace, ['nft', '-j', 'list', 'table', 'ip6', 'kube-proxy'])).stdout;
      assertSameTable(parseNftablesScript(script), parseNftablesJson(listed), 'IPv6');
      const result = traceNftables(parseNftablesJson(listed), {srcIP: 'fd00:10:244:1::9', dstIP: 'fd00::10', dstPort: 80, protocol: 'TCP', origin: 'arriving'}, {localAddresses: ['fd00:10:240::11']});
      assert.deepEqual(result.branches.map((branch) => branch.endpoint), ['[fd00:10:244:1::5]:8080']);
    } finally {
      await deleteNamespace(namespace);
    }
  });
});
