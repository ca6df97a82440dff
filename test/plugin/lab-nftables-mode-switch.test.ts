// Switching a node's proxy mode: an agent restarted in nftables mode on a node where iptables mode
// ran removes iptables mode's chains and jump rules at start, and back again removes the nftables
// table, as kube-proxy cleans up the other modes; kubectl proxyctl then sees the new mode, no
// drift, and the service still answers. Root only; the namespace and agents are removed after.
import assert from 'node:assert/strict';
import {test, type TestContext} from 'node:test';
import {startAgent, type RunningAgent} from '../../src/agent/agent.ts';
import {defaultAgentConfig, type ProxyMode} from '../../src/agent/config/agent-config.ts';
import {validateAgentConfig} from '../../src/agent/config/load-config.ts';
import {memoryLogger} from '../../src/agent/log.ts';
import {describeRun, inNetns, isRoot, runPlugin, startAgentCluster, until, type AgentCluster} from './agent-cluster.ts';

/**
 * iptablesModeRules: iptables mode's chains and jumps in the namespace, one line each. kubelet's
 * KUBE-FIREWALL (iptables mode ensures it for localhost NodePorts) is shared with kubelet and
 * stays, as with kube-proxy.
 */
function iptablesModeRules(netns: string): string[] {
  const lines: string[] = [];
  for (const table of ['nat', 'filter']) {
    lines.push(
      ...inNetns(netns, ['iptables-save', '-t', table])
        .split('\n')
        .filter((line) => /KUBE-/.test(line) && !/KUBE-FIREWALL( |$)/.test(line)),
    );
  }
  return lines;
}

/** nftables mode's tables in the namespace (iptables-nft keeps its own ip nat and ip filter tables). */
function nftablesModeTables(netns: string): string[] {
  return inNetns(netns, ['nft', 'list', 'tables'])
    .trim()
    .split('\n')
    .filter((table) => table.endsWith(' kube-proxy'));
}

/** restartAgent stops the node's agent and starts one in `mode` with otherwise the same settings. */
async function restartAgent(t: TestContext, cluster: AgentCluster, running: RunningAgent, mode: ProxyMode): Promise<RunningAgent> {
  await running.stop();
  const config = defaultAgentConfig();
  Object.assign(config, {
    mode,
    kubeconfig: cluster.kubeconfig,
    hostnameOverride: 'node-1',
    netns: cluster.netns,
    healthzBindAddress: '',
    metricsBindAddress: '',
    apiBindAddress: '127.0.0.1:0',
    clusterCIDRs: ['10.244.0.0/16'],
  });
  const log = memoryLogger(2);
  const agent = await startAgent(validateAgentConfig(config), {log});
  t.after(() => agent.stop());
  try {
    await until(`the first ${mode} sync`, () => agent.proxier.status().lastResults.length > 0);
  } catch (error) {
    throw new Error(`${(error as Error).message}\nagent log:\n${log.lines.slice(-30).join('\n')}`);
  }
  return agent;
}

/** The service answers from the node, the drift check is clean, and status names the mode. */
async function assertServing(cluster: AgentCluster, agent: RunningAgent, mode: ProxyMode): Promise<void> {
  const url = agent.api!.url;
  const status = await runPlugin(['status', '--agent-url', url]);
  assert.equal(status.code, 0, describeRun(status));
  assert.match(status.stdout, new RegExp(`^node-1\\s+${mode}\\s+true\\s`, 'm'));
  const diff = await runPlugin(['diff', 'node-1', '--agent-url', url]);
  assert.equal(diff.code, 0, describeRun(diff));
  const trace = await runPlugin([
    'trace',
    'web',
    '--node',
    'node-1',
    '--probe',
    '10',
    '-o',
    'json',
    '--agent-url',
    url,
    '--kubeconfig',
    cluster.kubeconfig,
  ]);
  assert.equal(trace.code, 0, describeRun(trace));
  const answer = JSON.parse(trace.stdout) as {verdict: string; probe: {failures: unknown[]; answers: {count: number}[]}};
  assert.equal(answer.verdict, 'DNAT');
  assert.deepEqual(answer.probe.failures, []);
  assert.equal(
    answer.probe.answers.reduce((sum, entry) => sum + entry.count, 0),
    10,
  );
}

test('restarting the agent in the other mode removes the previous mode’s rules', async (t) => {
  if (!isRoot) {
    t.skip('needs root: the agents write rules in a fresh network namespace');
    return;
  }
  const cluster = await startAgentCluster(t);
  assert.ok(
    iptablesModeRules(cluster.netns).some((line) => line.includes('default/web:http')),
    'iptables mode wrote its rules',
  );
  assert.deepEqual(nftablesModeTables(cluster.netns), []);

  const nftables = await restartAgent(t, cluster, cluster.agent, 'nftables');
  assert.deepEqual(iptablesModeRules(cluster.netns), [], 'no KUBE- chain or jump of iptables mode is left');
  assert.deepEqual(nftablesModeTables(cluster.netns), ['table ip kube-proxy']);
  await assertServing(cluster, nftables, 'nftables');

  const iptables = await restartAgent(t, cluster, nftables, 'iptables');
  assert.deepEqual(nftablesModeTables(cluster.netns), [], 'the nftables table is gone');
  assert.ok(iptablesModeRules(cluster.netns).some((line) => line.includes('default/web:http')));
  await assertServing(cluster, iptables, 'iptables');
});
