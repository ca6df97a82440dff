// ipvs backend figures: full sync and one-endpoint change at 1,000 and 10,000 services x 10
// endpoints, next to the floor of loading the same state with `ipset restore` + `ipvsadm-restore`
// into an empty network namespace. The kernel needs IP_VS; on a host without it the whole
// benchmark runs inside the qemu guest (scripts/qemu/guest.ts), so both sides share one CPU model.
import {buildProxyModel} from '../src/core/model/index.ts';
import {
  diffIpvs,
  formatIpsetRestore,
  formatIpvsadmRestore,
  parseIpsetSave,
  parseIpvsadmSave,
  planIpvsSync,
  renderIpvs,
  traceIpvs,
  type IpvsState,
} from '../src/core/ipvs/index.ts';
import {guestUnavailableReason, hostHasIpvs, nodeCrashedInGuest, runInGuest} from '../scripts/qemu/guest.ts';
import {deleteNamespace, isRoot, runIn, scratchNamespace} from './netns.ts';
import {figure, heading, percentile, skipped, timed} from './report.ts';
import {benchClusterCIDR, benchNodeIP, benchNodeName, endpointSliceFor, makeWorkload, serviceIP} from './workload.ts';

export async function benchIpvs(sizes = [1000, 10000], endpointsPerService = 10): Promise<void> {
  if (process.env.PROXYCTL_IN_GUEST !== '1' && !(isRoot && hostHasIpvs())) {
    const unavailable = isRoot ? guestUnavailableReason() : 'needs root';
    if (unavailable) {
      skipped('ipvs benchmark', `this kernel has no IP_VS and no qemu guest: ${unavailable}`);
      return;
    }
    await benchInGuest(`import('./bench/ipvs.ts').then((m) => m.benchIpvs(${JSON.stringify(sizes)}, ${endpointsPerService}))`, {
      memoryMiB: 3072,
      timeoutMs: 1_800_000,
    });
    return;
  }
  for (const size of sizes) await benchSize(size, endpointsPerService);
}

/**
 * benchInGuest runs `program` (a module's bench function, imported from the checkout) in a qemu
 * guest with Debian's kernel, which has IP_VS, printing its output as it comes.
 */
export async function benchInGuest(program: string, options: {memoryMiB: number; timeoutMs: number}): Promise<void> {
  console.log("   (this kernel has no IP_VS: running in a qemu guest with Debian's kernel, software-emulated CPU)");
  const run = () =>
    runInGuest([process.execPath, '--input-type=module', '-e', program], {
      ...options,
      onStdout: (chunk) => process.stdout.write(chunk),
      onStderr: (chunk) => process.stderr.write(chunk),
    });
  let result = await run();
  if (nodeCrashedInGuest(result)) {
    // As the guest's test runs are: qemu's emulation of the CPU makes Node crash now and then in a long run.
    console.log("   the guest's Node crashed (the emulator's doing: scripts/qemu/guest.ts); running once more");
    result = await run();
  }
  if (result.exitCode !== 0) console.log(`   guest run failed (exit ${result.exitCode ?? 'none'}${result.timedOut ? ', timed out' : ''})`);
}

async function benchSize(serviceCount: number, endpointsPerService: number): Promise<void> {
  const workload = makeWorkload(serviceCount, endpointsPerService);
  heading('ipvs: full sync and one-endpoint change', `${workload.label}, one TCP port each, ClusterIP`);
  const options = {family: 'IPv4' as const, nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]};
  const empty: IpvsState = {family: 'IPv4', virtualServers: [], sets: [], boundAddresses: [], iptables: ''};

  // Full sync as the proxy computes it: model, render, the restore texts, the diff against an empty node.
  const full = await timed(() => {
    const state = renderIpvs(
      buildProxyModel({services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node}, options),
    );
    const texts = {ipvs: formatIpvsadmRestore(state.virtualServers), sets: formatIpsetRestore(state.sets, 'IPv4')};
    return {state, texts, diff: diffIpvs(state, empty)};
  });
  const servers = full.result.state.virtualServers.length;

  // One endpoint of the last service replaced: the incremental sync's plan (ipvsadm -R and ipset restore lines).
  const changedSlices = [...workload.endpointSlices];
  changedSlices[serviceCount - 1] = endpointSliceFor(serviceCount - 1, endpointsPerService, 1);
  const change = await timed(() => {
    const state = renderIpvs(buildProxyModel({services: workload.services, endpointSlices: changedSlices, node: workload.node}, options));
    return planIpvsSync(state, full.result.state);
  });
  const changedLines = change.result.changes;

  const namespace = scratchNamespace('ipvs');
  let setsFloor: number;
  let ipvsFloor: number;
  let readBack: {ipvs: string; sets: string};
  let changeApply: number;
  try {
    // IPVS refuses masquerading real servers while loopback is down (it cannot classify their addresses).
    runIn(namespace, ['ip', 'link', 'set', 'lo', 'up']);
    setsFloor = (await timed(() => runIn(namespace, ['ipset', 'restore'], full.result.texts.sets))).ms;
    ipvsFloor = (await timed(() => runIn(namespace, ['ipvsadm-restore'], full.result.texts.ipvs))).ms;
    readBack = {ipvs: runIn(namespace, ['ipvsadm', '-Sn']), sets: runIn(namespace, ['ipset', 'save'])};
    changeApply = (
      await timed(() => {
        runIn(namespace, ['ipvsadm', '-R'], change.result.ipvsadm);
        if (change.result.ipset) runIn(namespace, ['ipset', 'restore'], change.result.ipset);
      })
    ).ms;
  } finally {
    deleteNamespace(namespace);
  }
  const floor = setsFloor + ipvsFloor;

  figure({
    name: `full sync compute (${servers.toLocaleString('en-US')} virtual servers)`,
    value: full.ms,
    unit: 'ms',
    floor: {name: 'ipset restore + ipvsadm-restore', value: floor},
  });
  figure({name: '  of which ipset restore', value: setsFloor, unit: 'ms'});
  figure({name: '  of which ipvsadm-restore', value: ipvsFloor, unit: 'ms'});
  figure({
    name: `one-endpoint change (${changedLines} changes planned)`,
    value: change.ms,
    unit: 'ms',
    floor: {name: 'ipset restore + ipvsadm-restore', value: floor},
  });
  figure({name: '  applying that plan (ipvsadm -R + ipset restore)', value: changeApply, unit: 'ms'});
  const parse = await timed(() => ({virtualServers: parseIpvsadmSave(readBack.ipvs), sets: parseIpsetSave(readBack.sets)}));
  figure({name: 'parse ipvsadm -Sn + ipset save', value: parse.ms, unit: 'ms'});
  const applied: IpvsState = {...full.result.state, ...parse.result};
  const packet = {
    srcIP: '10.128.0.1',
    dstIP: serviceIP(serviceCount - 1),
    dstPort: 80,
    protocol: 'TCP' as const,
    origin: 'arriving' as const,
  };
  const times: number[] = [];
  for (let i = 0; i < 21; i++) times.push((await timed(() => traceIpvs(applied, packet, {localAddresses: [benchNodeIP]}))).ms);
  times.sort((a, b) => a - b);
  figure({name: 'trace one packet to the last service (p50)', value: percentile(times, 50), unit: 'ms'});
}
