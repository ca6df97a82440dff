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
    about: 'proxyctl-agent process at 1,000 and 10,000 services x 10 endpoints: start to first sync, one endpoint change, RSS, vs iptables-restore',
    run: async () => (await import('./agent.ts')).benchAgent(),
  },
  apiserver: {
    about: 'lab API server watch fan-out: 50 watchers, 10,000 EndpointSlices',
    run: async () => (await import('./apiserver.ts')).benchApiServerWatch(),
  },
  'agent-api': {
    about: 'trace over the applied rules at 1,000 and 10,000 services x 10 endpoints, diff --all-nodes across 200 agents',
    run: async () => (await import('./agent-api.ts')).benchAgentApi(),
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
