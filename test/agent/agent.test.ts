// The whole agent in-process: embedded API server -> watches -> proxier -> iptables in a fresh
// network namespace, with healthz and metrics on loopback. Stopping leaves the rules. Root only.
import assert from 'node:assert/strict';
import {mkdtemp, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {test} from 'node:test';
import {startAgent} from '../../src/agent/agent.ts';
import {defaultAgentConfig} from '../../src/agent/config/agent-config.ts';
import {validateAgentConfig} from '../../src/agent/config/load-config.ts';
import {memoryLogger} from '../../src/agent/log.ts';
import {startApiServer} from '../../src/lab/apiserver/server.ts';
import {createNetns, inNetns, isRoot} from './netns.ts';
import {FakeRules} from './sync/fake-rules.ts';

async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

test('agent: a Service and its EndpointSlice become rules in the namespace; stop keeps them', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs iptables in it');
    return;
  }
  const netns = createNetns(t);
  const dir = await mkdtemp(join(tmpdir(), 'pxa-agent-'));
  t.after(() => rm(dir, {recursive: true, force: true}));
  const server = await startApiServer({port: 0});
  t.after(() => server.stop());
  server.store.create('nodes', {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name: 'node-1'},
    status: {addresses: [{type: 'InternalIP', address: '10.240.0.11'}]},
  });
  const kubeconfig = join(dir, 'kubeconfig');
  await server.writeKubeconfig(kubeconfig);

  const config = defaultAgentConfig();
  Object.assign(config, {
    kubeconfig,
    hostnameOverride: 'node-1',
    netns,
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    clusterCIDRs: ['10.244.0.0/16'],
  });
  config.iptables.minSyncPeriod = 100;
  const log = memoryLogger(2);
  const agent = await startAgent(validateAgentConfig(config), {log, rules: new FakeRules()});
  let stopped = false;
  t.after(() => (stopped ? undefined : agent.stop()));

  const natRules = () => inNetns(netns, ['iptables-save', '-t', 'nat']);
  await until('the kubernetes service rules', () => natRules().includes('default/kubernetes'));

  const created = server.store.create(
    'services',
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'web', namespace: 'default'},
      spec: {ports: [{name: 'http', port: 80, targetPort: 8080, protocol: 'TCP'}]},
    },
    'default',
  ) as unknown as {spec: {clusterIP: string}};
  server.store.create(
    'endpointslices',
    {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {name: 'web-manual', namespace: 'default', labels: {'kubernetes.io/service-name': 'web'}},
      addressType: 'IPv4',
      ports: [{name: 'http', protocol: 'TCP', port: 8080}],
      endpoints: [{addresses: ['10.244.2.5'], conditions: {ready: true}, nodeName: 'node-2'}],
    },
    'default',
  );
  await until(
    'the web service rules',
    () => natRules().includes(`-d ${created.spec.clusterIP}/32`) && natRules().includes('10.244.2.5:8080'),
  );

  const healthz = await fetch(`${agent.healthz!.url}/healthz`);
  assert.equal(healthz.status, 200);
  assert.equal(((await healthz.json()) as {nodeEligible: boolean}).nodeEligible, true);
  const metrics = await (await fetch(`${agent.metricsServer!.url}/metrics`)).text();
  assert.match(metrics, /kubeproxy_sync_proxy_rules_last_timestamp_seconds \d/);
  assert.match(metrics, /kubeproxy_sync_proxy_rules_service_changes_total [1-9]/);

  // The node is about to be deleted by the autoscaler: /healthz says so, /livez does not.
  server.store.update('nodes', {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name: 'node-1'},
    spec: {taints: [{key: 'ToBeDeletedByClusterAutoscaler', effect: 'NoSchedule'}]},
    status: {addresses: [{type: 'InternalIP', address: '10.240.0.11'}]},
  });
  await until('healthz 503', async () => (await fetch(`${agent.healthz!.url}/healthz`)).status === 503);
  assert.equal((await fetch(`${agent.healthz!.url}/livez`)).status, 200);

  const before = natRules().replace(/^#.*\n/gm, '');
  await agent.stop();
  stopped = true;
  assert.equal(natRules().replace(/^#.*\n/gm, ''), before, 'stopping never flushes rules');
  assert.ok(log.lines.some((line) => line.includes('agent stopped; rules left in place')));
});
