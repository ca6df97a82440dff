// The lab API server's workload side through its REST API: the scheduler, Deployments and
// ReplicaSets (scale, rolling update bounds, rollback, history), garbage collection, Events in
// core/v1 and events.k8s.io/v1, and pods/log without a kubelet. No kubelet runs here: where a pod
// must turn Ready, the test writes its status through pods/status as a kubelet does.
import assert from 'node:assert/strict';
import {randomBytes} from 'node:crypto';
import {after, before, describe, it} from 'node:test';
import {EventRecorder, eventTtlMs} from '../../../src/lab/apiserver/event-recorder.ts';
import type {KubeObject} from '../../../src/lab/apiserver/object-log.ts';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';

let server: ApiServer;

async function api(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<{status: number; body: any}> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: {authorization: `Bearer ${server.adminToken}`, ...(body !== undefined ? {'content-type': contentType} : {})},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // plain text (pods/log)
  }
  return {status: response.status, body: parsed};
}

async function ok(method: string, path: string, body?: unknown, contentType?: string): Promise<any> {
  const answer = await api(method, path, body, contentType);
  assert.ok(answer.status < 300, `${method} ${path}: ${answer.status} ${JSON.stringify(answer.body)}`);
  return answer.body;
}

async function namespace(): Promise<string> {
  const name = `wl-${randomBytes(4).toString('hex')}`;
  await ok('POST', '/api/v1/namespaces', {metadata: {name}});
  return name;
}

function node(name: string, labels: Record<string, string> = {}, spec: Record<string, unknown> = {}): KubeObject {
  return {
    metadata: {name, labels: {'kubernetes.io/hostname': name, ...labels}},
    spec,
    status: {conditions: [{type: 'Ready', status: 'True'}]},
  };
}

function pods(ns: string, selector?: string): KubeObject[] {
  return server.store.list('pods', {namespace: ns, labelSelector: selector}).items;
}

/** What a kubelet reports once a bound pod's container runs and is ready. */
async function reportReady(pod: KubeObject, index: number): Promise<void> {
  const now = new Date().toISOString();
  await ok('PUT', `/api/v1/namespaces/${pod.metadata.namespace}/pods/${pod.metadata.name}/status`, {
    ...pod,
    status: {
      phase: 'Running',
      podIP: `10.244.9.${index % 250}`,
      conditions: [
        {type: 'Ready', status: 'True', lastTransitionTime: now},
        {type: 'PodScheduled', status: 'True', lastTransitionTime: now},
      ],
    },
  });
}

/** Plays the kubelet of every node: pods bound and not yet Ready turn Ready; deleted pods go once asked. */
async function kubeletRound(ns: string): Promise<void> {
  await server.settle();
  let index = 0;
  for (const pod of pods(ns)) {
    index++;
    if (!pod.spec.nodeName) continue;
    if (pod.metadata.deletionTimestamp) await api('DELETE', `/api/v1/namespaces/${ns}/pods/${pod.metadata.name}?gracePeriodSeconds=0`);
    else if (pod.status?.phase !== 'Running') await reportReady(pod, index);
  }
  await server.settle();
}

function deployment(name: string, replicas: number, extra: Record<string, unknown> = {}): KubeObject {
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: {name},
    spec: {
      replicas,
      selector: {matchLabels: {app: name}},
      template: {metadata: {labels: {app: name}}, spec: {containers: [{name: 'web', image: 'nginx:1', ports: [{containerPort: 80}]}]}},
      ...extra,
    },
  };
}

function replicaSetsOf(ns: string, name: string): KubeObject[] {
  return server.store.list('replicasets', {namespace: ns, labelSelector: `app=${name}`}).items;
}

describe('lab API server workloads', () => {
  before(async () => {
    server = await startApiServer({port: 0});
    for (const [index, name] of ['node-0', 'node-1', 'node-2'].entries())
      server.store.create('nodes', node(name, {zone: `z${index}`, ...(index === 2 ? {disk: 'ssd'} : {})}), undefined, {keepStatus: true});
  });
  after(async () => {
    await server?.stop();
  });

  it('binds pods without a nodeName across the nodes, honouring nodeSelector and nodeName', async () => {
    const ns = await namespace();
    for (let i = 0; i < 6; i++)
      await ok('POST', `/api/v1/namespaces/${ns}/pods`, {metadata: {name: `p${i}`}, spec: {containers: [{name: 'c', image: 'x'}]}});
    await ok('POST', `/api/v1/namespaces/${ns}/pods`, {
      metadata: {name: 'ssd'},
      spec: {nodeSelector: {disk: 'ssd'}, containers: [{name: 'c', image: 'x'}]},
    });
    await ok('POST', `/api/v1/namespaces/${ns}/pods`, {
      metadata: {name: 'pinned'},
      spec: {nodeName: 'node-1', containers: [{name: 'c', image: 'x'}]},
    });
    await server.settle();
    const byNode = new Map<string, number>();
    for (const pod of pods(ns).filter((p) => /^p\d$/.test(p.metadata.name)))
      byNode.set(pod.spec.nodeName, (byNode.get(pod.spec.nodeName) ?? 0) + 1);
    assert.deepEqual([...byNode.values()].sort(), [2, 2, 2], `six pods spread two per node: ${JSON.stringify([...byNode])}`);
    assert.equal(server.store.get('pods', ns, 'ssd').spec.nodeName, 'node-2');
    assert.equal(server.store.get('pods', ns, 'pinned').spec.nodeName, 'node-1');
    const events = (await ok('GET', `/api/v1/namespaces/${ns}/events?fieldSelector=involvedObject.name=ssd`)).items;
    assert.ok(
      events.some((e: any) => e.reason === 'Scheduled' && e.message === `Successfully assigned ${ns}/ssd to node-2`),
      JSON.stringify(events),
    );
  });

  it('leaves a pod no node fits Pending with FailedScheduling, and binds it when a node fits', async () => {
    const ns = await namespace();
    await ok('POST', `/api/v1/namespaces/${ns}/pods`, {
      metadata: {name: 'gpu'},
      spec: {nodeSelector: {gpu: 'yes'}, containers: [{name: 'c', image: 'x'}]},
    });
    await server.settle();
    const pod = await ok('GET', `/api/v1/namespaces/${ns}/pods/gpu`);
    assert.equal(pod.status.phase, 'Pending');
    assert.equal(pod.spec.nodeName, undefined);
    const condition = pod.status.conditions.find((c: any) => c.type === 'PodScheduled');
    assert.equal(condition.status, 'False');
    assert.equal(condition.reason, 'Unschedulable');
    const message = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.";
    assert.equal(condition.message, message);
    const core = (await ok('GET', `/api/v1/namespaces/${ns}/events`)).items;
    assert.ok(core.some((e: any) => e.reason === 'FailedScheduling' && e.type === 'Warning' && e.message === message));
    const v1 = await ok('GET', `/apis/events.k8s.io/v1/namespaces/${ns}/events`);
    assert.equal(v1.apiVersion, 'events.k8s.io/v1');
    const failed = v1.items.find((e: any) => e.reason === 'FailedScheduling');
    assert.equal(failed.note, message, 'events.k8s.io/v1 names the message "note"');
    assert.equal(failed.regarding.name, 'gpu');
    assert.equal(failed.reportingController, 'default-scheduler');

    // Cordoned nodes are not candidates either.
    await ok('PATCH', '/api/v1/nodes/node-0', {spec: {unschedulable: true}}, 'application/strategic-merge-patch+json');
    await ok('PATCH', '/api/v1/nodes/node-1', {spec: {unschedulable: true}}, 'application/merge-patch+json');
    await ok('PATCH', '/api/v1/nodes/node-1', {metadata: {labels: {gpu: 'yes'}}}, 'application/merge-patch+json');
    await server.settle();
    assert.equal(
      server.store.get('pods', ns, 'gpu').status.conditions.find((c: any) => c.type === 'PodScheduled').message,
      "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) were unschedulable.",
    );
    await ok('PATCH', '/api/v1/nodes/node-1', {spec: {unschedulable: false}}, 'application/merge-patch+json');
    await ok('PATCH', '/api/v1/nodes/node-0', {spec: {unschedulable: false}}, 'application/merge-patch+json');
    await server.settle();
    assert.equal(server.store.get('pods', ns, 'gpu').spec.nodeName, 'node-1', 'bound once a node fits');
    await ok('PATCH', '/api/v1/nodes/node-1', {metadata: {labels: {gpu: null}}}, 'application/merge-patch+json');
  });

  it('creates a Deployment ReplicaSet and pods, scales through the scale subresource, and reports rollout status', async () => {
    const ns = await namespace();
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, deployment('web', 3));
    await kubeletRound(ns);
    const [rs] = replicaSetsOf(ns, 'web');
    assert.match(rs.metadata.name, /^web-[bcdfghjklmnpqrstvwxz2456789]+$/);
    assert.equal(rs.metadata.annotations!['deployment.kubernetes.io/revision'], '1');
    assert.equal(rs.metadata.ownerReferences![0].kind, 'Deployment');
    const hash = rs.metadata.labels!['pod-template-hash'];
    assert.equal(pods(ns, `app=web,pod-template-hash=${hash}`).length, 3);
    for (const pod of pods(ns)) assert.equal(pod.metadata.ownerReferences![0].name, rs.metadata.name);

    const d = await ok('GET', `/apis/apps/v1/namespaces/${ns}/deployments/web`);
    assert.equal(d.status.observedGeneration, d.metadata.generation);
    assert.deepEqual([d.status.replicas, d.status.updatedReplicas, d.status.readyReplicas, d.status.availableReplicas], [3, 3, 3, 3]);
    assert.deepEqual(
      d.status.conditions.map((c: any) => `${c.type}=${c.status}/${c.reason}`),
      ['Available=True/MinimumReplicasAvailable', 'Progressing=True/NewReplicaSetAvailable'],
    );

    const scale = await ok('GET', `/apis/apps/v1/namespaces/${ns}/deployments/web/scale`);
    assert.deepEqual([scale.kind, scale.apiVersion, scale.spec.replicas, scale.status.selector], ['Scale', 'autoscaling/v1', 3, 'app=web']);
    await ok('PATCH', `/apis/apps/v1/namespaces/${ns}/deployments/web/scale`, {spec: {replicas: 5}}, 'application/merge-patch+json');
    await kubeletRound(ns);
    assert.equal(pods(ns).length, 5);
    await ok('PUT', `/apis/apps/v1/namespaces/${ns}/deployments/web/scale`, {...scale, metadata: {name: 'web'}, spec: {replicas: 2}});
    await kubeletRound(ns);
    assert.equal(pods(ns).length, 2);
    // kubectl set image: a strategic merge patch naming the container by its merge key keeps its other fields.
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/deployments/web`,
      {spec: {template: {spec: {containers: [{name: 'web', image: 'nginx:2'}]}}}},
      'application/strategic-merge-patch+json',
    );
    const [container] = server.store.get('deployments', ns, 'web').spec.template.spec.containers;
    assert.deepEqual([container.image, container.ports], ['nginx:2', [{containerPort: 80, protocol: 'TCP'}]]);
    const negative = await api(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/deployments/web/scale`,
      {spec: {replicas: -1}},
      'application/merge-patch+json',
    );
    assert.equal(negative.status, 422);
  });

  it('rolls a new template out within maxSurge and maxUnavailable, then rolls back to a revision', async () => {
    const ns = await namespace();
    const strategy = {type: 'RollingUpdate', rollingUpdate: {maxSurge: 1, maxUnavailable: 0}};
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, deployment('web', 4, {strategy}));
    await kubeletRound(ns);
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/deployments/web`,
      {spec: {template: {spec: {containers: [{name: 'web', image: 'nginx:2'}]}}}},
      'application/strategic-merge-patch+json',
    );
    let rounds = 0;
    for (;;) {
      await server.settle();
      const active = pods(ns).filter((p) => !p.metadata.deletionTimestamp);
      const ready = active.filter((p) => p.status?.phase === 'Running');
      assert.ok(active.length <= 5, `at most replicas + maxSurge pods: ${active.length}`);
      assert.ok(ready.length >= 4, `never fewer than replicas - maxUnavailable ready: ${ready.length}`);
      const d = server.store.get('deployments', ns, 'web');
      if (d.status.updatedReplicas === 4 && d.status.availableReplicas === 4 && d.status.replicas === 4) break;
      assert.ok(++rounds < 30, `rollout finished: ${JSON.stringify(d.status)}`);
      await kubeletRound(ns);
    }
    const running = pods(ns).filter((p) => !p.metadata.deletionTimestamp);
    assert.deepEqual(
      running.map((p) => p.spec.containers[0].image),
      ['nginx:2', 'nginx:2', 'nginx:2', 'nginx:2'],
      'old pods may still terminate; the running ones are the new template',
    );
    const history = replicaSetsOf(ns, 'web').map((rs) => [
      rs.metadata.annotations!['deployment.kubernetes.io/revision'],
      rs.spec.template.spec.containers[0].image,
      rs.spec.replicas,
    ]);
    assert.deepEqual(history.sort(), [
      ['1', 'nginx:1', 0],
      ['2', 'nginx:2', 4],
    ]);

    // kubectl rollout undo: the old ReplicaSet's template, put back by a JSON patch, becomes revision 3.
    const old = replicaSetsOf(ns, 'web').find((rs) => rs.metadata.annotations!['deployment.kubernetes.io/revision'] === '1')!;
    const template = structuredClone(old.spec.template);
    delete template.metadata.labels!['pod-template-hash'];
    template.metadata.creationTimestamp = null;
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/deployments/web`,
      [{op: 'replace', path: '/spec/template', value: template}],
      'application/json-patch+json',
    );
    for (let i = 0; i < 10; i++) await kubeletRound(ns);
    const after = server.store.get('replicasets', ns, old.metadata.name);
    assert.equal(
      after.metadata.annotations!['deployment.kubernetes.io/revision'],
      '3',
      'the rolled-back ReplicaSet is the newest revision',
    );
    assert.equal(after.spec.replicas, 4);
    assert.equal(server.store.get('deployments', ns, 'web').metadata.annotations!['deployment.kubernetes.io/revision'], '3');
    assert.equal(replicaSetsOf(ns, 'web').length, 2, 'no third ReplicaSet for a template seen before');
    const reasons = (await ok('GET', `/api/v1/namespaces/${ns}/events`)).items.map((e: any) => e.message);
    assert.ok(
      reasons.some((m: string) => /^Scaled up replica set web-\w+ from 0 to 1$/.test(m)),
      reasons.join('\n'),
    );
  });

  it('a paused Deployment keeps its ReplicaSets until resumed', async () => {
    const ns = await namespace();
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, deployment('web', 2));
    await kubeletRound(ns);
    await ok('PATCH', `/apis/apps/v1/namespaces/${ns}/deployments/web`, {spec: {paused: true}}, 'application/merge-patch+json');
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/deployments/web`,
      {spec: {template: {spec: {containers: [{name: 'web', image: 'nginx:2'}]}}}},
      'application/strategic-merge-patch+json',
    );
    await kubeletRound(ns);
    assert.equal(replicaSetsOf(ns, 'web').length, 1, 'no new ReplicaSet while paused');
    const progressing = server.store.get('deployments', ns, 'web').status.conditions.find((c: any) => c.type === 'Progressing');
    assert.deepEqual([progressing.status, progressing.reason], ['Unknown', 'DeploymentPaused']);
    await ok('PATCH', `/apis/apps/v1/namespaces/${ns}/deployments/web`, {spec: {paused: false}}, 'application/merge-patch+json');
    for (let i = 0; i < 6; i++) await kubeletRound(ns);
    const images = pods(ns)
      .filter((p) => !p.metadata.deletionTimestamp)
      .map((p) => p.spec.containers[0].image);
    assert.deepEqual(images, ['nginx:2', 'nginx:2'], 'resumed, the rollout happens');
  });

  it('deletes what an object owns when it goes (background), and keeps it with propagationPolicy Orphan', async () => {
    const ns = await namespace();
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, deployment('gone', 2));
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, deployment('kept', 2));
    await kubeletRound(ns);
    await ok('DELETE', `/apis/apps/v1/namespaces/${ns}/deployments/gone`, {propagationPolicy: 'Background'});
    await ok('DELETE', `/apis/apps/v1/namespaces/${ns}/deployments/kept`, {propagationPolicy: 'Orphan'});
    await kubeletRound(ns);
    await kubeletRound(ns);
    assert.equal(replicaSetsOf(ns, 'gone').length, 0);
    assert.equal(pods(ns, 'app=gone').length, 0, 'the ReplicaSet went, and its pods with it');
    const [kept] = replicaSetsOf(ns, 'kept');
    assert.equal(kept.metadata.ownerReferences, undefined, 'the orphaned ReplicaSet lost its owner reference');
    assert.equal(pods(ns, 'app=kept').length, 2);
  });

  it('refuses Deployments kube-apiserver refuses, with its messages', async () => {
    const ns = await namespace();
    const mismatch = deployment('bad', 1);
    mismatch.spec.template.metadata.labels = {app: 'other'};
    const answer = await api('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, mismatch);
    assert.equal(answer.status, 422);
    assert.match(answer.body.message, /spec.template.metadata.labels: Invalid value: .*`selector` does not match template `labels`/);
    const zero = deployment('zero', 1, {strategy: {type: 'RollingUpdate', rollingUpdate: {maxSurge: 0, maxUnavailable: 0}}});
    assert.equal((await api('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, zero)).status, 422);
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/deployments`, deployment('fixed', 0));
    const moved = await api(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/deployments/fixed`,
      {spec: {selector: {matchLabels: {app: 'x'}}, template: {metadata: {labels: {app: 'x'}}}}},
      'application/merge-patch+json',
    );
    assert.equal(moved.status, 422);
    assert.match(moved.body.message, /spec.selector: Invalid value: .*field is immutable/);
  });

  it('counts an event that happens again, and removes events not seen for the event TTL', async () => {
    const ns = await namespace();
    let now = Date.parse('2030-01-01T00:00:00Z');
    const recorder = new EventRecorder(server.store, () => now);
    const pod = server.store.create('pods', {metadata: {name: 'p'}, spec: {containers: [{name: 'c', image: 'x'}]}}, ns);
    recorder.record({component: 'kubelet', host: 'node-0'}, pod, 'Warning', 'BackOff', 'Back-off restarting failed container');
    now += 5000;
    recorder.record({component: 'kubelet', host: 'node-0'}, pod, 'Warning', 'BackOff', 'Back-off restarting failed container');
    const [counted] = server.store
      .list('events', {namespace: ns, fieldSelector: 'involvedObject.name=p'})
      .items.filter((e) => e.reason === 'BackOff');
    assert.deepEqual([counted.count, counted.firstTimestamp, counted.lastTimestamp], [2, '2030-01-01T00:00:00Z', '2030-01-01T00:00:05Z']);
    now += eventTtlMs + 60_000;
    recorder.record({component: 'kubelet', host: 'node-0'}, pod, 'Normal', 'Started', 'Started container c');
    const left = server.store
      .list('events', {namespace: ns})
      .items.filter((e) => e.involvedObject.name === 'p')
      .map((e) => e.reason);
    assert.deepEqual(left, ['Started'], 'the BackOff event, last seen over an hour ago, is gone');
  });

  it('answers pods/log as kube-apiserver does for a container no kubelet has started', async () => {
    const ns = await namespace();
    await ok('POST', `/api/v1/namespaces/${ns}/pods`, {
      metadata: {name: 'two'},
      spec: {
        containers: [
          {name: 'a', image: 'x'},
          {name: 'b', image: 'y'},
        ],
      },
    });
    const choose = await api('GET', `/api/v1/namespaces/${ns}/pods/two/log`);
    assert.equal(choose.status, 400);
    assert.equal(choose.body.message, 'a container name must be specified for pod two, choose one of: [a b]');
    const waiting = await api('GET', `/api/v1/namespaces/${ns}/pods/two/log?container=a`);
    assert.equal(waiting.body.message, 'container "a" in pod "two" is waiting to start: ContainerCreating');
    const wrong = await api('GET', `/api/v1/namespaces/${ns}/pods/two/log?container=c`);
    assert.equal(wrong.body.message, 'container c is not valid for pod two');
  });
});
