// The embedded API server seen through @kubernetes/client-node: CRUD, errors, patches, watches, port-forward.
import {after, before, describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {createServer, type Server} from 'node:net';
import {PassThrough} from 'node:stream';
import {
  ApiException,
  CoreV1Api,
  DiscoveryV1Api,
  AuthorizationV1Api,
  AuthenticationV1Api,
  KubeConfig,
  ListWatch,
  PatchStrategy,
  PortForward,
  Watch,
  setHeaderOptions,
  type V1Service,
  type V1Pod,
} from '@kubernetes/client-node';
import {startApiServer, type ApiServer} from '../../../src/lab/apiserver/server.ts';

function kubeConfigFor(server: ApiServer, user?: string, token?: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromString(server.kubeconfig({user, token}));
  return kc;
}

async function apiError(promise: Promise<unknown>): Promise<{code: number; status: any}> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof ApiException, `expected an ApiException, got ${err}`);
    return {code: err.code, status: typeof err.body === 'string' ? JSON.parse(err.body) : err.body};
  }
  assert.fail('expected the request to fail');
}

function service(name: string, spec: Record<string, unknown>): V1Service {
  return {apiVersion: 'v1', kind: 'Service', metadata: {name}, spec};
}

function pod(name: string, labels: Record<string, string>, extra: Partial<V1Pod['spec']> = {}): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {name, labels},
    spec: {
      nodeName: 'node-a',
      containers: [{name: 'app', image: 'registry.example/app:1', ports: [{name: 'http', containerPort: 8080}]}],
      ...extra,
    },
  };
}

async function eventually<T>(what: string, check: () => T | undefined | Promise<T | undefined>, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('embedded API server through client-node', () => {
  let server: ApiServer;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  let kc: KubeConfig;

  before(async () => {
    server = await startApiServer({port: 0, bookmarkIntervalSeconds: 0.2, watchWindow: 50});
    kc = kubeConfigFor(server);
    core = kc.makeApiClient(CoreV1Api);
    discovery = kc.makeApiClient(DiscoveryV1Api);
  });
  after(async () => {
    await server.stop();
  });

  it('starts with the default namespaces and the kubernetes service', async () => {
    const namespaces = await core.listNamespace();
    assert.deepEqual(namespaces.items.map((n) => n.metadata?.name).sort(), ['default', 'kube-node-lease', 'kube-public', 'kube-system']);
    const kubernetes = await core.readNamespacedService({name: 'kubernetes', namespace: 'default'});
    assert.equal(kubernetes.spec?.clusterIP, '10.96.0.1');
    assert.equal(kubernetes.spec?.ports?.[0].port, 443);
    const sa = await core.readNamespacedServiceAccount({name: 'default', namespace: 'kube-system'});
    assert.equal(sa.metadata?.name, 'default');
  });

  it('creates, reads, updates, patches and deletes a service', async () => {
    const created = await core.createNamespacedService({
      namespace: 'default',
      body: service('crud', {selector: {app: 'crud'}, ports: [{name: 'http', port: 80, targetPort: 8080}]}),
    });
    assert.match(created.metadata?.uid ?? '', /^[0-9a-f-]{36}$/);
    assert.ok(created.metadata?.creationTimestamp instanceof Date);
    assert.equal(created.metadata?.generation, 1);
    assert.equal(created.spec?.type, 'ClusterIP');
    assert.equal(created.spec?.sessionAffinity, 'None');
    assert.equal(created.spec?.ports?.[0].protocol, 'TCP');
    assert.ok(created.spec?.clusterIP?.startsWith('10.96.'));
    assert.deepEqual(created.spec?.clusterIPs, [created.spec?.clusterIP]);

    const read = await core.readNamespacedService({name: 'crud', namespace: 'default'});
    assert.equal(read.metadata?.resourceVersion, created.metadata?.resourceVersion);

    read.spec!.ports![0].port = 81;
    const updated = await core.replaceNamespacedService({name: 'crud', namespace: 'default', body: read});
    assert.equal(updated.spec?.ports?.[0].port, 81);
    assert.equal(updated.metadata?.generation, 2);
    assert.ok(Number(updated.metadata?.resourceVersion) > Number(created.metadata?.resourceVersion));
    assert.equal(updated.spec?.clusterIP, created.spec?.clusterIP, 'the ClusterIP is kept');

    // A write based on the old resourceVersion is refused.
    const stale = await apiError(
      core.replaceNamespacedService({
        name: 'crud',
        namespace: 'default',
        body: {...read, metadata: {...read.metadata, resourceVersion: created.metadata?.resourceVersion}},
      }),
    );
    assert.equal(stale.code, 409);
    assert.equal(stale.status.reason, 'Conflict');
    assert.equal(
      stale.status.message,
      'Operation cannot be fulfilled on services "crud": the object has been modified; please apply your changes to the latest version and try again',
    );

    const merged = await core.patchNamespacedService(
      {name: 'crud', namespace: 'default', body: {metadata: {labels: {tier: 'web'}}, spec: {type: 'NodePort'}}},
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
    assert.equal(merged.metadata?.labels?.tier, 'web');
    assert.ok((merged.spec?.ports?.[0].nodePort ?? 0) >= 30000);

    const strategic = await core.patchNamespacedService(
      {name: 'crud', namespace: 'default', body: {spec: {ports: [{name: 'metrics', port: 9090, targetPort: 9090}]}}},
      setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
    );
    assert.deepEqual(
      strategic.spec?.ports?.map((p) => p.port),
      [81, 9090],
      'ports merge by their port key',
    );

    const jsonPatched = await core.patchNamespacedService(
      {name: 'crud', namespace: 'default', body: [{op: 'replace', path: '/metadata/labels/tier', value: 'api'}]},
      setHeaderOptions('Content-Type', PatchStrategy.JsonPatch),
    );
    assert.equal(jsonPatched.metadata?.labels?.tier, 'api');

    const deleted = await core.deleteNamespacedService({name: 'crud', namespace: 'default'});
    assert.equal(deleted.metadata?.name, 'crud');
    const missing = await apiError(core.readNamespacedService({name: 'crud', namespace: 'default'}));
    assert.equal(missing.code, 404);
    assert.equal(missing.status.message, 'services "crud" not found');
  });

  it('answers duplicates, bad bodies and invalid services like kube-apiserver', async () => {
    await core.createNamespacedConfigMap({namespace: 'default', body: {metadata: {name: 'settings'}, data: {a: '1'}}});
    const dup = await apiError(core.createNamespacedConfigMap({namespace: 'default', body: {metadata: {name: 'settings'}}}));
    assert.equal(dup.code, 409);
    assert.equal(dup.status.reason, 'AlreadyExists');
    assert.equal(dup.status.message, 'configmaps "settings" already exists');

    const range = await apiError(
      core.createNamespacedService({namespace: 'default', body: service('web', {type: 'NodePort', ports: [{port: 80, nodePort: 70000}]})}),
    );
    assert.equal(range.code, 422);
    assert.equal(
      range.status.message,
      'Service "web" is invalid: spec.ports[0].nodePort: Invalid value: 70000: provided port is not in the valid range. The range of valid ports is 30000-32767',
    );
    assert.deepEqual(range.status.details.causes, [
      {
        reason: 'FieldValueInvalid',
        message: 'Invalid value: 70000: provided port is not in the valid range. The range of valid ports is 30000-32767',
        field: 'spec.ports[0].nodePort',
      },
    ]);

    const several = await apiError(
      core.createNamespacedService({
        namespace: 'default',
        body: service('two', {ports: [{port: 80}, {port: 81, protocol: 'ICMP'}], sessionAffinity: 'Sticky'}),
      }),
    );
    assert.equal(several.code, 422);
    assert.deepEqual(
      several.status.details.causes.map((c: any) => c.field),
      ['spec.ports[0].name', 'spec.ports[1].name', 'spec.ports[1].protocol', 'spec.sessionAffinity'],
    );
    assert.match(several.status.message, /^Service "two" is invalid: \[spec\.ports\[0\]\.name: Required value, /);
    assert.match(several.status.message, /spec\.ports\[1\]\.protocol: Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"/);

    const nodePortOnClusterIP = await apiError(
      core.createNamespacedService({namespace: 'default', body: service('cip', {ports: [{port: 80, nodePort: 30080}]})}),
    );
    assert.equal(
      nodePortOnClusterIP.status.message,
      'Service "cip" is invalid: spec.ports[0].nodePort: Forbidden: may not be used when `type` is \'ClusterIP\'',
    );

    const external = await apiError(core.createNamespacedService({namespace: 'default', body: service('ext', {type: 'ExternalName'})}));
    assert.equal(external.status.message, 'Service "ext" is invalid: spec.externalName: Required value');

    const outside = await apiError(
      core.createNamespacedService({namespace: 'default', body: service('outside', {clusterIP: '192.168.1.1', ports: [{port: 80}]})}),
    );
    assert.equal(
      outside.status.message,
      'Service "outside" is invalid: spec.clusterIPs: Invalid value: []string{"192.168.1.1"}: failed to allocate IP 192.168.1.1: provided IP (192.168.1.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12',
    );
    const taken = await apiError(
      core.createNamespacedService({namespace: 'default', body: service('taken', {clusterIP: '10.96.0.1', ports: [{port: 80}]})}),
    );
    assert.match(taken.status.message, /failed to allocate IP 10\.96\.0\.1: provided IP is already allocated$/);

    const policy = await apiError(
      core.createNamespacedService({namespace: 'default', body: service('etp', {externalTrafficPolicy: 'Local', ports: [{port: 80}]})}),
    );
    assert.equal(
      policy.status.message,
      'Service "etp" is invalid: spec.externalTrafficPolicy: Invalid value: "Local": may only be set for externally-accessible services',
    );

    const noNamespace = await apiError(core.createNamespacedConfigMap({namespace: 'nowhere', body: {metadata: {name: 'x'}}}));
    assert.equal(noNamespace.code, 404);
    assert.equal(noNamespace.status.message, 'namespaces "nowhere" not found');

    const badPod = await apiError(
      core.createNamespacedPod({namespace: 'default', body: {metadata: {name: 'Bad_Pod'}, spec: {containers: []}}}),
    );
    assert.equal(badPod.code, 422);
    assert.deepEqual(
      badPod.status.details.causes.map((c: any) => c.field),
      ['metadata.name', 'spec.containers'],
    );
  });

  it('answers malformed bodies with 400 and unsupported verbs with 405', async () => {
    const headers = {authorization: `Bearer ${server.adminToken}`, 'content-type': 'application/json'};
    const malformed = await fetch(`${server.url}/api/v1/namespaces/default/configmaps`, {method: 'POST', headers, body: '{"metadata": '});
    assert.equal(malformed.status, 400);
    assert.equal(((await malformed.json()) as any).reason, 'BadRequest');
    const putCollection = await fetch(`${server.url}/api/v1/namespaces/default/configmaps`, {method: 'PUT', headers, body: '{}'});
    assert.equal(putCollection.status, 405);
    assert.equal(((await putCollection.json()) as any).reason, 'MethodNotAllowed');
    const unknown = await fetch(`${server.url}/api/v1/namespaces/default/widgets`, {headers});
    assert.equal(unknown.status, 404);
  });

  it('lists with label selectors, field selectors and pages', async () => {
    await core.createNamespace({body: {metadata: {name: 'sel'}}});
    const labels: Array<Record<string, string>> = [{app: 'a', tier: 'web'}, {app: 'b', tier: 'web'}, {app: 'c'}, {app: 'a', tier: 'db'}];
    for (const [i, l] of labels.entries())
      await core.createNamespacedPod({namespace: 'sel', body: pod(`p${i}`, l, {nodeName: i % 2 === 0 ? 'node-a' : 'node-b'})});
    const names = async (labelSelector?: string, fieldSelector?: string) =>
      (await core.listNamespacedPod({namespace: 'sel', labelSelector, fieldSelector})).items.map((p) => p.metadata?.name);
    assert.deepEqual(await names('app=a'), ['p0', 'p3']);
    assert.deepEqual(await names('app==a,tier=web'), ['p0']);
    assert.deepEqual(await names('app!=a'), ['p1', 'p2']);
    assert.deepEqual(await names('app in (b, c)'), ['p1', 'p2']);
    assert.deepEqual(await names('app notin (a)'), ['p1', 'p2']);
    assert.deepEqual(await names('tier'), ['p0', 'p1', 'p3']);
    assert.deepEqual(await names('!tier'), ['p2']);
    assert.deepEqual(await names(undefined, 'metadata.name=p2'), ['p2']);
    assert.deepEqual(await names(undefined, 'spec.nodeName=node-b'), ['p1', 'p3']);
    assert.deepEqual(await names('tier=web', 'spec.nodeName!=node-b'), ['p0']);
    const everywhere = await core.listPodForAllNamespaces({fieldSelector: 'metadata.namespace=sel'});
    assert.equal(everywhere.items.length, 4);
    const bad = await apiError(core.listNamespacedPod({namespace: 'sel', fieldSelector: 'spec.image=x'}));
    assert.equal(bad.code, 400);
    assert.equal(bad.status.message, 'field label not supported: spec.image');

    const page1 = await core.listNamespacedPod({namespace: 'sel', limit: 3});
    assert.equal(page1.items.length, 3);
    assert.equal(page1.metadata?.remainingItemCount, 1);
    const page2 = await core.listNamespacedPod({namespace: 'sel', limit: 3, _continue: page1.metadata?._continue});
    assert.deepEqual(
      page2.items.map((p) => p.metadata?.name),
      ['p3'],
    );
    assert.equal(page2.metadata?._continue, undefined);
  });

  it('gives pods a grace period on delete unless gracePeriodSeconds is 0', async () => {
    await core.createNamespace({body: {metadata: {name: 'grace'}}});
    await core.createNamespacedPod({namespace: 'grace', body: pod('slow', {app: 'g'}, {terminationGracePeriodSeconds: 1})});
    const terminating = await core.deleteNamespacedPod({namespace: 'grace', name: 'slow'});
    assert.ok(terminating.metadata?.deletionTimestamp, 'the pod is marked for deletion');
    assert.equal(terminating.metadata?.deletionGracePeriodSeconds, 1);
    assert.ok(await core.readNamespacedPod({namespace: 'grace', name: 'slow'}));
    await eventually('the pod to go after its grace period', async () => {
      const list = await core.listNamespacedPod({namespace: 'grace'});
      return list.items.length === 0 ? true : undefined;
    });

    await core.createNamespacedPod({namespace: 'grace', body: pod('fast', {app: 'g'})});
    await core.deleteNamespacedPod({namespace: 'grace', name: 'fast', gracePeriodSeconds: 0});
    assert.equal((await apiError(core.readNamespacedPod({namespace: 'grace', name: 'fast'}))).code, 404);
  });

  it('serves EndpointSlices through DiscoveryV1Api', async () => {
    const body = {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {generateName: 'manual-', labels: {'kubernetes.io/service-name': 'manual'}},
      addressType: 'IPv4',
      endpoints: [{addresses: ['10.244.1.7'], conditions: {ready: true}, nodeName: 'node-a', zone: 'zone-1'}],
      ports: [{name: 'http', port: 8080}],
    };
    const created = await discovery.createNamespacedEndpointSlice({namespace: 'default', body});
    assert.match(created.metadata?.name ?? '', /^manual-[a-z0-9]{5}$/);
    assert.equal(created.ports?.[0].protocol, 'TCP');
    const list = await discovery.listNamespacedEndpointSlice({namespace: 'default', labelSelector: 'kubernetes.io/service-name=manual'});
    assert.equal(list.items.length, 1);
    const bad = await apiError(
      discovery.createNamespacedEndpointSlice({
        namespace: 'default',
        body: {...body, addressType: 'IPv4', endpoints: [{addresses: ['fe80::1']}]},
      }),
    );
    assert.equal(bad.code, 422);
    assert.equal(bad.status.details.causes[0].field, 'endpoints[0].addresses[0]');
    assert.match(bad.status.message, /^EndpointSlice.discovery.k8s.io "|^EndpointSlice "/);
    await discovery.deleteNamespacedEndpointSlice({namespace: 'default', name: created.metadata!.name!});
  });

  it('ListWatch sees adds, updates and deletes, and relists after 410 Gone', async () => {
    await core.createNamespace({body: {metadata: {name: 'lw'}}});
    const path = '/api/v1/namespaces/lw/configmaps';
    const events: string[] = [];
    const informer = new ListWatch(path, new Watch(kc), () => core.listNamespacedConfigMap({namespace: 'lw'}), false);
    informer.on('add', (o) => events.push(`add ${o.metadata?.name} ${o.data?.v}`));
    informer.on('update', (o) => events.push(`update ${o.metadata?.name} ${o.data?.v}`));
    informer.on('delete', (o) => events.push(`delete ${o.metadata?.name}`));
    await informer.start();
    try {
      await core.createNamespacedConfigMap({namespace: 'lw', body: {metadata: {name: 'one'}, data: {v: '1'}}});
      await eventually('add', () => events.includes('add one 1') || undefined);
      await core.patchNamespacedConfigMap(
        {namespace: 'lw', name: 'one', body: {data: {v: '2'}}},
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      await eventually('update', () => events.includes('update one 2') || undefined);
      await core.deleteNamespacedConfigMap({namespace: 'lw', name: 'one'});
      await eventually('delete', () => events.includes('delete one') || undefined);
      assert.equal(informer.list('lw').length, 0);
    } finally {
      await informer.stop();
    }

    // A watch resuming from a revision older than the kept window gets 410 Gone; ListWatch relists.
    const stale = informer.latestResourceVersion();
    for (let i = 0; i < 60; i++) await core.createNamespacedConfigMap({namespace: 'default', body: {metadata: {name: `churn-${i}`}}});
    await core.createNamespacedConfigMap({namespace: 'lw', body: {metadata: {name: 'after-gap'}, data: {v: '3'}}});
    /** The events of a watch from `resourceVersion`, once the server ends it. */
    const watchedFrom = async (resourceVersion: string) => {
      const events: any[] = [];
      await new Promise<void>((resolve, reject) => {
        new Watch(kc)
          .watch(
            path,
            {resourceVersion},
            (type, obj) => events.push({type, obj}),
            () => resolve(),
          )
          .catch(reject);
      });
      return events;
    };
    const watchErrors = await watchedFrom(stale);
    assert.equal(watchErrors.length, 1);
    assert.equal(watchErrors[0].type, 'ERROR');
    assert.equal(watchErrors[0].obj.code, 410);
    assert.equal(watchErrors[0].obj.reason, 'Expired');
    assert.match(watchErrors[0].obj.message, /^too old resource version: \d+ \(\d+\)$/);

    // A watch from a revision this server has not reached (a client of a server whose storage was
    // replaced) waits for it, then is refused as kube-apiserver refuses it.
    const ahead = String(Number(informer.latestResourceVersion()) + 1000);
    const askedAt = Date.now();
    const tooLarge = await watchedFrom(ahead);
    assert.ok(Date.now() - askedAt >= 2500, 'it waited for the revision first');
    assert.equal(tooLarge.length, 1);
    assert.equal(tooLarge[0].type, 'ERROR');
    assert.equal(tooLarge[0].obj.code, 504);
    assert.match(tooLarge[0].obj.message, new RegExp(`^Too large resource version: ${ahead}, current: \\d+$`));
    assert.equal(tooLarge[0].obj.details.causes[0].reason, 'ResourceVersionTooLarge');

    // A relisting informer recovers the state, including what happened during the gap.
    const relisting = new ListWatch(path, new Watch(kc), () => core.listNamespacedConfigMap({namespace: 'lw'}), false);
    await relisting.start();
    try {
      assert.deepEqual(
        relisting.list('lw').map((c) => c.metadata?.name),
        ['after-gap'],
      );
    } finally {
      await relisting.stop();
    }
  });

  it('resumes a watch that ended (timeoutSeconds) from its resourceVersion without losing events', async () => {
    await core.createNamespace({body: {metadata: {name: 'resume'}}});
    const path = '/api/v1/namespaces/resume/configmaps';
    const list = await core.listNamespacedConfigMap({namespace: 'resume'});
    let rv = list.metadata!.resourceVersion!;
    const seen: string[] = [];
    let bookmarks = 0;
    const writer = (async () => {
      for (let i = 0; i < 30; i++) {
        await core.createNamespacedConfigMap({namespace: 'resume', body: {metadata: {name: `cm-${i}`}}});
        await new Promise((r) => setTimeout(r, 40));
      }
    })();
    // Short watches that the server ends; each resumes from the last resourceVersion seen.
    const deadline = Date.now() + 15000;
    while (seen.length < 30 && Date.now() < deadline) {
      await new Promise<void>((resolve, reject) => {
        new Watch(kc)
          .watch(
            path,
            {resourceVersion: rv, timeoutSeconds: 1, allowWatchBookmarks: true},
            (type, obj) => {
              if (type === 'BOOKMARK') bookmarks++;
              else if (type === 'ADDED') seen.push(obj.metadata.name);
              rv = obj.metadata.resourceVersion;
            },
            (err) => (err ? reject(err) : resolve()),
          )
          .catch(reject);
      });
    }
    await writer;
    assert.deepEqual(
      seen,
      Array.from({length: 30}, (_, i) => `cm-${i}`),
      'every change once, in order',
    );
    assert.ok(bookmarks > 0, 'bookmarks were sent');
  });

  it('watches of one object and with selectors see it enter and leave', async () => {
    await core.createNamespace({body: {metadata: {name: 'wsel'}}});
    const events: string[] = [];
    const controller = await new Watch(kc).watch(
      '/api/v1/namespaces/wsel/configmaps',
      {labelSelector: 'team=blue'},
      (type, obj) => events.push(`${type} ${obj.metadata.name}`),
      () => undefined,
    );
    try {
      await core.createNamespacedConfigMap({namespace: 'wsel', body: {metadata: {name: 'x', labels: {team: 'red'}}}});
      await core.patchNamespacedConfigMap(
        {namespace: 'wsel', name: 'x', body: {metadata: {labels: {team: 'blue'}}}},
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      await core.patchNamespacedConfigMap(
        {namespace: 'wsel', name: 'x', body: {metadata: {labels: {team: 'green'}}}},
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      await eventually('the object to leave the selection', () => (events.length >= 2 ? true : undefined));
      assert.deepEqual(events, ['ADDED x', 'DELETED x']);
    } finally {
      controller.abort();
    }
  });

  it('port-forwards to a pod port through the WebSocket channel protocol', async (t) => {
    const echo: Server = createServer((socket) => socket.pipe(socket));
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
    t.after(() => echo.close());
    const echoPort = (echo.address() as any).port as number;
    const forwarding = await startApiServer({
      port: 0,
      resolvePodAddress: (_pod, port) => ({host: '127.0.0.1', port: port === 8080 ? echoPort : 1}),
    });
    t.after(() => forwarding.stop());
    const fkc = kubeConfigFor(forwarding);
    const fcore = fkc.makeApiClient(CoreV1Api);
    await fcore.createNamespacedPod({namespace: 'default', body: pod('echo', {app: 'echo'})});

    const output = new PassThrough();
    const errors = new PassThrough();
    const input = new PassThrough();
    const received: Buffer[] = [];
    output.on('data', (chunk) => received.push(chunk));
    const ws = await new PortForward(fkc).portForward('default', 'echo', [8080], output, errors, input);
    input.write('hello through the API server\n');
    await eventually('the echo', () => (Buffer.concat(received).toString() === 'hello through the API server\n' ? true : undefined));
    (ws as any).close();
  });

  it('refuses pods/portforward to a user without the right, and allows it once RBAC grants it', async (t) => {
    const echo: Server = createServer((socket) => socket.end('hi'));
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
    t.after(() => echo.close());
    const echoPort = (echo.address() as any).port as number;
    const guarded = await startApiServer({
      port: 0,
      users: [{name: 'viewer', token: 'viewer-token'}],
      resolvePodAddress: () => ({host: '127.0.0.1', port: echoPort}),
    });
    t.after(() => guarded.stop());
    const admin = kubeConfigFor(guarded);
    await admin.makeApiClient(CoreV1Api).createNamespacedPod({namespace: 'default', body: pod('agent', {app: 'agent'})});
    const viewer = kubeConfigFor(guarded, 'viewer');
    const attempt = () =>
      new PortForward(viewer).portForward('default', 'agent', [8080], new PassThrough(), new PassThrough(), new PassThrough());
    await assert.rejects(attempt(), (err: any) => {
      // client-node rejects with the WebSocket error event of the refused upgrade.
      assert.equal(err.message ?? err.error?.message, 'Unexpected server response: 403');
      return true;
    });

    const sar = await admin.makeApiClient(AuthorizationV1Api).createSubjectAccessReview({
      body: {
        spec: {user: 'viewer', resourceAttributes: {namespace: 'default', verb: 'create', resource: 'pods', subresource: 'portforward'}},
      },
    });
    assert.equal(sar.status?.allowed, false);

    const rbac = {'content-type': 'application/json', authorization: `Bearer ${guarded.adminToken}`};
    const post = (path: string, body: unknown) =>
      fetch(`${guarded.url}${path}`, {method: 'POST', headers: rbac, body: JSON.stringify(body)});
    assert.equal(
      (
        await post('/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles', {
          metadata: {name: 'forward'},
          rules: [{apiGroups: [''], resources: ['pods/portforward'], verbs: ['create']}],
        })
      ).status,
      201,
    );
    assert.equal(
      (
        await post('/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings', {
          metadata: {name: 'viewer-forward'},
          roleRef: {apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'forward'},
          subjects: [{kind: 'User', name: 'viewer', apiGroup: 'rbac.authorization.k8s.io'}],
        })
      ).status,
      201,
    );
    const allowed = await admin.makeApiClient(AuthorizationV1Api).createSubjectAccessReview({
      body: {
        spec: {user: 'viewer', resourceAttributes: {namespace: 'default', verb: 'create', resource: 'pods', subresource: 'portforward'}},
      },
    });
    assert.equal(allowed.status?.allowed, true);
    const ws = await attempt();
    (ws as any).close();

    const review = await admin.makeApiClient(AuthenticationV1Api).createTokenReview({body: {spec: {token: 'viewer-token'}}});
    assert.equal(review.status?.authenticated, true);
    assert.equal(review.status?.user?.username, 'viewer');
    const unknown = await admin.makeApiClient(AuthenticationV1Api).createTokenReview({body: {spec: {token: 'nope'}}});
    assert.equal(unknown.status?.authenticated, false);

    const list = await apiError(viewer.makeApiClient(CoreV1Api).listNamespacedSecret({namespace: 'default'}));
    assert.ok(list.code === 403 || list.code === 404);
  });
});
