// `kubectl proxyctl lab up|status|exec|down` through the built CLI: a real namespace cluster with
// the embedded API server and one agent per node, reached by kubectl and by real packets, and
// nothing left after down. Root only.
import assert from 'node:assert/strict';
import {existsSync} from 'node:fs';
import {readdir, readFile} from 'node:fs/promises';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';
import {execa} from 'execa';
import {currentKubectl} from '../../scripts/current-kubectl.ts';
import {labDir, labNamespacePrefix, type LabState} from '../../src/lab/lab-state.ts';
import {listNamespaces, netnsUnavailableReason} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {fetchJsonInNetns} from '../agent/health/fetch-in-netns.ts';

const repo = fileURLToPath(new URL('../..', import.meta.url));
const cli = join(repo, 'bin/kubectl-proxyctl');
const built = existsSync(join(repo, 'dist/src/plugin/commands/lab/up.js'));
const demoClient = join(repo, 'src/lab/workload/demoapp-client.ts');
const unavailable = await netnsUnavailableReason();
const name = `test-${process.pid}`;
const prefix = labNamespacePrefix(name);

async function proxyctl(...args: string[]) {
  const result = await execa(cli, args, {reject: false, timeout: 120_000, env: {NO_COLOR: '1'}});
  return {stdout: String(result.stdout), stderr: String(result.stderr), exitCode: result.exitCode ?? -1};
}

/** probe runs the demo client inside a lab pod, node or client through `lab exec`. */
async function probe(target: string, protocol: 'tcp' | 'udp', host: string, port: number, count = 1): Promise<ProbeResult[]> {
  const result = await proxyctl(
    'lab',
    'exec',
    '--name',
    name,
    target,
    '--',
    process.execPath,
    demoClient,
    '--protocol',
    protocol,
    '--host',
    host,
    '--port',
    String(port),
    '--count',
    String(count),
    '--timeout-ms',
    '2000',
  );
  assert.equal(result.exitCode, 0, `demo client in ${target}: ${result.stderr}`);
  return JSON.parse(result.stdout) as ProbeResult[];
}

function replies(results: ProbeResult[]) {
  return results.map((result) => {
    assert.equal(result.outcome, 'reply', JSON.stringify(result));
    return (result as Extract<ProbeResult, {outcome: 'reply'}>).reply;
  });
}

async function processesMentioning(text: string): Promise<string[]> {
  const found: string[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    const command = await readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '');
    if (command.includes(text)) found.push(`${entry}: ${command.split('\0').join(' ')}`);
  }
  return found;
}

const skipReason = unavailable
  ? `needs root: ${unavailable}`
  : built
    ? undefined
    : 'needs the build: run `npm run build` first (the lab runs bin/kubectl-proxyctl)';

describe('lab up / exec / down', {concurrency: false, skip: skipReason}, () => {
  let up: Awaited<ReturnType<typeof proxyctl>>;
  let state: LabState;
  let kubectlPath: string;

  before(async () => {
    up = await proxyctl('lab', 'up', '--name', name, '--nodes', '2', '--pods-per-node', '2');
    assert.equal(up.exitCode, 0, `lab up failed: ${up.stderr}`);
    state = JSON.parse(await readFile(join(labDir(name), 'state.json'), 'utf8')) as LabState;
    const script = await execa(join(repo, 'scripts/debian-kubectl.sh'), [], {reject: true});
    kubectlPath = String(script.stdout).trim().split('\n').pop()!;
  });
  after(async () => {
    // Also when a test failed: down is safe to run twice.
    await proxyctl('lab', 'down', '--name', name);
  });

  it('prints the kubeconfig and how to use the lab', () => {
    assert.match(up.stdout, new RegExp(`export KUBECONFIG=${join(labDir(name), 'kubeconfig')}`));
    assert.match(up.stdout, /kubectl get nodes/);
    // Named after the lab, so that two labs' kubeconfigs can be merged.
    assert.match(up.stdout, new RegExp(`kubeconfig +\\S+ \\(context admin@proxyctl-lab-${name}\\)`));
    assert.match(up.stdout, new RegExp(`kubectl --context admin@proxyctl-lab-${name} get nodes`));
    assert.match(up.stdout, new RegExp(`kubectl proxyctl lab exec --name ${name} pod-1-1 -- `));
    assert.match(up.stdout, /node-0 +10\.240\.0\.10 +10\.244\.0\.0\/24 +True +synced/);
    assert.equal(state.phase, 'ready');
    assert.equal(state.agents.length, 2);
  });

  // Right after up: a ready lab's rules are complete.
  it('the agents proxy ClusterIP, UDP and NodePort services with real packets; no endpoints is refused', async () => {
    const demoPods = new Map([
      ['pod-0-0', '10.244.0.10'],
      ['pod-0-1', '10.244.0.11'],
      ['pod-1-0', '10.244.1.10'],
    ]);
    // From the toolbox pod on node-1: pod traffic keeps its source address.
    for (const reply of replies(await probe('pod-1-1', 'tcp', '10.96.0.10', 80, 12))) {
      assert.equal(demoPods.get(reply.pod), reply.podIP, `${reply.pod} is a demoapp pod`);
      assert.equal(reply.clientIP, '10.244.1.11');
    }
    for (const reply of replies(await probe('pod-1-1', 'udp', '10.96.0.53', 53, 3))) assert.ok(demoPods.has(reply.pod), reply.pod);
    const [empty] = await probe('pod-1-1', 'tcp', '10.96.0.99', 80);
    assert.equal(empty.outcome, 'refused', JSON.stringify(empty));

    // From outside the cluster: the NodePort on node-1, and a ClusterIP through the gateway node-0.
    for (const reply of replies(await probe('client', 'tcp', '10.240.0.11', 30080, 4))) assert.ok(demoPods.has(reply.pod), reply.pod);
    for (const reply of replies(await probe('client-0', 'tcp', '10.96.0.10', 80, 2))) assert.ok(demoPods.has(reply.pod), reply.pod);
  });

  it('a pod reaches a pod on another node by its IP', async () => {
    const [reply] = replies(await probe('pod-0-0', 'tcp', '10.244.1.11', 8080));
    assert.deepEqual(reply, {pod: 'pod-1-1', podIP: '10.244.1.11', clientIP: '10.244.0.10', protocol: 'tcp'});
  });

  it('kubectl 1.20 and kubectl 1.34 see the nodes, the pods with the agents, and the services', async () => {
    for (const binary of [kubectlPath, currentKubectl()]) await seenBy(binary);
  });

  async function seenBy(binary: string): Promise<void> {
    const kubectl = async (...args: string[]) => {
      const result = await execa(binary, ['--kubeconfig', state.kubeconfig, ...args], {
        reject: false,
        env: {HOME: labDir(name), NO_COLOR: '1'},
        timeout: 30_000,
      });
      assert.equal(result.exitCode, 0, `${binary} ${args.join(' ')}: ${String(result.stderr)}`);
      return String(result.stdout);
    };
    assert.match(await kubectl('get', 'nodes'), /node-0\s+Ready[\s\S]*node-1\s+Ready/);
    assert.equal((await kubectl('config', 'current-context')).trim(), `admin@proxyctl-lab-${name}`);
    const pods = await kubectl('get', 'pods', '-A', '-o', 'wide');
    for (const pod of ['pod-0-0', 'pod-0-1', 'pod-1-0', 'pod-1-1']) assert.match(pods, new RegExp(`default\\s+${pod}\\s+1/1\\s+Running`));
    assert.match(pods, /kube-system\s+proxyctl-agent-node-1\s+1\/1\s+Running\s+0\s+\S+\s+10\.240\.0\.11\s+node-1/);
    const agents = await kubectl('get', 'pods', '-n', 'kube-system', '-l', 'app.kubernetes.io/name=proxyctl-agent', '-o', 'name');
    assert.deepEqual(agents.trim().split('\n').sort(), ['pod/proxyctl-agent-node-0', 'pod/proxyctl-agent-node-1']);
    const services = await kubectl('get', 'services');
    assert.match(services, /demoapp\s+ClusterIP\s+10\.96\.0\.10\s+<none>\s+80\/TCP/);
    assert.match(services, /demoapp-nodeport\s+NodePort\s+10\.96\.0\.80\s+<none>\s+80:30080\/TCP/);
    assert.match(services, /demoapp-udp\s+ClusterIP\s+10\.96\.0\.53\s+<none>\s+53\/UDP/);
    assert.match(services, /empty\s+ClusterIP\s+10\.96\.0\.99/);
  }

  // The lab started by the built CLI runs the built kubelet: a pod made through the API gets a server.
  it('a pod created with kubectl run is scheduled and run by its node, and answers on its port', async () => {
    const run = await execa(kubectlPath, ['--kubeconfig', state.kubeconfig, 'run', 'cli-run', '--image=nginx', '--port=80'], {
      reject: false,
    });
    assert.equal(run.exitCode, 0, String(run.stderr));
    const wait = await execa(
      kubectlPath,
      ['--kubeconfig', state.kubeconfig, 'wait', '--for=condition=Ready', 'pod/cli-run', '--timeout=30s'],
      {
        reject: false,
      },
    );
    assert.equal(wait.exitCode, 0, String(wait.stderr));
    const ip = String(
      (await execa(kubectlPath, ['--kubeconfig', state.kubeconfig, 'get', 'pod', 'cli-run', '-o', 'jsonpath={.status.podIP}'])).stdout,
    );
    const [reply] = replies(await probe('pod-0-0', 'tcp', ip, 80));
    assert.equal(reply.pod, 'cli-run');
    await execa(kubectlPath, ['--kubeconfig', state.kubeconfig, 'delete', 'pod', 'cli-run', '--grace-period=1']);
  });

  it("the API server's port-forward reaches an agent's own ports", async () => {
    const forward = execa(
      kubectlPath,
      ['--kubeconfig', state.kubeconfig, '-n', 'kube-system', 'port-forward', 'pod/proxyctl-agent-node-1', ':10256'],
      {reject: false, env: {HOME: labDir(name)}, buffer: false},
    );
    try {
      const localPort = await new Promise<number>((resolve, reject) => {
        let said = '';
        const timer = setTimeout(() => reject(new Error(`kubectl port-forward said: ${said}`)), 15_000);
        forward.stdout?.on('data', (chunk: Buffer) => {
          said += chunk.toString();
          const port = /127\.0\.0\.1:(\d+) -> 10256/.exec(said)?.[1];
          if (port) {
            clearTimeout(timer);
            resolve(Number(port));
          }
        });
      });
      const response = await fetch(`http://127.0.0.1:${localPort}/healthz`);
      assert.equal(response.status, 200);
      assert.notEqual(((await response.json()) as {lastUpdated: string}).lastUpdated, '');
    } finally {
      forward.kill();
      await forward;
    }
  });

  it('the plugin finds the agents by label and reaches them through the port-forward', async () => {
    const result = await execa(cli, ['status', '--kubeconfig', state.kubeconfig, '-o', 'json'], {
      reject: false,
      env: {NO_COLOR: '1'},
      timeout: 60_000,
    });
    assert.equal(result.exitCode, 0, String(result.stderr));
    const agents = (JSON.parse(String(result.stdout)) as {agents: Array<{node: string; ready: boolean}>}).agents;
    assert.deepEqual(
      agents.map((agent) => [agent.node, agent.ready]),
      [
        ['node-0', true],
        ['node-1', true],
      ],
    );
  });

  it('externalTrafficPolicy Local: each lab agent answers the healthCheckNodePort on its node IP with its own local endpoint count', async () => {
    const kubectl = async (args: string[], input?: string) => {
      const result = await execa(kubectlPath, ['--kubeconfig', state.kubeconfig, ...args], {
        input,
        reject: false,
        env: {HOME: labDir(name)},
        timeout: 30_000,
      });
      assert.equal(result.exitCode, 0, `kubectl ${args.join(' ')}: ${String(result.stderr)}`);
      return String(result.stdout);
    };
    const service = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'lb-local', namespace: 'default'},
      spec: {
        type: 'LoadBalancer',
        externalTrafficPolicy: 'Local',
        selector: {lb: 'local'},
        ports: [{name: 'http', port: 80, targetPort: 8080}],
      },
    };
    await kubectl(['apply', '-f', '-'], JSON.stringify(service));
    await kubectl(['label', 'pod', 'pod-0-0', 'lb=local']);
    const port = Number(await kubectl(['get', 'service', 'lb-local', '-o', 'jsonpath={.spec.healthCheckNodePort}']));
    assert.ok(port >= 30000 && port <= 32767, `the API server allocated a healthCheckNodePort: ${port}`);
    // From the external client, as a cloud load balancer probes each node.
    const client = state.topology!.externalClients[0].namespace;
    const check = (nodeIP: string) => fetchJsonInNetns(client, `http://${nodeIP}:${port}/`);
    const body = (localEndpoints: number) => ({
      service: {namespace: 'default', name: 'lb-local'},
      localEndpoints,
      serviceProxyHealthy: true,
    });
    const eventually = async (what: string, nodeIP: string, expected: unknown) => {
      const deadline = Date.now() + 10_000;
      let seen: unknown;
      while (Date.now() < deadline) {
        seen = await check(nodeIP);
        if (JSON.stringify(seen) === JSON.stringify(expected)) return;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      assert.deepEqual(seen, expected, what);
    };
    await eventually('node-0 has the endpoint', '10.240.0.10', {status: 200, json: body(1)});
    await eventually('node-1 has none', '10.240.0.11', {status: 503, json: body(0)});
    await kubectl(['label', 'pod', 'pod-1-0', 'lb=local']);
    await eventually('node-1 counts its own', '10.240.0.11', {status: 200, json: body(1)});
    await eventually('node-0 still one', '10.240.0.10', {status: 200, json: body(1)});
    await kubectl(['delete', 'service', 'lb-local']);
    await kubectl(['label', 'pod', 'pod-0-0', 'pod-1-0', 'lb-']);
    await eventually('the port closed on node-0', '10.240.0.10', {error: 'ECONNREFUSED'});
  });

  it('an agent Pod deleted through the API comes back, as its DaemonSet would make it, and proxies again', async () => {
    const kubectl = (...args: string[]) =>
      execa(kubectlPath, ['--kubeconfig', state.kubeconfig, '-n', 'kube-system', ...args], {
        reject: false,
        env: {HOME: labDir(name)},
        timeout: 30_000,
      });
    const pod = 'proxyctl-agent-node-1';
    const before = String((await kubectl('get', 'pod', pod, '-o', 'jsonpath={.metadata.uid}')).stdout);
    const deleted = await kubectl('delete', 'pod', pod);
    assert.equal(deleted.exitCode, 0, String(deleted.stderr));
    const deadline = Date.now() + 20_000;
    let now = '';
    while (Date.now() < deadline) {
      now = String((await kubectl('get', 'pod', pod, '-o', 'jsonpath={.metadata.uid} {.status.containerStatuses[0].ready}')).stdout);
      if (now.endsWith(' true') && !now.startsWith(before)) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    assert.match(now, / true$/, 'the new agent pod is ready');
    assert.notEqual(now.split(' ')[0], before, 'a new pod');
    for (const reply of replies(await probe('pod-1-1', 'tcp', '10.96.0.10', 80, 3))) assert.match(reply.pod, /^pod-(0-0|0-1|1-0)$/);
  });

  it('lab status shows the running lab; lab exec passes the exit code through', async () => {
    const status = await proxyctl('lab', 'status', '--name', name, '-o', 'json');
    assert.equal(status.exitCode, 0, status.stderr);
    const parsed = JSON.parse(status.stdout) as {
      phase: string;
      nodes: Array<{name: string; agent?: {ready?: boolean}}>;
      services: Array<{name: string; endpoints: number}>;
    };
    assert.equal(parsed.phase, 'ready');
    assert.deepEqual(
      parsed.nodes.map((node) => [node.name, node.agent?.ready]),
      [
        ['node-0', true],
        ['node-1', true],
      ],
    );
    assert.equal(parsed.services.find((service) => service.name === 'demoapp')?.endpoints, 3);
    assert.equal((await proxyctl('lab', 'exec', '--name', name, 'node-1', '--', 'sh', '-c', 'exit 7')).exitCode, 7);
    // The command after the first -- arrives word for word: repeated flags stay in order, a second
    // -- and a --name inside it are the command's.
    const verbatim = await proxyctl(
      'lab',
      'exec',
      '--name',
      name,
      'node-1',
      '--',
      'printf',
      '[%s]',
      'curl',
      '-H',
      'A: 1',
      '-v',
      '-H',
      'B: 2',
      '--',
      '--name',
      'x',
    );
    assert.equal(verbatim.exitCode, 0, verbatim.stderr);
    assert.equal(verbatim.stdout, '[curl][-H][A: 1][-v][-H][B: 2][--][--name][x]');
    const unknown = await proxyctl('lab', 'exec', '--name', name, 'pod-9-9', '--', 'true');
    assert.notEqual(unknown.exitCode, 0);
    assert.match(unknown.stderr, /has no node, pod or client named "pod-9-9"/);
  });

  it('a second lab up with the same name is refused, makes nothing, and the first lab keeps running', async () => {
    const namespacesBefore = (await listNamespaces()).filter((namespace) => namespace.startsWith(prefix)).sort();
    const readState = async () => JSON.parse(await readFile(join(labDir(name), 'state.json'), 'utf8')) as LabState;
    const stateBefore = await readState();
    const second = await proxyctl('lab', 'up', '--name', name);
    assert.equal(second.exitCode, 1);
    assert.match(second.stderr, new RegExp(`lab ${name} is already running`));
    assert.match(second.stderr, new RegExp(`kubectl proxyctl lab down --name ${name}`), 'says how to remove it');
    assert.deepEqual(
      (await listNamespaces()).filter((namespace) => namespace.startsWith(prefix)).sort(),
      namespacesBefore,
      'no namespace made or removed',
    );
    const stateAfter = await readState();
    assert.equal(stateAfter.supervisorPid, stateBefore.supervisorPid, 'the same supervisor runs the lab');
    assert.deepEqual(
      stateAfter.agents.map((agent) => agent.pid),
      stateBefore.agents.map((agent) => agent.pid),
      'and the same agents',
    );
    const [reply] = replies(await probe('pod-0-0', 'tcp', '10.244.1.10', 8080));
    assert.equal(reply.pod, 'pod-1-0');
  });

  it('lab down removes every namespace, process and file; a second down is fine', async () => {
    assert.ok((await listNamespaces()).some((namespace) => namespace.startsWith(prefix)));
    const down = await proxyctl('lab', 'down', '--name', name);
    assert.equal(down.exitCode, 0, down.stderr);
    assert.match(down.stdout, new RegExp(`lab ${name} removed \\(9 network namespaces`));
    assert.deepEqual(
      (await listNamespaces()).filter((namespace) => namespace.startsWith(prefix)),
      [],
    );
    assert.deepEqual(await processesMentioning(prefix), []);
    assert.deepEqual(await processesMentioning(`"name":"${name}"`), [], 'the supervisor is gone');
    assert.equal(existsSync(labDir(name)), false);
    const again = await proxyctl('lab', 'down', '--name', name);
    assert.equal(again.exitCode, 0, again.stderr);
    assert.match(again.stdout, /not running: nothing to remove/);
  });
});

describe('lab bad input', {skip: built ? undefined : 'needs the build: run `npm run build` first'}, () => {
  it('refuses bad flags, naming them, before making anything', async () => {
    const badName = await proxyctl('lab', 'up', '--name', 'Bad_Name');
    assert.equal(badName.exitCode, 1);
    assert.match(badName.stderr, /--name "Bad_Name": a lab name is/);
    const badNodes = await proxyctl('lab', 'up', '--nodes', '0', '--name', name);
    assert.notEqual(badNodes.exitCode, 0);
    assert.match(badNodes.stderr, /--nodes/);
    assert.equal(existsSync(labDir(name)), false);
  });

  it('says clearly when root or iproute2 is missing', {
    skip: unavailable ? `needs root to take it away: ${unavailable}` : undefined,
  }, async () => {
    const node = process.execPath;
    const run = join(repo, 'bin/run.js');
    // Without iproute2 on PATH.
    const noIp = await execa(node, [run, 'lab', 'up', '--name', name], {
      reject: false,
      env: {PATH: '/nonexistent', NO_COLOR: '1'},
      extendEnv: false,
    });
    assert.equal(noIp.exitCode, 1);
    assert.match(String(noIp.stderr), /lab up: the ip command \(iproute2\) is not installed/);
    // As an unprivileged user.
    const notRoot = await execa('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', node, run, 'lab', 'up', '--name', name], {
      reject: false,
      env: {NO_COLOR: '1', HOME: '/tmp'},
    });
    assert.equal(notRoot.exitCode, 1, String(notRoot.stderr));
    assert.match(String(notRoot.stderr), /lab up: network namespaces need root/);
    assert.equal(existsSync(labDir(name)), false);
    assert.deepEqual(
      (await listNamespaces()).filter((namespace) => namespace.startsWith(prefix)),
      [],
    );
  });
});

describe('a lab whose supervisor was killed', {concurrency: false, skip: skipReason}, () => {
  const crashed = `test-${process.pid}-killed`;
  after(async () => {
    await proxyctl('lab', 'down', '--name', crashed);
  });

  it('is reported as not running, and lab down still removes its agents, namespaces and files', async () => {
    const up = await proxyctl('lab', 'up', '--name', crashed, '--nodes', '1', '--pods-per-node', '1');
    assert.equal(up.exitCode, 0, up.stderr);
    const state = JSON.parse(await readFile(join(labDir(crashed), 'state.json'), 'utf8')) as LabState;
    const agentPid = state.agents[0].pid!;
    process.kill(state.supervisorPid, 'SIGKILL');
    while ((await processesMentioning(`"name":"${crashed}"`)).length > 0) await new Promise((resolve) => setTimeout(resolve, 50));

    const status = await proxyctl('lab', 'status', '--name', crashed);
    assert.equal(status.exitCode, 1);
    assert.match(status.stderr, new RegExp(`lab ${crashed} is not running`));
    assert.ok(
      (await processesMentioning(labNamespacePrefix(crashed))).some((line) => line.startsWith(`${agentPid}:`)),
      'the agent outlived its supervisor',
    );

    const down = await proxyctl('lab', 'down', '--name', crashed);
    assert.equal(down.exitCode, 0, down.stderr);
    assert.deepEqual(await processesMentioning(labNamespacePrefix(crashed)), []);
    assert.deepEqual(
      (await listNamespaces()).filter((namespace) => namespace.startsWith(labNamespacePrefix(crashed))),
      [],
    );
    assert.equal(existsSync(labDir(crashed)), false);
  });
});
