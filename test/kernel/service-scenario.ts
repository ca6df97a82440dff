// The services every mode's kernel test loads, and the real-packet cases every mode must pass.
// Each mode's test file renders these objects with its own backend, loads the result into the
// node namespaces, and registers sharedServiceCases with its tracer; what a mode does differently
// (ipvs' round robin, its virtual servers without real servers) is a named ModeBehaviour, not a
// second copy of the case.
//
// node-0: pod-0-0 client, pod-0-1 and pod-0-2 servers, pod-0-3 talks to itself (hairpin)
// node-1: pod-1-0 server, pod-1-2 client
// client-0 (10.240.0.100) and client-1 (10.240.0.101) outside the cluster CIDR, routed through node-0
import assert from 'node:assert/strict';
import {it, type TestContext} from 'node:test';
import {buildProxyModel, type EndpointSliceInput, type ProxyModel, type ServiceInput} from '../../src/core/model/index.ts';
import type {TraceResult} from '../../src/core/trace/types.ts';
import type {NodeDescription} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {NamespaceProbers} from '../../src/lab/workload/launch.ts';
import {demoPorts, findPod, kernelUnavailable, type KernelLab, nodeObject, startKernelLab} from './namespace-lab.ts';

export const servers = ['pod-0-1', 'pod-0-2', 'pod-0-3', 'pod-1-0'];
export const loadBalancerIP = '10.250.0.30';
export const externalIP = '10.250.0.20';
export const serviceCIDR = '10.96.0.0/16';
export const clusterIPs = {
  web: '10.96.0.10',
  sticky: '10.96.0.11',
  empty: '10.96.0.12',
  external: '10.96.0.13',
  hairpin: '10.96.0.14',
  npCluster: '10.96.0.15',
  npLocal: '10.96.0.16',
  lb: '10.96.0.17',
};
export const nodePorts = {cluster: 30080, local: 30081, lb: 30082};

const httpPort = {name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http};
const dnsPort = {name: 'dns', protocol: 'UDP', port: 53, targetPort: demoPorts.udp};

export function service(name: string, spec: NonNullable<ServiceInput['spec']>, status?: ServiceInput['status']): ServiceInput {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name, namespace: 'default'},
    spec: {type: 'ClusterIP', ports: [httpPort], ...spec, clusterIPs: [spec.clusterIP!]},
    ...(status ? {status} : {}),
  };
}

/** Endpoint conditions; a slice's endpoints are ready unless given others. */
export type EndpointConditions = {ready: boolean; serving: boolean; terminating: boolean};

export function slice(
  serviceName: string,
  pods: Array<{ip: string; node: string; conditions?: EndpointConditions}>,
  udp = false,
): EndpointSliceInput {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name: `${serviceName}-1`, namespace: 'default', labels: {'kubernetes.io/service-name': serviceName}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: demoPorts.http}, ...(udp ? [{name: 'dns', protocol: 'UDP', port: demoPorts.udp}] : [])],
    endpoints: pods.map((pod) => ({
      addresses: [pod.ip],
      nodeName: pod.node,
      conditions: pod.conditions ?? {ready: true, serving: true, terminating: false},
    })),
  };
}

/** A sender: a namespace, its address, and where its packets enter a node. */
export interface Sender {
  name: string;
  namespace: string;
  ip: string;
  /** The interface of the entry node the packet arrives on. */
  inInterface: string;
}

export interface Target {
  protocol: 'tcp' | 'udp';
  ip: string;
  port: number;
}

export type Reply = Extract<ProbeResult, {outcome: 'reply'}>;

/** A tracer over the rules read back from one node, for the first packet of a connection. */
export type NodeTracer = (entry: NodeDescription, sender: Sender, target: Target) => TraceResult;

/**
 * ServiceScenario: the namespace cluster with demo servers, the services and slices above, and the
 * ways to send from it. One per test file; start() in `before`, close() in `after`.
 */
export class ServiceScenario {
  lab: KernelLab | undefined;
  services: ServiceInput[] = [];
  slices: EndpointSliceInput[] = [];
  /** Each node's own addresses, as the tracer needs them to tell local from forwarded traffic. */
  readonly localAddresses = new Map<string, string[]>();
  readonly #unavailable: () => string;
  // One demo client per sending namespace for the scenario's life: a Node process per probe takes
  // seconds to start in the qemu guest.
  readonly #probers = new NamespaceProbers();

  /** `unavailable` says why this file's cases cannot run in this process (the skip reason). */
  constructor(unavailable: () => string = () => `needs root: ${kernelUnavailable}`) {
    this.#unavailable = unavailable;
  }

  /**
   * modelFor: what the proxy on `entry` derives from the scenario's services and `slices` (default
   * the scenario's own); the scenario's objects are all valid, so any problem fails the test.
   */
  modelFor(entry: NodeDescription, slices: EndpointSliceInput[] = this.slices): ProxyModel {
    const model = buildProxyModel(
      {services: this.services, endpointSlices: slices, node: nodeObject(entry)},
      {family: 'IPv4', clusterCIDRs: [this.lab!.topology.clusterCIDR]},
    );
    assert.deepEqual(model.problems, [], `model of ${entry.name}`);
    return model;
  }

  async start(): Promise<KernelLab> {
    const lab = await startKernelLab(
      {nodes: 2, podsPerNode: 4, externalClients: 2, externalRoutes: [`${externalIP}/32`, `${loadBalancerIP}/32`]},
      servers,
    );
    this.lab = lab;
    const threeEndpoints = [this.at('pod-0-1'), this.at('pod-0-2'), this.at('pod-1-0')];
    this.services = [
      service('web', {clusterIP: clusterIPs.web, ports: [httpPort, dnsPort]}),
      service('sticky', {clusterIP: clusterIPs.sticky, sessionAffinity: 'ClientIP'}),
      service('empty', {clusterIP: clusterIPs.empty, ports: [httpPort, dnsPort]}),
      service('external', {clusterIP: clusterIPs.external, externalIPs: [externalIP]}),
      service('hairpin', {clusterIP: clusterIPs.hairpin}),
      service('np-cluster', {
        type: 'NodePort',
        clusterIP: clusterIPs.npCluster,
        ports: [{...httpPort, nodePort: nodePorts.cluster}],
        externalTrafficPolicy: 'Cluster',
      }),
      service('np-local', {
        type: 'NodePort',
        clusterIP: clusterIPs.npLocal,
        ports: [{...httpPort, nodePort: nodePorts.local}],
        externalTrafficPolicy: 'Local',
      }),
      service(
        'lb',
        {
          type: 'LoadBalancer',
          clusterIP: clusterIPs.lb,
          ports: [{...httpPort, nodePort: nodePorts.lb}],
          loadBalancerSourceRanges: [`${lab.topology.externalClients[0].ip}/32`],
        },
        {loadBalancer: {ingress: [{ip: loadBalancerIP}]}},
      ),
    ];
    this.slices = [
      slice('web', threeEndpoints, true),
      slice('sticky', threeEndpoints),
      slice('external', [this.at('pod-0-2')]),
      slice('hairpin', [this.at('pod-0-3')]),
      slice('np-cluster', [this.at('pod-1-0')]),
      slice('np-local', [this.at('pod-0-1')]),
      slice('lb', [this.at('pod-0-1'), this.at('pod-1-0')]),
    ];
    return lab;
  }

  async close(): Promise<void> {
    await this.#probers.closeAll();
    await this.lab?.close();
  }

  /** The lab, or undefined after skipping the case with the reason it cannot run here. */
  skipUnlessLab(t: TestContext): KernelLab | undefined {
    if (!this.lab) t.skip(this.#unavailable());
    return this.lab;
  }

  /** Where a pod is, as an endpoint of a slice. */
  at(name: string): {ip: string; node: string} {
    const found = findPod(this.lab!.topology, name);
    return {ip: found.ip, node: found.node};
  }

  pod(name: string): Sender {
    const found = findPod(this.lab!.topology, name);
    return {name, namespace: found.namespace, ip: found.ip, inInterface: found.hostInterface};
  }

  client(index: number): Sender {
    const found = this.lab!.topology.externalClients[index];
    return {name: found.name, namespace: found.namespace, ip: found.ip, inInterface: found.interface};
  }

  node(index: number): NodeDescription {
    return this.lab!.topology.nodes[index];
  }

  async send(sender: Sender, target: Target, count = 1, timeoutMs = 2000): Promise<ProbeResult[]> {
    return this.#probers.probe(sender.namespace, {protocol: target.protocol, host: target.ip, port: target.port, timeoutMs}, count);
  }
}

/** The packet a tracer follows for a sender's first packet to a target. */
export function firstPacket(sender: Sender, target: Target) {
  return {
    srcIP: sender.ip,
    dstIP: target.ip,
    dstPort: target.port,
    protocol: target.protocol === 'tcp' ? 'TCP' : 'UDP',
    origin: 'arriving',
    inInterface: sender.inInterface,
  } as const;
}

/**
 * The chi-square statistic of three endpoints' counts against an even choice. With two degrees of
 * freedom its tail is exp(-x/2), so a fair random choice exceeds evenChoiceBound once in a million
 * runs. With 600 connections, a choice that gives one endpoint half of them scores 75.
 */
function chiSquareAgainstEven(counts: number[]): number {
  assert.equal(counts.length, 3, 'the bound is for three endpoints (two degrees of freedom)');
  const expected = counts.reduce((sum, count) => sum + count, 0) / counts.length;
  return counts.reduce((sum, count) => sum + (count - expected) ** 2 / expected, 0);
}
const evenChoiceBound = 2 * Math.log(1e6);

export function describeTrace(result: TraceResult): string {
  const branches = result.branches
    .map((branch) => `${branch.endpoint} p=${branch.probability.toFixed(3)} masq=${branch.masquerade}`)
    .join('; ');
  return `trace verdict ${result.verdict} [${branches}] via ${result.hops.map((hop) => `${hop.table}/${hop.chain}->${hop.target}`).join(' ')}`;
}

/**
 * assertTraceAgrees checks the kernel's outcome against the tracer: the endpoint reached is one
 * of the predicted branches, the source was rewritten exactly when that branch masquerades, and
 * refusals and drops are the predicted REJECT and DROP.
 */
export function assertTraceAgrees(predicted: TraceResult, results: ProbeResult[], sender: Sender, target: Target): void {
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

export function replies(results: ProbeResult[], what: string): Reply[] {
  for (const result of results) assert.equal(result.outcome, 'reply', `${what}: ${JSON.stringify(result)}`);
  return results as Reply[];
}

/** What a mode does differently from iptables mode in the shared cases, and why. */
export interface ModeBehaviour {
  /**
   * A NodePort with externalTrafficPolicy Local on a node without a local endpoint: 'dropped'
   * (iptables, nftables), or 'not-delivered' (ipvs keeps the virtual server without real servers,
   * and the node's own stack answers).
   */
  noLocalEndpoint: 'dropped' | 'not-delivered';
  /** Hairpin source: 'pod-gateway' (masqueraded to the node's address on the pod link) or 'masqueraded' (any rewrite). */
  hairpinSource: 'pod-gateway' | 'masqueraded';
  /** Endpoint choice: 'random' (statistic / numgen) or 'round-robin' (ipvs rr: exactly even). */
  spread: 'random' | 'round-robin';
  /** How long a probe that should get through waits (the qemu guest is slower). */
  probeTimeoutMs: number;
  /** How long a probe that should be dropped waits before that counts as the drop. */
  dropTimeoutMs: number;
  /** A refusal "at once" comes within this time. */
  refusalWithinMs: number;
}

export const iptablesLikeBehaviour: ModeBehaviour = {
  noLocalEndpoint: 'dropped',
  hairpinSource: 'pod-gateway',
  spread: 'random',
  probeTimeoutMs: 2000,
  dropTimeoutMs: 1500,
  refusalWithinMs: 1000,
};

/**
 * sharedServiceCases registers the real-packet cases every mode passes: ClusterIP from a pod keeps
 * its source, off-cluster sources masqueraded, NodePort with both policies, no endpoints refused,
 * externalIPs, load-balancer source ranges, hairpin, session affinity, spread, UDP. Each checks
 * that the mode's tracer, over the state read back from the kernel, predicted what happened.
 */
export function sharedServiceCases(scenario: ServiceScenario, trace: NodeTracer, behaviour: ModeBehaviour = iptablesLikeBehaviour): void {
  const send = (sender: Sender, target: Target, count = 1, timeoutMs = behaviour.probeTimeoutMs) =>
    scenario.send(sender, target, count, timeoutMs);

  it('pod -> ClusterIP reaches an endpoint and keeps the pod source IP', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const results = await send(sender, target, 6);
    for (const result of replies(results, 'pod to ClusterIP')) assert.equal(result.reply.clientIP, sender.ip);
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('traffic to a ClusterIP from outside the cluster CIDR is masqueraded', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.client(0);
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const results = await send(sender, target, 6);
    const nodeIPs = scenario.localAddresses.get(scenario.node(0).name)!;
    for (const result of replies(results, 'external client to ClusterIP')) {
      assert.ok(
        nodeIPs.includes(result.reply.clientIP),
        `endpoint saw ${result.reply.clientIP}, not one of node-0's addresses ${nodeIPs.join(', ')}`,
      );
    }
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('NodePort with externalTrafficPolicy Cluster is masqueraded to the node', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.client(0);
    const target: Target = {protocol: 'tcp', ip: scenario.node(0).ip, port: nodePorts.cluster};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'NodePort Cluster')) {
      assert.equal(result.reply.pod, 'pod-1-0');
      assert.equal(
        result.reply.clientIP,
        scenario.node(0).ip,
        'forwarded to node-1, so masqueraded to node-0 own address on the node network',
      );
    }
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('NodePort with externalTrafficPolicy Local keeps the client source IP', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.client(0);
    const target: Target = {protocol: 'tcp', ip: scenario.node(0).ip, port: nodePorts.local};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'NodePort Local')) {
      assert.equal(result.reply.pod, 'pod-0-1');
      assert.equal(result.reply.clientIP, sender.ip);
    }
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it(`NodePort with externalTrafficPolicy Local on a node without a local endpoint is ${behaviour.noLocalEndpoint === 'dropped' ? 'dropped' : 'not delivered'}`, async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.client(0);
    const target: Target = {protocol: 'tcp', ip: scenario.node(1).ip, port: nodePorts.local};
    const results = await send(sender, target, 1, behaviour.dropTimeoutMs);
    if (behaviour.noLocalEndpoint === 'dropped') assert.equal(results[0].outcome, 'timeout', JSON.stringify(results[0]));
    else assert.notEqual(results[0].outcome, 'reply', JSON.stringify(results[0]));
    assertTraceAgrees(trace(scenario.node(1), sender, target), results, sender, target);
  });

  it('a service without endpoints is refused at once, TCP and UDP', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    for (const target of [
      {protocol: 'tcp', ip: clusterIPs.empty, port: 80},
      {protocol: 'udp', ip: clusterIPs.empty, port: 53},
    ] satisfies Target[]) {
      const results = await send(sender, target, 1, 3000);
      assert.equal(results[0].outcome, 'refused', `${target.protocol}: ${JSON.stringify(results[0])}`);
      assert.ok(results[0].ms < behaviour.refusalWithinMs, `${target.protocol} refusal took ${results[0].ms} ms`);
      assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
    }
  });

  it('externalIPs reach the endpoint from outside the cluster, masqueraded', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.client(0);
    const target: Target = {protocol: 'tcp', ip: externalIP, port: 80};
    const results = await send(sender, target, 3);
    for (const result of replies(results, 'externalIP')) {
      assert.equal(result.reply.pod, 'pod-0-2');
      assert.notEqual(result.reply.clientIP, sender.ip, 'externalTrafficPolicy Cluster masquerades external traffic');
    }
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('a load-balancer IP admits clients in loadBalancerSourceRanges and drops the others', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const target: Target = {protocol: 'tcp', ip: loadBalancerIP, port: 80};
    const allowed = scenario.client(0);
    const reached = await send(allowed, target, 4);
    for (const result of replies(reached, 'allowed client to LB IP'))
      assert.ok(['pod-0-1', 'pod-1-0'].includes(result.reply.pod), result.reply.pod);
    assertTraceAgrees(trace(scenario.node(0), allowed, target), reached, allowed, target);

    const blocked = scenario.client(1);
    const dropped = await send(blocked, target, 1, behaviour.dropTimeoutMs);
    assert.equal(dropped[0].outcome, 'timeout', JSON.stringify(dropped[0]));
    assertTraceAgrees(trace(scenario.node(0), blocked, target), dropped, blocked, target);
  });

  it('hairpin: a pod reaching itself through its service is masqueraded', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-3');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.hairpin, port: 80};
    const results = await send(sender, target, 2);
    for (const result of replies(results, 'hairpin')) {
      assert.equal(result.reply.pod, 'pod-0-3');
      if (behaviour.hairpinSource === 'pod-gateway')
        assert.equal(result.reply.clientIP, scenario.node(0).podGateway, 'masqueraded to the node address on the pod link');
      else assert.notEqual(result.reply.clientIP, sender.ip, 'hairpin traffic is masqueraded');
    }
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('session affinity ClientIP: 20 connections from one client reach one endpoint', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-1-2');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.sticky, port: 80};
    const results = replies(await send(sender, target, 20), 'sticky');
    assert.equal(
      new Set(results.map((result) => result.reply.pod)).size,
      1,
      `reached ${results.map((result) => result.reply.pod).join(', ')}`,
    );
    assertTraceAgrees(trace(scenario.node(1), sender, target), results, sender, target);
  });

  it(`connections spread over 3 endpoints (${behaviour.spread})`, async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const total = behaviour.spread === 'random' ? 600 : 30;
    const results = replies(await send(sender, target, total), 'spread');
    const counts = new Map<string, number>();
    for (const result of results) counts.set(result.reply.pod, (counts.get(result.reply.pod) ?? 0) + 1);
    assert.deepEqual([...counts.keys()].sort(), ['pod-0-1', 'pod-0-2', 'pod-1-0']);
    const seen = JSON.stringify(Object.fromEntries(counts));
    if (behaviour.spread === 'random') {
      const statistic = chiSquareAgainstEven([...counts.values()]);
      assert.ok(statistic <= evenChoiceBound, `${seen} of ${total}: chi-square ${statistic.toFixed(1)} against an even choice`);
    } else for (const [name, count] of counts) assert.equal(count, total / 3, `${name} got ${count} of ${total} (round robin): ${seen}`);
    const predicted = trace(scenario.node(0), sender, target);
    assert.equal(predicted.branches.length, 3, describeTrace(predicted));
    for (const branch of predicted.branches) assert.ok(Math.abs(branch.probability - 1 / 3) < 0.01, describeTrace(predicted));
    assertTraceAgrees(predicted, results, sender, target);
  });

  it('UDP reaches an endpoint of the UDP port and keeps the pod source IP', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-1-2');
    const target: Target = {protocol: 'udp', ip: clusterIPs.web, port: 53};
    const results = replies(await send(sender, target, 6), 'UDP');
    for (const result of results) {
      assert.equal(result.reply.protocol, 'udp');
      assert.equal(result.reply.clientIP, sender.ip);
      assert.ok(['pod-0-1', 'pod-0-2', 'pod-1-0'].includes(result.reply.pod), result.reply.pod);
    }
    assertTraceAgrees(trace(scenario.node(1), sender, target), results, sender, target);
  });
}
