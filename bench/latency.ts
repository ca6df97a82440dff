// First-packet latency through a ClusterIP against the number of services, iptables mode beside
// nftables mode (root only). A client pod's namespace connects over its node's namespace, which
// holds the rendered rules, to a backend pod's namespace; each TCP connect is a new connection, so
// its SYN goes through the nat rules before conntrack remembers the answer.
//
// iptables mode finds a service by walking KUBE-SERVICES one rule per service port, so the target
// is the service whose rule comes last in that chain: the worst case, N rules before the match.
// nftables mode finds it in the service-ips verdict map, one lookup whatever the position.
import {buildProxyModel, type EndpointSliceInput, type ProxyModel, type ServiceInput} from '../src/core/model/index.ts';
import {renderIptables} from '../src/core/iptables/index.ts';
import {renderNftables} from '../src/core/nftables/index.ts';
import {
  buildCluster,
  deleteNamespacesWithPrefix,
  destroyCluster,
  execInNamespace,
  netnsUnavailableReason,
  newNamespacePrefix,
  type ClusterTopology,
} from '../src/lab/netns/index.ts';
import {DemoAppGroup} from '../src/lab/workload/launch.ts';
import {percentile, timed} from './report.ts';
import {benchNodeName, serviceIP} from './workload.ts';

export interface LatencyBenchOptions {
  /** Service counts. Default 1,000 / 10,000 / 30,000. */
  serviceCounts?: number[];
  /** Connections timed per mode and size. Default 2,000. */
  connections?: number;
  modes?: LatencyMode[];
}

export type LatencyMode = 'iptables' | 'nftables';

interface Figure {
  count: number;
  mode: LatencyMode | 'no rules';
  loadMs: number;
  p50: number;
  p99: number;
}

const backendPort = 8080;
const servicePort = 80;
const connectTimer = new URL('./connect-timer.ts', import.meta.url).pathname;

/** latencyModel: `count` ClusterIP services, one TCP port each, all served by the one backend pod. */
function latencyModel(count: number, backendIP: string, topology: ClusterTopology, nodeIP: string): ProxyModel {
  const services: ServiceInput[] = [];
  const endpointSlices: EndpointSliceInput[] = [];
  for (let index = 0; index < count; index++) {
    const name = `svc-${index}`;
    services.push({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name, namespace: 'bench'},
      spec: {
        type: 'ClusterIP',
        clusterIP: serviceIP(index),
        clusterIPs: [serviceIP(index)],
        ports: [{name: 'http', protocol: 'TCP', port: servicePort, targetPort: backendPort}],
      },
    });
    endpointSlices.push({
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {name: `${name}-abcde`, namespace: 'bench', labels: {'kubernetes.io/service-name': name}},
      addressType: 'IPv4',
      ports: [{name: 'http', protocol: 'TCP', port: backendPort}],
      endpoints: [{addresses: [backendIP], nodeName: benchNodeName, conditions: {ready: true}}],
    });
  }
  const node = {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name: benchNodeName},
    status: {addresses: [{type: 'InternalIP', address: nodeIP}]},
  };
  return buildProxyModel({services, endpointSlices, node}, {family: 'IPv4', clusterCIDRs: [topology.clusterCIDR], nodeName: benchNodeName});
}

/** lastServiceRule: the ClusterIP whose rule is the last one of nat KUBE-SERVICES, and how many come before it. */
function lastServiceRule(rules: string): {ip: string; position: number} {
  const nat = rules.slice(rules.indexOf('*nat'));
  const serviceRules = nat.split('\n').filter((line) => line.startsWith('-A KUBE-SERVICES ') && line.includes(' cluster IP" '));
  const last = serviceRules.at(-1);
  const ip = last && / -d ([\d.]+)(\/32)? /.exec(last)?.[1];
  if (!ip) throw new Error('the rendered nat table has no ClusterIP rule in KUBE-SERVICES');
  return {ip, position: serviceRules.length};
}

/**
 * connectTimes: `count` connect times from the namespace, in milliseconds. The timer runs at a
 * real-time priority so that its wake-up on the SYN-ACK does not wait behind other work on this
 * shared machine.
 */
async function connectTimes(namespace: string, ip: string, count: number, port = servicePort): Promise<number[]> {
  const {stdout} = await execInNamespace(namespace, ['chrt', '-f', '10', process.execPath, connectTimer, ip, String(port), String(count)], {
    timeoutMs: 600_000,
  });
  return JSON.parse(stdout) as number[];
}

const ms = (value: number) => `${value.toFixed(3)} ms`;

interface Setup {
  count: number;
  mode: LatencyMode | 'no rules';
  client: string;
  target: string;
  port: number;
  loadMs: number;
  times: number[];
}

/**
 * runLatencyBench prints p50/p99 connect times per mode and size; without root it says why and
 * returns. Every (mode, size) gets a node namespace of its own with its rules loaded, and the
 * connections are made in rounds that visit each of them in turn: this machine is shared, and
 * interleaving spreads whatever else runs on it evenly over the figures being compared.
 */
export async function runLatencyBench(options: LatencyBenchOptions = {}): Promise<void> {
  const unavailable = await netnsUnavailableReason();
  if (unavailable) {
    console.log(`   skipped: ${unavailable}`);
    return;
  }
  const counts = options.serviceCounts ?? [1_000, 10_000, 30_000];
  const connections = options.connections ?? 2_000;
  const modes = options.modes ?? ['iptables', 'nftables'];
  const rounds = Math.max(1, Math.min(10, Math.floor(connections / 100)));
  console.log(
    `   workload: N ClusterIP services x 1 endpoint (one TCP port each), ${connections.toLocaleString('en-US')} connections per figure, one after the other, in ${rounds} rounds interleaved across figures`,
  );
  console.log(
    '   path: client pod namespace -> node namespace (rules) -> backend pod namespace; time from connect() to the established socket',
  );
  console.log(
    '   target: the service whose rule is last in KUBE-SERVICES (iptables worst case: every other service rule is tried first); nftables finds it in the service-ips map',
  );

  const prefix = newNamespacePrefix();
  const apps = new DemoAppGroup();
  // One more node with no rules at all: its client connects straight to the backend pod, the floor
  // that shows what the path and this machine's scheduling cost without any proxy.
  const topology = await buildCluster({prefix, nodes: counts.length * modes.length + 1, podsPerNode: 2, upstream: false});
  const setups: Setup[] = [];
  try {
    const {stdout: version} = await execInNamespace(topology.nodes[0].namespace, ['iptables', '-V']);
    console.log(`   iptables front end: ${version.trim()}`);
    await apps.start(
      topology.nodes.map((node) => ({namespace: node.pods[1].namespace, name: node.pods[1].name, httpPort: backendPort, udpPort: 5353})),
    );
    const floorNode = topology.nodes.at(-1)!;
    await connectTimes(floorNode.pods[0].namespace, floorNode.pods[1].ip, 50, backendPort);
    setups.push({
      count: 0,
      mode: 'no rules',
      client: floorNode.pods[0].namespace,
      target: floorNode.pods[1].ip,
      port: backendPort,
      loadMs: 0,
      times: [],
    });
    let nodeIndex = 0;
    for (const count of counts) {
      for (const mode of modes) {
        const node = topology.nodes[nodeIndex++];
        const [client, backend] = node.pods;
        const model = latencyModel(count, backend.ip, topology, node.ip);
        const iptablesRules = renderIptables(model, {includeJumps: true});
        const target = lastServiceRule(iptablesRules);
        const loaded = await timed(() =>
          mode === 'iptables'
            ? execInNamespace(node.namespace, ['iptables-restore', '-w', '5'], {input: iptablesRules, timeoutMs: 600_000})
            : execInNamespace(node.namespace, ['nft', '-f', '-'], {input: renderNftables(model), timeoutMs: 600_000}),
        );
        console.log(
          `   ${count.toLocaleString('en-US').padStart(6)} services  ${mode.padEnd(8)}  rules loaded in ${(loaded.ms / 1000).toFixed(1)} s; target ${target.ip}:${servicePort}, KUBE-SERVICES rule ${target.position.toLocaleString('en-US')} of ${target.position.toLocaleString('en-US')}`,
        );
        // The first connections fill the neighbour and route caches; they are not counted.
        await connectTimes(client.namespace, target.ip, 50);
        // Forget the warm-up's connections, so that every timed SYN starts a new conntrack entry.
        await execInNamespace(node.namespace, ['conntrack', '-F']).catch(() => undefined);
        setups.push({count, mode, client: client.namespace, target: target.ip, port: servicePort, loadMs: loaded.ms, times: []});
      }
    }
    for (let round = 0; round < rounds; round++) {
      const perRound = Math.floor(connections / rounds) + (round < connections % rounds ? 1 : 0);
      for (const setup of round % 2 === 0 ? setups : [...setups].reverse())
        setup.times.push(...(await connectTimes(setup.client, setup.target, perRound, setup.port)));
    }
  } finally {
    await apps.stopAll();
    await destroyCluster(topology).catch(() => undefined);
    await deleteNamespacesWithPrefix(prefix);
  }

  const figures: Figure[] = setups.map((setup) => {
    const sorted = setup.times.sort((a, b) => a - b);
    return {count: setup.count, mode: setup.mode, loadMs: setup.loadMs, p50: percentile(sorted, 50), p99: percentile(sorted, 99)};
  });
  for (const figure of figures) {
    if (figure.mode === 'no rules') {
      console.log(
        `   floor: no proxy rules, straight to the backend pod  p50 ${ms(figure.p50).padStart(10)}  p99 ${ms(figure.p99).padStart(10)}`,
      );
      continue;
    }
    console.log(
      `   ${figure.count.toLocaleString('en-US').padStart(6)} services  ${figure.mode.padEnd(8)}  p50 ${ms(figure.p50).padStart(10)}  p99 ${ms(figure.p99).padStart(10)}`,
    );
  }
  for (const mode of modes) {
    const own = figures.filter((figure) => figure.mode === mode);
    if (own.length < 2) continue;
    const [first, last] = [own[0], own.at(-1)!];
    const p99Ratio = last.p99 / first.p99;
    const goal = mode === 'nftables' ? (p99Ratio <= 1.2 ? '  goal <= 1.2x met' : '  goal <= 1.2x NOT met') : '';
    console.log(
      `   ${mode.padEnd(8)} ${last.count.toLocaleString('en-US')} / ${first.count.toLocaleString('en-US')} services: p50 ${(last.p50 / first.p50).toFixed(2)}x, p99 ${p99Ratio.toFixed(2)}x${goal}`,
    );
  }
}

/** Run alone: node bench/latency.ts [--services 1000,10000,30000] [--connections N] [--modes iptables,nftables] */
if (import.meta.url === `file://${process.argv[1]}`) {
  const value = (name: string) => {
    const index = process.argv.indexOf(name);
    return index > 0 ? process.argv[index + 1] : undefined;
  };
  await runLatencyBench({
    ...(value('--services') ? {serviceCounts: value('--services')!.split(',').map(Number)} : {}),
    ...(value('--connections') ? {connections: Number(value('--connections'))} : {}),
    ...(value('--modes') ? {modes: value('--modes')!.split(',') as LatencyMode[]} : {}),
  });
}
