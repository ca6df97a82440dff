// A one-node cluster for plugin tests: the embedded API server, a fresh network namespace acting as
// node-1 (with two endpoint addresses served by the demo app), and the whole agent in-process with
// its rules in that namespace and its API on loopback. The agent pod in kube-system port-forwards to
// that API. Root only; everything is removed after the test, on failure too.
import {execFileSync, execFile} from 'node:child_process';
import {randomBytes} from 'node:crypto';
import {existsSync} from 'node:fs';
import {mkdtemp, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import type {TestContext} from 'node:test';
import assert from 'node:assert/strict';
import {startAgent, type RunningAgent} from '../../src/agent/agent.ts';
import {defaultAgentConfig} from '../../src/agent/config/agent-config.ts';
import {validateAgentConfig} from '../../src/agent/config/load-config.ts';
import {memoryLogger} from '../../src/agent/log.ts';
import {startApiServer, type ApiServer} from '../../src/lab/apiserver/server.ts';
import {startDemoApp} from '../../src/lab/workload/launch.ts';

export const isRoot = process.getuid?.() === 0;
export const root = new URL('../../', import.meta.url).pathname;
export const pluginBin = join(root, 'bin/kubectl-proxyctl');

export const nodeIP = '10.240.0.11';
export const endpointIPs = ['10.244.1.5', '10.244.1.6'];
export const clientIP = '10.244.1.9';

export interface AgentCluster {
  server: ApiServer;
  agent: RunningAgent;
  netns: string;
  dir: string;
  /** Admin kubeconfig. */
  kubeconfig: string;
  /** Kubeconfig of "viewer", who may read pods, services, endpoint slices and nodes but not port-forward. */
  viewerKubeconfig: string;
  agentUrl: string;
  webClusterIP: string;
  emptyClusterIP: string;
  log: ReturnType<typeof memoryLogger>;
  nat(): string;
}

export async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

export function inNetns(netns: string, command: string[]): string {
  return execFileSync('ip', ['netns', 'exec', netns, ...command], {encoding: 'utf8'});
}

export interface PluginRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** runPlugin runs the built CLI (bin/kubectl-proxyctl over dist/) as a user would, without colour. */
export function runPlugin(args: string[], env: Record<string, string> = {}): Promise<PluginRun> {
  assert.ok(existsSync(join(root, 'dist/src/plugin/commands/trace.js')), 'the plugin is not built: run npm run build first');
  return new Promise((resolve) => {
    execFile(
      pluginBin,
      args,
      {env: {...process.env, NO_COLOR: '1', ...env}, timeout: 60_000, maxBuffer: 16 * 1024 * 1024},
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        resolve({code, stdout, stderr});
      },
    );
  });
}

export function describeRun(run: PluginRun): string {
  return `exit ${run.code}\nstdout:\n${run.stdout}\nstderr:\n${run.stderr}`;
}

export async function startAgentCluster(t: TestContext): Promise<AgentCluster> {
  const netns = `pxapi-${process.pid}-${randomBytes(3).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', netns]);
  t.after(() => {
    try {
      execFileSync('ip', ['netns', 'del', netns]);
    } catch {
      // already gone
    }
  });
  // node-1's address on one end of a veth pair, the endpoints' addresses on the other: all local
  // to the namespace, so connections from the node reach the demo app through the service rules.
  for (const command of [
    ['link', 'set', 'lo', 'up'],
    ['link', 'add', 'pxnode0', 'type', 'veth', 'peer', 'name', 'pxpods0'],
    ['addr', 'add', `${nodeIP}/24`, 'dev', 'pxnode0'],
    ...endpointIPs.map((ip) => ['addr', 'add', `${ip}/24`, 'dev', 'pxpods0']),
    ['link', 'set', 'pxnode0', 'up'],
    ['link', 'set', 'pxpods0', 'up'],
    // Service addresses need a route before the rules rewrite them; this one stays in the namespace.
    ['route', 'add', 'default', 'dev', 'pxnode0'],
  ]) {
    execFileSync('ip', ['-n', netns, ...command]);
  }
  const demo = await startDemoApp({namespace: netns, name: 'web', httpPort: 8080, udpPort: 5353});
  t.after(() => demo.stop());

  const dir = await mkdtemp(join(tmpdir(), 'pxapi-plugin-'));
  t.after(() => rm(dir, {recursive: true, force: true}));

  let agentPort = 0;
  const server = await startApiServer({
    port: 0,
    users: [{name: 'viewer', token: 'viewer-token'}],
    grants: [{user: 'viewer', verbs: ['get', 'list', 'watch'], resources: ['pods', 'services', 'endpointslices', 'nodes']}],
    // The agent pod uses the host network: its API is the agent's loopback listener.
    resolvePodAddress: (pod, port) =>
      pod.metadata.labels?.['app.kubernetes.io/name'] === 'proxyctl-agent'
        ? {host: '127.0.0.1', port: agentPort}
        : {host: String(pod.status?.podIP), port},
  });
  t.after(() => server.stop());
  const kubeconfig = join(dir, 'admin.kubeconfig');
  const viewerKubeconfig = join(dir, 'viewer.kubeconfig');
  await server.writeKubeconfig(kubeconfig);
  await server.writeKubeconfig(viewerKubeconfig, {user: 'viewer', token: 'viewer-token'});

  const store = server.store;
  store.create('nodes', {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name: 'node-1'},
    status: {addresses: [{type: 'InternalIP', address: nodeIP}]},
  });
  store.create(
    'pods',
    {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {name: 'proxyctl-agent-abcde', labels: {'app.kubernetes.io/name': 'proxyctl-agent'}},
      spec: {
        nodeName: 'node-1',
        hostNetwork: true,
        containers: [{name: 'agent', image: 'proxyctl:dev', ports: [{name: 'api', containerPort: 10260}]}],
      },
      status: {phase: 'Running', podIP: nodeIP},
    },
    'kube-system',
    {keepStatus: true},
  );
  store.create(
    'pods',
    {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {name: 'client', annotations: {'lab.proxyctl.dev/netns': netns}},
      spec: {nodeName: 'node-1', containers: [{name: 'client', image: 'demo:dev'}]},
      status: {phase: 'Running', podIP: clientIP},
    },
    'default',
    {keepStatus: true},
  );
  const web = store.create(
    'services',
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'web', namespace: 'default'},
      spec: {ports: [{name: 'http', port: 80, targetPort: 8080, protocol: 'TCP'}]},
    },
    'default',
  ) as unknown as {spec: {clusterIP: string}};
  store.create(
    'endpointslices',
    {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {name: 'web-manual', namespace: 'default', labels: {'kubernetes.io/service-name': 'web'}},
      addressType: 'IPv4',
      ports: [{name: 'http', protocol: 'TCP', port: 8080}],
      endpoints: endpointIPs.map((ip, i) => ({
        addresses: [ip],
        conditions: {ready: true},
        nodeName: 'node-1',
        targetRef: {kind: 'Pod', namespace: 'default', name: `web-${i + 1}`},
      })),
    },
    'default',
  );
  const empty = store.create(
    'services',
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'empty', namespace: 'default'},
      spec: {selector: {app: 'nothing'}, ports: [{port: 80, targetPort: 8080, protocol: 'TCP'}]},
    },
    'default',
  ) as unknown as {spec: {clusterIP: string}};

  const config = defaultAgentConfig();
  Object.assign(config, {
    kubeconfig,
    hostnameOverride: 'node-1',
    netns,
    healthzBindAddress: '',
    metricsBindAddress: '',
    apiBindAddress: '127.0.0.1:0',
    clusterCIDRs: ['10.244.0.0/16'],
  });
  config.iptables.minSyncPeriod = 100;
  // No periodic resync during a test: drift must stay until the test asks for a sync.
  config.iptables.syncPeriod = 600_000;
  const log = memoryLogger(2);
  const agent = await startAgent(validateAgentConfig(config), {log});
  t.after(() => agent.stop());
  assert.ok(agent.api, `the agent API did not start:\n${log.lines.filter((line) => / (warn|error) /.test(line)).join('\n')}`);
  agentPort = agent.api.port;

  const nat = () => inNetns(netns, ['iptables-save', '-t', 'nat']);
  try {
    await until(
      'the web and empty service rules',
      () => nat().includes('default/web:http') && inNetns(netns, ['iptables-save', '-t', 'filter']).includes('default/empty'),
    );
    await until('the first sync to finish', () => agent.proxier.status().lastResults.length > 0);
  } catch (error) {
    throw new Error(`${(error as Error).message}\nagent log:\n${log.lines.slice(-30).join('\n')}\nnat:\n${nat()}`);
  }
  return {
    server,
    agent,
    netns,
    dir,
    kubeconfig,
    viewerKubeconfig,
    agentUrl: agent.api.url,
    webClusterIP: web.spec.clusterIP,
    emptyClusterIP: empty.spec.clusterIP,
    log,
    nat,
  };
}
