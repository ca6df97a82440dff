// A whole observe session in-process, against the embedded API server, over one in-memory node
// (RecordingHost): a proxying agent in iptables mode stands in for kube-proxy and writes the
// rules; an observing agent beside it reads kube-proxy's ConfigMap, rebuilds what kube-proxy
// should have programmed, and answers status, diff, trace and probe over its WebSocket API while
// rules are tampered with and an endpoint goes away unfollowed. Every command the observer ran is
// listed and checked to be a read; none was even attempted that writes.
import assert from 'node:assert/strict';
import {mkdtemp, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {test} from 'node:test';
import {startAgent} from '../../../src/agent/agent.ts';
import {defaultAgentConfig} from '../../../src/agent/config/agent-config.ts';
import {validateAgentConfig} from '../../../src/agent/config/load-config.ts';
import {type Host, HostCommandError} from '../../../src/agent/host/host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import type {KubeObject} from '../../../src/lab/apiserver/object-log.ts';
import {startApiServer} from '../../../src/lab/apiserver/server.ts';
import {AgentClient} from '../../../src/plugin/lib/agent-client.ts';
import {RecordingHost} from '../recording-host.ts';

async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The commands an observer may run: each only reads the node. */
const readCommands = [
  /^iptablesSave /,
  /^iptablesListChain /,
  /^iptablesFrontEnd /,
  /^iptablesVersion /,
  /^sysctlRead /,
  /^nfacct (get|list)\b/,
  /^nft (-[jt] )?list\b/,
  /^ipset (list|save)\b/,
  /^ipvsadm -[LS]/,
  /^ip (-j |-br )?(link|addr) show\b/,
];

/**
 * A Host that records, as "method args", every call the observer makes of the node before it
 * reaches the shared in-memory node. Its iptables reports the legacy front end, so that the
 * observer's API reads the node for every request (no nft monitor follows an in-memory node).
 */
function recordingCalls(node: RecordingHost): {host: Host; calls: string[]} {
  const calls: string[] = [];
  const host = new Proxy(node, {
    get(target, property, receiver) {
      if (property === 'iptablesFrontEnd') return async () => 'legacy';
      const value = Reflect.get(target, property, receiver);
      if (typeof value !== 'function' || property === 'constructor') return value;
      return (...args: unknown[]) => {
        const words = args.map((arg) =>
          Array.isArray(arg) ? arg.join(' ') : typeof arg === 'string' && arg.length > 40 ? '<input>' : String(arg),
        );
        calls.push(`${String(property)} ${words.join(' ')}`.trim());
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  }) as unknown as Host;
  return {host, calls};
}

/** The node both agents run on. */
const nodeOne: KubeObject = {
  apiVersion: 'v1',
  kind: 'Node',
  metadata: {name: 'node-1'},
  status: {addresses: [{type: 'InternalIP', address: '10.240.0.11'}]},
};

function service(name: string): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name, namespace: 'default'},
    spec: {ports: [{name: 'http', port: 80, targetPort: 8080, protocol: 'TCP'}]},
  };
}

function slice(addresses: string[]): KubeObject {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name: 'web-1', namespace: 'default', labels: {'kubernetes.io/service-name': 'web'}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: 8080}],
    endpoints: addresses.map((address) => ({addresses: [address], conditions: {ready: true}, nodeName: 'node-2'})),
  };
}

test('observe session: status, diff, trace and probe through the API; drift explained by Service; nothing written', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'pxa-observe-'));
  t.after(() => rm(dir, {recursive: true, force: true}));
  const server = await startApiServer({port: 0});
  t.after(() => server.stop());
  server.store.create('nodes', nodeOne);
  server.store.create(
    'configmaps',
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: {name: 'kube-proxy', namespace: 'kube-system'},
      data: {
        'config.conf': [
          'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
          'kind: KubeProxyConfiguration',
          'mode: iptables',
          'clusterCIDR: 10.244.0.0/16',
          'metricsBindAddress: 0.0.0.0:10249',
          'someFutureField: 3',
          '',
        ].join('\n'),
      },
    },
    'kube-system',
  );
  const created = server.store.create('services', service('web'), 'default') as unknown as {spec: {clusterIP: string}};
  server.store.create('endpointslices', slice(['10.244.2.5', '10.244.2.6']), 'default');
  const kubeconfig = join(dir, 'kubeconfig');
  await server.writeKubeconfig(kubeconfig);

  const node = new RecordingHost();
  const base = () => {
    const config = defaultAgentConfig();
    Object.assign(config, {kubeconfig, hostnameOverride: 'node-1', clusterCIDRs: ['10.244.0.0/16']});
    config.iptables.minSyncPeriod = 50;
    return config;
  };

  // The stand-in for kube-proxy.
  const kubeProxy = base();
  Object.assign(kubeProxy, {healthzBindAddress: '', metricsBindAddress: '', apiBindAddress: ''});
  const standIn = await startAgent(validateAgentConfig(kubeProxy), {log: memoryLogger(0), host: node});
  let standInStopped = false;
  t.after(() => (standInStopped ? undefined : standIn.stop()));
  const nat = async () => node.iptablesSave('IPv4', 'nat');
  await until('the stand-in to write the web rules', async () => (await nat()).includes('10.244.2.6:8080'));

  // The observer: its own ports (0 here: free ones), and no flag of kube-proxy's settings but --cluster-cidr.
  const observing = base();
  Object.assign(observing, {
    observe: true,
    observeMode: 'iptables',
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    apiBindAddress: '127.0.0.1:0',
  });
  const {host, calls} = recordingCalls(node);
  const log = memoryLogger(2);
  const observer = await startAgent(
    {...validateAgentConfig(observing), setBy: new Map([['clusterCIDR', 'flag --cluster-cidr']])},
    {log, host},
  );
  t.after(() => observer.stop());
  assert.equal(observer.healthz?.port !== 10256 && observer.metricsServer?.port !== 10249, true);
  const client = await AgentClient.connect({url: observer.api!.url, timeoutMs: 10_000, label: 'the observer'});
  t.after(() => client.close());

  // No drift while kube-proxy's rules are what they should be.
  await until('a drift check', async () => (await client.call('status', {})).drift.checkedAt !== null);
  const status = await client.call('status', {});
  assert.equal(status.observe?.observing, 'kube-proxy iptables');
  assert.deepEqual(status.drift.services, []);
  assert.equal(status.observe?.driftSince, null);
  const clusterCIDR = status.observe!.settings.find((setting) => setting.name === 'clusterCIDR');
  assert.deepEqual(clusterCIDR, {name: 'clusterCIDR', value: '10.244.0.0/16', source: 'ConfigMap kube-system/kube-proxy'});
  assert.equal(status.observe!.settings.find((setting) => setting.name === 'iptables.masqueradeBit')?.source, "kube-proxy's default");
  assert.ok(
    status.observe!.problems.some((problem) => problem.includes('someFutureField') && problem.includes('unknown field')),
    `the unknown field is named: ${status.observe!.problems.join(' / ')}`,
  );
  assert.equal((await client.call('diff', {})).equal, true);

  const trace = await client.call('trace', {
    packet: {srcIP: '10.244.1.9', dstIP: created.spec.clusterIP, dstPort: 80, protocol: 'TCP', origin: 'arriving'},
  });
  assert.equal(trace.drifted, false);
  assert.ok(JSON.stringify(trace).includes('10.244.2.'), "the trace reaches an endpoint through kube-proxy's rules");
  const probe = await client.call('probe', {target: {ip: '127.0.0.1', port: 9, protocol: 'TCP'}, count: 1});
  assert.equal(probe.failures.length + probe.answers.length > 0, true);
  await assert.rejects(client.call('sync', {}), /writes no rules/);

  // Someone deletes the web service's jump: diff names the service port, and says what happened.
  const jump = (await nat())
    .split('\n')
    .find((line) => line.startsWith('-A KUBE-SERVICES') && line.includes('default/web:http cluster IP'));
  assert.ok(jump, 'the stand-in wrote the web service jump');
  node.tamper('IPv4', 'nat', jump.replace(/^-A/, '-D'));
  const tampered = await client.call('diff', {});
  assert.equal(tampered.equal, false);
  const group = tampered.groups.find((candidate) => candidate.servicePort === 'default/web:http');
  assert.ok(group, `diff names default/web:http: ${JSON.stringify(tampered.groups.map((g) => g.servicePort))}`);
  assert.equal(group.explanations?.[0].kind, 'missing-rule');
  assert.match(group.explanations![0].text, /should have written is missing: -t nat -A KUBE-SERVICES .*default\/web:http cluster IP/);
  const drifted = await client.call('status', {});
  assert.deepEqual(drifted.drift.services, ['default/web:http']);
  assert.notEqual(drifted.observe?.driftSince, null);
  assert.ok(log.lines.some((line) => line.includes('service port drifted') && line.includes('default/web:http')));
  const metrics = await (await fetch(`${observer.metricsServer!.url}/metrics`)).text();
  assert.match(metrics, /^proxyctl_observe_drifted_service_ports\{node="node-1"\} 1$/m);
  assert.match(metrics, /^proxyctl_observe_drift_seconds\{node="node-1"\} \d/m);

  // kube-proxy repairs it (the stand-in's full sync): drift ends, and the log says so.
  standIn.proxier.requestSync({full: true});
  await until('the repaired rules to read as no drift', async () => (await client.call('diff', {})).equal);
  assert.ok(log.lines.some((line) => line.includes('service port no longer drifts') && line.includes('default/web:http')));

  // kube-proxy stops following: an endpoint leaves the EndpointSlice, its rules stay.
  await standIn.stop();
  standInStopped = true;
  server.store.update('endpointslices', slice(['10.244.2.5']), 'default');
  await until('the observer to see the endpoint leave', async () => {
    const diff = await client.call('diff', {});
    return diff.groups.some((candidate) => candidate.explanations?.some((explanation) => explanation.kind === 'stale-endpoint'));
  });
  const stale = (await client.call('diff', {})).groups.find((candidate) => candidate.servicePort === 'default/web:http')!;
  assert.match(stale.explanations![0].text, /^endpoint 10\.244\.2\.6 still programmed, removed from the EndpointSlice \d+s ago$/);
  assert.equal(stale.explanations![0].endpoint, '10.244.2.6');

  // Nothing the observer ran writes, and it attempted nothing that would have.
  const writes = calls.filter((call) => !readCommands.some((pattern) => pattern.test(call)));
  assert.deepEqual(writes, [], 'the observer ran only reads');
  assert.ok(
    calls.some((call) => call.startsWith('iptablesSave')),
    'the observer read the rules',
  );
  assert.ok(!log.lines.some((line) => line.includes('refused')), 'no write was attempted');
});

for (const mode of ['ipvs', 'nftables'] as const)
  test(`observe session, ${mode} mode over a node kube-proxy never programmed: every service port said so; nothing written`, async (t) => {
    const server = await startApiServer({port: 0});
    t.after(() => server.stop());
    server.store.create('nodes', nodeOne);
    server.store.create('services', service('web'), 'default');
    server.store.create('endpointslices', slice(['10.244.2.5']), 'default');
    const dir = await mkdtemp(join(tmpdir(), 'pxa-observe-'));
    t.after(() => rm(dir, {recursive: true, force: true}));
    const kubeconfig = join(dir, 'kubeconfig');
    await server.writeKubeconfig(kubeconfig);
    const node = new RecordingHost();
    // An empty node, as its tools print it: no ipvs services, no sets, no kube-ipvs0, no nft table.
    node.nft = async (args) => {
      node.calls.push(`nft ${args.join(' ')}`);
      if (args.includes('kube-proxy')) throw new HostCommandError(['nft', ...args], 1, 'Error: No such file or directory');
      return '';
    };
    node.ip = async (args) => {
      node.calls.push(`ip ${args.join(' ')}`);
      throw new HostCommandError(['ip', ...args], 1, 'Device "kube-ipvs0" does not exist.');
    };
    const config = defaultAgentConfig();
    Object.assign(config, {
      kubeconfig,
      hostnameOverride: 'node-1',
      clusterCIDRs: ['10.244.0.0/16'],
      observe: true,
      observeMode: mode,
      healthzBindAddress: '127.0.0.1:0',
      metricsBindAddress: '',
      apiBindAddress: '127.0.0.1:0',
    });
    const {host, calls} = recordingCalls(node);
    const log = memoryLogger(0);
    const observer = await startAgent(validateAgentConfig(config), {log, host});
    t.after(() => observer.stop());
    const client = await AgentClient.connect({url: observer.api!.url, timeoutMs: 10_000, label: 'the observer'});
    t.after(() => client.close());
    await until('the first model', async () => (await client.call('status', {})).ready);
    const diff = await client.call('diff', {});
    assert.equal(diff.equal, false);
    const web = diff.groups.find((group) => group.servicePort === 'default/web:http');
    assert.deepEqual(web?.explanations, [{kind: 'no-kube-proxy-rules', text: 'no kube-proxy rules at all on this node'}]);
    const status = await client.call('status', {});
    assert.equal(status.observe?.observing, `kube-proxy ${mode}`);
    assert.deepEqual(
      calls.filter((call) => !readCommands.some((pattern) => pattern.test(call))),
      [],
      'the observer ran only reads',
    );
    assert.ok(!log.lines.some((line) => line.includes('refused')), log.lines.filter((line) => line.includes('refused')).join('\n'));
  });
