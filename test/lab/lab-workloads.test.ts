// Workloads in a real lab, with today's kubectl (1.34) and with Debian's kubectl 1.20: pods scheduled and run by the nodes' kubelets
// (address, demo server, logs, events), Deployments scaled, rolled out, restarted and undone while
// the agents keep a ClusterIP answering with zero failed requests, graceful deletion as the
// EndpointSlice and the namespaces show it, and garbage collection. Root only.
import assert from 'node:assert/strict';
import {existsSync} from 'node:fs';
import {join} from 'node:path';
import {after, before, describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';
import {execa} from 'execa';
import {downLab, resolveExecTarget, upLab} from '../../src/lab/lab-control.ts';
import {labDir, type LabState, readLabState} from '../../src/lab/lab-state.ts';
import {listNamespaces, netnsUnavailableReason} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {currentKubectl} from '../../scripts/current-kubectl.ts';

const repo = fileURLToPath(new URL('../..', import.meta.url));
const demoClient = join(repo, 'src/lab/workload/demoapp-client.ts');

/** The kubectl clients the suite runs with, each against a lab of its own. */
const clients = [
  {version: '1.34', labName: `wl34-${process.pid}`, path: async () => currentKubectl()},
  {
    version: '1.20',
    labName: `wl20-${process.pid}`,
    path: async () =>
      String((await execa(join(repo, 'scripts/debian-kubectl.sh'), [], {reject: true})).stdout)
        .trim()
        .split('\n')
        .pop()!,
  },
];

/** Why this suite cannot run here, if it cannot: it needs root (namespaces) and the build (the agents run from dist/). */
async function skipReasonHere(): Promise<string | undefined> {
  const unavailable = await netnsUnavailableReason();
  if (unavailable) return `needs root: ${unavailable}`;
  if (!existsSync(join(repo, 'dist/src/agent/main.js')))
    return 'needs the build: run `npm run build` first (the lab runs the agents from dist/)';
  return undefined;
}
const skipReason = await skipReasonHere();

for (const client of clients) describeWorkloads(client);

function describeWorkloads({version, labName: name, path}: (typeof clients)[number]): void {
  describe(`lab workloads with kubectl ${version}`, {concurrency: false, skip: skipReason}, () => {
    let state: LabState;
    let kubectlPath: string;

    const kubectl = async (...args: string[]) => {
      const result = await execa(kubectlPath, ['--kubeconfig', state.kubeconfig, ...args], {
        reject: false,
        env: {HOME: labDir(name), NO_COLOR: '1'},
        timeout: 90_000,
      });
      return {stdout: String(result.stdout), stderr: String(result.stderr), exitCode: result.exitCode ?? -1};
    };
    const ok = async (...args: string[]) => {
      const result = await kubectl(...args);
      assert.equal(result.exitCode, 0, `kubectl ${args.join(' ')}: ${result.stderr}`);
      return result.stdout;
    };
    const json = async (...args: string[]) => JSON.parse(await ok(...args, '-o', 'json'));
    const netnsOf = async (pod: string): Promise<string> => (await json('get', 'pod', pod)).metadata.annotations['lab.proxyctl.dev/netns'];

    /** probe runs the demo client inside a pod's namespace: count requests, one after the other. */
    const probe = async (fromPod: string, host: string, port: number, count: number): Promise<ProbeResult[]> => {
      const command = [process.execPath, demoClient, '--protocol', 'tcp', '--host', host, '--port', String(port), '--count', String(count)];
      const result = await execa('ip', ['netns', 'exec', await netnsOf(fromPod), ...command, '--timeout-ms', '2000'], {timeout: 300_000});
      return JSON.parse(String(result.stdout)) as ProbeResult[];
    };
    const repliers = (results: ProbeResult[]) =>
      results.map((result) => {
        assert.equal(result.outcome, 'reply', JSON.stringify(result));
        return (result as Extract<ProbeResult, {outcome: 'reply'}>).reply.pod;
      });

    /** answering waits (up to 20 s) until a request through the ClusterIP gets a reply, and returns who replied. */
    const answering = async (fromPod: string, clusterIP: string): Promise<string> => {
      let last: ProbeResult | undefined;
      for (let attempt = 0; attempt < 40; attempt++) {
        [last] = await probe(fromPod, clusterIP, 80, 1);
        if (last.outcome === 'reply') return last.reply.pod;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      assert.fail(`${clusterIP}:80 does not answer: ${JSON.stringify(last)}`);
    };

    before(async () => {
      state = await upLab({name, nodes: 2, podsPerNode: 2});
      kubectlPath = await path();
    });
    after(async () => {
      await downLab(name);
      assert.deepEqual(
        (await listNamespaces()).filter((ns) => ns.startsWith(state?.prefix ?? `pxl-${name}.`)),
        [],
        'lab down leaves no namespace',
      );
    });

    it('kubectl run: the scheduler binds the pod, its kubelet runs the demo server on its port, logs and events say so', async () => {
      assert.equal((await ok('run', 'solo', '--image=nginx:1.25', '--port=80')).trim(), 'pod/solo created');
      await ok('wait', '--for=condition=Ready', 'pod/solo', '--timeout=30s');
      const pod = await json('get', 'pod', 'solo');
      const node = state.topology!.nodes.find((n) => n.name === pod.spec.nodeName)!;
      assert.ok(node, `bound to a lab node: ${pod.spec.nodeName}`);
      assert.ok(pod.status.podIP.startsWith(node.podCIDR.split('.').slice(0, 3).join('.')), `${pod.status.podIP} in ${node.podCIDR}`);
      assert.match(pod.metadata.annotations['lab.proxyctl.dev/netns'], new RegExp(`^${state.prefix.replace('.', '\\.')}p-`));
      assert.equal(pod.status.phase, 'Running');
      // `lab exec solo -- ...` enters the same namespace: the supervisor records it in state.json.
      let recorded: LabState | undefined;
      for (let i = 0; i < 20 && !recorded?.podNamespaces?.solo; i++) {
        recorded = await readLabState(name);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.equal(resolveExecTarget(recorded!, 'solo').namespace, pod.metadata.annotations['lab.proxyctl.dev/netns']);
      assert.deepEqual(repliers(await probe('pod-1-1', pod.status.podIP, 80, 2)), ['solo', 'solo']);
      const logs = await ok('logs', 'solo');
      assert.match(logs, /GET \/ port 80 from 10\.244\.1\.11 200/);
      // kubectl logs -f: a request made while following shows up.
      const follow = execa(kubectlPath, ['--kubeconfig', state.kubeconfig, 'logs', '-f', 'solo'], {
        reject: false,
        env: {HOME: labDir(name)},
      });
      let followed = '';
      follow.stdout?.on('data', (chunk: Buffer) => (followed += chunk.toString()));
      await new Promise((resolve) => setTimeout(resolve, 1000));
      await probe('pod-0-0', pod.status.podIP, 80, 1);
      for (let i = 0; i < 50 && !followed.includes('from 10.244.0.10'); i++) await new Promise((resolve) => setTimeout(resolve, 100));
      follow.kill();
      await follow;
      assert.match(followed, /GET \/ port 80 from 10\.244\.0\.10 200/);
      const events = await ok('get', 'events', '--field-selector', 'involvedObject.name=solo');
      assert.match(events, /Scheduled +pod\/solo +Successfully assigned default\/solo to node-\d/);
      assert.match(events, /Started +pod\/solo +Started container solo/);
    });

    it("a Service whose only endpoint terminates still answers from it while it drains (kube-proxy's terminating fallback)", async () => {
      await ok('expose', 'pod', 'solo', '--port=80', '--name=solo');
      const clusterIP = (await json('get', 'service', 'solo')).spec.clusterIP;
      assert.equal(await answering('pod-1-1', clusterIP), 'solo', 'the agents proxy the new service');
      await ok('delete', 'pod', 'solo', '--wait=false');
      let conditions: unknown;
      for (let i = 0; i < 50; i++) {
        const slices = (await json('get', 'endpointslices.v1beta1.discovery.k8s.io', '-l', 'kubernetes.io/service-name=solo')).items;
        conditions = slices.flatMap((slice: any) => slice.endpoints ?? [])[0]?.conditions;
        if ((conditions as any)?.terminating) break;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      assert.deepEqual(conditions, {ready: false, serving: true, terminating: true});
      // No ready endpoint is left: the rules send to the serving, terminating one.
      await new Promise((resolve) => setTimeout(resolve, 500));
      assert.deepEqual(repliers(await probe('pod-1-1', clusterIP, 80, 3)), ['solo', 'solo', 'solo']);
      await ok('wait', '--for=delete', 'pod/solo', '--timeout=30s');
      await ok('delete', 'service', 'solo');
    });

    it('the demo server listens on every declared TCP and UDP port, and on 8080 when none is declared', async () => {
      const ports =
        '{"spec":{"containers":[{"name":"dns","image":"coredns","ports":[{"containerPort":53,"protocol":"UDP"},{"containerPort":9153}]}]}}';
      await ok('run', 'ports', '--image=coredns', `--overrides=${ports}`);
      await ok('run', 'bare', '--image=busybox');
      await ok('wait', '--for=condition=Ready', 'pod/ports', 'pod/bare', '--timeout=30s');
      const ipOf = async (pod: string) => (await json('get', 'pod', pod)).status.podIP as string;
      const udp = await execa('ip', [
        'netns',
        'exec',
        await netnsOf('pod-1-1'),
        process.execPath,
        demoClient,
        '--protocol',
        'udp',
        '--host',
        await ipOf('ports'),
        '--port',
        '53',
      ]);
      assert.deepEqual(repliers(JSON.parse(String(udp.stdout))), ['ports']);
      assert.deepEqual(repliers(await probe('pod-1-1', await ipOf('ports'), 9153, 1)), ['ports']);
      assert.deepEqual(repliers(await probe('pod-1-1', await ipOf('bare'), 8080, 1)), ['bare']);
      await ok('delete', 'pod', 'ports', 'bare', '--grace-period=1');
    });

    it('a pod asking for what the lab cannot run is accepted and runs; an event names what is ignored', async () => {
      const spec = {
        spec: {
          volumes: [{name: 'data', emptyDir: {}}],
          initContainers: [{name: 'setup', image: 'busybox'}],
          containers: [
            {
              name: 'app',
              image: 'nginx',
              ports: [{containerPort: 80, hostPort: 8081}],
              resources: {limits: {cpu: '100m', memory: '64Mi'}},
              volumeMounts: [{name: 'data', mountPath: '/data'}],
            },
          ],
        },
      };
      await ok('run', 'heavy', '--image=nginx', `--overrides=${JSON.stringify(spec)}`);
      await ok('wait', '--for=condition=Ready', 'pod/heavy', '--timeout=30s');
      const events = await ok('get', 'events', '--field-selector', 'involvedObject.name=heavy,reason=IgnoredByLab', '-o', 'json');
      const [ignored] = JSON.parse(events).items;
      assert.equal(
        ignored?.message,
        'The lab runs its demo server for every image and ignores: volumes (data); init containers (setup); container app: volumeMounts, resources, hostPort 8081',
      );
      assert.deepEqual(repliers(await probe('pod-1-1', (await json('get', 'pod', 'heavy')).status.podIP, 80, 1)), ['heavy']);
      await ok('delete', 'pod', 'heavy', '--grace-period=1');
    });

    it('a pod no node fits stays Pending with a FailedScheduling event', async () => {
      await ok('run', 'nowhere', '--image=nginx', '--overrides={"spec":{"nodeSelector":{"disk":"ssd"}}}');
      let events = '';
      for (let i = 0; i < 50 && !events.includes('FailedScheduling'); i++) {
        events = await ok('get', 'events', '--field-selector', 'involvedObject.name=nowhere');
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.match(
        events,
        /Warning +FailedScheduling +pod\/nowhere +0\/2 nodes are available: 2 node\(s\) didn't match Pod's node affinity\/selector\./,
      );
      assert.equal((await json('get', 'pod', 'nowhere')).status.phase, 'Pending');
      await ok('delete', 'pod', 'nowhere');
    });

    it('a Deployment is created, exposed, scaled and reached through its ClusterIP on every endpoint', async () => {
      await ok('create', 'deployment', 'web', '--image=nginx:1.25', '--replicas=3', '--port=8080');
      await ok('expose', 'deployment', 'web', '--port=80', '--target-port=8080');
      assert.match(await ok('rollout', 'status', 'deployment/web', '--timeout=60s'), /deployment "web" successfully rolled out/);
      await ok('scale', 'deployment', 'web', '--replicas=5');
      await ok('rollout', 'status', 'deployment/web', '--timeout=60s');
      const pods = (await json('get', 'pods', '-l', 'app=web')).items.map((p: any) => p.metadata.name).sort();
      assert.equal(pods.length, 5);
      const clusterIP = (await json('get', 'service', 'web')).spec.clusterIP;
      // The agents take a moment (their minimum sync period) to program a new service and its endpoints.
      await answering('pod-0-1', clusterIP);
      let seen = new Set<string>();
      for (let attempt = 0; attempt < 10 && seen.size < 5; attempt++) {
        for (const pod of repliers(await probe('pod-0-1', clusterIP, 80, 40))) seen.add(pod);
      }
      assert.deepEqual([...seen].sort(), pods, 'every replica answers through the ClusterIP');
    });

    it('rollout restart under a stream of requests through the ClusterIP fails none of them; undo and history follow', async () => {
      const clusterIP = (await json('get', 'service', 'web')).spec.clusterIP;
      const before = new Set((await json('get', 'pods', '-l', 'app=web')).items.map((p: any) => p.metadata.name));
      const stream = probe('pod-0-1', clusterIP, 80, 3000);
      await new Promise((resolve) => setTimeout(resolve, 500));
      await ok('rollout', 'restart', 'deployment/web');
      await ok('rollout', 'status', 'deployment/web', '--timeout=90s');
      const results = await stream;
      const failed = results.filter((result) => result.outcome !== 'reply');
      assert.deepEqual(failed, [], `${failed.length} of ${results.length} requests failed`);
      const answered = new Set(repliers(results));
      const after = new Set((await json('get', 'pods', '-l', 'app=web')).items.map((p: any) => p.metadata.name));
      assert.ok(
        [...answered].some((pod) => before.has(pod)),
        'old pods answered during the rollout',
      );
      assert.ok(
        [...answered].some((pod) => after.has(pod) && !before.has(pod)),
        'new pods answered during the rollout',
      );

      const history = await ok('rollout', 'history', 'deployment/web');
      assert.match(history, /REVISION +CHANGE-CAUSE\n1 +<none>\n2 +<none>/);
      assert.match(await ok('rollout', 'undo', 'deployment/web'), /deployment.apps\/web rolled back/);
      await ok('rollout', 'status', 'deployment/web', '--timeout=90s');
      assert.match(await ok('rollout', 'history', 'deployment/web'), /\n2 +<none>\n3 +<none>/);
      const deployment = await json('get', 'deployment', 'web');
      assert.equal(deployment.metadata.annotations['deployment.kubernetes.io/revision'], '3');
      assert.equal(deployment.spec.template.metadata.annotations?.['kubectl.kubernetes.io/restartedAt'], undefined, 'back to revision 1');
    });

    it('kubectl delete pod: Terminating with a serving, terminating, not ready endpoint, then gone with its namespace', async () => {
      // One that is not terminating already (the rollout's old pods may still drain).
      const pod = (await json('get', 'pods', '-l', 'app=web')).items.find((p: any) => !p.metadata.deletionTimestamp);
      const podName = pod.metadata.name;
      const netns = pod.metadata.annotations['lab.proxyctl.dev/netns'];
      await ok('delete', 'pod', podName, '--wait=false');
      const terminating = await json('get', 'pod', podName);
      assert.ok(terminating.metadata.deletionTimestamp, 'deletionTimestamp is set');
      assert.match(await ok('get', 'pod', podName), /Terminating/);
      const slices = (await json('get', 'endpointslices.v1beta1.discovery.k8s.io', '-l', 'kubernetes.io/service-name=web')).items;
      const endpoint = slices.flatMap((slice: any) => slice.endpoints ?? []).find((e: any) => e.targetRef?.name === podName);
      assert.deepEqual(endpoint?.conditions, {ready: false, serving: true, terminating: true});
      await ok('wait', '--for=delete', `pod/${podName}`, '--timeout=30s');
      for (let i = 0; i < 50 && (await listNamespaces()).includes(netns); i++) await new Promise((resolve) => setTimeout(resolve, 100));
      assert.ok(!(await listNamespaces()).includes(netns), `${netns} is removed with the pod`);
      await ok('rollout', 'status', 'deployment/web', '--timeout=60s');
    });

    it('kubectl delete deployment removes its ReplicaSets and pods', async () => {
      await ok('delete', 'deployment', 'web');
      let left: any[] = [1];
      for (let i = 0; i < 100 && left.length > 0; i++) {
        left = [...(await json('get', 'replicasets', '-l', 'app=web')).items, ...(await json('get', 'pods', '-l', 'app=web')).items];
        if (left.length > 0) await new Promise((resolve) => setTimeout(resolve, 200));
      }
      assert.deepEqual(
        left.map((o) => o.metadata.name),
        [],
      );
    });
  });
}
