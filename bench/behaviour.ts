// Behaviour diff figures: every packet class of 10,000 services x 10 endpoints traced through an
// iptables and an nftables ruleset rendered for the same node, both in memory, against the floor
// of tracing every class once through one ruleset. Goal: the diff within 10 s.
import {cpus, loadavg} from 'node:os';
import {diffBehaviour, packetClasses, renderedRules, behaviourSide} from '../src/core/behaviour/index.ts';
import {buildProxyModel} from '../src/core/model/index.ts';
import {progressBar} from '../src/plugin/lib/progress-bar.ts';
import {figure, heading, timed} from './report.ts';
import {benchClusterCIDR, benchNodeIP, benchNodeName, makeWorkload} from './workload.ts';

const goalMs = 10_000;
// The workload's ClusterIPs are 10.0.0.1 upward; its pods are in 10.128.0.0/9, outside this range.
const serviceCIDR = '10.0.0.0/16';

export async function benchBehaviour(serviceCount = 10_000, endpointsPerService = 10): Promise<void> {
  const workload = makeWorkload(serviceCount, endpointsPerService);
  const model = buildProxyModel(
    {services: workload.services, endpointSlices: workload.endpointSlices, node: workload.node},
    {family: 'IPv4', nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]},
  );
  const options = {nodeAddresses: [benchNodeIP], serviceCIDRs: [serviceCIDR]};
  const classes = packetClasses(model, options);
  heading(
    'behaviour diff: iptables mode -> nftables mode',
    `${workload.label}, ClusterIP, one TCP port each; ${classes.length.toLocaleString('en-US')} packet classes (each ClusterIP from a pod on the node, the node and an outside client; an undefined port from 2; node-wide classes); both rulesets rendered and parsed in memory beforehand`,
  );
  const iptables = behaviourSide(renderedRules(model, 'iptables', options), [benchNodeIP]);
  const nftables = behaviourSide(renderedRules(model, 'nftables', options), [benchNodeIP]);

  // The floor: each class traced once, through one ruleset, with nothing compared.
  const floor = await timed(() => {
    for (const packetClass of classes) iptables.trace(packetClass.packet);
  });
  const bar = progressBar('classes compared');
  const cpuBefore = process.cpuUsage();
  const diff = await timed(() => diffBehaviour(classes, iptables, nftables, {onProgress: (done, total) => bar.update(done, total)}));
  const cpu = process.cpuUsage(cpuBefore);
  bar.end();
  figure({name: 'trace every class through iptables once', value: floor.ms, unit: 'ms'});
  figure({
    name: 'behaviour diff (both rulesets, compared)',
    value: diff.ms,
    unit: 'ms',
    floor: {name: 'tracing every class once', value: floor.ms},
    note: `goal <= ${goalMs / 1000} s ${diff.ms <= goalMs ? 'met' : 'NOT met'}; ${diff.result.summary.changedClasses.toLocaleString('en-US')} classes differ`,
  });
  // On a shared machine the wall time says more about the neighbours than about the diff.
  figure({
    name: 'behaviour diff, CPU time of this process',
    value: (cpu.user + cpu.system) / 1000,
    unit: 'ms',
    note: `load average ${loadavg()[0].toFixed(1)} on ${cpus().length} CPUs during the run`,
  });
  const one = packetClasses(model, {...options, service: 'bench/svc-4242'});
  const single = await timed(() => diffBehaviour(one, iptables, nftables));
  figure({name: `--service bench/svc-4242 (${one.length} classes)`, value: single.ms, unit: 'ms'});
}
