// Agent configuration: kube-proxy's ConfigMap file, flags over the file, and each kind of refusal.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {test} from 'node:test';
import {fileURLToPath} from 'node:url';
import {ConfigError} from '../../../src/agent/config/agent-config.ts';
import {formatGoDuration, parseGoDuration} from '../../../src/agent/config/duration.ts';
import {checkNetnsExists, loadAgentConfig} from '../../../src/agent/config/load-config.ts';

// The config.conf key of the kube-proxy ConfigMap kubeadm writes (v1.31), unchanged.
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`;

const tuned = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: 10.244.0.0/16
hostnameOverride: Node-1
iptables:
  masqueradeAll: true
  masqueradeBit: 15
  syncPeriod: 1m0s
  minSyncPeriod: 500ms
  localhostNodePorts: false
nodePortAddresses: [primary, 192.168.0.0/16]
detectLocalMode: InterfaceNamePrefix
detectLocal:
  interfaceNamePrefix: veth
metricsBindAddress: 0.0.0.0:9249
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 2h
logging:
  verbosity: 3
`;

function load(argv: string[], files: Record<string, string> = {}) {
  return loadAgentConfig(argv, (path) => {
    if (!(path in files)) throw Object.assign(new Error(`ENOENT: ${path}`), {code: 'ENOENT'});
    return files[path];
  }).config;
}

function refusal(argv: string[], files: Record<string, string> = {}): string {
  try {
    load(argv, files);
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected a ConfigError, got ${String(error)}`);
    assert.ok(!error.message.includes('\n'), 'one line');
    return error.message;
  }
  assert.fail(`accepted ${argv.join(' ')}`);
}

test('no flags: kube-proxy defaults', () => {
  const config = load([]);
  assert.equal(config.mode, 'iptables');
  assert.equal(config.metricsBindAddress, '127.0.0.1:10249');
  assert.equal(config.healthzBindAddress, '0.0.0.0:10256');
  assert.equal(config.apiBindAddress, '127.0.0.1:10260');
  assert.deepEqual(config.iptables, {
    masqueradeAll: false,
    masqueradeBit: 14,
    localhostNodePorts: true,
    syncPeriod: 30_000,
    minSyncPeriod: 1_000,
  });
  assert.equal(config.cleanup, false);
  assert.equal(config.netns, undefined);
});

test("kubeadm's ConfigMap is accepted; zero values mean the defaults where kube-proxy says so", () => {
  const config = load(['--config', '/etc/kube-proxy/config.conf'], {'/etc/kube-proxy/config.conf': kubeadmConfig});
  assert.equal(config.kubeconfig, '/var/lib/kube-proxy/kubeconfig.conf');
  assert.deepEqual(config.clusterCIDRs, ['10.244.0.0/16', 'fd00:10:244::/56']);
  assert.equal(config.mode, 'iptables');
  assert.equal(config.detectLocalMode, 'ClusterCIDR');
  assert.equal(config.iptables.masqueradeBit, 14);
  assert.equal(config.iptables.localhostNodePorts, true);
  assert.equal(config.iptables.syncPeriod, 30_000);
  assert.equal(config.iptables.minSyncPeriod, 1_000);
  assert.equal(config.healthzBindAddress, '0.0.0.0:10256');
  assert.equal(config.metricsBindAddress, '127.0.0.1:10249');
  assert.equal(config.conntrack.maxPerCore, 32768);
});

test('an empty bind address flag turns that server off', () => {
  assert.equal(load(['--metrics-bind-address=']).metricsBindAddress, '');
});

test('a tuned file is read field by field', () => {
  const config = load(['--config=/c.yaml'], {'/c.yaml': tuned});
  assert.equal(config.hostnameOverride, 'node-1');
  assert.deepEqual(config.iptables, {
    masqueradeAll: true,
    masqueradeBit: 15,
    localhostNodePorts: false,
    syncPeriod: 60_000,
    minSyncPeriod: 500,
  });
  assert.deepEqual(config.nodePortAddresses, ['primary', '192.168.0.0/16']);
  assert.equal(config.detectLocalMode, 'InterfaceNamePrefix');
  assert.equal(config.detectLocal.interfaceNamePrefix, 'veth');
  assert.equal(config.metricsBindAddress, '0.0.0.0:9249');
  assert.equal(config.conntrack.maxPerCore, 0);
  assert.equal(config.conntrack.tcpEstablishedTimeout, 2 * 3_600_000);
  assert.equal(config.verbosity, 3);
});

test('nftables layout: proxyctl by default, kube-proxy by flag or by the file', () => {
  assert.equal(load(['--proxy-mode=nftables']).nftables.layout, 'proxyctl');
  assert.equal(load(['--proxy-mode=nftables', '--nftables-layout', 'kube-proxy']).nftables.layout, 'kube-proxy');
  const file =
    'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  layout: kube-proxy\n';
  assert.equal(load(['--config', '/c.yaml'], {'/c.yaml': file}).nftables.layout, 'kube-proxy');
  assert.equal(load(['--config', '/c.yaml', '--nftables-layout=proxyctl'], {'/c.yaml': file}).nftables.layout, 'proxyctl');
});

test('flags override the file, wherever they stand', () => {
  const config = load(
    [
      '--masquerade-all=false',
      '--config',
      '/c.yaml',
      '--cluster-cidr',
      '10.0.0.0/8',
      '--v=5',
      '--metrics-bind-address',
      '127.0.0.1',
      '--hostname-override=node-2',
      '--netns',
      'pxa-1',
      '--proxy-mode',
      'iptables',
    ],
    {'/c.yaml': tuned},
  );
  assert.equal(config.iptables.masqueradeAll, false);
  assert.deepEqual(config.clusterCIDRs, ['10.0.0.0/8']);
  assert.equal(config.verbosity, 5);
  assert.equal(config.metricsBindAddress, '127.0.0.1:10249', 'an address alone gets the default port');
  assert.equal(config.hostnameOverride, 'node-2');
  assert.equal(config.netns, 'pxa-1');
  assert.equal(config.iptables.masqueradeBit, 15, 'what no flag touches stays from the file');
});

test('ipvs flags as kube-proxy names them', () => {
  const config = load([
    '--proxy-mode=ipvs',
    '--ipvs-scheduler',
    'lc',
    '--ipvs-sync-period=45s',
    '--ipvs-min-sync-period',
    '2s',
    '--ipvs-exclude-cidrs',
    '10.10.0.0/16,10.20.0.0/16',
    '--ipvs-strict-arp',
    '--ipvs-tcp-timeout=15m',
    '--ipvs-tcpfin-timeout',
    '30s',
    '--ipvs-udp-timeout=5s',
  ]);
  assert.equal(config.mode, 'ipvs');
  assert.equal(config.ipvs.scheduler, 'lc');
  assert.equal(config.ipvs.syncPeriod, 45_000);
  assert.equal(config.ipvs.minSyncPeriod, 2000);
  assert.deepEqual(config.ipvs.excludeCIDRs, ['10.10.0.0/16', '10.20.0.0/16']);
  assert.equal(config.ipvs.strictARP, true);
  assert.equal(config.ipvs.tcpTimeout, 15 * 60_000);
  assert.equal(config.ipvs.tcpFinTimeout, 30_000);
  assert.equal(config.ipvs.udpTimeout, 5000);
});

test('nodePortAddresses keywords localhost and all become CIDRs', () => {
  assert.deepEqual(load(['--nodeport-addresses', 'localhost,all,primary']).nodePortAddresses, [
    '127.0.0.0/8',
    '::1/128',
    '0.0.0.0/0',
    '::/0',
    'primary',
  ]);
});

test('--cleanup and -v', () => {
  const config = load(['--cleanup', '-v', '2']);
  assert.equal(config.cleanup, true);
  assert.equal(config.verbosity, 2);
});

const withFile = (body: string) => ({'/c.yaml': `apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n${body}`});

const refusals: Array<{name: string; argv?: string[]; file?: string; says: RegExp}> = [
  {name: 'unknown flag', argv: ['--proxy-mod=iptables'], says: /^flag --proxy-mod: unknown flag/},
  {name: 'flag without value', argv: ['--kubeconfig'], says: /^flag --kubeconfig: needs a value/},
  {name: 'bad boolean flag', argv: ['--masquerade-all=yes'], says: /^flag --masquerade-all: "yes" is not true or false/},
  {name: 'bad duration flag', argv: ['--iptables-sync-period', '30x'], says: /^flag --iptables-sync-period: "30x" is not a duration/},
  {name: 'bad integer flag', argv: ['--v', 'high'], says: /^flag --v: "high" is not an integer/},
  {name: 'positional argument', argv: ['iptables'], says: /^argument "iptables"/},
  {
    name: 'unknown mode by flag',
    argv: ['--proxy-mode', 'userspace'],
    says: /^flag --proxy-mode: "userspace" is not one of iptables, ipvs, nftables/,
  },
  {
    name: 'bad cluster CIDR by flag',
    argv: ['--cluster-cidr', '10.244.0.0/33'],
    says: /^flag --cluster-cidr: "10.244.0.0\/33" is not a CIDR/,
  },
  {name: 'two CIDRs of one family', argv: ['--cluster-cidr', '10.0.0.0/8,10.1.0.0/16'], says: /has two IPv4 CIDRs/},
  {
    name: 'unknown nftables layout by flag',
    argv: ['--proxy-mode=nftables', '--nftables-layout', 'kubeproxy'],
    says: /^flag --nftables-layout: "kubeproxy" is not one of proxyctl, kube-proxy, kube-proxy-1.33/,
  },
  {
    name: 'unknown nftables layout in the file',
    file: 'mode: nftables\nnftables:\n  layout: maps\n',
    says: /^config file \/c\.yaml: nftables\.layout: "maps" is not one of proxyctl, kube-proxy, kube-proxy-1.33/,
  },
  {
    name: 'bad metrics address',
    argv: ['--metrics-bind-address', 'localhost:x'],
    says: /^flag --metrics-bind-address: "localhost:x" is not IP:port/,
  },
  {name: 'bad netns name', argv: ['--netns', '../x'], says: /^flag --netns: "..\/x" is not a network namespace name/},
  {name: 'missing file', argv: ['--config', '/nope.yaml'], says: /^config file \/nope.yaml: cannot read it: ENOENT/},
  {name: 'not YAML', file: 'mode: [', says: /^config file \/c.yaml: not YAML/},
  {name: 'wrong apiVersion', file: 'x', says: /apiVersion/},
  {
    name: 'unknown field',
    file: 'iptables:\n  masqueradeBits: 14\n',
    says: /^config file \/c.yaml: iptables.masqueradeBits: unknown field$/,
  },
  {name: 'unknown top-level field', file: 'proxyMode: iptables\n', says: /proxyMode: unknown field/},
  {name: 'bad duration', file: 'iptables:\n  syncPeriod: 30\n', says: /^config file \/c.yaml: iptables.syncPeriod: 30 is not a duration/},
  {
    name: 'bad duration text',
    file: 'iptables:\n  syncPeriod: "thirty seconds"\n',
    says: /iptables.syncPeriod: "thirty seconds" is not a duration/,
  },
  {name: 'wrong type', file: 'iptables:\n  masqueradeAll: "yes"\n', says: /iptables.masqueradeAll: "yes" is not true or false/},
  {name: 'section is not an object', file: 'iptables: fast\n', says: /iptables: "fast" is not an object/},
  {
    name: 'masqueradeBit out of range',
    file: 'iptables:\n  masqueradeBit: 32\n',
    says: /^config file \/c.yaml: iptables.masqueradeBit: 32 is not in 0-31/,
  },
  {
    name: 'syncPeriod shorter than minSyncPeriod',
    file: 'iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 10s\n',
    says: /iptables.syncPeriod: "1s" is shorter than iptables.minSyncPeriod 10s/,
  },
  {
    name: 'zero syncPeriod by flag',
    argv: ['--iptables-sync-period', '0s'],
    says: /^flag --iptables-sync-period: "0s" is not greater than 0/,
  },
  {name: 'unknown mode in file', file: 'mode: kernelspace\n', says: /^config file \/c.yaml: mode: "kernelspace" is not one of/},
  {
    name: 'bad ipvs scheduler by flag',
    argv: ['--proxy-mode=ipvs', '--ipvs-scheduler', 'fastest'],
    says: /^flag --ipvs-scheduler: "fastest" is not one of rr/,
  },
  {
    name: 'bad ipvs exclude CIDR by flag',
    argv: ['--proxy-mode=ipvs', '--ipvs-exclude-cidrs', '10.0.0.0/8,nope'],
    says: /^flag --ipvs-exclude-cidrs: "nope"/,
  },
  {name: 'bad ipvs timeout by flag', argv: ['--ipvs-udp-timeout', 'soon'], says: /^flag --ipvs-udp-timeout: "soon" is not a duration/},
  {
    name: 'bad ipvs scheduler in ipvs mode',
    file: 'mode: ipvs\nipvs:\n  scheduler: fastest\n',
    says: /ipvs.scheduler: "fastest" is not one of rr/,
  },
  {name: 'bad excludeCIDRs in ipvs mode', file: 'mode: ipvs\nipvs:\n  excludeCIDRs: [nope]\n', says: /ipvs.excludeCIDRs: "nope"/},
  {name: 'bad nodePortAddresses', file: 'nodePortAddresses: [eth0]\n', says: /nodePortAddresses: "eth0" is neither a CIDR nor/},
  {
    name: 'bridge mode without bridge',
    file: 'detectLocalMode: BridgeInterface\n',
    says: /detectLocal.bridgeInterface: "" is not an interface name/,
  },
  {name: 'unknown detectLocalMode', file: 'detectLocalMode: Magic\n', says: /detectLocalMode: "Magic" is not one of/},
  {name: 'bad bindAddress', file: 'bindAddress: somewhere\n', says: /bindAddress: "somewhere" is not an IP address/},
  {name: 'bad healthz address', file: 'healthzBindAddress: 0.0.0.0\n', says: /healthzBindAddress: "0.0.0.0" is not IP:port/},
  {name: 'bad hostnameOverride', file: 'hostnameOverride: "node_1"\n', says: /hostnameOverride: "node_1" is not a node name/},
  {name: 'negative conntrack', file: 'conntrack:\n  min: -1\n', says: /conntrack.min: -1 is negative/},
  {
    name: 'bad featureGates',
    file: 'featureGates:\n  Foo: yes-please\n',
    says: /featureGates: an object is not a map of names to true or false/,
  },
  {name: 'list where a string belongs', file: 'clusterCIDR: [10.0.0.0/8]\n', says: /clusterCIDR: a list is not a string/},
];

for (const row of refusals) {
  test(`refused: ${row.name}`, () => {
    const argv = row.argv ?? ['--config', '/c.yaml'];
    const files =
      row.file === undefined ? {} : row.file === 'x' ? {'/c.yaml': 'apiVersion: v1\nkind: KubeProxyConfiguration\n'} : withFile(row.file);
    assert.match(refusal(argv, files), row.says);
  });
}

test('Go durations both ways', () => {
  const rows: Array<[string, number]> = [
    ['30s', 30_000],
    ['1m0s', 60_000],
    ['1h30m', 5_400_000],
    ['500ms', 500],
    ['0', 0],
    ['1.5s', 1_500],
    ['2h45m10s', 9_910_000],
  ];
  for (const [text, milliseconds] of rows) assert.equal(parseGoDuration(text), milliseconds, text);
  for (const bad of ['', '30', 's', '1d', '1m30', '--1s']) assert.equal(parseGoDuration(bad), undefined, bad);
  assert.equal(formatGoDuration(60_000), '1m0s');
  assert.equal(formatGoDuration(30_000), '30s');
  assert.equal(formatGoDuration(3_600_000), '1h0m0s');
  assert.equal(formatGoDuration(250), '250ms');
});

test('--netns naming a network namespace that does not exist: the agent refuses to start, exit 2 naming the flag', async (t) => {
  const directory = await mkdtemp(join(tmpdir(), 'pxa-netns-'));
  t.after(() => rm(directory, {recursive: true, force: true}));
  await writeFile(join(directory, 'pxa-present'), '');
  assert.doesNotThrow(() => checkNetnsExists('pxa-present', directory));
  assert.doesNotThrow(() => checkNetnsExists(undefined, directory));
  assert.throws(
    () => checkNetnsExists('pxa-absent', directory),
    (error: unknown) => error instanceof ConfigError && /^flag --netns: network namespace "pxa-absent" does not exist/.test(error.message),
  );

  // The agent as users start it (the build): refused before it touches anything.
  const missing = `pxa-missing-${process.pid}`;
  const agent = spawnSync(
    process.execPath,
    [fileURLToPath(new URL('../../../dist/src/agent/main.js', import.meta.url)), '--netns', missing, '--kubeconfig', '/nonexistent'],
    {encoding: 'utf8', timeout: 30_000},
  );
  assert.equal(agent.status, 2, agent.stderr);
  assert.match(agent.stderr, new RegExp(`^proxyctl-agent: flag --netns: network namespace "${missing}" does not exist`));
});

test('--service-cluster-ip-range: service CIDRs, one per family, for clusters without ServiceCIDR objects', () => {
  assert.deepEqual(load([]).serviceCIDRs, []);
  assert.deepEqual(load(['--proxy-mode=nftables', '--service-cluster-ip-range', '10.96.0.0/12, fd00:10:96::/112']).serviceCIDRs, [
    '10.96.0.0/12',
    'fd00:10:96::/112',
  ]);
  assert.match(refusal(['--service-cluster-ip-range=10.96.0.0']), /--service-cluster-ip-range.*10\.96\.0\.0.*is not a CIDR/);
  assert.match(refusal(['--service-cluster-ip-range=10.96.0.0/12,10.100.0.0/16']), /--service-cluster-ip-range.*has two IPv4 CIDRs/);
});
