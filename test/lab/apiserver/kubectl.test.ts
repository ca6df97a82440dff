// Debian's kubectl 1.20 against the embedded API server: get, describe, apply, label, delete, get -w, errors.
import {after, before, describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {connect, createServer, type Server} from 'node:net';
import {execa} from 'execa';
import {startApiServer, type ApiServer} from '../../../src/lab/apiserver/server.ts';

const repo = fileURLToPath(new URL('../../../', import.meta.url));

let server: ApiServer;
let dir: string;
let kubectlPath: string;

async function kubectl(...args: string[]): Promise<{stdout: string; stderr: string; exitCode: number}> {
  const result = await execa(kubectlPath, ['--kubeconfig', join(dir, 'kubeconfig'), ...args], {
    env: {HOME: dir, NO_COLOR: '1'},
    reject: false,
    timeout: 30000,
  });
  return {stdout: result.stdout as string, stderr: result.stderr as string, exitCode: result.exitCode ?? -1};
}

async function ok(...args: string[]): Promise<string> {
  const r = await kubectl(...args);
  assert.equal(r.exitCode, 0, `kubectl ${args.join(' ')} failed: ${r.stderr}`);
  return r.stdout;
}

/** Rows of kubectl's column output as objects keyed by header. */
function rows(text: string): Array<Record<string, string>> {
  const lines = text.trim().split('\n');
  const header = lines[0];
  const starts = [...header.matchAll(/\S+(?: \S+)*/g)].map((m) => m.index!);
  const names = starts.map((s, i) => header.slice(s, starts[i + 1]).trim());
  return lines.slice(1).map((line) => Object.fromEntries(names.map((n, i) => [n, line.slice(starts[i], starts[i + 1]).trim()])));
}

const manifest = `apiVersion: v1
kind: Service
metadata:
  name: web
  labels: {app: web}
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: http
    nodePort: 30080
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  labels: {app: web}
spec:
  nodeName: node-a
  containers:
  - name: app
    image: registry.example/web:1
    ports:
    - name: http
      containerPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: external-1
  labels:
    kubernetes.io/service-name: external
addressType: IPv4
endpoints:
- addresses: [192.0.2.10]
  conditions: {ready: true}
  nodeName: node-a
  zone: zone-1
ports:
- name: https
  port: 443
  protocol: TCP
`;

describe('Debian kubectl 1.20 against the embedded API server', () => {
  before(async () => {
    const script = await execa(join(repo, 'scripts/debian-kubectl.sh'), [], {reject: true});
    kubectlPath = (script.stdout as string).trim().split('\n').pop()!;
    const version = await execa(kubectlPath, ['version', '--client', '--short'], {reject: false});
    assert.match(version.stdout as string, /v1\.20\./, 'the Debian kubectl is version 1.20');
    dir = await mkdtemp(join(tmpdir(), 'proxyctl-kubectl-'));
    server = await startApiServer({port: 0});
    await server.writeKubeconfig(join(dir, 'kubeconfig'));
    await writeFile(join(dir, 'web.yaml'), manifest);
  });
  after(async () => {
    await server?.stop();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it('applies services, pods and endpointslices, and applies again unchanged', async () => {
    const first = await ok('apply', '-f', join(dir, 'web.yaml'));
    assert.deepEqual(first.trim().split('\n'), [
      'service/web created',
      'pod/web-1 created',
      'endpointslice.discovery.k8s.io/external-1 created',
    ]);
    const second = await ok('apply', '-f', join(dir, 'web.yaml'));
    assert.deepEqual(second.trim().split('\n'), [
      'service/web unchanged',
      'pod/web-1 unchanged',
      'endpointslice.discovery.k8s.io/external-1 unchanged',
    ]);
    const changed = manifest.replace('port: 80\n', 'port: 8000\n').replace('zone: zone-1', 'zone: zone-2');
    await writeFile(join(dir, 'web-changed.yaml'), changed);
    const third = await ok('apply', '-f', join(dir, 'web-changed.yaml'));
    assert.match(third, /service\/web configured/);
    assert.match(third, /endpointslice.discovery.k8s.io\/external-1 configured/);
    const svc = server.store.get('services', 'default', 'web');
    assert.deepEqual(
      svc.spec.ports.map((p: any) => [p.port, p.nodePort]),
      [[8000, 30080]],
    );
    assert.equal(server.store.get('endpointslices', 'default', 'external-1').endpoints[0].zone, 'zone-2');
  });

  it('prints services, pods and endpointslices as tables', async () => {
    server.store.mutate(
      'pods',
      'default',
      'web-1',
      (p) => {
        p.status = {
          phase: 'Running',
          podIP: '10.244.0.7',
          podIPs: [{ip: '10.244.0.7'}],
          conditions: [{type: 'Ready', status: 'True'}],
          containerStatuses: [{name: 'app', ready: true, restartCount: 0, image: 'x', imageID: '', started: true}],
        };
      },
      {subresource: 'status'},
    );
    await server.settle();
    const services = rows(await ok('get', 'services', '-o', 'wide'));
    const web = services.find((r) => r.NAME === 'web');
    assert.ok(web, 'service web is listed');
    assert.equal(web.TYPE, 'NodePort');
    assert.equal(web['CLUSTER-IP'], server.store.get('services', 'default', 'web').spec.clusterIP);
    assert.equal(web['PORT(S)'], '8000:30080/TCP');
    assert.equal(web.SELECTOR, 'app=web');
    assert.ok(services.some((r) => r.NAME === 'kubernetes' && r['PORT(S)'] === '443/TCP'));

    const pods = rows(await ok('get', 'pods', '-o', 'wide'));
    assert.deepEqual(
      {name: pods[0].NAME, ready: pods[0].READY, status: pods[0].STATUS, ip: pods[0].IP, node: pods[0].NODE},
      {name: 'web-1', ready: '1/1', status: 'Running', ip: '10.244.0.7', node: 'node-a'},
    );

    const slices = rows(await ok('get', 'endpointslices', '-l', 'kubernetes.io/service-name=web'));
    assert.equal(slices.length, 1);
    assert.equal(slices[0].ADDRESSTYPE, 'IPv4');
    assert.equal(slices[0].PORTS, '8080');
    assert.equal(slices[0].ENDPOINTS, '10.244.0.7');

    const yaml = await ok('get', 'service', 'web', '-o', 'jsonpath={.spec.clusterIP} {.spec.ports[0].nodePort}');
    assert.match(yaml, /^10\.96\.\d+\.\d+ 30080$/);
  });

  it('describes services, pods and endpointslices', async () => {
    const svc = await ok('describe', 'service', 'web');
    assert.match(svc, /^Name:\s+web$/m);
    assert.match(svc, /^Type:\s+NodePort$/m);
    assert.match(svc, /^NodePort:\s+http\s+30080\/TCP$/m);
    const pod = await ok('describe', 'pod', 'web-1');
    assert.match(pod, /^Node:\s+node-a/m);
    assert.match(pod, /^IP:\s+10\.244\.0\.7$/m);
    const slice = await ok('describe', 'endpointslice', 'external-1');
    assert.match(slice, /^AddressType:\s+IPv4$/m);
    assert.match(slice, /192\.0\.2\.10/);
    assert.match(slice, /topology\.kubernetes\.io\/zone=zone-2/);
  });

  it('labels objects', async () => {
    await ok('label', 'service', 'web', 'tier=frontend');
    await ok('label', 'pod', 'web-1', 'version=v1');
    await ok('label', 'endpointslice', 'external-1', 'owner=lab');
    assert.equal(server.store.get('services', 'default', 'web').metadata.labels?.tier, 'frontend');
    assert.equal(server.store.get('pods', 'default', 'web-1').metadata.labels?.version, 'v1');
    assert.equal(server.store.get('endpointslices', 'default', 'external-1').metadata.labels?.owner, 'lab');
    const selected = rows(await ok('get', 'services', '-l', 'tier in (frontend,backend)'));
    assert.deepEqual(
      selected.map((r) => r.NAME),
      ['web'],
    );
    await ok('label', 'service', 'web', 'tier-');
    assert.equal(server.store.get('services', 'default', 'web').metadata.labels?.tier, undefined);
  });

  it('prints the error message a real cluster prints for an invalid service', async () => {
    await writeFile(
      join(dir, 'bad.yaml'),
      'apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\nspec:\n  type: NodePort\n  ports:\n  - port: 80\n    nodePort: 70000\n',
    );
    const r = await kubectl('apply', '-f', join(dir, 'bad.yaml'));
    assert.notEqual(r.exitCode, 0);
    assert.equal(
      r.stderr.trim(),
      'The Service "bad" is invalid: spec.ports[0].nodePort: Invalid value: 70000: provided port is not in the valid range. The range of valid ports is 30000-32767',
    );
    const missing = await kubectl('get', 'service', 'nope');
    assert.equal(missing.stderr.trim(), 'Error from server (NotFound): services "nope" not found');
  });

  it('receives changes with get -w', async (t) => {
    const watcher = execa(kubectlPath, ['--kubeconfig', join(dir, 'kubeconfig'), 'get', 'services', '-w'], {
      env: {HOME: dir},
      reject: false,
    });
    t.after(() => {
      watcher.kill();
    });
    let output = '';
    watcher.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    const waitFor = async (re: RegExp) => {
      const deadline = Date.now() + 10000;
      while (!re.test(output)) {
        if (Date.now() > deadline) assert.fail(`kubectl get -w did not print ${re}; got:\n${output}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    await waitFor(/^web\s+NodePort/m);
    server.store.create('services', {metadata: {name: 'watched', namespace: 'default'}, spec: {ports: [{port: 8443}]}}, 'default');
    await waitFor(/^watched\s+ClusterIP\s+10\.96\.\d+\.\d+\s+<none>\s+8443\/TCP/m);
    server.store.patch('services', 'default', 'watched', 'application/merge-patch+json', {spec: {type: 'NodePort'}});
    await waitFor(/^watched\s+NodePort\s+\S+\s+<none>\s+8443:3\d{4}\/TCP/m);
  });

  it('port-forwards to a pod over SPDY, and reports a refused pod port', async (t) => {
    const echo: Server = createServer((socket) => socket.pipe(socket));
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
    t.after(() => echo.close());
    const echoPort = (echo.address() as {port: number}).port;
    const forwarding = await startApiServer({
      port: 0,
      resolvePodAddress: (_pod, port) => ({host: '127.0.0.1', port: port === 8080 ? echoPort : 1}),
    });
    t.after(() => forwarding.stop());
    const kubeconfig = join(dir, 'forwarding-kubeconfig');
    await forwarding.writeKubeconfig(kubeconfig);
    forwarding.store.create(
      'pods',
      {
        metadata: {name: 'echo', namespace: 'default'},
        spec: {nodeName: 'node-a', containers: [{name: 'app', image: 'echo:1'}]},
        status: {phase: 'Running', podIP: '10.244.0.9'},
      },
      'default',
      {keepStatus: true},
    );
    const child = execa(kubectlPath, ['--kubeconfig', kubeconfig, 'port-forward', 'pod/echo', ':8080', ':9999'], {
      env: {HOME: dir},
      reject: false,
    });
    t.after(() => {
      child.kill();
    });
    let out = '';
    let err = '';
    child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
    const deadline = Date.now() + 10000;
    let ports: number[] = [];
    while (ports.length < 2) {
      ports = [...out.matchAll(/Forwarding from 127\.0\.0\.1:(\d+) -> (?:8080|9999)/g)].map((m) => Number(m[1]));
      if (Date.now() > deadline) assert.fail(`kubectl port-forward did not start: ${out} ${err}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const exchange = (port: number, payload: Buffer) =>
      new Promise<Buffer>((resolve, reject) => {
        const chunks: Buffer[] = [];
        const socket = connect(port, '127.0.0.1', () => socket.write(payload));
        socket.on('data', (c) => {
          chunks.push(c);
          if (Buffer.concat(chunks).length >= payload.length) socket.end();
        });
        socket.on('close', () => resolve(Buffer.concat(chunks)));
        socket.on('error', reject);
      });
    assert.equal((await exchange(ports[0], Buffer.from('hello over spdy\n'))).toString(), 'hello over spdy\n');
    const big = Buffer.alloc(1024 * 1024, 7);
    assert.equal(Buffer.compare(await exchange(ports[0], big), big), 0, 'a megabyte comes back intact');

    // Port 9999 of the pod refuses connections: kubectl reports the error the server sent on the error stream.
    await exchange(ports[1], Buffer.from('x')).catch(() => Buffer.alloc(0));
    const errDeadline = Date.now() + 5000;
    while (!/an error occurred forwarding \d+ -> 9999: error forwarding port 9999 to pod/.test(err)) {
      if (Date.now() > errDeadline) assert.fail(`kubectl did not report the refused port: ${err}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  });

  it('deletes with kubectl delete -f and waits until the objects are gone', async () => {
    const out = await ok('delete', '-f', join(dir, 'web.yaml'), '--grace-period=0', '--force');
    assert.match(out, /service "web" force deleted/);
    assert.match(out, /pod "web-1" force deleted/);
    assert.match(out, /endpointslice.discovery.k8s.io "external-1" force deleted/);
    assert.equal(server.store.tryGet('services', 'default', 'web'), undefined);
    assert.equal(server.store.tryGet('pods', 'default', 'web-1'), undefined);
    await ok('delete', 'service', 'watched');
    assert.equal(server.store.tryGet('services', 'default', 'watched'), undefined);
  });

  // No kubelet runs here: pods stay unready (test/lab/lab-workloads.test.ts runs them in a lab).
  it('creates, scales and exposes a deployment, and shows its ReplicaSet, pods, events and history', async () => {
    server.store.create(
      'nodes',
      {metadata: {name: 'node-k'}, spec: {}, status: {conditions: [{type: 'Ready', status: 'True'}]}},
      undefined,
      {keepStatus: true},
    );
    assert.equal(
      (await ok('create', 'deployment', 'kd', '--image=nginx:1.25', '--replicas=2', '--port=8080')).trim(),
      'deployment.apps/kd created',
    );
    assert.equal((await ok('scale', 'deployment', 'kd', '--replicas=3')).trim(), 'deployment.apps/kd scaled');
    await server.settle();
    const [rs] = rows(await ok('get', 'replicasets', '-l', 'app=kd'));
    assert.match(rs.NAME, /^kd-\w+$/);
    assert.deepEqual([rs.DESIRED, rs.CURRENT, rs.READY], ['3', '3', '0']);
    const [deployment] = rows(await ok('get', 'deployment', 'kd'));
    assert.deepEqual([deployment.READY, deployment['UP-TO-DATE'], deployment.AVAILABLE], ['0/3', '3', '0']);
    const pods = rows(await ok('get', 'pods', '-l', 'app=kd', '-o', 'wide'));
    assert.equal(pods.length, 3);
    for (const pod of pods) assert.deepEqual([pod.STATUS, pod.NODE], ['Pending', 'node-k']);
    assert.equal((await ok('expose', 'deployment', 'kd', '--port=80', '--target-port=8080')).trim(), 'service/kd exposed');
    assert.match(await ok('get', 'service', 'kd', '-o', 'wide'), /kd +ClusterIP +[\d.]+ +<none> +80\/TCP +\S+ +app=kd/);
    const events = await ok('get', 'events');
    assert.match(events, new RegExp(`ScalingReplicaSet +deployment/kd +Scaled up replica set ${rs.NAME} from 0 to 2`));
    assert.match(events, new RegExp(`SuccessfulCreate +replicaset/${rs.NAME} +Created pod: ${rs.NAME}-\\w+`));
    assert.match(events, /Scheduled +pod\/kd-\w+-\w+ +Successfully assigned default\/kd-\w+-\w+ to node-k/);
    assert.match(await ok('rollout', 'history', 'deployment/kd'), /REVISION +CHANGE-CAUSE\n1 +<none>/);
    const logs = await kubectl('logs', 'deployment/kd');
    assert.match(logs.stderr, /is waiting to start: ContainerCreating/);
    assert.match(await ok('delete', 'deployment', 'kd'), /deployment.apps "kd" deleted/);
    await server.settle();
    assert.deepEqual(rows(await ok('get', 'replicasets', '-l', 'app=kd')), []);
  });

  it("merges with another server's kubeconfig: each context reaches its own server", async () => {
    const other = await startApiServer({port: 0, clusterName: 'proxyctl-lab-other'});
    try {
      await other.writeKubeconfig(join(dir, 'other-kubeconfig'));
      other.store.create('configmaps', {metadata: {name: 'only-in-other', namespace: 'default'}, data: {}}, 'default');
      const merged = async (...args: string[]) => {
        const result = await execa(kubectlPath, args, {
          env: {HOME: dir, KUBECONFIG: `${join(dir, 'kubeconfig')}:${join(dir, 'other-kubeconfig')}`},
          extendEnv: false,
          reject: false,
          timeout: 30000,
        });
        assert.equal(result.exitCode, 0, `kubectl ${args.join(' ')}: ${String(result.stderr)}`);
        return String(result.stdout);
      };
      assert.deepEqual((await merged('config', 'get-contexts', '-o', 'name')).trim().split('\n').sort(), [
        'admin@proxyctl-lab',
        'admin@proxyctl-lab-other',
      ]);
      assert.match(await merged('--context', 'admin@proxyctl-lab-other', 'get', 'configmaps', '-o', 'name'), /configmap\/only-in-other/);
      assert.doesNotMatch(await merged('--context', 'admin@proxyctl-lab', 'get', 'configmaps', '-o', 'name'), /only-in-other/);
    } finally {
      await other.stop();
    }
  });
});
