// --proxy-mode ipvs on a kernel without IP_VS: the agent says why and runs iptables mode instead,
// as kube-proxy does. Root only (a fresh network namespace); this machine's kernel has no IP_VS.
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
import {hostHasIpvs} from '../../scripts/qemu/guest.ts';
import {createNetns, inNetns, isRoot} from './netns.ts';
import {FakeRules} from './sync/fake-rules.ts';

test('agent: --proxy-mode ipvs without IP_VS falls back to iptables mode and logs why', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs iptables in it');
    return;
  }
  if (hostHasIpvs()) {
    t.skip('this kernel has IP_VS: there is nothing to fall back from');
    return;
  }
  const netns = createNetns(t);
  const dir = await mkdtemp(join(tmpdir(), 'pxa-ipvs-fallback-'));
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
    mode: 'ipvs',
    kubeconfig,
    hostnameOverride: 'node-1',
    netns,
    healthzBindAddress: '',
    metricsBindAddress: '',
    clusterCIDRs: ['10.244.0.0/16'],
  });
  config.iptables.minSyncPeriod = 100;
  const log = memoryLogger(2);
  const agent = await startAgent(validateAgentConfig(config), {log, rules: new FakeRules()});
  t.after(() => agent.stop());

  assert.ok(
    log.lines.some((line) => line.includes("can't use the IPVS proxier, falling back to iptables mode")),
    log.lines.join('\n'),
  );
  const deadline = Date.now() + 15_000;
  while (!inNetns(netns, ['iptables-save', '-t', 'nat']).includes('default/kubernetes')) {
    if (Date.now() > deadline) assert.fail('iptables mode never wrote the kubernetes service rules');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
});
