// Behaviour diff figures: every packet class of 10,000 services x 10 endpoints traced through an
// iptables and an nftables ruleset rendered for the same node, both in memory, against the floor
// of tracing every class once through one ruleset. Goal: the diff within 10 s.
// Then migrate-check end to end: `kubectl proxyctl migrate-check --to nftables NODE` as a new
// process against a one-node lab (its node is node-0), beside `kubectl proxyctl status` (the same way to the agent,
// without the diff) and `kubectl get svc`. Goal: within 2 s.
import {execFile} from 'node:child_process';
import {cpus, loadavg} from 'node:os';
import {fileURLToPath} from 'node:url';
import {downLab, upLab} from '../src/lab/lab-control.ts';
import {diffBehaviour, packetClasses, renderedRules, behaviourSide} from '../src/core/behaviour/index.ts';
import {buildProxyModel} from '../src/core/model/index.ts';
import {progressBar} from '../src/plugin/lib/progress-bar.ts';
import {figure, heading, percentile, skipped, timed} from './report.ts';
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
  await benchMigrateCheck();
}

const migrateGoalMs = 2000;
const labRuns = 5;
const projectRoot = fileURLToPath(new URL('..', import.meta.url));

/** One run of a command as a new process; the exit codes in `accept` are answers (migrate-check exits 1 when something would change). */
function runOnce(argv: string[], env: NodeJS.ProcessEnv, accept: number[]): Promise<number> {
  return new Promise((resolve, reject) => {
    execFile(argv[0], argv.slice(1), {env, maxBuffer: 16 << 20}, (error, _stdout, stderr) => {
      const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
      if (accept.includes(code)) resolve(code);
      else reject(new Error(`${argv.join(' ')}: exit ${code}: ${String(stderr).trim().split('\n').slice(-3).join(' / ')}`));
    });
  });
}

/** p50 and fastest of `labRuns` runs after one warm-up, in ms. */
async function p50(argv: string[], env: NodeJS.ProcessEnv, accept = [0]): Promise<{p50: number; min: number}> {
  const times: number[] = [];
  for (let i = 0; i <= labRuns; i++) {
    const run = await timed(() => runOnce(argv, env, accept));
    if (i > 0) times.push(run.ms);
  }
  times.sort((a, b) => a - b);
  return {p50: percentile(times, 50), min: times[0]};
}

export async function benchMigrateCheck(): Promise<void> {
  heading(
    'migrate-check of one lab node, end to end',
    `kubectl proxyctl migrate-check --to nftables NODE as a new process against a one-node lab (its demo services, 3 demo pods, the agent in ` +
      `iptables mode); p50 of ${labRuns} runs after one warm-up`,
  );
  if (process.getuid?.() !== 0) {
    skipped('migrate-check --to nftables NODE', 'needs root (the lab builds network namespaces)');
    return;
  }
  const name = `bench-migrate-${process.pid}`;
  const interrupted = () => void downLab(name).finally(() => process.exit(130));
  process.once('SIGINT', interrupted).once('SIGTERM', interrupted);
  try {
    const state = await upLab({name, nodes: 1, podsPerNode: 3});
    const env = {...process.env, PATH: `${projectRoot}bin:${process.env.PATH}`, NO_COLOR: '1', KUBECONFIG: state.kubeconfig};
    const getSvc = await p50(['kubectl', 'get', 'svc'], env);
    figure({name: 'kubectl get svc', value: getSvc.p50, unit: 'ms', note: `min ${getSvc.min.toFixed(0)} ms`});
    const status = await p50(['kubectl', 'proxyctl', 'status'], env);
    figure({
      name: 'kubectl proxyctl status',
      value: status.p50,
      unit: 'ms',
      floor: {name: 'kubectl get svc', value: getSvc.p50},
      note: `min ${status.min.toFixed(0)} ms`,
    });
    const node = state.agents[0].node;
    const check = await p50(['kubectl', 'proxyctl', 'migrate-check', '--to', 'nftables', node], env, [0, 1]);
    figure({
      name: `kubectl proxyctl migrate-check --to nftables ${node}`,
      value: check.p50,
      unit: 'ms',
      floor: {name: 'kubectl proxyctl status', value: status.p50},
      note: `min ${check.min.toFixed(0)} ms; goal <= ${migrateGoalMs / 1000} s ${check.p50 <= migrateGoalMs ? 'met' : 'NOT met'}`,
    });
  } finally {
    process.off('SIGINT', interrupted).off('SIGTERM', interrupted);
    await downLab(name).catch((error: Error) => console.error(`lab down ${name}: ${error.message}`));
  }
}
