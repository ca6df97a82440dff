// nftables mode figures (root only): first-packet latency through a ClusterIP against the number
// of services, iptables mode beside nftables mode, and sync times at 10,000 services x 10
// endpoints beside a kube-proxy-shaped table (a chain per endpoint) loaded by the same `nft`.
import {performance} from 'node:perf_hooks';
import {buildProxyModel, changedServicePorts, type EndpointSliceInput, type ProxyModel, type ServiceInput} from '../src/core/model/index.ts';
import {endpointNameBase, servicePortNameBase} from '../src/core/nftables/names.ts';
import {renderNftables, renderNftablesSync} from '../src/core/nftables/render.ts';
import {buildCluster, createNamespace, deleteNamespace, deleteNamespacesWithPrefix, destroyCluster, execInNamespace, netnsUnavailableReason, newNamespacePrefix} from '../src/lab/netns/index.ts';
import {DemoAppGroup} from '../src/lab/workload/launch.ts';
import {benchClusterCIDR, benchNodeIP, benchNodeName, endpointSliceFor, makeWorkload, serviceIP, type Workload} from './workload.ts';

export interface NftablesBenchOptions {
  /** Service counts for first-packet latency. Default 1,000 / 10,000 / 30,000. */
  latencyServiceCounts?: number[];
  /** Connections timed per mode and size. Default 1,000. */
  connections?: number;
  /** Services (x 10 endpoints) for the sync figures. Default 10,000. */
  syncServices?: number;
  /** Skip loading the kube-proxy-shaped table (it takes more than a minute at 10,000 x 10). */
  skipKubeProxyFloor?: boolean;
  skipLatency?: boolean;
  skipSync?: boolean;
  log?: (line: string) => void;
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
const millis = (ms: number) => `${ms.toFixed(ms < 10 ? 2 : 0)} ms`;

function percentile(values: number[], fraction: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(fraction * sorted.length))];
}

async function timed<T>(work: () => Promise<T> | T): Promise<{ms: number; value: T}> {
  const started = performance.now();
  const value = await work();
  return {ms: performance.now() - started, value};
}

async function nftLoad(namespace: string, script: string): Promise<void> {
  await execInNamespace(namespace, ['nft', '-f', '-'], {input: script, timeoutMs: 600_000});
}

function modelOf(workload: Workload): ProxyModel {
  return buildProxyModel({services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node}, {family: 'IPv4', clusterCIDRs: [benchClusterCIDR], nodeName: benchNodeName});
}

/**
 * kubeProxyShapedScript writes the table the way kube-proxy's nftables proxier lays it out for
 * ClusterIP services (a chain per endpoint, chosen by `numgen ... vmap`), as the floor to compare.
 */
function kubeProxyShapedScript(model: ProxyModel, only?: string): string {
  const t = 'ip kube-proxy';
  const out: string[] = [];
  if (!only) {
    out.push(`add table ${t}`, `add chain ${t} nat-prerouting { type nat hook prerouting priority -100 ; }`, `add chain ${t} services`, `add chain ${t} mark-for-masquerade`);
    out.push(`add map ${t} service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }`, `add rule ${t} nat-prerouting jump services`, `add rule ${t} services ip daddr . meta l4proto . th dport vmap @service-ips`);
  }
  const elements: string[] = [];
  for (const port of model.servicePorts) {
    if (only && port.key !== only) continue;
    const chain = `service-${servicePortNameBase(port)}`;
    const endpoints = port.clusterEndpoints.map((endpoint) => ({endpoint, chain: `endpoint-${endpointNameBase(port, endpoint)}`}));
    for (const name of [chain, ...endpoints.map((entry) => entry.chain)]) out.push(`add chain ${t} ${name}`, `flush chain ${t} ${name}`);
    out.push(`add rule ${t} ${chain} ip daddr ${port.clusterIP} tcp dport ${port.port} ip saddr != ${benchClusterCIDR} jump mark-for-masquerade`);
    out.push(`add rule ${t} ${chain} numgen random mod ${endpoints.length} vmap { ${endpoints.map((entry, index) => `${index} : goto ${entry.chain}`).join(', ')} }`);
    for (const {endpoint, chain: endpointChain} of endpoints) {
      out.push(`add rule ${t} ${endpointChain} ip saddr ${endpoint.ip} jump mark-for-masquerade`, `add rule ${t} ${endpointChain} meta l4proto tcp dnat to ${endpoint.ip}:${endpoint.port}`);
    }
    elements.push(`${port.clusterIP} . tcp . ${port.port} : goto ${chain}`);
  }
  for (let start = 0; start < elements.length; start += 500) out.push(`add element ${t} service-ips { ${elements.slice(start, start + 500).join(', ')} }`);
  return out.join('\n') + '\n';
}

/** withOneEndpointChanged: the workload with one endpoint of service `index` moved to a new address. */
function withOneEndpointChanged(workload: Workload, index: number, round: number): Workload {
  const endpointSlices = [...workload.endpointSlices];
  const changed = structuredClone(endpointSlices[index]) as EndpointSliceInput;
  changed.endpoints![0].addresses = [`10.255.${(round >> 8) & 255}.${round & 255}`];
  endpointSlices[index] = changed;
  return {...workload, endpointSlices};
}

async function benchSync(options: NftablesBenchOptions, log: (line: string) => void): Promise<void> {
  const count = options.syncServices ?? 10_000;
  const workload = makeWorkload(count, 10);
  log(`\nnftables sync, ${workload.label} (ClusterIP services, one TCP port each)`);
  const prefix = newNamespacePrefix();
  const ours = `${prefix}nft-ours`;
  const floor = `${prefix}nft-floor`;
  try {
    await createNamespace(ours);
    const built = await timed(() => modelOf(workload));
    const rendered = await timed(() => renderNftablesSync(built.value));
    const loaded = await timed(() => nftLoad(ours, rendered.value.script));
    log(`  proxyctl full sync: model ${millis(built.ms)} + render ${millis(rendered.ms)} + nft -f ${seconds(loaded.ms)} = ${seconds(built.ms + rendered.ms + loaded.ms)} (${(rendered.value.script.length / 1e6).toFixed(1)} MB script)`);

    let state = rendered.value.state;
    let model = built.value;
    const rounds: Array<{model: number; changes: number; render: number; apply: number; lines: number}> = [];
    for (let round = 1; round <= 5; round++) {
      const changedWorkload = withOneEndpointChanged(workload, Math.floor(count / 2), round);
      const next = await timed(() => modelOf(changedWorkload));
      const changed = await timed(() => changedServicePorts(model, next.value));
      const partial = await timed(() => renderNftablesSync(next.value, {existing: state, changedServicePorts: changed.value}));
      const applied = await timed(() => nftLoad(ours, partial.value.script));
      rounds.push({model: next.ms, changes: changed.ms, render: partial.ms, apply: applied.ms, lines: partial.value.script.trim().split('\n').length});
      state = partial.value.state;
      model = next.value;
    }
    const median = (pick: (round: (typeof rounds)[number]) => number) => percentile(rounds.map(pick), 0.5);
    log(
      `  proxyctl one endpoint change (median of ${rounds.length}): render ${millis(median((r) => r.render))} + nft -f ${millis(median((r) => r.apply))} = ${millis(median((r) => r.render + r.apply))} (${median((r) => r.lines)}-line transaction);` +
        ` before it, core/model's full rebuild ${millis(median((r) => r.model))} and change detection ${millis(median((r) => r.changes))}`,
    );

    if (options.skipKubeProxyFloor) {
      log('  kube-proxy-shaped floor: skipped');
      return;
    }
    await createNamespace(floor);
    const floorScript = kubeProxyShapedScript(built.value);
    const floorLoad = await timed(() => nftLoad(floor, floorScript));
    log(`  kube-proxy-shaped floor, full load: nft -f ${seconds(floorLoad.ms)} (${(floorScript.length / 1e6).toFixed(1)} MB script)`);
    const middle = built.value.servicePorts[Math.floor(built.value.servicePorts.length / 2)];
    const floorPartial: number[] = [];
    for (let round = 0; round < 3; round++) floorPartial.push((await timed(() => nftLoad(floor, kubeProxyShapedScript(built.value, middle.key)))).ms);
    log(`  kube-proxy-shaped floor, one-service transaction: nft -f ${millis(percentile(floorPartial, 0.5))}`);
    log(`  ratio proxyctl / floor: full ${(loaded.ms / floorLoad.ms).toFixed(3)}, one change ${(median((r) => r.apply) / percentile(floorPartial, 0.5)).toFixed(3)} (nft -f only)`);
  } finally {
    await deleteNamespace(ours).catch(() => undefined);
    await deleteNamespace(floor).catch(() => undefined);
    await deleteNamespacesWithPrefix(prefix);
  }
}

/** latencyWorkload: N ClusterIP services of one endpoint each; the measured one sorts last. */
function latencyWorkload(count: number, serverIP: string): Workload {
  const base = makeWorkload(count - 1, 1);
  const target: ServiceInput = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name: 'zz-target', namespace: 'bench'},
    spec: {type: 'ClusterIP', clusterIP: serviceIP(count), clusterIPs: [serviceIP(count)], ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}]},
  };
  const slice = endpointSliceFor(0, 1);
  const targetSlice: EndpointSliceInput = {
    ...slice,
    metadata: {name: 'zz-target-1', namespace: 'bench', labels: {'kubernetes.io/service-name': 'zz-target'}},
    endpoints: [{addresses: [serverIP], nodeName: benchNodeName, conditions: {ready: true}}],
  };
  return {...base, services: [...base.services, target], endpointSlices: [...base.endpointSlices, targetSlice]};
}

async function benchLatency(options: NftablesBenchOptions, log: (line: string) => void): Promise<void> {
  const counts = options.latencyServiceCounts ?? [1_000, 10_000, 30_000];
  const connections = options.connections ?? 1_000;
  const iptables = (await import('../src/core/iptables/index.ts' as string).catch(() => undefined)) as {renderIptables?: (model: ProxyModel, options?: {includeJumps?: boolean}) => string} | undefined;
  log(`\nfirst-packet latency: TCP connect from a pod to a ClusterIP through its node, ${connections} connections per figure;`);
  log('  N ClusterIP services of one endpoint each, the measured one last in rule order');
  const prefix = newNamespacePrefix();
  const apps = new DemoAppGroup();
  const topology = await buildCluster({prefix, nodes: 1, podsPerNode: 2, upstream: false});
  try {
    const [client, server] = topology.nodes[0].pods;
    const nodeNamespace = topology.nodes[0].namespace;
    await apps.start([{namespace: server.namespace, name: server.name, httpPort: 8080, udpPort: 5353}]);
    const results: Array<{count: number; mode: string; p50: number; p99: number}> = [];
    for (const count of counts) {
      const workload = latencyWorkload(count, server.ip);
      const model = buildProxyModel({services: workload.services, endpointSlices: workload.endpointSlices, node: {...workload.node, status: {addresses: [{type: 'InternalIP', address: topology.nodes[0].ip}]}}}, {family: 'IPv4', clusterCIDRs: [benchClusterCIDR, topology.clusterCIDR], nodeName: benchNodeName});
      const target = serviceIP(count);
      const modes: Array<{mode: string; load: () => Promise<void>; clear: () => Promise<void>}> = [
        {mode: 'nftables', load: () => nftLoad(nodeNamespace, renderNftables(model)), clear: () => nftLoad(nodeNamespace, 'delete table ip kube-proxy\n')},
      ];
      if (iptables?.renderIptables) {
        const render = iptables.renderIptables;
        modes.unshift({
          mode: 'iptables',
          load: async () => void (await execInNamespace(nodeNamespace, ['iptables-restore', '-w', '5'], {input: render(model, {includeJumps: true}), timeoutMs: 600_000})),
          clear: async () => void (await execInNamespace(nodeNamespace, ['sh', '-c', 'for t in nat filter; do iptables -t $t -F; iptables -t $t -X; done'])),
        });
      }
      for (const mode of modes) {
        const loaded = await timed(() => mode.load());
        log(`  (${mode.mode}: ${count.toLocaleString('en-US')} services loaded in ${seconds(loaded.ms)})`);
        try {
          // Warm up once so the route and neighbour entries exist before timing.
          await execInNamespace(client.namespace, [process.execPath, new URL('./nftables-connect.ts', import.meta.url).pathname, target, '80', '20']);
          const {stdout} = await execInNamespace(client.namespace, [process.execPath, new URL('./nftables-connect.ts', import.meta.url).pathname, target, '80', String(connections)], {timeoutMs: 600_000});
          const times = JSON.parse(stdout) as number[];
          const figure = {count, mode: mode.mode, p50: percentile(times, 0.5), p99: percentile(times, 0.99)};
          results.push(figure);
          log(`  ${count.toLocaleString('en-US').padStart(6)} services  ${mode.mode.padEnd(8)}  p50 ${millis(figure.p50).padStart(8)}  p99 ${millis(figure.p99).padStart(8)}`);
        } finally {
          await mode.clear();
        }
      }
    }
    if (!iptables?.renderIptables) log('  iptables mode: src/core/iptables is not in this tree; only nftables measured');
    const nft = results.filter((result) => result.mode === 'nftables');
    if (nft.length > 1) log(`  nftables p99 at ${nft[nft.length - 1].count.toLocaleString('en-US')} / at ${nft[0].count.toLocaleString('en-US')} services: ${(nft[nft.length - 1].p99 / nft[0].p99).toFixed(2)}x (goal <= 1.2x)`);
    const ipt = results.filter((result) => result.mode === 'iptables');
    if (ipt.length > 1) log(`  iptables p99 at ${ipt[ipt.length - 1].count.toLocaleString('en-US')} / at ${ipt[0].count.toLocaleString('en-US')} services: ${(ipt[ipt.length - 1].p99 / ipt[0].p99).toFixed(2)}x`);
  } finally {
    await apps.stopAll();
    await destroyCluster(topology).catch(() => undefined);
    await deleteNamespacesWithPrefix(prefix);
  }
}

/** runNftablesBench prints the nftables figures; without root it says why and returns. */
export async function runNftablesBench(options: NftablesBenchOptions = {}): Promise<void> {
  const log = options.log ?? ((line: string) => console.log(line));
  const unavailable = await netnsUnavailableReason();
  if (unavailable) {
    log(`nftables bench skipped: ${unavailable}`);
    return;
  }
  if (!options.skipLatency) await benchLatency(options, log);
  if (!options.skipSync) await benchSync(options, log);
}

/** Run alone: node bench/nftables.ts [--services 1000,10000,30000] [--connections N] [--sync-services N] [--no-floor] [--no-latency] [--no-sync] */
if (import.meta.url === `file://${process.argv[1]}`) {
  const value = (name: string) => {
    const index = process.argv.indexOf(name);
    return index > 0 ? process.argv[index + 1] : undefined;
  };
  const options: NftablesBenchOptions = {
    ...(value('--services') ? {latencyServiceCounts: value('--services')!.split(',').map(Number)} : {}),
    ...(value('--connections') ? {connections: Number(value('--connections'))} : {}),
    ...(value('--sync-services') ? {syncServices: Number(value('--sync-services'))} : {}),
    skipKubeProxyFloor: process.argv.includes('--no-floor'),
    skipLatency: process.argv.includes('--no-latency'),
    skipSync: process.argv.includes('--no-sync'),
  };
  await runNftablesBench(options);
}
