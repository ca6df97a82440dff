// iptables backend figures: render, parse and trace at 1,000 and 10,000 services x 10 endpoints,
// each next to what the kernel tools need for the same ruleset (iptables-restore into an empty
// network namespace, iptables-save out of it).
import {buildProxyModel} from '../src/core/model/index.ts';
import {parseIptablesSave, renderIptables, traceIptables} from '../src/core/iptables/index.ts';
import {deleteNamespace, isRoot, runIn, scratchNamespace} from './netns.ts';
import {figure, heading, mib, percentile, skipped, timed} from './report.ts';
import {benchClusterCIDR, benchNodeIP, benchNodeName, makeWorkload, serviceIP} from './workload.ts';

export async function benchIptables(sizes = [1000, 10000], endpointsPerService = 10): Promise<void> {
  for (const size of sizes) await benchSize(size, endpointsPerService);
}

async function benchSize(serviceCount: number, endpointsPerService: number): Promise<void> {
  const workload = makeWorkload(serviceCount, endpointsPerService);
  heading('iptables: render, parse, trace', `${workload.label}, one TCP port each, ClusterIP, cluster CIDR ${benchClusterCIDR}`);
  const heapBefore = process.memoryUsage().heapUsed;
  const model = await timed(() =>
    buildProxyModel(
      {services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node},
      {family: 'IPv4', nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]},
    ),
  );
  const render = await timed(() => renderIptables(model.result, {includeJumps: true}));
  const heapAfter = process.memoryUsage().heapUsed;
  const lines = render.result.split('\n').length;

  let restoreFloor: number | undefined;
  let saveFloor: number | undefined;
  let dump = render.result;
  if (isRoot) {
    const namespace = scratchNamespace('iptables');
    try {
      restoreFloor = (await timed(() => runIn(namespace, ['iptables-restore'], render.result))).ms;
      const save = await timed(() => runIn(namespace, ['iptables-save']));
      saveFloor = save.ms;
      dump = save.result;
    } finally {
      deleteNamespace(namespace);
    }
  }

  figure({name: 'build model (objects -> ProxyModel)', value: model.ms, unit: 'ms'});
  figure({
    name: `render (${lines.toLocaleString('en-US')} lines)`,
    value: render.ms,
    unit: 'ms',
    floor: restoreFloor === undefined ? undefined : {name: 'iptables-restore of the result', value: restoreFloor, goal: 0.25},
  });
  if (restoreFloor === undefined) skipped('iptables-restore floor', 'needs root (a scratch network namespace)');
  figure({
    name: 'heap held by model + rules',
    value: mib(heapAfter - heapBefore),
    unit: 'MiB',
    note: `peak RSS so far ${mib(process.resourceUsage().maxRSS * 1024).toFixed(0)} MiB`,
  });

  const parse = await timed(() => parseIptablesSave(dump));
  figure({
    name: `parse (${isRoot ? 'iptables-save from the kernel' : 'render output'})`,
    value: parse.ms,
    unit: 'ms',
    floor: saveFloor === undefined ? undefined : {name: 'iptables-save', value: saveFloor},
  });

  // The last service is the worst case for iptables: its rule is last in KUBE-SERVICES.
  const packet = {
    srcIP: '10.128.0.1',
    dstIP: serviceIP(serviceCount - 1),
    dstPort: 80,
    protocol: 'TCP' as const,
    origin: 'arriving' as const,
  };
  const times: number[] = [];
  for (let i = 0; i < 21; i++) times.push((await timed(() => traceIptables(parse.result, packet, {localAddresses: [benchNodeIP]}))).ms);
  times.sort((a, b) => a - b);
  figure({name: 'trace one packet to the last service (p50)', value: percentile(times, 50), unit: 'ms', note: 'goal < 50 ms'});
}
