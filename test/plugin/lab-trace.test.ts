// kubectl proxyctl in the lab (`lab up`: a namespace cluster with one real agent per node), once per
// proxy mode (iptables, nftables), the same promises in each: trace on each demo service from a
// pod, from a node and from the external client, where the endpoints the trace predicts are the
// ones --probe reaches; REJECT and DROP shown as such; one object of the rules tampered with on one
// node found by diff there only, repaired by sync. Root only; each lab is torn down on failure too.
import assert from 'node:assert/strict';
import {existsSync} from 'node:fs';
import {readFile} from 'node:fs/promises';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {CoreV1Api, KubeConfig} from '@kubernetes/client-node';
import {labDir, type LabState} from '../../src/lab/lab-state.ts';
import {readLabStatus, usageExamples} from '../../src/lab/lab-status.ts';
import {netnsUnavailableReason} from '../../src/lab/netns/index.ts';
import {describeRun, root, runPlugin, type PluginRun} from './agent-cluster.ts';

const labModes = ['iptables', 'nftables'] as const;
type LabMode = (typeof labModes)[number];
const unavailable = await netnsUnavailableReason();
const built = existsSync(join(root, 'dist/src/plugin/commands/lab/up.js'));
const skip = unavailable
  ? `needs root: ${unavailable}`
  : built
    ? undefined
    : 'needs the build: run `npm run build` first (the lab runs bin/kubectl-proxyctl)';

interface TraceJson {
  node: string;
  verdict: string;
  branches: {endpoint: string; probability: number}[];
  warnings: string[];
  drifted: boolean;
  probe?: {answers: {endpoint: string; count: number}[]; failures: {reason: string; count: number}[]; count: number};
}

function branchIPs(trace: TraceJson): string[] {
  return trace.branches.map((branch) => branch.endpoint.replace(/:\d+$/, '')).sort();
}

function answeredIPs(trace: TraceJson): string[] {
  return (trace.probe?.answers ?? []).map((answer) => answer.endpoint).sort();
}

/**
 * tamperOneObject removes the demoapp ClusterIP's entry from node-1's rules, the way a person or
 * another program might, and returns the diff line that must report it: in iptables mode its
 * KUBE-SERVICES rule, in nftables mode its element of the service-ips map.
 */
async function tamperOneObject(mode: LabMode, netns: string): Promise<string> {
  const {execFileSync} = await import('node:child_process');
  const inNode = (...command: string[]) => execFileSync('ip', ['netns', 'exec', netns, ...command], {encoding: 'utf8'});
  if (mode === 'iptables') {
    const rule = inNode('iptables-save', '-t', 'nat')
      .split('\n')
      .find((line) => line.startsWith('-A KUBE-SERVICES') && line.includes('default/demoapp:') && line.includes('cluster IP'));
    assert.ok(rule, 'the demoapp rule on node-1');
    const args = [...rule.replace(/^-A /, '').matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((m) => m[1] ?? m[2]);
    inNode('iptables', '-t', 'nat', '-D', ...args);
    return `--t nat ${rule}`;
  }
  const element = inNode('nft', 'list', 'map', 'ip', 'kube-proxy', 'service-ips')
    .split(/[{,}]/)
    .map((text) => text.trim())
    .find((text) => text.includes(' : goto ') && text.includes('-default/demoapp/tcp/'));
  assert.ok(element, 'the demoapp element of service-ips on node-1');
  const key = element.slice(0, element.indexOf(' : '));
  inNode('nft', 'delete', 'element', 'ip', 'kube-proxy', 'service-ips', `{ ${key} }`);
  return `- element service-ips { ${element} }`;
}

for (const mode of labModes)
  describe(`kubectl proxyctl in the lab, ${mode} mode`, {concurrency: false, skip}, () => {
    const name = `pxapi-${process.pid}-${mode.slice(0, 3)}`;
    let state: LabState;
    let env: Record<string, string>;
    let pods: {name: string; node: string; ip: string; app: string}[];
    const plugin = (...args: string[]): Promise<PluginRun> => runPlugin(args, env);
    const traceJson = async (...args: string[]): Promise<TraceJson> => {
      const run = await plugin('trace', ...args, '-o', 'json');
      assert.equal(run.code, 0, describeRun(run));
      return JSON.parse(run.stdout) as TraceJson;
    };

    before(async () => {
      // The default lab's shape (2 nodes, 3 pods each), which the commands' examples name.
      const up = await runPlugin(['lab', 'up', '--name', name, '--nodes', '2', '--pods-per-node', '3', '--proxy-mode', mode]);
      assert.equal(up.code, 0, describeRun(up));
      state = JSON.parse(await readFile(join(labDir(name), 'state.json'), 'utf8')) as LabState;
      env = {KUBECONFIG: state.kubeconfig};
      const config = new KubeConfig();
      config.loadFromFile(state.kubeconfig);
      const list = await config.makeApiClient(CoreV1Api).listNamespacedPod({namespace: 'default'});
      pods = list.items.map((pod) => ({
        name: pod.metadata!.name!,
        node: pod.spec!.nodeName!,
        ip: pod.status!.podIP!,
        app: pod.metadata!.labels!.app,
      }));
    });
    after(async () => {
      await runPlugin(['lab', 'down', '--name', name]);
    });

    it('status lists every node ready', async () => {
      const run = await plugin('status');
      assert.equal(run.code, 0, describeRun(run));
      assert.match(run.stdout, new RegExp(`^node-0\\s+${mode}\\s+true\\s`, 'm'));
      assert.match(run.stdout, new RegExp(`^node-1\\s+${mode}\\s+true\\s`, 'm'));
    });

    it("the examples of trace, diff, status and sync, and the lab's own hints, run as written", async () => {
      const manifest = JSON.parse(await readFile(join(root, 'oclif.manifest.json'), 'utf8')) as {
        commands: Record<string, {examples?: ({command: string} | string)[]}>;
      };
      let ran = 0;
      for (const id of ['trace', 'diff', 'status', 'sync']) {
        for (const example of manifest.commands[id].examples ?? []) {
          const command = typeof example === 'string' ? example : example.command;
          const argv = command.replace(/^<%= config\.bin %> /, '').split(' ');
          // A saved file, and the agent's address on a real node: not the lab's.
          if (argv.includes('--rules') || argv.includes('--agent-url')) continue;
          const run = await plugin(...argv);
          assert.equal(run.code, 0, `kubectl proxyctl ${argv.join(' ')}\n${describeRun(run)}`);
          ran++;
        }
      }
      // And the trace commands `lab up` and `lab status` suggest.
      for (const line of usageExamples(await readLabStatus(state)).filter((text) => text.startsWith('kubectl proxyctl trace '))) {
        const argv = line
          .replace(/\s+#.*$/, '')
          .split(' ')
          .slice(2);
        const run = await plugin(...argv);
        assert.equal(run.code, 0, `${line}\n${describeRun(run)}`);
        ran++;
      }
      assert.ok(ran >= 12, `${ran} examples ran`);
    });

    it('from a pod, on each demo service: the probe reaches exactly the predicted endpoints', async () => {
      const client = pods.find((pod) => pod.app === 'toolbox') ?? pods[0];
      const demo = pods
        .filter((pod) => pod.app === 'demoapp')
        .map((pod) => pod.ip)
        .sort();
      for (const service of ['demoapp', 'demoapp-nodeport', 'demoapp-udp']) {
        const trace = await traceJson(service, '--from', client.name, '--probe', '30');
        assert.equal(trace.node, client.node, `${service}: traced on the pod's node`);
        assert.equal(trace.verdict, 'DNAT', service);
        assert.deepEqual(branchIPs(trace), demo, `${service}: every demo pod is an endpoint`);
        assert.deepEqual(trace.probe!.failures, [], service);
        assert.deepEqual(answeredIPs(trace), branchIPs(trace), `${service}: the endpoints that answered are the predicted ones`);
      }
    });

    it('a trace from no node in particular on two nodes asks for --node, the flag trace takes', async () => {
      const run = await plugin('trace', 'demoapp', '-n', 'default');
      assert.equal(run.code, 2, describeRun(run));
      assert.match(run.stderr, /agents run on 2 nodes \(node-0, node-1\): give --node NODE or use --all-nodes/, describeRun(run));
    });

    it('the text a person reads: the path once, a row per endpoint, within 30 lines; -o wide adds the sentences', async () => {
      const client = pods.find((pod) => pod.app === 'toolbox') ?? pods[0];
      const json = await traceJson('demoapp', '--from', client.name);
      const run = await plugin('trace', 'demoapp', '-n', 'default', '--from', client.name);
      assert.equal(run.code, 0, describeRun(run));
      const lines = run.stdout.trimEnd().split('\n');
      assert.ok(lines.length <= 30, `${lines.length} lines:\n${run.stdout}`);
      const hops = lines.filter((line) => /^ {2}(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) /.test(line));
      assert.equal(new Set(hops).size, hops.length, `each hop once:\n${run.stdout}`);
      for (const branch of json.branches)
        assert.match(run.stdout, new RegExp(`^ {2}${branch.endpoint.replaceAll('.', '\\.')}\\s+\\d+\\.\\d%\\s+pod-`, 'm'));
      const wide = await plugin('trace', 'demoapp', '--from', client.name, '-o', 'wide');
      assert.equal(wide.code, 0, describeRun(wide));
      const withHops = json as unknown as {hops: {explanation: string}[]; branches: {hops: {explanation: string}[]}[]};
      for (const hop of [...withHops.hops, ...withHops.branches.flatMap((branch) => branch.hops)]) {
        assert.ok(wide.stdout.includes(hop.explanation), `-o wide explains each hop ("${hop.explanation}"):\n${wide.stdout}`);
        assert.ok(!run.stdout.includes(hop.explanation), `not without -o wide ("${hop.explanation}")`);
      }
    });

    it('from a node itself', async () => {
      const trace = await traceJson('demoapp', '--node', 'node-1', '--probe', '30');
      assert.equal(trace.verdict, 'DNAT');
      assert.deepEqual(trace.probe!.failures, []);
      assert.deepEqual(answeredIPs(trace), branchIPs(trace));
    });

    it('from the external client through a NodePort', async () => {
      const external = state.topology!.externalClients[0];
      assert.ok(external, 'the lab has an external client');
      const trace = await traceJson(
        'demoapp-nodeport',
        '--via',
        'node-port',
        '--from',
        external.ip,
        '--node',
        'node-0',
        '--from-netns',
        external.namespace,
        '--probe',
        '30',
      );
      assert.equal(trace.verdict, 'DNAT');
      assert.deepEqual(trace.probe!.failures, []);
      assert.deepEqual(answeredIPs(trace), branchIPs(trace));

      // By name, as `lab status` lists it: its address, its namespace, and the node it routes through.
      const byName = await traceJson(
        'demoapp-nodeport',
        '--via',
        'node-port',
        '--from',
        external.name,
        '--node',
        'node-1',
        '--probe',
        '10',
      );
      assert.equal(byName.node, 'node-1');
      assert.equal((byName as unknown as {packet: {srcIP: string}}).packet.srcIP, external.ip);
      assert.equal((byName.probe as unknown as {from: string}).from, `external client ${external.name}`);
      assert.deepEqual(byName.probe!.failures, []);
      const viaGateway = await traceJson('demoapp', '--from', external.name, '--probe', '30');
      assert.equal(
        viaGateway.node,
        state.topology!.nodes.find((node) => node.ip === external.gateway)!.name,
        'traced on the node the client routes service traffic through',
      );
      assert.deepEqual(answeredIPs(viaGateway), branchIPs(viaGateway));
    });

    it('REJECT for a service without endpoints, DROP for Local policy without a local endpoint', async () => {
      const empty = await traceJson('empty', '--from', pods[0].name, '--probe', '5');
      assert.equal(empty.verdict, 'REJECT');
      assert.deepEqual(empty.probe!.failures, [{reason: 'connection refused', count: 5}]);

      // A NodePort with externalTrafficPolicy Local whose only endpoint is on node-1.
      const config = new KubeConfig();
      config.loadFromFile(state.kubeconfig);
      const only = pods.find((pod) => pod.node === 'node-1')!;
      await config
        .makeApiClient(CoreV1Api)
        .patchNamespacedPod({namespace: 'default', name: only.name, body: [{op: 'add', path: '/metadata/labels/local', value: 'yes'}]});
      await config.makeApiClient(CoreV1Api).createNamespacedService({
        namespace: 'default',
        body: {
          metadata: {name: 'local-only'},
          spec: {type: 'NodePort', externalTrafficPolicy: 'Local', selector: {local: 'yes'}, ports: [{port: 80, targetPort: 8080}]},
        },
      });
      const external = state.topology!.externalClients[0];
      let trace: TraceJson | undefined;
      for (let attempt = 0; attempt < 50 && trace?.verdict !== 'DROP'; attempt++) {
        if (attempt > 0) await new Promise((resolve) => setTimeout(resolve, 200));
        const run = await plugin(
          'trace',
          'local-only',
          '--via',
          'node-port',
          '--from',
          external.ip,
          '--node',
          'node-0',
          '--from-netns',
          external.namespace,
          '--probe',
          '3',
          '-o',
          'json',
        );
        if (run.code === 0) trace = JSON.parse(run.stdout) as TraceJson;
      }
      assert.equal(trace?.verdict, 'DROP', JSON.stringify(trace));
      assert.deepEqual(trace!.probe!.failures, [{reason: 'timed out', count: 3}]);
    });

    it('a tampered object on one node: diff there exits 1 with that change, the other node 0; sync repairs it', async () => {
      const netns = state.topology!.nodes.find((node) => node.name === 'node-1')!.namespace;
      const clean = await plugin('diff', 'node-1');
      assert.equal(clean.code, 0, describeRun(clean));
      const change = await tamperOneObject(mode, netns);

      const drifted = await plugin('diff', 'node-1');
      assert.equal(drifted.code, 1, describeRun(drifted));
      const changeLine = mode === 'iptables' ? /^[-+]-t / : /^[-+] /;
      assert.deepEqual(
        drifted.stdout.split('\n').filter((line) => changeLine.test(line)),
        [change],
        describeRun(drifted),
      );
      const other = await plugin('diff', 'node-0');
      assert.equal(other.code, 0, describeRun(other));
      const traced = await traceJson('demoapp', '--node', 'node-1');
      assert.equal(traced.drifted, true, 'trace warns that the applied rules differ for this service');
      assert.ok(
        traced.warnings.some((warning) => /differ/.test(warning)),
        JSON.stringify(traced.warnings),
      );

      const sync = await plugin('sync', 'node-1');
      assert.equal(sync.code, 0, describeRun(sync));
      const counts = mode === 'nftables' ? '[1-9]\\d* in table kube-proxy' : '[1-9]\\d* nat, [1-9]\\d* filter';
      assert.match(
        sync.stdout,
        new RegExp(`^node-1\\s+${mode}\\s+full\\s+\\S+\\s+${counts}\\s+repaired [1-9]\\d* services?: `, 'm'),
        describeRun(sync),
      );
      const repaired = await plugin('diff', 'node-1');
      assert.equal(repaired.code, 0, describeRun(repaired));
    });

    it('--agent-url reaches an agent straight, without the API server', async () => {
      const agent = state.agents.find((entry) => entry.node === 'node-0')!;
      const url = (agent as unknown as {apiUrl?: string; api?: {url?: string}}).apiUrl;
      const config = new KubeConfig();
      config.loadFromFile(state.kubeconfig);
      const pod = (
        await config
          .makeApiClient(CoreV1Api)
          .listNamespacedPod({namespace: 'kube-system', labelSelector: 'app.kubernetes.io/name=proxyctl-agent'})
      ).items.find((item) => item.spec?.nodeName === 'node-0')!;
      const agentUrl = pod.metadata?.annotations?.['lab.proxyctl.dev/agent-url'] ?? url;
      assert.ok(agentUrl, 'the agent pod names its URL');
      const run = await runPlugin(['status', '--agent-url', agentUrl], {KUBECONFIG: '/nonexistent'});
      assert.equal(run.code, 0, describeRun(run));
      assert.match(run.stdout, new RegExp(`^node-0\\s+${mode}\\s+true`, 'm'));
    });
  });
