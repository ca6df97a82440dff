// The lab's pure parts, without root: names and namespace prefixes, input checks, which pods serve
// the demo, the objects it registers (accepted by the API server as a kubelet's would be), where
// port-forward streams go, and what `lab exec` targets mean.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {startApiServer} from '../../src/lab/apiserver/server.ts';
import {checkLabSpec, resolveExecTarget} from '../../src/lab/lab-control.ts';
import {defaultAgentConfig} from '../../src/agent/config/agent-config.ts';
import {learnKubeProxySettings} from '../../src/agent/observe/kube-proxy-settings.ts';
import {
  agentPodName,
  agentPodObject,
  demoPodObject,
  demoPodRoles,
  demoServiceObjects,
  kubeProxyConfigMapObject,
  netnsAnnotation,
  nodeObject,
  standInConfiguration,
} from '../../src/lab/lab-objects.ts';
import {checkLabName, LabError, labNamespacePrefix, type AgentState, type LabState} from '../../src/lab/lab-state.ts';
import {formatLabStatus, type LabStatus, usageExamples} from '../../src/lab/lab-status.ts';
import {describeCluster} from '../../src/lab/netns/index.ts';
import {labPodResolver} from '../../src/lab/pod-port-forward.ts';

const topology = describeCluster({prefix: labNamespacePrefix('demo'), nodes: 2, podsPerNode: 3, externalClient: true});

describe('lab names and input', () => {
  it('accepts DNS labels and refuses the rest, naming the flag', () => {
    for (const good of ['a', 'proxyctl', 'my-lab-2', 'x'.repeat(32)]) assert.equal(checkLabName(good), good);
    for (const bad of ['', 'Lab', 'a.b', '-a', 'a-', 'a_b', 'x'.repeat(33)]) {
      assert.throws(
        () => checkLabName(bad),
        (error: Error) => error instanceof LabError && error.message.startsWith(`--name ${JSON.stringify(bad)}:`),
      );
    }
  });

  it("gives each lab a namespace prefix that no other lab's names start with", () => {
    assert.equal(labNamespacePrefix('a'), 'pxl-a.');
    assert.ok(!`${labNamespacePrefix('a-b')}node-0`.startsWith(labNamespacePrefix('a')));
  });

  it('checks nodes, pods per node, their product and the proxy mode', () => {
    assert.deepEqual(checkLabSpec({name: 'x', nodes: 2, podsPerNode: 3}), {
      name: 'x',
      nodes: 2,
      podsPerNode: 3,
      proxyMode: 'iptables',
      agents: true,
    });
    assert.throws(() => checkLabSpec({name: 'x', nodes: 0, podsPerNode: 3}), /^LabError: --nodes 0: must be a whole number from 1 to 20$/);
    assert.throws(() => checkLabSpec({name: 'x', nodes: 2, podsPerNode: 51}), /--pods-per-node 51/);
    assert.throws(() => checkLabSpec({name: 'x', nodes: 5, podsPerNode: 41}), /at most 200 pods in all/);
    assert.throws(
      () => checkLabSpec({name: 'x', nodes: 1, podsPerNode: 1, proxyMode: 'userspace' as 'ipvs'}),
      /--proxy-mode userspace: must be one of iptables, nftables, ipvs/,
    );
  });
});

describe('lab objects', () => {
  it('spreads the three demoapp replicas over the nodes; the other pods are toolboxes', () => {
    const roles = demoPodRoles(topology.nodes);
    assert.deepEqual(
      [...roles].filter(([, role]) => role === 'demoapp').map(([pod]) => pod),
      ['pod-0-0', 'pod-1-0', 'pod-0-1'],
    );
    assert.deepEqual(
      [...roles].filter(([, role]) => role === 'toolbox').map(([pod]) => pod),
      ['pod-1-1', 'pod-0-2', 'pod-1-2'],
    );
  });

  it("makes each node own its agent Pod, as a node owns a static pod's mirror: a DaemonSet of the agent's label adopts none", async () => {
    const server = await startApiServer({port: 0});
    try {
      const now = new Date().toISOString();
      const node = topology.nodes[0];
      const stored = server.store.create('nodes', nodeObject(node, 0, now), undefined, {keepStatus: true});
      server.store.create('pods', agentPodObject(node, 'ws://127.0.0.1:1', now, stored.metadata.uid), 'kube-system', {keepStatus: true});
      server.store.create(
        'daemonsets',
        {
          metadata: {name: 'proxyctl-agent', namespace: 'kube-system'},
          spec: {
            selector: {matchLabels: {'app.kubernetes.io/name': 'proxyctl-agent'}},
            template: {
              metadata: {labels: {'app.kubernetes.io/name': 'proxyctl-agent'}},
              spec: {hostNetwork: true, containers: [{name: 'agent', image: 'proxyctl-agent:0.1.0'}]},
            },
          },
        },
        'kube-system',
      );
      await server.settle();
      const pod = server.store.get('pods', 'kube-system', agentPodName(node.name));
      assert.deepEqual(
        (pod.metadata.ownerReferences ?? []).map((owner) => `${owner.kind}/${owner.name}`),
        [`Node/${node.name}`],
      );
    } finally {
      await server.stop();
    }
  });

  it('registers nodes, pods and services the API server accepts; the demo services get their endpoints', async () => {
    const server = await startApiServer({port: 0});
    try {
      const now = new Date().toISOString();
      for (const [index, node] of topology.nodes.entries()) {
        server.store.create('nodes', nodeObject(node, index, now), undefined, {keepStatus: true});
        server.store.create('pods', agentPodObject(node, 'ws://127.0.0.1:1', now), 'kube-system', {keepStatus: true});
      }
      const roles = demoPodRoles(topology.nodes);
      for (const node of topology.nodes)
        for (const pod of node.pods)
          server.store.create('pods', demoPodObject(pod, node.ip, roles.get(pod.name)!, now), 'default', {keepStatus: true});
      for (const service of demoServiceObjects()) server.store.create('services', service, 'default');
      await server.settle();

      const endpoints = (service: string) =>
        server.store
          .list('endpointslices', {namespace: 'default', labelSelector: `kubernetes.io/service-name=${service}`})
          .items.flatMap((slice) => (slice.endpoints ?? []) as Array<{addresses: string[]; nodeName: string; conditions: {ready: boolean}}>)
          .map((endpoint) => `${endpoint.addresses[0]}@${endpoint.nodeName}:${endpoint.conditions.ready}`)
          .sort();
      const demo = ['10.244.0.10@node-0:true', '10.244.0.11@node-0:true', '10.244.1.10@node-1:true'];
      assert.deepEqual(endpoints('demoapp'), demo);
      assert.deepEqual(endpoints('demoapp-nodeport'), demo);
      assert.deepEqual(endpoints('demoapp-udp'), demo);
      assert.deepEqual(endpoints('empty'), []);
      const nodePort = server.store.get('services', 'default', 'demoapp-nodeport');
      assert.equal(nodePort.spec.ports[0].nodePort, 30080);
      const agents = server.store.list('pods', {
        namespace: 'kube-system',
        labelSelector: 'app.kubernetes.io/name=proxyctl-agent',
        fieldSelector: 'spec.nodeName=node-1',
      }).items;
      assert.equal(agents.length, 1);
      assert.equal(agents[0].spec.hostNetwork, true);
      assert.deepEqual(
        agents[0].spec.containers[0].ports.find((port: {name: string}) => port.name === 'api'),
        {name: 'api', containerPort: 10260, protocol: 'TCP'},
      );
    } finally {
      await server.stop();
    }
  });
});

describe('lab port-forward targets', () => {
  const agents: AgentState[] = [
    {
      node: 'node-1',
      namespace: topology.nodes[1].namespace,
      pod: 'proxyctl-agent-node-1',
      healthzPort: 41001,
      metricsPort: 41002,
      apiPort: 41003,
      log: '/dev/null',
      restarts: 0,
    },
  ];
  const resolve = labPodResolver({prefix: topology.prefix, agents: () => agents});
  const now = new Date().toISOString();

  it("sends an agent pod's container ports to that agent's loopback ports", async () => {
    const pod = agentPodObject(topology.nodes[1], 'ws://127.0.0.1:41003', now);
    assert.deepEqual(await resolve(pod, 10260), {host: '127.0.0.1', port: 41003});
    assert.deepEqual(await resolve(pod, 10256), {host: '127.0.0.1', port: 41001});
    assert.deepEqual(await resolve(pod, 10249), {host: '127.0.0.1', port: 41002});
    assert.throws(
      () => resolve(pod, 8080),
      /pod kube-system\/proxyctl-agent-node-1 serves no port 8080 \(api 10260, healthz 10256, metrics 10249\)/,
    );
    assert.throws(() => resolve(agentPodObject(topology.nodes[0], '', now), 10260), /no agent of this lab runs for it/);
  });

  it("sends a pod of the agent image to the loopback port its kubelet moved the server to, other ports into the node's namespace", async () => {
    const observer = {
      metadata: {
        name: 'proxyctl-observer-x7k2p',
        namespace: 'kube-system',
        uid: 'u-7',
        annotations: {[netnsAnnotation]: topology.nodes[1].namespace},
      },
      spec: {nodeName: 'node-1', hostNetwork: true},
    };
    const moved = labPodResolver({
      prefix: topology.prefix,
      agents: () => agents,
      loopbackPort: (pod, port) => (pod.metadata.uid === 'u-7' && port === 10270 ? 41070 : undefined),
    });
    assert.deepEqual(await moved(observer, 10270), {host: '127.0.0.1', port: 41070});
    const elsewhere = await moved(observer, 9000);
    assert.equal(typeof (elsewhere as {connect?: unknown}).connect, 'function');
  });

  it("enters only this lab's namespaces for other pods", async () => {
    const pod = demoPodObject(topology.nodes[0].pods[0], topology.nodes[0].ip, 'demoapp', now);
    const target = await resolve(pod, 8080);
    assert.equal(typeof (target as {connect?: unknown}).connect, 'function');
    pod.metadata.annotations = {'lab.proxyctl.dev/netns': 'pxl-other.pod-0-0'};
    assert.throws(() => resolve(pod, 8080), /does not run in this lab/);
  });
});

describe('lab exec targets', () => {
  const state = {
    spec: {name: 'demo'},
    topology,
    agents: [{node: 'node-1', namespace: 'pxl-demo.node-1', pod: 'proxyctl-agent-node-1'}],
  } as LabState;

  it('finds pods, nodes and clients by name', () => {
    assert.equal(resolveExecTarget(state, 'pod-1-2').namespace, 'pxl-demo.pod-1-2');
    assert.equal(resolveExecTarget(state, 'default/pod-0-1').namespace, 'pxl-demo.pod-0-1');
    assert.equal(resolveExecTarget(state, 'node-1').kind, 'node');
    assert.equal(resolveExecTarget(state, 'client').namespace, 'pxl-demo.client-0');
    assert.equal(resolveExecTarget(state, 'kube-system/proxyctl-agent-node-1').namespace, 'pxl-demo.node-1');
    assert.throws(
      () => resolveExecTarget(state, 'pod-7-7'),
      /lab demo has no node, pod or client named "pod-7-7"; try one of: node-0, node-1, pod-0-0/,
    );
  });
});

describe('lab status usage examples', () => {
  const status = (proxyMode: string): LabStatus => ({
    name: 'demo',
    phase: 'ready',
    proxyMode,
    supervisorPid: 1,
    startedAt: '2026-01-01T00:00:00Z',
    kubeconfig: '/run/proxyctl-lab/demo/kubeconfig',
    context: 'admin@proxyctl-lab-demo',
    nodes: [{name: 'node-0', ip: '10.240.0.10', podCIDR: '10.244.0.0/24', netns: 'pxl-demo.node-0'}],
    pods: [],
    externalClients: [],
    services: [],
  });

  it('with --observe, shows checking a switch of kube-proxy to the other mode, then making it as on a kubeadm cluster', () => {
    for (const [mode, target] of [
      ['iptables', 'nftables'],
      ['nftables', 'iptables'],
    ]) {
      const lines = usageExamples({...status(mode), observe: true});
      const check = lines.findIndex((line) => line.startsWith(`kubectl proxyctl migrate-check --to ${target} `));
      const edit = lines.findIndex((line) => line.startsWith('kubectl -n kube-system edit configmap kube-proxy '));
      const restart = lines.findIndex((line) => line.startsWith('kubectl -n kube-system rollout restart daemonset/kube-proxy '));
      assert.ok(check >= 0 && check < edit && edit < restart, `${mode}: ${lines.join('\n')}`);
      assert.match(lines[edit], new RegExp(`mode: ${target} in config.conf`));
    }
    assert.ok(
      !usageExamples(status('iptables')).some((line) => line.includes('migrate-check')),
      'only an observe lab has kube-proxy to switch',
    );
  });

  it("shows the node's rules with the tool of the lab's proxy mode", () => {
    for (const [mode, command] of [
      ['iptables', 'iptables-save -t nat'],
      ['nftables', 'nft list table ip kube-proxy'],
      ['ipvs', 'ipvsadm -Ln'],
    ]) {
      const rules = usageExamples(status(mode)).filter((line) => line.includes('the rules on node-0'));
      assert.equal(rules.length, 1, mode);
      assert.ok(rules[0].includes(` node-0 -- ${command} `), `${mode}: ${rules[0]}`);
    }
    assert.ok(!usageExamples(status('none')).some((line) => line.includes('the rules on')), 'a lab without agents has no rules to show');
    assert.ok(
      usageExamples(status('iptables')).some((line) =>
        /^kubectl create deployment web --image=nginx .*# every image runs the demo server/.test(line),
      ),
      'the examples show a workload to play with',
    );
  });

  it('says so when the agents run another mode than asked (ipvs falls back to iptables without IP_VS)', () => {
    const fellBack = {...status('ipvs'), runningMode: 'iptables'};
    assert.match(formatLabStatus(fellBack), /agents in iptables mode \(asked for ipvs; see the agents' logs for why\)/);
    assert.ok(usageExamples(fellBack).some((line) => line.includes(' node-0 -- iptables-save -t nat ')));
  });
});

describe("lab up --observe: kube-proxy's ConfigMap", () => {
  it("is read by an observer as kubeadm's: the mode and cluster CIDR from it, no problem, the rest defaults", async () => {
    const configMap = kubeProxyConfigMapObject(standInConfiguration('nftables', '10.244.0.0/16'));
    assert.deepEqual([configMap.metadata.namespace, configMap.metadata.name], ['kube-system', 'kube-proxy']);
    const learned = await learnKubeProxySettings(defaultAgentConfig(), new Map(), async () => configMap, 'nftables');
    assert.deepEqual(learned.problems, []);
    assert.equal(learned.configuredMode, 'nftables');
    const sources = new Map(learned.settings.map((setting) => [setting.name, `${setting.value} (${setting.source})`]));
    assert.equal(sources.get('clusterCIDR'), '10.244.0.0/16 (ConfigMap kube-system/kube-proxy)');
    assert.equal(sources.get('nftables.masqueradeBit'), "14 (kube-proxy's default)");
  });
});
