// npm run bench [-- NAME...]: figures, not tests. Each benchmark states its workload and prints
// its figures next to the kernel floor they are measured against.
import {cpus, totalmem} from 'node:os';

// Loaded on demand so that one benchmark can run while another's backend is being changed.
const benches: Record<string, {about: string; run: () => Promise<void>}> = {
  iptables: {
    about: 'render/parse/trace at 1,000 and 10,000 services x 10 endpoints vs iptables-restore/iptables-save',
    run: async () => (await import('./iptables.ts')).benchIptables(),
  },
  agent: {
    about:
      'proxyctl-agent process at 1,000 and 10,000 services x 10 endpoints: start to first sync, one endpoint change, RSS, vs iptables-restore',
    run: async () => (await import('./agent.ts')).benchAgent(),
  },
  'agent-nftables': {
    about:
      'proxyctl-agent process in nftables mode at 1,000 and 10,000 services x 10 endpoints: start to first sync (goal <= 10 s), one endpoint change API write -> kernel (goal <= 100 ms), RSS, vs nft -f',
    run: async () => (await import('./agent.ts')).benchAgent([1000, 10000], 10, 'nftables'),
  },
  apiserver: {
    about: 'lab API server watch fan-out: 50 watchers, 10,000 EndpointSlices',
    run: async () => (await import('./apiserver.ts')).benchApiServerWatch(),
  },
  'agent-api': {
    about: 'trace over the applied rules at 1,000 and 10,000 services x 10 endpoints, diff --all-nodes across 200 agents',
    run: async () => (await import('./agent-api.ts')).benchAgentApi(),
  },
  nftables: {
    about:
      'nftables sync at 10,000 services x 10 endpoints (full, one endpoint change) next to a kube-proxy-shaped table; first-packet latency is `latency`',
    run: async () => (await import('./nftables.ts')).runNftablesBench(),
  },
  ipvs: {
    about:
      'ipvs full sync and one endpoint change at 1,000 and 10,000 services x 10 endpoints vs ipset restore + ipvsadm-restore (in the qemu guest when this kernel has no IP_VS)',
    run: async () => (await import('./ipvs.ts')).benchIpvs(),
  },
  lab: {
    about:
      'lab up with 3 nodes x 10 pods, from the call to every agent synced (goal < 10 s), and lab down; kubectl scale deployment web --replicas=50 in a 3-node lab to every pod Ready and every agent holding all 50 endpoints (goal <= 15 s); pod start bound -> Ready (goal p50 <= 200 ms)',
    run: async () => (await import('./lab.ts')).benchLab(),
  },
  'lab-trace': {
    about:
      'kubectl proxyctl trace end to end in a one-node lab whose agent proxies 10,000 services x 10 endpoints (goal < 200 ms), as a new process and in a loaded plugin',
    run: async () => (await import('./lab-trace.ts')).benchLabTrace(),
  },
  plugin: {
    about:
      'kubectl proxyctl as a new process: --version (goal <= 150 ms) and --help vs kubectl running a no-op plugin, status and trace in a two-node lab (goal <= 400 ms) vs kubectl get svc',
    run: async () => (await import('./plugin.ts')).benchPlugin(),
  },
  release: {
    about:
      'npm run release (read from dist/release/): archive size per platform, --version from the unpacked linux/amd64 archive (goal <= 150 ms) vs node -e 0, agent image size (goal <= 150 MiB unpacked), release time (goal <= 5 min)',
    run: async () => (await import('./release.ts')).benchRelease(),
  },
  behaviour: {
    about:
      'behaviour diff iptables -> nftables of 10,000 services x 10 endpoints, both rulesets in memory (goal <= 10 s), vs tracing every packet class once; kubectl proxyctl migrate-check --to nftables of the node of a one-node lab as a new process (goal <= 2 s) vs kubectl proxyctl status',
    run: async () => (await import('./behaviour.ts')).benchBehaviour(),
  },
  observe: {
    about:
      'proxyctl-agent --observe beside kube-proxy iptables, nftables and ipvs layouts at 1,000 and 10,000 services x 10 endpoints: first full read vs the dump tool (goal <= 1.5x), RSS after 10 traces and a diff (goal < 250 MiB), a foreign change to its drift logged and counted (goal <= 5 s) and CPU per change (goal <= 1 s); ipvs in the qemu guest when this kernel has no IP_VS',
    run: async () => (await import('./observe.ts')).benchObserve(),
  },
  latency: {
    about:
      'first-packet latency (TCP connect through a ClusterIP), p50/p99 at 1,000 / 10,000 / 30,000 services, iptables vs nftables mode (goal: nftables p99 at 30,000 within 1.2x of 1,000)',
    run: async () => (await import('./latency.ts')).runLatencyBench(),
  },
};

const asked = process.argv.slice(2);
const unknown = asked.filter((name) => !(name in benches));
if (unknown.length > 0) {
  console.error(`unknown benchmark ${unknown.join(', ')}; there are: ${Object.keys(benches).join(', ')}`);
  process.exit(2);
}
console.log(`proxyctl benchmarks: Node ${process.version}, ${cpus().length} CPUs, ${(totalmem() / 2 ** 30).toFixed(0)} GiB`);
for (const name of asked.length > 0 ? asked : Object.keys(benches)) {
  console.log(`\n# ${name}: ${benches[name].about}`);
  await benches[name].run();
}
