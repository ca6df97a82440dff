// The observing agent's figures (docs/observe.md, Figures) at 1,000 and 10,000 services x 10
// endpoints, beside kube-proxy's rules in each of its layouts: a proxyctl-agent --observe process
// on a scratch network namespace, fed by the embedded API server in this process, as
// bench/agent.ts runs the proxying agent. kube-proxy's stand-in is its layout rendered by proxyctl
// and loaded straight into the namespace: iptables mode's with iptables-restore (with the
// conditional pieces this node's iptables allows, as the observer detects them), nftables mode's
// (`nftablesLayout: 'kube-proxy'`) with nft -f, ipvs mode's as kube-proxy leaves it: the service
// addresses on the dummy device kube-ipvs0, the sets with ipset restore, the virtual servers with
// ipvsadm-restore and its iptables layer with iptables-restore. ipvs needs IP_VS: on a kernel
// without it (this host's) the ipvs layout runs in a qemu guest with Debian's kernel
// (scripts/qemu/guest.ts), after the other layouts; the guest's CPU is emulated, so its times are
// slow, and what counts is their ratio to the dump tool timed in the same guest. Per layout:
// - first full read: the observer's own reading of kube-proxy's rules, from running the dump tool to
//   the rules parsed (it logs how long), next to the mode's own dump tool on the same rules
//   (iptables-save; `nft -j list table ip kube-proxy`; for ipvs the commands the observer reads
//   with, one after another: `ipvsadm -Sn`, `ipset save`, `ip -j addr show dev kube-ipvs0`,
//   iptables-save), timed before the observer starts and after it stopped; goal <= 1.5x; and the
//   observer's start to its first drift check done (status says when), which adds the lists, the
//   desired rules and the comparison;
// - the observer's RSS after the first full read, 10 traces and a diff through its WebSocket API
//   (goal < 250 MiB), each read once it is idle (its CPU time still for 1.5 s: the garbage of
//   the last answer collected), and its peak (VmHWM) since it started;
// - a foreign change (one service's rule or map element deleted by hand; in ipvs mode one real
//   server of one service's virtual server), from the deleting command's exit to the observer's
//   log line naming the drifted service port, logged as its metrics count it (goal <= 5 s; the
//   metrics are then asked once and must count it), and the observer's own CPU time
//   (utime + stime in /proc/PID/stat) from just before the change until it is idle again (goal
//   <= 1 s per change); its reaped children's CPU (the dumps it ran) is noted, and its CPU while
//   idle, per second. In ipvs mode virtual servers and sets change unseen by nft monitor: the
//   observer looks at them every few seconds (watchIpvsState), its looks reap their commands, and
//   it is seldom idle for long. There a change is counted until 4 s after its drift is logged,
//   less the observer's CPU over as long a time with nothing changed, measured over 10 s
//   just before it: what the change itself cost. The looks are in the idle CPU, given apart.
// PXBENCH_OBSERVE_SIZES=1000 (comma-separated service counts) runs only those sizes, and
// PXBENCH_OBSERVE_LAYOUTS=iptables (or nftables, ipvs, comma-separated) only those layouts: the
// 10,000-service run takes many minutes, most of them loading kube-proxy's nftables table, and
// the ipvs layout in the guest longer. PXBENCH_CPU_PROFILE_DIR=DIR writes a CPU profile of each
// foreign change there (bench/cpu-profile.ts); the CPU figures then hold the profiler's own cost.
import {mkdtemp, readFile, rm} from 'node:fs/promises';
import {setTimeout as sleep} from 'node:timers/promises';
import {loadavg, tmpdir} from 'node:os';
import {join} from 'node:path';
import {buildProxyModel, type EndpointSliceInput, type ProxyModel, type ServiceInput} from '../src/core/model/index.ts';
import {renderIptables} from '../src/core/iptables/render.ts';
import {renderNftables} from '../src/core/nftables/render.ts';
import {dummyDevice, formatIpsetRestore, formatIpvsadmRestore, renderIpvs, withJumpRules} from '../src/core/ipvs/index.ts';
import {CommandHost} from '../src/agent/host/command-host.ts';
import {createLogger} from '../src/agent/log.ts';
import {detectIptablesFeatures} from '../src/agent/sync/iptables-features.ts';
import {startApiServer} from '../src/lab/apiserver/server.ts';
import {AgentClient} from '../src/plugin/lib/agent-client.ts';
import type {StatusResult} from '../src/protocol/methods.ts';
import {guestUnavailableReason, hostHasIpvs} from '../scripts/qemu/guest.ts';
import {type AgentRun, loadWorkload, startAgentRun, tracesAcross} from './agent.ts';
import {type AgentProfiler, connectProfiler, cpuProfileDir, inspectorFlag} from './cpu-profile.ts';
import {benchInGuest} from './ipvs.ts';
import {deleteNamespace, isRoot, runIn, runInAsync, scratchNamespace} from './netns.ts';
import {figure, heading, mib, percentile, skipped, timed} from './report.ts';
import {benchClusterCIDR, benchNodeName, makeWorkload, serviceIP} from './workload.ts';

const quiet = createLogger({write: () => {}});
/** Traces through the API before the RSS is read, as the issue's figure asks; then one whole-node diff. */
const apiTraces = 10;
/** Foreign changes per layout; the median and the largest are printed. */
const foreignChanges = 3;
/**
 * How long a change is counted (and with PXBENCH_CPU_PROFILE_DIR, profiled) once the drift is
 * logged, where the observer looks on a timer: its explanation, log line and the next look.
 */
const countedAfterNoticeMs = 4000;
/** Where the observer looks on a timer: how long its CPU is measured before each change, with nothing changed. */
const quietMeasuredMs = 10_000;
/** How often the bench asks the observer (status, metrics) while it waits for something. */
const pollMs = 100;
/** The observer is idle again once its CPU time has not grown for this long. */
const idleWindowMs = 1500;
/** How long the observer's idle CPU is measured before the first change. */
const idleMeasuredMs = 35_000;
/** Clock ticks per second of /proc/PID/stat's times (USER_HZ, 100 on Linux). */
const ticksPerSecond = 100;

/** One of kube-proxy's layouts as the bench loads it, deletes a piece of it, and dumps it. */
interface ObservedLayout {
  name: 'iptables' | 'nftables' | 'ipvs';
  dumpName: string;
  /** The commands that dump the layout as the observer reads it, run one after another. */
  dump: string[][];
  /** kube-proxy's rules for `model` (the namespace tells what the node allows), and the commands that load them, in order. */
  render(
    model: ProxyModel,
    node: {namespace: string; serviceCIDRs: string[]},
  ): Promise<{text: string; load: Array<{command: string[]; input?: string}>; size: string}>;
  /** The command that deletes one piece of service `s`'s rules from `text`, as someone on the node might. */
  deleteOne(text: string, s: number): string[];
  /** How the observer learns of a foreign change beyond nft monitor (ipvs mode's looks), for the figures' notes. */
  changeSignal?: string;
  /**
   * The observer's log line when a look sees a foreign change (logged from --v 3): its CPU from
   * that line to the drift's is the change's own work, apart from the looks it makes anyway.
   */
  changeSeen?: RegExp;
  /**
   * Where the observer looks on a timer: the file each look reads whole in the node's namespace,
   * whose reading by dd (its own time: the kernel spelling the file) is the least a look can take.
   */
  lookReads?: string;
}

const iptablesLayout: ObservedLayout = {
  name: 'iptables',
  dumpName: 'iptables-save',
  dump: [['iptables-save']],
  async render(model, {namespace}) {
    const iptablesFeatures = await detectIptablesFeatures(new CommandHost({netns: namespace}), quiet, {
      families: ['IPv4'],
      createCounters: false,
    });
    const text = renderIptables({...model, config: {...model.config, iptablesFeatures}}, {includeJumps: true});
    const load = [{command: ['iptables-restore', '-w', '5'], input: text}];
    return {text, load, size: `${text.split('\n').length.toLocaleString('en-US')} iptables lines`};
  },
  deleteOne(text, s) {
    // The service's jump in KUBE-SERVICES, deleted by its spec as `iptables -D` takes it.
    const jump = text.split('\n').find((line) => line.startsWith('-A KUBE-SERVICES ') && line.includes(`"bench/svc-${s}:http cluster IP"`));
    if (!jump) throw new Error(`no KUBE-SERVICES jump for bench/svc-${s} in the rendered rules`);
    const words = [...jump.slice(3).matchAll(/"([^"]*)"|(\S+)/g)].map((match) => match[1] ?? match[2]);
    return ['iptables', '-w', '5', '-t', 'nat', '-D', ...words];
  },
};

const nftablesLayout: ObservedLayout = {
  name: 'nftables',
  dumpName: 'nft -j list table ip kube-proxy',
  dump: [['nft', '-j', 'list', 'table', 'ip', 'kube-proxy']],
  async render(model, {serviceCIDRs}) {
    const text = renderNftables({...model, config: {...model.config, nftablesLayout: 'kube-proxy'}}, {serviceCIDRs});
    return {text, load: [{command: ['nft', '-f', '-'], input: text}], size: `${(text.length / 1e6).toFixed(1)} MB nft script`};
  },
  deleteOne(text, s) {
    // The service's element of the service-ips verdict map.
    const ip = new RegExp(`(\\d+\\.\\d+\\.\\d+\\.\\d+) \\. tcp \\. 80 : goto service-\\w+-bench/svc-${s}/tcp/http\\b`).exec(text)?.[1];
    if (!ip) throw new Error(`no service-ips element for bench/svc-${s} in the rendered table`);
    return ['nft', 'delete', 'element', 'ip', 'kube-proxy', 'service-ips', `{ ${ip} . tcp . 80 }`];
  },
};

const ipvsLayout: ObservedLayout = {
  name: 'ipvs',
  dumpName: 'ipvsadm -Sn + ipset save + ip addr + iptables-save',
  // What the observer runs to read ipvs mode's state (readIpvsKernelState), in its order.
  dump: [['ipvsadm', '-Sn'], ['ipset', 'save'], ['ip', '-j', 'addr', 'show', 'dev', dummyDevice], ['iptables-save']],
  async render(model) {
    const state = renderIpvs(model);
    const servers = formatIpvsadmRestore(state.virtualServers);
    // IPVS refuses masquerading real servers while loopback is down; kube-proxy keeps kube-ipvs0 down.
    const device = [
      'link set lo up',
      `link add ${dummyDevice} type dummy`,
      ...state.boundAddresses.map((ip) => `addr add ${ip}/32 dev ${dummyDevice}`),
    ];
    const iptables = withJumpRules(state.iptables);
    const entries = state.sets.reduce((sum, set) => sum + set.entries.length, 0);
    return {
      text: servers,
      load: [
        {command: ['ip', '-batch', '-'], input: `${device.join('\n')}\n`},
        // kube-proxy's ipvs sysctls, as the kernel tests load its state.
        {
          command: [
            'sysctl',
            '-qw',
            'net.ipv4.vs.conntrack=1',
            'net.ipv4.vs.expire_nodest_conn=1',
            'net.ipv4.vs.expire_quiescent_template=1',
          ],
        },
        {command: ['ipset', 'restore'], input: formatIpsetRestore(state.sets, 'IPv4')},
        {command: ['ipvsadm-restore'], input: servers},
        {command: ['iptables-restore', '-w', '5'], input: iptables},
      ],
      size:
        `${state.virtualServers.length.toLocaleString('en-US')} virtual servers, ${entries.toLocaleString('en-US')} set entries, ` +
        `${state.boundAddresses.length.toLocaleString('en-US')} addresses, ${iptables.split('\n').length} iptables lines`,
    };
  },
  deleteOne(text, s) {
    // One real server of the service's virtual server, as `ipvsadm -d` takes it.
    const ip = serviceIP(s);
    const real = new RegExp(`^-a -t ${ip.replaceAll('.', '\\.')}:80 -r (\\S+) `, 'm').exec(text)?.[1];
    if (!real) throw new Error(`no real server of bench/svc-${s} (${ip}:80) in the rendered virtual servers`);
    return ['ipvsadm', '-d', '-t', `${ip}:80`, '-r', real];
  },
  changeSignal:
    "the observer looks at the ipvs state every 2 s from one look's start to the next, further apart for a slow look but so as to see a change within 4 s while a look takes under 1.3 s (lookPeriod) (/proc/net/ip_vs, read through a process kept in the node namespace, ipset list -t, ip -br addr show dev kube-ipvs0; the servers that changed spelled from the table, or ipvsadm -Sn)",
  changeSeen: /agent api: ipvs state changed/,
  lookReads: '/proc/net/ip_vs',
};

export async function benchObserve(
  sizes = (process.env.PXBENCH_OBSERVE_SIZES ?? '1000,10000').split(',').map(Number),
  endpointsPerService = 10,
  layoutNames = (process.env.PXBENCH_OBSERVE_LAYOUTS ?? 'iptables,nftables,ipvs').split(','),
): Promise<void> {
  if (!isRoot) {
    heading('observe: an observing agent beside kube-proxy', 'proxyctl-agent --observe on a scratch network namespace');
    skipped('every figure', 'needs root (scratch network namespaces, kube-proxy layouts loaded into them)');
    return;
  }
  const layouts = [iptablesLayout, nftablesLayout, ipvsLayout].filter((layout) => layoutNames.includes(layout.name));
  // hostHasIpvs loads ip_vs where the kernel has it (the guest's); without it, ipvs runs in a guest.
  const ipvsElsewhere = layouts.includes(ipvsLayout) && !hostHasIpvs();
  for (const size of sizes) {
    for (const layout of layouts) if (!(ipvsElsewhere && layout === ipvsLayout)) await benchLayout(size, endpointsPerService, layout);
  }
  if (!ipvsElsewhere) return;
  const unavailable = process.env.PROXYCTL_IN_GUEST === '1' ? 'modprobe ip_vs failed in the guest' : guestUnavailableReason();
  if (unavailable) {
    heading('observe (kube-proxy ipvs): first full read, memory, drift', 'kube-proxy ipvs mode');
    skipped('every figure', `this kernel has no IP_VS and no qemu guest: ${unavailable}`);
  } else
    await benchInGuest(
      `import('./bench/observe.ts').then((m) => m.benchObserve(${JSON.stringify(sizes)}, ${endpointsPerService}, ['ipvs']))`,
      // The observer beside 10,000 services, the bench's API server and kube-proxy's state in the guest's kernel.
      {memoryMiB: 4096, timeoutMs: 5_400_000},
    );
}

async function benchLayout(serviceCount: number, endpointsPerService: number, layout: ObservedLayout): Promise<void> {
  const workload = makeWorkload(serviceCount, endpointsPerService);
  heading(
    `observe (kube-proxy ${layout.name}): first full read, memory, drift`,
    `${workload.label}, one TCP port each, ClusterIP; kube-proxy's ${layout.name} layout loaded into a scratch namespace; ` +
      `proxyctl-agent --observe --netns, embedded API server; load average ${loadAverage()}` +
      (process.env.PROXYCTL_IN_GUEST === '1' ? "; in the qemu guest (Debian's kernel, emulated CPU)" : ''),
  );
  const namespace = scratchNamespace(`observe-${layout.name}-${serviceCount}`);
  const dir = await mkdtemp(join(tmpdir(), 'pxbench-observe-'));
  let server: Awaited<ReturnType<typeof startApiServer>> | undefined;
  let observer: AgentRun | undefined;
  try {
    server = await startApiServer({port: 0});
    loadWorkload(server.store, workload);
    // kube-proxy programs every Service the API server serves: the workload's and default/kubernetes.
    const model = buildProxyModel(
      {
        services: server.store.log.list('services') as unknown as ServiceInput[],
        endpointSlices: server.store.log.list('discovery.k8s.io/endpointslices') as unknown as EndpointSliceInput[],
        node: workload.node,
      },
      {family: 'IPv4', nodeName: benchNodeName, clusterCIDRs: [benchClusterCIDR]},
    );
    const serviceCIDRs = server.store.log
      .list('networking.k8s.io/servicecidrs')
      .flatMap((object) => (object as unknown as {spec: {cidrs: string[]}}).spec.cidrs);
    const rules = await layout.render(model, {namespace, serviceCIDRs});
    const loaded = await timed(() => rules.load.map(({command, input}) => runIn(namespace, command, input)));
    const loadNote = rules.load.map(({command}) => command.join(' ')).join('; ');
    figure({name: `kube-proxy's rules loaded (${rules.size})`, value: loaded.ms, unit: 'ms', note: loadNote});
    const dumpBefore = await dumped(namespace, layout);
    const lookFloor = layout.lookReads === undefined ? undefined : lookFloorMeasured(namespace, layout.lookReads);
    if (lookFloor)
      figure({
        name: `  one read of ${layout.lookReads} (dd)`,
        value: lookFloor.ms,
        unit: 'ms',
        note: `the least a look can take: dd's own time, the median of ${lookFloor.each.length} (${lookFloor.each.map((ms) => ms.toFixed(0)).join(', ')} ms)`,
      });

    const kubeconfig = join(dir, 'kubeconfig');
    await server.writeKubeconfig(kubeconfig);
    const nodeOptions = [process.env.PXBENCH_AGENT_NODE_OPTIONS, cpuProfileDir && inspectorFlag].filter(Boolean).join(' ');
    observer = await startAgentRun(namespace, kubeconfig, undefined, ['--observe'], nodeOptions || undefined, layout.changeSeen ? 3 : 0);
    await observer.waitForLine(/desired rules rebuilt/, 900_000);
    const client = await AgentClient.connect({url: observer.apiUrl, timeoutMs: 0, label: 'the observer'});
    try {
      const first = await waitForStatus(client, (status) => status.drift.checkedAt !== null, 900_000, 'its first drift check');
      const firstReadMs = performance.now() - observer.startedAt;
      if (first.observe?.observing !== `kube-proxy ${layout.name}`)
        throw new Error(`the observer found ${first.observe?.observing ?? 'no observe status'}, not kube-proxy ${layout.name}`);
      if (first.drift.services.length > 0) {
        const diff = await client.call('diff', {});
        throw new Error(`the observer found drift in the loaded rules:\n${diff.text.slice(0, 3000)}`);
      }
      // Each figure is printed as soon as it is measured, so that a later failure loses none.
      const read = await observer.waitForLine(/agent api: rules read whole/, 0);
      const readMs = Number(/seconds=([\d.]+)/.exec(read.line)?.[1] ?? NaN) * 1000;
      figure({
        name: "first full read of kube-proxy's rules",
        value: readMs,
        unit: 'ms',
        floor: {name: layout.dumpName, value: dumpBefore.ms, goal: 1.5},
        note: `from the observer running ${layout.dumpName} to the rules parsed (its log); the floor timed on the same rules just before the observer started${dumpBefore.note}`,
      });
      figure({
        name: 'start -> first drift check',
        value: firstReadMs,
        unit: 'ms',
        floor: {name: layout.dumpName, value: dumpBefore.ms},
        note: 'the observer started, the cluster listed, the desired rules made, the read, the comparison',
      });
      const found = await observer.waitForLine(/observing kube-proxy/, 0);
      figure({
        name: "  of which: start -> kube-proxy's mode found",
        value: found.at - observer.startedAt,
        unit: 'ms',
        note: 'the observer logs the mode as soon as it is found, before anything else',
      });
      await untilIdle(observer.pid, idleTimeoutMs(layout));
      const afterFirstRead = await observer.rss();
      figure({
        name: 'observer RSS after the first full read',
        value: mib(afterFirstRead.rss),
        unit: 'MiB',
        note: `peak ${mib(afterFirstRead.peak).toFixed(0)} MiB; ${await heapNote(observer)}${idleNote()}`,
      });
      const api = await useApi(client, model);
      await untilIdle(observer.pid, idleTimeoutMs(layout));
      const afterApi = await observer.rss();
      const ms = (list: number[]) => list.map((value) => value.toFixed(0)).join(', ');
      figure({
        name: `observer RSS after ${apiTraces} traces and a diff`,
        value: mib(afterApi.rss),
        unit: 'MiB',
        note: `goal < 250 MiB ${mib(afterApi.rss) < 250 ? 'met' : 'NOT met'}; peak since start ${mib(afterApi.peak).toFixed(0)} MiB; ${await heapNote(observer)}; traces ${ms(api.traces)} ms, diff ${api.diff.toFixed(0)} ms${idleNote()}`,
      });
      await tracesOnceMonitored(observer, client, model);
      const profile = cpuProfileDir
        ? {profiler: await connectProfiler(observer), prefix: join(cpuProfileDir, `observe-${layout.name}-${serviceCount}`)}
        : undefined;
      try {
        printChanges(
          await foreignChangesMeasured(observer, client, namespace, layout, rules.text, serviceCount, profile),
          layout,
          lookFloor,
        );
      } finally {
        profile?.profiler.close();
      }
      await observer.stop();
      const dumpAfter = await dumped(namespace, layout);
      figure({
        name: `  ${layout.dumpName} after the observer stopped`,
        value: dumpAfter.ms,
        unit: 'ms',
        floor: {name: 'the same dump before the observer', value: dumpBefore.ms},
        note: `against the mean of both: first full read ${(readMs / ((dumpBefore.ms + dumpAfter.ms) / 2)).toFixed(3)}x, start -> first drift check ${(firstReadMs / ((dumpBefore.ms + dumpAfter.ms) / 2)).toFixed(3)}x`,
      });
    } catch (error) {
      const log = observer?.lines.slice(-12).join('\n      ') ?? '';
      skipped('the remaining figures', `failed: ${(error as Error).message}; the observer's log ends:\n      ${log}`);
    } finally {
      client.close();
    }
  } finally {
    await observer?.stop();
    await server?.stop();
    deleteNamespace(namespace);
    await rm(dir, {recursive: true, force: true});
  }
}

/** The layout's dump, each command after the other as the observer runs them; when more than one, each one's time. */
async function dumped(namespace: string, layout: ObservedLayout): Promise<{ms: number; note: string}> {
  const each = [];
  for (const command of layout.dump) each.push({command: command.join(' '), ms: (await timed(() => runIn(namespace, command))).ms});
  const ms = each.reduce((sum, one) => sum + one.ms, 0);
  return {ms, note: each.length > 1 ? ` (${each.map((one) => `${one.command} ${one.ms.toFixed(0)} ms`).join(', ')})` : ''};
}

/** How many times the look's file is read by dd for its floor. */
const lookFloorReads = 3;

/** dd's own time to read `file` in the namespace (its "copied, N s"), the median of lookFloorReads, and each. */
function lookFloorMeasured(namespace: string, file: string): {ms: number; each: number[]} {
  const each: number[] = [];
  for (let read = 0; read < lookFloorReads; read++) {
    const report = runIn(namespace, ['sh', '-c', `dd if=${file} of=/dev/null bs=64k 2>&1`]);
    const seconds = /copied, ([\d.e+-]+) s/.exec(report)?.[1];
    if (seconds === undefined) throw new Error(`dd of ${file} did not say how long it took: ${report.trim()}`);
    each.push(Number(seconds) * 1000);
  }
  return {
    ms: percentile(
      [...each].sort((a, b) => a - b),
      50,
    ),
    each,
  };
}

/**
 * Until nft monitor listens (it reads the whole ruleset first), every request reads the kernel:
 * traces once it does, and how long that took.
 */
async function tracesOnceMonitored(observer: AgentRun, client: AgentClient, model: ProxyModel): Promise<void> {
  const listening = await observer.waitForLine(/the ruleset monitor listens/, 900_000);
  const settled = await tracesAcross(client, model, apiTraces);
  const afterSettled = await observer.rss();
  figure({
    name: `  ${apiTraces} traces once the ruleset monitor listens`,
    value: percentile(
      [...settled].sort((a, b) => a - b),
      50,
    ),
    unit: 'ms',
    note: `each ${settled.map((value) => value.toFixed(0)).join(', ')} ms; nft monitor listened ${((listening.at - observer.startedAt) / 1000).toFixed(1)} s after the start; RSS then ${mib(afterSettled.rss).toFixed(0)} MiB, ${await heapNote(observer)}`,
  });
}

/** Traces of services across the model (each must reach DNAT), then a whole-node diff (must find no drift). */
async function useApi(client: AgentClient, model: ProxyModel): Promise<{traces: number[]; diff: number}> {
  const traces = await tracesAcross(client, model, apiTraces);
  const diff = await timed(() => client.call('diff', {}));
  if (!diff.result.equal) throw new Error(`diff through the observer found drift:\n${diff.result.text.slice(0, 2000)}`);
  return {traces, diff: diff.ms};
}

interface ChangeFigures {
  command: string;
  /**
   * Per change: the deleting command's own time, its exit to the log line naming the drift, the
   * observer's CPU for the change (countedCpuMs less quietCpuMs) and its children's; windowMs: how
   * long the CPU was counted, from just before the change until the observer was idle, or for an
   * observer that looks on a timer until countedAfterNoticeMs after the drift was logged;
   * quietCpuMs: that observer's CPU over as long a time with nothing changed (else 0);
   * wholeReadings: the whole readings of the rules it logged meanwhile.
   */
  rounds: Array<{
    commandMs: number;
    noticedMs: number;
    cpuMs: number;
    countedCpuMs: number;
    quietCpuMs: number;
    childCpuMs: number;
    windowMs: number;
    wholeReadings: number;
    /** With changeSeen: the observer's CPU from the look's line naming the change to the drift's line, and that time. */
    seenToDrift?: {cpuMs: number; ms: number};
  }>;
  /** The observer's CPU while idle, per second, measured before the first change. */
  idleCpuMsPerSecond: number;
}

/** Deletes one piece of a different service's rules per round and measures how the observer notices it. */
async function foreignChangesMeasured(
  observer: AgentRun,
  client: AgentClient,
  namespace: string,
  layout: ObservedLayout,
  rulesText: string,
  serviceCount: number,
  profile?: {profiler: AgentProfiler; prefix: string},
): Promise<ChangeFigures> {
  // Idle for longer than a syncPeriod (30 s), so that the rate holds the periodic model rebuild and its drift check.
  const idleFrom = await cpuTimes(observer.pid);
  await sleep(idleMeasuredMs);
  const idleCpuMsPerSecond = ((await cpuTimes(observer.pid)).own - idleFrom.own) / (idleMeasuredMs / 1000);
  const rounds: ChangeFigures['rounds'] = [];
  let command: string[] = [];
  for (let round = 1; round <= foreignChanges; round++) {
    const s = Math.floor((serviceCount * round) / (foreignChanges + 1)) + 3;
    command = layout.deleteOne(rulesText, s);
    const quiet = layout.changeSignal ? await quietRate(observer.pid) : undefined;
    if (!quiet) await untilIdle(observer.pid, idleTimeoutMs(layout));
    const before = await cpuTimes(observer.pid);
    const countedFrom = performance.now();
    const logFrom = observer.lines.length;
    await profile?.profiler.start();
    const deleting = await timed(() => runInAsync(namespace, command));
    const deleted = performance.now();
    // The log line and the gauge come from one step (DriftTracker.checked): the line's arrival
    // times the drift, and the metrics are then asked once, not ten times a second, which the
    // observer would spend its CPU on within the count.
    const seen = layout.changeSeen && (await observer.waitForLine(layout.changeSeen, 600_000, logFrom));
    const cpuWhenSeen = seen && (await cpuTimes(observer.pid));
    const logged = await observer.waitForLine(new RegExp(`service port drifted .*servicePort=bench/svc-${s}:`), 600_000, logFrom);
    const cpuWhenLogged = seen && (await cpuTimes(observer.pid));
    const noticedMs = logged.at - deleted;
    await waitForMetric(observer, round, 10_000);
    // An observer that looks on a timer is counted for a fixed while after the drift is logged;
    // one that waits for events, until it is idle. A profile needs the fixed while:
    // sampling keeps the CPU time moving.
    if (quiet || profile) await sleep(countedAfterNoticeMs);
    if (profile) await profile.profiler.stopInto(`${profile.prefix}-change-${round}.cpuprofile`);
    const after = quiet ? {...(await cpuTimes(observer.pid)), at: performance.now()} : await untilIdle(observer.pid, idleTimeoutMs(layout));
    const status = await client.call('status', {});
    if (!status.drift.services.some((name) => name.includes(`bench/svc-${s}`)))
      throw new Error(`the observer's status does not name bench/svc-${s} after its rule was deleted: ${status.drift.services.join(', ')}`);
    const windowMs = after.at - countedFrom;
    const quietCpuMs = quiet ? (quiet.ownMsPerSecond * windowMs) / 1000 : 0;
    rounds.push({
      commandMs: deleting.ms,
      noticedMs,
      cpuMs: after.own - before.own - quietCpuMs,
      countedCpuMs: after.own - before.own,
      quietCpuMs,
      childCpuMs: after.children - before.children,
      windowMs,
      wholeReadings: observer.lines.slice(logFrom).filter((line) => line.includes('agent api: rules read whole')).length,
      seenToDrift: seen && cpuWhenSeen && cpuWhenLogged ? {cpuMs: cpuWhenLogged.own - cpuWhenSeen.own, ms: logged.at - seen.at} : undefined,
    });
  }
  return {command: command.length > 7 ? `${command.slice(0, 7).join(' ')} ...` : command.join(' '), rounds, idleCpuMsPerSecond};
}

function printChanges(changes: ChangeFigures, layout: ObservedLayout, lookFloor?: {ms: number}): void {
  const sorted = (pick: (round: ChangeFigures['rounds'][number]) => number) => changes.rounds.map(pick).sort((a, b) => a - b);
  const noticed = sorted((round) => round.noticedMs);
  const cpu = sorted((round) => round.cpuMs);
  const list = (values: number[]) => values.map((value) => value.toFixed(0)).join(', ');
  const each = (pick: (round: ChangeFigures['rounds'][number]) => number) => list(changes.rounds.map(pick));
  figure({
    name: `foreign change -> drift logged and counted (p50 of ${changes.rounds.length})`,
    value: percentile(noticed, 50),
    unit: 'ms',
    ...(lookFloor && {floor: {name: `one read of ${layout.lookReads}`, value: lookFloor.ms}}),
    note:
      `each ${each((round) => round.noticedMs)} ms, from the exit of "${changes.command}" ` +
      `(itself ${each((round) => round.commandMs)} ms); goal <= 5 s ${noticed.at(-1)! <= 5000 ? 'met' : 'NOT met'}` +
      (lookFloor
        ? `; the largest ${(noticed.at(-1)! / lookFloor.ms).toFixed(2)}x the read: a change waits for a look's read to pass ` +
          `the changed server (looks are spaced to twice their length, so that looking takes at most half the time), up to ` +
          `two reads of the table, then for the comparison`
        : '') +
      (layout.changeSignal ? `; ${layout.changeSignal}` : ''),
  });
  // An observer that looks on a timer (changeSignal) was counted less its quiet CPU.
  const counted = layout.changeSignal
    ? `counted from just before the change until ${countedAfterNoticeMs / 1000} s after the drift was logged ` +
      `(${each((round) => round.windowMs / 1000)} s: ${each((round) => round.countedCpuMs)} ms), less the observer's CPU ` +
      `over as long a time just before, with nothing changed (${each((round) => round.quietCpuMs)} ms; ` +
      `measured over ${quietMeasuredMs / 1000} s before each change): it looks on a timer and is seldom idle`
    : `counted from just before the change until idle ${idleWindowMs / 1000} s (${each((round) => round.windowMs / 1000)} s)`;
  figure({
    name: `observer CPU per foreign change (p50 of ${changes.rounds.length})`,
    value: percentile(cpu, 50),
    unit: 'ms',
    note:
      `each ${each((round) => round.cpuMs)} ms of utime+stime, ${counted}; ` +
      `its dumps' CPU ${each((round) => round.childCpuMs)} ms; idle ${changes.idleCpuMsPerSecond.toFixed(0)} ms/s ` +
      `(over ${idleMeasuredMs / 1000} s before the first change); ` +
      `whole readings of the rules in each count ${each((round) => round.wholeReadings)}; ` +
      `goal <= 1 s ${cpu.at(-1)! <= 1000 ? 'met' : 'NOT met'}${idleNote()}` +
      (cpuProfileDir ? `; profiled (${cpuProfileDir}), the profiler's sampling included` : ''),
  });
  const seenToDrift = changes.rounds.flatMap((round) => (round.seenToDrift ? [round.seenToDrift] : []));
  if (seenToDrift.length === changes.rounds.length && seenToDrift.length > 0) {
    const seenCpu = seenToDrift.map((round) => round.cpuMs).sort((a, b) => a - b);
    figure({
      name: `  of which: from the look's report of the change to its drift logged (p50 of ${seenToDrift.length})`,
      value: percentile(seenCpu, 50),
      unit: 'ms',
      note:
        `each ${list(seenToDrift.map((round) => round.cpuMs))} ms of the observer's utime+stime over ` +
        `${list(seenToDrift.map((round) => round.ms))} ms (read when each line arrived): the follow, the comparison and ` +
        `the explanation, and any look meanwhile; the look that saw the change is one of those it makes anyway ` +
        `(the idle rate above); goal <= 1 s ${seenCpu.at(-1)! <= 1000 ? 'met' : 'NOT met'} for the change's own work`,
    });
  }
}

/** The observer's own CPU per second over quietMeasuredMs, with nothing changed. */
async function quietRate(pid: number): Promise<{ownMsPerSecond: number}> {
  const from = {...(await cpuTimes(pid)), at: performance.now()};
  await sleep(quietMeasuredMs);
  const to = {...(await cpuTimes(pid)), at: performance.now()};
  return {ownMsPerSecond: ((to.own - from.own) * 1000) / (to.at - from.at)};
}

/** The process's own CPU time and its reaped children's, in milliseconds (/proc/PID/stat fields 14-17). */
async function cpuTimes(pid: number): Promise<{own: number; children: number}> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) may hold spaces: count from after its closing parenthesis.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = (index: number) => Number(fields[index - 3]);
  const ms = (value: number) => (value * 1000) / ticksPerSecond;
  return {own: ms(ticks(14) + ticks(15)), children: ms(ticks(16) + ticks(17))};
}

/**
 * How long to wait for the observer to be idle. In ipvs mode it looks at the state every few
 * seconds, and in the qemu guest (an emulated CPU) its looks and periodic checks may leave no
 * quiet idleWindowMs: the figure is then taken after this wait, said so in its note (idleMissed).
 */
function idleTimeoutMs(layout: ObservedLayout): number {
  return layout.changeSignal ? 30_000 : 600_000;
}

/** Times untilIdle gave up waiting for the observer to be idle (printed with the figures). */
let idleMissed = 0;
const idleNote = () =>
  idleMissed > 0 ? `; so far ${idleMissed} times not idle for ${idleWindowMs / 1000} s within 30 s, measured after that wait` : '';

/**
 * Waits until the process's CPU time has not grown for idleWindowMs; returns the times at the start
 * of that quiet window, and when they were read (`at`, performance.now()).
 */
async function untilIdle(pid: number, timeoutMs: number): Promise<{own: number; children: number; at: number}> {
  const deadline = performance.now() + timeoutMs;
  let last = {...(await cpuTimes(pid)), at: performance.now()};
  for (;;) {
    await sleep(pollMs);
    const now = {...(await cpuTimes(pid)), at: performance.now()};
    if (now.own !== last.own || now.children !== last.children) last = now;
    else if (now.at - last.at >= idleWindowMs) return last;
    if (performance.now() > deadline && timeoutMs < 600_000) return (idleMissed++, now);
    if (performance.now() > deadline) throw new Error(`the observer was not idle for ${idleWindowMs} ms within ${timeoutMs / 1000} s`);
  }
}

/** Where the observer's memory is, from its process metrics: the JS heap used and held, and memory outside it (buffers). */
async function heapNote(observer: AgentRun): Promise<string> {
  const heap = await observer.heap().catch(() => undefined);
  if (!heap) return 'its heap not read';
  return `JS heap ${mib(heap.used).toFixed(0)} MiB used of ${mib(heap.total).toFixed(0)}, outside it ${mib(heap.external).toFixed(0)} MiB`;
}

/** Waits until the observer's gauge of drifted service ports reaches `count`, as a Prometheus scrape would see it. */
async function waitForMetric(observer: AgentRun, count: number, timeoutMs: number): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    // A keep-alive connection the observer's metrics server closed while its event loop was busy
    // (ECONNRESET) is no answer: ask again on a new one.
    const page = await fetch(observer.metricsUrl, {keepalive: false, headers: {connection: 'close'}})
      .then((response) => response.text())
      .catch(() => '');
    const value = Number(/^proxyctl_observe_drifted_service_ports\{[^}]*\} (\S+)/m.exec(page)?.[1] ?? NaN);
    if (value >= count) return;
    if (performance.now() > deadline)
      throw new Error(`the observer's metrics did not count ${count} drifted service ports within ${timeoutMs / 1000} s (at ${value})`);
    await sleep(pollMs);
  }
}

async function waitForStatus(
  client: AgentClient,
  done: (status: StatusResult) => boolean,
  timeoutMs: number,
  what: string,
): Promise<StatusResult> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const status = await client.call('status', {});
    if (done(status)) return status;
    if (performance.now() > deadline) throw new Error(`the observer did not finish ${what} within ${timeoutMs / 1000} s`);
    await sleep(pollMs);
  }
}

function loadAverage(): string {
  // Read at the start of each layout: the machine is shared, and the figures move with its load.
  return loadavg()
    .map((value) => value.toFixed(2))
    .join(', ');
}
