// kube-proxy's settings as an observer learns them: the ConfigMap's fields first, else the agent's
// flags, else kube-proxy's defaults, each with its source; unknown fields and an unreadable
// ConfigMap named, the rest still used. Also the observer's own ports.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {defaultAgentConfig} from '../../../src/agent/config/agent-config.ts';
import {loadAgentConfig} from '../../../src/agent/config/load-config.ts';
import {learnKubeProxySettings} from '../../../src/agent/observe/kube-proxy-settings.ts';

const configMap = (text: string) => ({apiVersion: 'v1', kind: 'ConfigMap', metadata: {name: 'kube-proxy'}, data: {'config.conf': text}});

const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
clusterCIDR: 10.244.0.0/16
mode: ipvs
ipvs:
  scheduler: wrr
  strictARP: true
iptables:
  masqueradeBit: 15
  newKnob: true
metricsBindAddress: 0.0.0.0:10249
nodePortAddresses: [primary]
`;

test('settings: the ConfigMap wins, flags fill in, defaults last; each says where it came from', async () => {
  const agent = defaultAgentConfig();
  agent.clusterCIDRs = ['10.99.0.0/16'];
  agent.iptables.masqueradeAll = true;
  const setBy = new Map([
    ['clusterCIDR', 'flag --cluster-cidr'],
    ['iptables.masqueradeAll', 'flag --masquerade-all'],
  ]);
  const learned = await learnKubeProxySettings(agent, setBy, async () => configMap(kubeadmConfig));
  const byName = new Map(learned.settings.map((setting) => [setting.name, setting]));
  assert.deepEqual(byName.get('clusterCIDR'), {name: 'clusterCIDR', value: '10.244.0.0/16', source: 'ConfigMap kube-system/kube-proxy'});
  assert.deepEqual(byName.get('iptables.masqueradeAll'), {name: 'iptables.masqueradeAll', value: 'true', source: 'flag --masquerade-all'});
  assert.deepEqual(byName.get('iptables.masqueradeBit'), {
    name: 'iptables.masqueradeBit',
    value: '15',
    source: 'ConfigMap kube-system/kube-proxy',
  });
  assert.deepEqual(byName.get('ipvs.scheduler')?.value, 'wrr');
  assert.deepEqual(byName.get('ipvs.strictARP')?.value, 'true');
  assert.deepEqual(byName.get('detectLocalMode'), {name: 'detectLocalMode', value: 'ClusterCIDR', source: "kube-proxy's default"});
  assert.deepEqual(byName.get('nodePortAddresses')?.value, 'primary');
  assert.equal(learned.configuredMode, 'ipvs');
  assert.deepEqual(learned.problems, ['ConfigMap kube-system/kube-proxy key config.conf: iptables.newKnob: unknown field (ignored)']);
  // kube-proxy's ports and kubeconfig are its own: the observer keeps its own.
  assert.equal(learned.config.metricsBindAddress, agent.metricsBindAddress);
  assert.equal(learned.config.kubeconfig, agent.kubeconfig);
  assert.deepEqual(learned.config.clusterCIDRs, ['10.244.0.0/16']);
});

test('settings: an unreadable ConfigMap is named, and the flags are used', async () => {
  const agent = defaultAgentConfig();
  agent.clusterCIDRs = ['10.99.0.0/16'];
  const learned = await learnKubeProxySettings(agent, new Map([['clusterCIDR', 'flag --cluster-cidr']]), async () => {
    throw new Error('GET /api/v1/namespaces/kube-system/configmaps/kube-proxy: 403 configmaps "kube-proxy" is forbidden');
  });
  assert.match(
    learned.problems[0],
    /^ConfigMap kube-system\/kube-proxy: cannot read it \(GET .*403 .*forbidden\); using the agent's flags$/,
  );
  assert.deepEqual(
    learned.settings.find((setting) => setting.name === 'clusterCIDR'),
    {
      name: 'clusterCIDR',
      value: '10.99.0.0/16',
      source: 'flag --cluster-cidr',
    },
  );

  const noKey = await learnKubeProxySettings(agent, new Map(), async () => ({data: {'kubeconfig.conf': ''}}));
  assert.match(noKey.problems[0], /cannot read it \(it has no key config\.conf\)/);
  const notYaml = await learnKubeProxySettings(agent, new Map(), async () => configMap('kind: [unclosed'));
  assert.match(notYaml.problems[0], /ConfigMap kube-system\/kube-proxy: cannot read it \(.*not YAML/);
});

test("observer ports: not kube-proxy's, unless set; a bare address gets the observer's port", () => {
  const observing = loadAgentConfig(['--observe']).config;
  assert.equal(observing.apiBindAddress, '127.0.0.1:10270');
  assert.equal(observing.healthzBindAddress, '0.0.0.0:10271');
  assert.equal(observing.metricsBindAddress, '127.0.0.1:10272');
  const bare = loadAgentConfig(['--observe', '--metrics-bind-address', '0.0.0.0']).config;
  assert.equal(bare.metricsBindAddress, '0.0.0.0:10272');
  const explicit = loadAgentConfig(['--observe', '--healthz-bind-address=127.0.0.1:9999']).config;
  assert.equal(explicit.healthzBindAddress, '127.0.0.1:9999');
  const proxying = loadAgentConfig([]).config;
  assert.equal(proxying.healthzBindAddress, '0.0.0.0:10256');
  assert.throws(() => loadAgentConfig(['--observe-mode', 'ipvs']), /flag --observe-mode: "ipvs" is set without observe/);
  assert.throws(
    () => loadAgentConfig(['--observe', '--cleanup']),
    /flag --cleanup: true is refused with observe \(--observe\): an observing agent never changes the node/,
  );
  assert.throws(() => loadAgentConfig(['--observe', '--observe-mode', 'userspace']), /flag --observe-mode: "userspace" is not one of/);
  const fromFile = loadAgentConfig(
    ['--config', 'f'],
    () => 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nobserve: true\nobserveMode: nftables\n',
  );
  assert.deepEqual(
    [fromFile.config.observe, fromFile.config.observeMode, fromFile.config.apiBindAddress],
    [true, 'nftables', '127.0.0.1:10270'],
  );
});
