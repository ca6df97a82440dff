// Today's kubectl (1.34, from the devDependency) and Debian's kubectl 1.20 against the lab API server:
// the everyday commands a user runs, each checked on the stored objects and on kubectl's own output.
import {after, before, describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {chmod, mkdtemp, rm, writeFile} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {connect, createServer, type Server} from 'node:net';
import {execa} from 'execa';
import {startApiServer, type ApiServer} from '../../../src/lab/apiserver/server.ts';
import {currentKubectl} from '../../../scripts/current-kubectl.ts';

const repo = fileURLToPath(new URL('../../../', import.meta.url));

interface Client {
  name: string;
  path: () => Promise<string>;
  version: RegExp;
  /** kubectl 1.34 leaves validation to the server (fieldValidation=Strict); 1.20 validates against OpenAPI v2 itself. */
  unknownField: RegExp;
}

const clients: Client[] = [
  {
    name: 'kubectl 1.34',
    path: async () => currentKubectl(),
    version: /v1\.34\./,
    unknownField: /Service in version "v1" cannot be handled as a Service: strict decoding error: unknown field "spec\.bogus"/,
  },
  {
    name: "Debian's kubectl 1.20",
    path: async () =>
      String((await execa(join(repo, 'scripts/debian-kubectl.sh'))).stdout)
        .trim()
        .split('\n')
        .pop()!,
    version: /v1\.20\./,
    unknownField: /ValidationError\(Service\.spec\): unknown field "bogus" in io\.k8s\.api\.core\.v1\.ServiceSpec/,
  },
];

const service = (name: string, targetPort: number) => `apiVersion: v1
kind: Service
metadata:
  name: ${name}
  labels: {app: ${name}}
spec:
  type: NodePort
  selector: {app: ${name}}
  ports:
  - name: http
    port: 80
    targetPort: ${targetPort}
`;

async function waitFor(read: () => string, re: RegExp, what: string): Promise<void> {
  const deadline = Date.now() + 10000;
  while (!re.test(read())) {
    if (Date.now() > deadline) assert.fail(`${what} did not print ${re}; got:\n${read()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

for (const client of clients) {
  describe(`${client.name} against the lab API server`, () => {
    let server: ApiServer;
    let dir: string;
    let kubectlPath: string;
    const kubeconfig = () => join(dir, 'kubeconfig');

    const kubectl = async (args: string[], env: Record<string, string> = {}) => {
      const r = await execa(kubectlPath, ['--kubeconfig', kubeconfig(), ...args], {
        env: {HOME: dir, NO_COLOR: '1', ...env},
        extendEnv: false,
        reject: false,
        timeout: 30000,
      });
      return {stdout: String(r.stdout), stderr: String(r.stderr), exitCode: r.exitCode ?? -1};
    };
    const ok = async (...args: string[]) => {
      const r = await kubectl(args);
      assert.equal(r.exitCode, 0, `kubectl ${args.join(' ')} failed: ${r.stderr}`);
      return r.stdout;
    };
    /** A pod bound to a node and Running, as a kubelet would report it. */
    const runningPod = (name: string, spec: Record<string, unknown> = {}) =>
      server.store.create(
        'pods',
        {
          metadata: {name, namespace: 'default'},
          spec: {nodeName: 'node-a', containers: [{name: 'app', image: 'demo'}], ...spec},
          status: {phase: 'Running', podIP: '10.244.0.9'},
        },
        'default',
        {keepStatus: true},
      );
    const file = async (name: string, text: string) => {
      await writeFile(join(dir, name), text);
      return join(dir, name);
    };

    let echo: Server;
    before(async () => {
      echo = createServer((socket) => socket.pipe(socket));
      await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
      kubectlPath = await client.path();
      const version = await execa(kubectlPath, ['version', '--client'], {reject: false});
      assert.match(String(version.stdout), client.version);
      dir = await mkdtemp(join(tmpdir(), 'proxyctl-kubectl-clients-'));
      server = await startApiServer({
        port: 0,
        // Every pod port forwards to the echo server.
        resolvePodAddress: () => ({host: '127.0.0.1', port: (echo.address() as {port: number}).port}),
        users: [{name: 'viewer', token: 'viewer-token'}],
        grants: [{user: 'viewer', verbs: ['get', 'list'], resources: ['services']}],
      });
      await server.writeKubeconfig(kubeconfig());
    });
    after(async () => {
      await server?.stop();
      echo?.close();
      if (dir) await rm(dir, {recursive: true, force: true});
    });

    it('reports a server version it supports, without a version-skew warning', async () => {
      const r = await kubectl(['version']);
      assert.equal(r.exitCode, 0, r.stderr);
      assert.match(r.stdout, /Server Version: (version.Info\{.*GitVersion:")?v1\.34\.0/);
      assert.doesNotMatch(r.stderr, /version difference|exceeds the supported minor version skew/);
    });

    it('creates a ClusterIP service with `kubectl create service`', async () => {
      assert.equal((await ok('create', 'service', 'clusterip', 'made', '--tcp=80:8080')).trim(), 'service/made created');
      const svc = server.store.get('services', 'default', 'made');
      assert.deepEqual(
        svc.spec.ports.map((p: any) => [p.name, p.port, p.targetPort, p.protocol]),
        [['80-8080', 80, 8080, 'TCP']],
      );
      assert.deepEqual(svc.spec.selector, {app: 'made'});
      assert.match(svc.spec.clusterIP, /^10\.9[6-9]\.|^10\.1[01]\d\./);
      assert.equal((await ok('create', 'configmap', 'settings', '--from-literal=mode=fast')).trim(), 'configmap/settings created');
      assert.deepEqual(server.store.get('configmaps', 'default', 'settings').data, {mode: 'fast'});
    });

    it('runs a pod with `kubectl run` and exposes it with `kubectl expose`', async () => {
      assert.match(await ok('run', 'runner', '--image=nginx', '--port=8080', '--labels=app=runner'), /pod\/runner created/);
      const pod = server.store.get('pods', 'default', 'runner');
      assert.deepEqual(
        pod.spec.containers.map((c: any) => [c.name, c.image, c.ports?.[0]?.containerPort]),
        [['runner', 'nginx', 8080]],
      );
      assert.match(await ok('expose', 'pod', 'runner', '--port=80', '--target-port=8080'), /service\/runner exposed/);
      const svc = server.store.get('services', 'default', 'runner');
      assert.deepEqual(svc.spec.selector, {app: 'runner'});
      assert.deepEqual(
        svc.spec.ports.map((p: any) => [p.port, p.targetPort]),
        [[80, 8080]],
      );
    });

    it('creates a Deployment with `kubectl create deployment` when apps/v1 is served', async (t) => {
      const served = await kubectl(['api-resources', '--api-group=apps', '-o', 'name']);
      if (!/deployments/.test(served.stdout)) {
        t.skip('this lab API server does not serve apps/v1 Deployments');
        return;
      }
      assert.equal((await ok('create', 'deployment', 'web', '--image=nginx', '--replicas=2')).trim(), 'deployment.apps/web created');
      const deployment = server.store.get('apps/deployments', 'default', 'web');
      assert.equal(deployment.spec.replicas, 2);
      assert.equal(deployment.spec.template.spec.containers[0].image, 'nginx');
    });

    it('answers `kubectl auth can-i` from the lab access control, for the admin and for a restricted user', async () => {
      assert.equal((await ok('auth', 'can-i', 'create', 'pods')).trim(), 'yes');
      await server.writeKubeconfig(join(dir, 'viewer'), {user: 'viewer', token: 'viewer-token'});
      const asViewer = (...args: string[]) =>
        execa(kubectlPath, ['--kubeconfig', join(dir, 'viewer'), ...args], {env: {HOME: dir}, extendEnv: false, reject: false});
      assert.equal(String((await asViewer('auth', 'can-i', 'list', 'services')).stdout).trim(), 'yes');
      const denied = await asViewer('auth', 'can-i', 'delete', 'services');
      assert.equal(String(denied.stdout).trim(), 'no');
      assert.equal(denied.exitCode, 1);
      const list = String((await asViewer('auth', 'can-i', '--list')).stdout);
      // The grant names no API group, so it holds in every group: services.*
      assert.match(list, /^services\.\*\s+\[\]\s+\[\]\s+\[get list\]$/m);
      assert.match(list, /^selfsubjectaccessreviews\.authorization\.k8s\.io\s+\[\]\s+\[\]\s+\[create\]$/m);
    });

    it('applies client-side: creates, leaves unchanged, configures', async () => {
      const path = await file('csa.yaml', service('csa', 8080));
      assert.equal((await ok('apply', '-f', path)).trim(), 'service/csa created');
      assert.equal((await ok('apply', '-f', path)).trim(), 'service/csa unchanged');
      const nodePort = server.store.get('services', 'default', 'csa').spec.ports[0].nodePort;
      assert.equal((await ok('apply', '-f', await file('csa.yaml', service('csa', 9090)))).trim(), 'service/csa configured');
      const port = server.store.get('services', 'default', 'csa').spec.ports[0];
      assert.deepEqual([port.targetPort, port.nodePort], [9090, nodePort], 'the port merged: its NodePort stays');
    });

    it('applies server-side: creates, updates, reports conflicts as kube-apiserver, takes fields over with --force-conflicts', async () => {
      const path = await file('ssa.yaml', service('ssa', 8080));
      assert.equal((await ok('apply', '--server-side', '-f', path)).trim(), 'service/ssa serverside-applied');
      const created = server.store.get('services', 'default', 'ssa');
      const mine = created.metadata.managedFields!.find((e: any) => e.manager === 'kubectl')!;
      assert.equal(mine.operation, 'Apply');
      assert.deepEqual(Object.keys(mine.fieldsV1['f:spec']['f:ports']), ['k:{"port":80,"protocol":"TCP"}']);
      await ok('apply', '--server-side', '-f', await file('ssa.yaml', service('ssa', 8081)));
      assert.equal(server.store.get('services', 'default', 'ssa').spec.ports[0].targetPort, 8081);

      const other = await file('ssa-other.yaml', service('ssa', 9999));
      const refused = await kubectl(['apply', '--server-side', '--field-manager=other', '-f', other]);
      assert.notEqual(refused.exitCode, 0);
      assert.match(
        refused.stderr,
        /Apply failed with 1 conflict: conflict with "kubectl": \.spec\.ports\[port=80,protocol="TCP"\]\.targetPort/,
      );
      assert.equal(server.store.get('services', 'default', 'ssa').spec.ports[0].targetPort, 8081, 'a refused apply changes nothing');

      await ok('apply', '--server-side', '--field-manager=other', '--force-conflicts', '-f', other);
      const taken = server.store.get('services', 'default', 'ssa');
      assert.equal(taken.spec.ports[0].targetPort, 9999);
      const kubectlFields = JSON.stringify(taken.metadata.managedFields!.find((e: any) => e.manager === 'kubectl')!.fieldsV1);
      assert.doesNotMatch(kubectlFields, /targetPort/, 'the forced field left its old manager');
    });

    it('patches with merge, strategic and JSON patches', async () => {
      await ok('create', 'service', 'nodeport', 'patched', '--tcp=80:8080');
      await ok('patch', 'service', 'patched', '--type=merge', '-p', '{"metadata":{"labels":{"tier":"web"}}}');
      await ok('patch', 'service', 'patched', '-p', '{"spec":{"ports":[{"port":443,"name":"https","targetPort":8443}]}}');
      await ok('patch', 'service', 'patched', '--type=json', '-p', '[{"op":"replace","path":"/spec/sessionAffinity","value":"ClientIP"}]');
      const svc = server.store.get('services', 'default', 'patched');
      assert.equal(svc.metadata.labels?.tier, 'web');
      assert.deepEqual(svc.spec.ports.map((p: any) => p.port).sort(), [443, 80], 'the strategic patch added a port beside the first');
      assert.equal(svc.spec.sessionAffinity, 'ClientIP');
    });

    it('edits through $EDITOR', async () => {
      const editor = await file(
        'editor.sh',
        '#!/bin/sh\nsed -i -e "s/tier: web/tier: edited/" -e "s/targetPort: 8443/targetPort: 9443/" "$1"\n',
      );
      await chmod(editor, 0o755);
      const r = await kubectl(['edit', 'service', 'patched'], {EDITOR: editor, KUBE_EDITOR: editor});
      assert.equal(r.exitCode, 0, r.stderr);
      assert.match(r.stdout, /service\/patched edited/);
      const svc = server.store.get('services', 'default', 'patched');
      assert.equal(svc.metadata.labels?.tier, 'edited');
      assert.equal(svc.spec.ports.find((p: any) => p.port === 443).targetPort, 9443);
    });

    it('labels and annotates', async () => {
      await ok('label', 'service', 'patched', 'stage=test');
      await ok('annotate', 'service', 'patched', 'owner=lab team');
      const meta = server.store.get('services', 'default', 'patched').metadata;
      assert.equal(meta.labels?.stage, 'test');
      assert.equal(meta.annotations?.owner, 'lab team');
      await ok('label', 'service', 'patched', 'stage-');
      assert.equal(server.store.get('services', 'default', 'patched').metadata.labels?.stage, undefined);
    });

    it('deletes a pod with its grace period, and waits for it to be gone', async () => {
      runningPod('slow', {terminationGracePeriodSeconds: 1});
      const deleted = await ok('delete', 'pod', 'slow', '--wait=false');
      assert.match(deleted, /pod "slow" deleted/);
      assert.ok(server.store.get('pods', 'default', 'slow').metadata.deletionTimestamp, 'the pod is Terminating first');
      await ok('wait', '--for=delete', 'pod/slow', '--timeout=10s');
      assert.equal(server.store.tryGet('pods', 'default', 'slow'), undefined);
    });

    it('explains kinds and their fields, and refuses a manifest with an unknown field', async () => {
      const explained = await ok('explain', 'service.spec');
      assert.match(explained, /^KIND:\s+Service$/m);
      assert.match(explained, /^\s+clusterIP\t<string>$/m);
      assert.match(explained, /^\s+ports\t<\[\](ServicePort|Object)>$/m);
      assert.match(await ok('explain', 'pod.spec.containers.ports'), /^\s+containerPort\t<integer>( -required-)?$/m);
      const path = await file('unknown.yaml', service('unknown', 8080).replace('  selector:', '  bogus: 1\n  selector:'));
      const refused = await kubectl(['apply', '-f', path]);
      assert.notEqual(refused.exitCode, 0);
      assert.match(refused.stderr, client.unknownField);
      assert.equal(server.store.tryGet('services', 'default', 'unknown'), undefined);
    });

    it('receives changes with get -w', async (t) => {
      const watcher = execa(kubectlPath, ['--kubeconfig', kubeconfig(), 'get', 'services', '-w'], {
        env: {HOME: dir},
        extendEnv: false,
        reject: false,
      });
      t.after(() => {
        watcher.kill();
      });
      let output = '';
      watcher.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
      await waitFor(() => output, /^kubernetes\s+ClusterIP/m, 'kubectl get -w');
      server.store.create('services', {metadata: {name: 'watched', namespace: 'default'}, spec: {ports: [{port: 8443}]}}, 'default');
      await waitFor(() => output, /^watched\s+ClusterIP\s+10\.\S+\s+<none>\s+8443\/TCP/m, 'kubectl get -w');
    });

    it('port-forwards to a pod', async (t) => {
      runningPod('echo');
      const child = execa(kubectlPath, ['--kubeconfig', kubeconfig(), 'port-forward', 'pod/echo', ':8080'], {
        env: {HOME: dir},
        extendEnv: false,
        reject: false,
      });
      t.after(() => {
        child.kill();
      });
      let out = '';
      child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
      child.stderr!.on('data', (c: Buffer) => (out += c.toString()));
      await waitFor(() => out, /Forwarding from 127\.0\.0\.1:\d+ -> 8080/, 'kubectl port-forward');
      const port = Number(/Forwarding from 127\.0\.0\.1:(\d+)/.exec(out)![1]);
      const reply = await new Promise<string>((resolve, reject) => {
        let got = '';
        const socket = connect(port, '127.0.0.1', () => socket.write('ping through the lab\n'));
        socket.on('data', (c) => {
          got += c.toString();
          if (got.endsWith('\n')) socket.end();
        });
        socket.on('close', () => resolve(got));
        socket.on('error', reject);
      });
      assert.equal(reply, 'ping through the lab\n');
    });
  });
}

describe('kubectl 1.34: explain and field validation from the OpenAPI v3 documents', () => {
  let server: ApiServer;
  let dir: string;
  const kubectl = async (...args: string[]) => {
    const r = await execa(currentKubectl(), ['--kubeconfig', join(dir, 'kubeconfig'), ...args], {
      env: {HOME: dir},
      extendEnv: false,
      reject: false,
    });
    return {stdout: String(r.stdout), stderr: String(r.stderr), exitCode: r.exitCode ?? -1};
  };
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'proxyctl-kubectl-explain-'));
    server = await startApiServer({port: 0});
    await server.writeKubeconfig(join(dir, 'kubeconfig'));
  });
  after(async () => {
    await server?.stop();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it('explains service.spec and its fields', async () => {
    const r = await kubectl('explain', 'service.spec');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /^KIND:\s+Service$/m);
    assert.match(r.stdout, /^FIELD: spec <ServiceSpec>$/m);
    for (const field of ['clusterIP\t<string>', 'ports\t<[]ServicePort>', 'sessionAffinity\t<string>', 'ipFamilies\t<[]string>'])
      assert.ok(r.stdout.includes(field), `explain lists ${field}`);
    const ports = await kubectl('explain', 'svc.spec.ports.port');
    assert.match(ports.stdout, /^FIELD: port <integer>$/m);
    const targetPort = await kubectl('explain', 'svc.spec.ports.targetPort');
    assert.match(targetPort.stdout, /^FIELD: targetPort <IntOrString>$/m);
    const slices = await kubectl('explain', 'endpointslices.endpoints.conditions');
    assert.match(slices.stdout, /ready\t<boolean>/);
  });

  it('refuses an unknown field with --validate=strict, as kube-apiserver words it, and accepts it with --validate=false', async () => {
    await writeFile(join(dir, 'bogus.yaml'), service('bogus', 8080).replace('  selector:', '  bogus: 1\n  selector:'));
    const strict = await kubectl('apply', '--validate=strict', '-f', join(dir, 'bogus.yaml'));
    assert.notEqual(strict.exitCode, 0);
    assert.match(
      strict.stderr,
      /Service in version "v1" cannot be handled as a Service: strict decoding error: unknown field "spec\.bogus"/,
    );
    assert.equal(server.store.tryGet('services', 'default', 'bogus'), undefined);
    const loose = await kubectl('apply', '--validate=false', '-f', join(dir, 'bogus.yaml'));
    assert.equal(loose.exitCode, 0, loose.stderr);
    await writeFile(join(dir, 'warned.yaml'), service('warned', 8080).replace('  selector:', '  bogus: 1\n  selector:'));
    const warned = await kubectl('apply', '--validate=warn', '-f', join(dir, 'warned.yaml'));
    assert.equal(warned.exitCode, 0, warned.stderr);
    assert.match(warned.stderr, /unknown field "spec\.bogus"/);
  });
});
