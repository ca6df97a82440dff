// nftables mode sync figures (root only): full sync and one endpoint change at 10,000 services x 10
// endpoints beside a kube-proxy-shaped table (a chain per endpoint) loaded by the same `nft`.
// First-packet latency, iptables beside nftables, is bench/latency.ts.
import {performance} from 'node:perf_hooks';
import {buildProxyModel, changedServicePorts, type EndpointSliceInput, type ProxyModel} from '../src/core/model/index.ts';
import {endpointNameBase, servicePortNameBase} from '../src/core/nftables/names.ts';
import {renderNftablesSync} from '../src/core/nftables/render.ts';
import {
  createNamespace,
  deleteNamespace,
  deleteNamespacesWithPrefix,
  execInNamespace,
  netnsUnavailableReason,
  newNamespacePrefix,
} from '../src/lab/netns/index.ts';
import {benchClusterCIDR, benchNodeName, makeWorkload, type Workload} from './workload.ts';

export interface NftablesBenchOptions {
  /** Services (x 10 endpoints) for the sync figures. Default 10,000. */
  syncServices?: number;
  /** Skip loading the kube-proxy-shaped table (it takes more than a minute at 10,000 x 10). */
  skipKubeProxyFloor?: boolean;
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
  return buildProxyModel(
    {services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node},
    {family: 'IPv4', clusterCIDRs: [benchClusterCIDR], nodeName: benchNodeName},
  );
}

/**
 * kubeProxyShapedScript writes the table the way kube-proxy's nftables proxier lays it out for
 * ClusterIP services (a chain per endpoint, chosen by `numgen ... vmap`), as the floor to compare.
 */
function kubeProxyShapedScript(model: ProxyModel, only?: string): string {
  const t = 'ip kube-proxy';
  const out: string[] = [];
  if (!only) {
    out.push(
      `add table ${t}`,
      `add chain ${t} nat-prerouting { type nat hook prerouting priority -100 ; }`,
      `add chain ${t} services`,
      `add chain ${t} mark-for-masquerade`,
    );
    out.push(
      `add map ${t} service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }`,
      `add rule ${t} nat-prerouting jump services`,
      `add rule ${t} services ip daddr . meta l4proto . th dport vmap @service-ips`,
    );
  }
  const elements: string[] = [];
  for (const port of model.servicePorts) {
    if (only && port.key !== only) continue;
    const chain = `service-${servicePortNameBase(port)}`;
    const endpoints = port.clusterEndpoints.map((endpoint) => ({endpoint, chain: `endpoint-${endpointNameBase(port, endpoint)}`}));
    for (const name of [chain, ...endpoints.map((entry) => entry.chain)]) out.push(`add chain ${t} ${name}`, `flush chain ${t} ${name}`);
    out.push(
      `add rule ${t} ${chain} ip daddr ${port.clusterIP} tcp dport ${port.port} ip saddr != ${benchClusterCIDR} jump mark-for-masquerade`,
    );
    out.push(
      `add rule ${t} ${chain} numgen random mod ${endpoints.length} vmap { ${endpoints.map((entry, index) => `${index} : goto ${entry.chain}`).join(', ')} }`,
    );
    for (const {endpoint, chain: endpointChain} of endpoints) {
      out.push(
        `add rule ${t} ${endpointChain} ip saddr ${endpoint.ip} jump mark-for-masquerade`,
        `add rule ${t} ${endpointChain} meta l4proto tcp dnat to ${endpoint.ip}:${endpoint.port}`,
      );
    }
    elements.push(`${port.clusterIP} . tcp . ${port.port} : goto ${chain}`);
  }
  for (let start = 0; start < elements.length; start += 500)
    out.push(`add element ${t} service-ips { ${elements.slice(start, start + 500).join(', ')} }`);
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
    log(
      `  proxyctl full sync: model ${millis(built.ms)} + render ${millis(rendered.ms)} + nft -f ${seconds(loaded.ms)} = ${seconds(built.ms + rendered.ms + loaded.ms)} (${(rendered.value.script.length / 1e6).toFixed(1)} MB script)`,
    );

    let state = rendered.value.state;
    let model = built.value;
    const rounds: Array<{model: number; changes: number; render: number; apply: number; lines: number}> = [];
    for (let round = 1; round <= 5; round++) {
      const changedWorkload = withOneEndpointChanged(workload, Math.floor(count / 2), round);
      const next = await timed(() => modelOf(changedWorkload));
      const changed = await timed(() => changedServicePorts(model, next.value));
      const partial = await timed(() => renderNftablesSync(next.value, {existing: state, changedServicePorts: changed.value}));
      const applied = await timed(() => nftLoad(ours, partial.value.script));
      rounds.push({
        model: next.ms,
        changes: changed.ms,
        render: partial.ms,
        apply: applied.ms,
        lines: partial.value.script.trim().split('\n').length,
      });
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
    for (let round = 0; round < 3; round++)
      floorPartial.push((await timed(() => nftLoad(floor, kubeProxyShapedScript(built.value, middle.key)))).ms);
    log(`  kube-proxy-shaped floor, one-service transaction: nft -f ${millis(percentile(floorPartial, 0.5))}`);
    log(
      `  ratio proxyctl / floor: full ${(loaded.ms / floorLoad.ms).toFixed(3)}, one change ${(median((r) => r.apply) / percentile(floorPartial, 0.5)).toFixed(3)} (nft -f only)`,
    );
  } finally {
    await deleteNamespace(ours).catch(() => undefined);
    await deleteNamespace(floor).catch(() => undefined);
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
  await benchSync(options, log);
}

/** Run alone: node bench/nftables.ts [--sync-services N] [--no-floor] */
if (import.meta.url === `file://${process.argv[1]}`) {
  const value = (name: string) => {
    const index = process.argv.indexOf(name);
    return index > 0 ? process.argv[index + 1] : undefined;
  };
  const options: NftablesBenchOptions = {
    ...(value('--sync-services') ? {syncServices: Number(value('--sync-services'))} : {}),
    skipKubeProxyFloor: process.argv.includes('--no-floor'),
  };
  await runNftablesBench(options);
}
