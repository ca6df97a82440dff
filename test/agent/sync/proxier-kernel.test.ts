// The proxier against a real kernel: a fresh network namespace, the real iptables commands through
// CommandHost, a small ruleset; checked with iptables-save inside the namespace. Root only.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {CommandHost} from '../../../src/agent/host/command-host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {cleanupProxyRules} from '../../../src/agent/sync/cleanup.ts';
import {coreIptablesRules} from '../../../src/agent/sync/iptables-rules.ts';
import {IptablesProxier} from '../../../src/agent/sync/proxier.ts';
import {diffIptables, parseIptablesSave, renderIptables} from '../../../src/core/iptables/index.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {createNetns, inNetns, isRoot} from '../netns.ts';
import {MemoryObjects, service, slice} from './cluster.ts';
import {FakeRules, serviceChain} from './fake-rules.ts';
import {everyListReceived, periodic, proxierOptions, requested} from './proxier-fixture.ts';

function kernelProxier(netns: string, objects: MemoryObjects) {
  const options = proxierOptions({host: new CommandHost({netns}), rules: new FakeRules(), objects});
  return {...options, proxier: everyListReceived(new IptablesProxier(options))};
}

test('rules land in the namespace, change partially, survive tampering, and --cleanup keeps foreign rules', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs iptables in it');
    return;
  }
  const netns = createNetns(t);
  // Someone else's rules that must survive everything the agent does.
  inNetns(netns, ['iptables', '-t', 'nat', '-N', 'DOCKER']);
  inNetns(netns, ['iptables', '-t', 'nat', '-A', 'PREROUTING', '-j', 'DOCKER']);
  inNetns(netns, ['iptables', '-t', 'nat', '-N', 'KUBE-KUBELET-CANARY']);

  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('dns', '10.96.0.53', {protocol: 'UDP', port: 53})],
    slices: [slice('web-1', 'web', ['10.244.2.5']), slice('dns-1', 'dns', ['10.244.2.3'], {protocol: 'UDP'})],
  });
  const {proxier, metrics, log} = kernelProxier(netns, objects);
  const save = () => inNetns(netns, ['iptables-save', '-t', 'nat']);

  await proxier.syncRules(requested);
  let rules = save();
  assert.match(rules, /-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/);
  assert.match(rules, /-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/);
  assert.match(rules, new RegExp(`-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp .*--dport 80 -j ${serviceChain('default/web:p/TCP')}`));
  assert.match(rules, /-j DNAT --to-destination 10.244.2.5:8080/);
  assert.match(rules, /-A PREROUTING -j DOCKER/, 'foreign rules stay');

  // A partial sync: only web's chain changes; dns's chain keeps its rule.
  objects.slicesByName.set('web-1', slice('web-1', 'web', ['10.244.2.6']));
  const [partial] = await proxier.syncRules(requested);
  assert.equal(partial.kind, 'partial');
  rules = save();
  assert.match(rules, /--to-destination 10.244.2.6:8080/);
  assert.ok(!rules.includes('10.244.2.5:8080'));
  assert.match(rules, /--to-destination 10.244.2.3:8080/);

  // Someone flushes KUBE-SERVICES; the next periodic sync puts it back.
  inNetns(netns, ['iptables', '-t', 'nat', '-F', 'KUBE-SERVICES']);
  const [repaired] = await proxier.syncRules(periodic);
  assert.equal(repaired.drift, true);
  assert.match(save(), /-A KUBE-SERVICES -d 10.96.0.10\/32/);
  assert.ok(log.lines.some((line) => line.includes('rules changed behind our back')));
  assert.match(await metrics.registry.metrics(), /proxyctl_drift_repairs_total\{ip_family="IPv4"\} 1/);

  // A deleted service's chain goes.
  objects.servicesByName.delete('dns');
  await proxier.syncRules(requested);
  assert.ok(!save().includes(serviceChain('default/dns:p/UDP')));

  // --cleanup: every KUBE-* chain and jump of ours goes; DOCKER and kubelet's canary stay.
  const result = await cleanupProxyRules(new CommandHost({netns}), memoryLogger(), ['IPv4']);
  assert.deepEqual(result.errors, []);
  rules = save();
  assert.ok(!/KUBE-SERVICES|KUBE-SVC-/.test(rules), rules);
  assert.match(rules, /-A PREROUTING -j DOCKER/);
  assert.match(rules, /:KUBE-KUBELET-CANARY/);
});

test('a ruleset the kernel refuses leaves the old rules in place', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs iptables in it');
    return;
  }
  const netns = createNetns(t);
  const objects = new MemoryObjects({services: [service('web', '10.96.0.10')], slices: [slice('web-1', 'web', ['10.244.2.5'])]});
  const {proxier, host, metrics} = kernelProxier(netns, objects);
  await proxier.syncRules(requested);
  const before = inNetns(netns, ['iptables-save', '-t', 'nat']).replace(/^#.*\n/gm, '');
  const broken = {
    render: () => ({
      input: '*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j NO-SUCH-CHAIN\nCOMMIT\n',
      declaredChains: () => ({filter: [], nat: ['KUBE-SERVICES']}),
      written: () => undefined,
    }),
    jumpRules: () => [],
  };
  const failing = everyListReceived(new IptablesProxier(proxierOptions({host, rules: broken, objects, metrics})));
  await assert.rejects(
    failing.syncRules(requested),
    /IPv4 full sync: ip netns exec pxa-\w+ iptables-restore -w 5 -W 100000 --noflush: exit \d+/,
  );
  assert.equal(inNetns(netns, ['iptables-save', '-t', 'nat']).replace(/^#.*\n/gm, ''), before, 'iptables-restore is atomic');
});

test('crossing the large-cluster threshold either way leaves the kernel equal to the desired rules: no drift that never clears', async (t) => {
  if (!isRoot) {
    t.skip('needs root: creates a network namespace and runs iptables in it');
    return;
  }
  const netns = createNetns(t);
  const ips = (count: number, third: number): string[] =>
    Array.from({length: count}, (_, index) => `10.244.${third + Math.floor(index / 250)}.${(index % 250) + 1}`);
  // 999 + 1 endpoints: exactly at the threshold, comments kept.
  const objects = new MemoryObjects({
    services: [service('web', '10.96.0.10'), service('api', '10.96.0.1')],
    slices: [slice('web-1', 'web', ips(500, 10)), slice('web-2', 'web', ips(499, 20)), slice('api-1', 'api', ['10.244.2.9'])],
  });
  const modelOptions = {nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16']};
  const proxier = everyListReceived(
    new IptablesProxier(proxierOptions({host: new CommandHost({netns}), rules: coreIptablesRules(), objects, model: modelOptions})),
  );
  /** What `kubectl proxyctl diff` compares: the desired rules rendered from the objects against the kernel's. */
  const drift = (): string => {
    const model = buildProxyModel(
      {services: objects.services(), endpointSlices: objects.endpointSlices(), node: objects.node()},
      {family: 'IPv4', ...modelOptions},
    );
    const desired = parseIptablesSave(renderIptables(model, {includeJumps: true}), {family: 'IPv4'});
    const applied = parseIptablesSave(inNetns(netns, ['iptables-save']), {family: 'IPv4'});
    const result = diffIptables(desired, applied);
    return result.equal ? '' : result.text.slice(0, 2000);
  };
  const setWeb2 = async (count: number): Promise<string> => {
    objects.slicesByName.set('web-2', slice('web-2', 'web', ips(count, 20)));
    return (await proxier.syncRules(requested))[0].kind;
  };

  await proxier.syncRules(requested);
  assert.equal(drift(), '');
  assert.equal(await setWeb2(500), 'full', 'up to 1,001 endpoints');
  assert.equal(drift(), '', 'api, unchanged, lost its endpoint comments too');
  assert.equal(await setWeb2(499), 'full', 'down to 1,000');
  assert.equal(drift(), '', 'and got them back');
  assert.equal(await setWeb2(498), 'partial');
  assert.equal(drift(), '');
  assert.equal((await proxier.syncRules(periodic))[0].drift, false, 'the drift check agrees');
});
