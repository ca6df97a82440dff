// apps/v1 DaemonSets in the lab API server: one pod per fitting node, bound by the scheduler through
// node affinity; replacement, new nodes, nodes that stop fitting; rolling updates within
// maxUnavailable or maxSurge, OnDelete; validation; ControllerRevisions; and today's kubectl
// (apply of manifests/observe/, get, rollout status|restart|history|undo, delete). No kubelet runs
// here: where a pod must turn Ready, the test writes its status through pods/status as a kubelet does.
import assert from 'node:assert/strict';
import {randomBytes} from 'node:crypto';
import {mkdtemp, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {after, before, describe, it} from 'node:test';
import {AppsV1Api, KubeConfig, PatchStrategy, setHeaderOptions, type V1DaemonSet} from '@kubernetes/client-node';
import {execa} from 'execa';
import {currentKubectl} from '../../../scripts/current-kubectl.ts';
import type {KubeObject} from '../../../src/lab/apiserver/object-log.ts';
import {decodeProtobufObject} from '../../../src/lab/apiserver/protobuf-codec.ts';
import {type ApiServer, startApiServer} from '../../../src/lab/apiserver/server.ts';

const repo = fileURLToPath(new URL('../../../', import.meta.url));

let server: ApiServer;

async function api(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<{status: number; body: any}> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: {authorization: `Bearer ${server.adminToken}`, ...(body !== undefined ? {'content-type': contentType} : {})},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return {status: response.status, body: await response.json()};
}

async function ok(method: string, path: string, body?: unknown, contentType?: string): Promise<any> {
  const answer = await api(method, path, body, contentType);
  assert.ok(answer.status < 300, `${method} ${path}: ${answer.status} ${JSON.stringify(answer.body)}`);
  return answer.body;
}

const mergePatch = 'application/merge-patch+json';
const strategicPatch = 'application/strategic-merge-patch+json';

async function namespace(): Promise<string> {
  const name = `ds-${randomBytes(4).toString('hex')}`;
  await ok('POST', '/api/v1/namespaces', {metadata: {name}});
  return name;
}

function addNode(name: string, labels: Record<string, string>, spec: Record<string, unknown> = {}): void {
  const node = {
    metadata: {name, labels: {'kubernetes.io/hostname': name, ...labels}},
    spec,
    status: {conditions: [{type: 'Ready', status: 'True'}]},
  };
  server.store.create('nodes', node, undefined, {keepStatus: true});
}

/** Pods not being deleted, by node. */
function podsByNode(ns: string): Map<string, KubeObject[]> {
  const byNode = new Map<string, KubeObject[]>();
  for (const pod of server.store.list('pods', {namespace: ns}).items) {
    if (pod.metadata.deletionTimestamp) continue;
    const node = pod.spec.nodeName ?? '<unbound>';
    byNode.set(node, [...(byNode.get(node) ?? []), pod]);
  }
  return byNode;
}

function daemonSet(name: string, spec: Record<string, unknown> = {}, podSpec: Record<string, unknown> = {}): KubeObject {
  return {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: {name},
    spec: {
      selector: {matchLabels: {app: name}},
      template: {metadata: {labels: {app: name}}, spec: {containers: [{name: 'agent', image: 'agent:1'}], ...podSpec}},
      ...spec,
    },
  };
}

function status(ns: string, name: string): Record<string, number> {
  return server.store.get('daemonsets', ns, name).status;
}

/** What a kubelet reports once a bound pod's container runs and is ready. */
async function reportReady(pod: KubeObject): Promise<void> {
  const now = new Date().toISOString();
  await ok('PUT', `/api/v1/namespaces/${pod.metadata.namespace}/pods/${pod.metadata.name}/status`, {
    ...pod,
    status: {
      phase: 'Running',
      podIP: '10.244.9.9',
      conditions: [
        {type: 'Ready', status: 'True', lastTransitionTime: now},
        {type: 'PodScheduled', status: 'True', lastTransitionTime: now},
      ],
    },
  });
}

/** Plays the kubelet of every node: bound pods turn Ready; pods being deleted go. */
async function kubeletRound(ns: string): Promise<void> {
  await server.settle();
  for (const pod of server.store.list('pods', {namespace: ns}).items) {
    if (!pod.spec.nodeName) continue;
    if (pod.metadata.deletionTimestamp) await ok('DELETE', `/api/v1/namespaces/${ns}/pods/${pod.metadata.name}?gracePeriodSeconds=0`);
    else if (pod.status?.phase !== 'Running') await reportReady(pod);
  }
  await server.settle();
}

async function messages(ns: string, reason: string): Promise<string[]> {
  const events = (await ok('GET', `/api/v1/namespaces/${ns}/events`)).items;
  return events.filter((e: any) => e.reason === reason).map((e: any) => e.message);
}

describe('lab API server DaemonSets', () => {
  before(async () => {
    server = await startApiServer({port: 0});
    addNode('node-0', {disk: 'ssd'});
    addNode('node-1', {disk: 'ssd'});
    addNode('node-2', {disk: 'hdd'});
  });
  after(async () => {
    await server?.stop();
  });

  it('runs one pod on each node its nodeSelector matches, bound by the scheduler, and reports status', async () => {
    const ns = await namespace();
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('agent', {}, {nodeSelector: {disk: 'ssd'}}));
    await server.settle();
    const byNode = podsByNode(ns);
    assert.deepEqual([...byNode.keys()].sort(), ['node-0', 'node-1'], 'one pod per ssd node, bound');
    const pod = byNode.get('node-0')![0];
    assert.match(pod.metadata.name, /^agent-[a-z0-9]{5}$/);
    assert.deepEqual(
      pod.metadata.ownerReferences!.map((ref) => [ref.kind, ref.name, ref.controller]),
      [['DaemonSet', 'agent', true]],
    );
    assert.equal(pod.metadata.labels!['pod-template-generation'], '1');
    const [revision] = server.store.list('controllerrevisions', {namespace: ns}).items;
    assert.equal(pod.metadata.labels!['controller-revision-hash'], revision.metadata.labels!['controller-revision-hash']);
    assert.equal(revision.metadata.name, `agent-${pod.metadata.labels!['controller-revision-hash']}`);
    assert.equal(revision.revision, 1);
    assert.deepEqual(pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution, {
      nodeSelectorTerms: [{matchFields: [{key: 'metadata.name', operator: 'In', values: ['node-0']}]}],
    });
    assert.deepEqual(
      pod.spec.tolerations.map((t: any) => `${t.key}:${t.operator}:${t.effect}`),
      [
        'node.kubernetes.io/not-ready:Exists:NoExecute',
        'node.kubernetes.io/unreachable:Exists:NoExecute',
        'node.kubernetes.io/disk-pressure:Exists:NoSchedule',
        'node.kubernetes.io/memory-pressure:Exists:NoSchedule',
        'node.kubernetes.io/pid-pressure:Exists:NoSchedule',
        'node.kubernetes.io/unschedulable:Exists:NoSchedule',
      ],
    );
    assert.ok((await messages(ns, 'Scheduled')).includes(`Successfully assigned ${ns}/${pod.metadata.name} to node-0`));
    assert.equal((await messages(ns, 'SuccessfulCreate')).length, 2);
    assert.deepEqual(status(ns, 'agent'), {
      currentNumberScheduled: 2,
      numberMisscheduled: 0,
      desiredNumberScheduled: 2,
      numberReady: 0,
      observedGeneration: 1,
      updatedNumberScheduled: 2,
      numberUnavailable: 2,
    });
    await kubeletRound(ns);
    assert.deepEqual(status(ns, 'agent'), {
      currentNumberScheduled: 2,
      numberMisscheduled: 0,
      desiredNumberScheduled: 2,
      numberReady: 2,
      observedGeneration: 1,
      updatedNumberScheduled: 2,
      numberAvailable: 2,
    });

    // A deleted pod comes back on its node once it is gone.
    await ok('DELETE', `/api/v1/namespaces/${ns}/pods/${pod.metadata.name}`);
    await server.settle();
    assert.equal(podsByNode(ns).get('node-0'), undefined, 'no second pod while the first terminates');
    await kubeletRound(ns);
    const [replacement] = podsByNode(ns).get('node-0')!;
    assert.notEqual(replacement.metadata.name, pod.metadata.name);
    assert.ok((await messages(ns, 'SuccessfulCreate')).includes(`Created pod: ${replacement.metadata.name}`));

    // A new node that matches gets one; a node that stops matching loses it; a node that goes loses it too.
    addNode('node-3', {disk: 'ssd'});
    await kubeletRound(ns);
    assert.equal(podsByNode(ns).get('node-3')?.length, 1);
    assert.equal(status(ns, 'agent').desiredNumberScheduled, 3);
    await ok('PATCH', '/api/v1/nodes/node-3', {metadata: {labels: {disk: null}}}, mergePatch);
    await server.settle();
    assert.equal(podsByNode(ns).get('node-3'), undefined, 'the pod on node-3 is being deleted');
    assert.equal(status(ns, 'agent').numberMisscheduled, 1, 'counted misscheduled while it terminates');
    await kubeletRound(ns);
    assert.deepEqual(
      [status(ns, 'agent').desiredNumberScheduled, status(ns, 'agent').numberMisscheduled, status(ns, 'agent').numberAvailable],
      [2, 0, 2],
    );
    await ok('PATCH', '/api/v1/nodes/node-3', {metadata: {labels: {disk: 'ssd'}}}, mergePatch);
    await kubeletRound(ns);
    assert.equal(podsByNode(ns).get('node-3')?.length, 1);
    await ok('DELETE', '/api/v1/nodes/node-3');
    await server.settle();
    assert.equal(podsByNode(ns).get('node-3'), undefined, 'the pod of a deleted node goes');
    assert.equal(status(ns, 'agent').desiredNumberScheduled, 2);

    // Deleting the DaemonSet deletes its pods and revisions (background garbage collection).
    await ok('DELETE', `/apis/apps/v1/namespaces/${ns}/daemonsets/agent`);
    await kubeletRound(ns);
    assert.equal(server.store.list('pods', {namespace: ns}).items.length, 0);
    assert.equal(server.store.list('controllerrevisions', {namespace: ns}).items.length, 0);
  });

  it('runs on cordoned nodes, not on nodes with a taint it does not tolerate, and replaces a failed pod', async () => {
    const ns = await namespace();
    await ok('PATCH', '/api/v1/nodes/node-1', {spec: {unschedulable: true}}, mergePatch);
    await ok('PATCH', '/api/v1/nodes/node-2', {spec: {taints: [{key: 'dedicated', value: 'infra', effect: 'NoSchedule'}]}}, mergePatch);
    try {
      await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('plain'));
      await ok(
        'POST',
        `/apis/apps/v1/namespaces/${ns}/daemonsets`,
        daemonSet('tolerant', {}, {hostNetwork: true, tolerations: [{key: 'dedicated', operator: 'Exists', effect: 'NoSchedule'}]}),
      );
      await kubeletRound(ns);
      const nodesOf = (app: string) =>
        server.store
          .list('pods', {namespace: ns, labelSelector: `app=${app}`})
          .items.map((p) => p.spec.nodeName)
          .sort();
      assert.deepEqual(nodesOf('plain'), ['node-0', 'node-1'], 'the cordoned node-1 too, not the tainted node-2');
      assert.deepEqual(nodesOf('tolerant'), ['node-0', 'node-1', 'node-2']);
      const [tolerant] = server.store.list('pods', {namespace: ns, labelSelector: 'app=tolerant'}).items;
      assert.deepEqual(
        tolerant.spec.tolerations.map((t: any) => t.key),
        [
          'dedicated',
          'node.kubernetes.io/not-ready',
          'node.kubernetes.io/unreachable',
          'node.kubernetes.io/disk-pressure',
          'node.kubernetes.io/memory-pressure',
          'node.kubernetes.io/pid-pressure',
          'node.kubernetes.io/unschedulable',
          'node.kubernetes.io/network-unavailable',
        ],
        'a hostNetwork daemon tolerates network-unavailable too',
      );

      // A pod that failed is deleted (with a FailedDaemonPod warning) and replaced on its node.
      const [failing] = server.store.list('pods', {namespace: ns, labelSelector: 'app=plain', fieldSelector: 'spec.nodeName=node-0'}).items;
      await ok('PUT', `/api/v1/namespaces/${ns}/pods/${failing.metadata.name}/status`, {...failing, status: {phase: 'Failed'}});
      await kubeletRound(ns);
      const [replaced] = server.store.list('pods', {
        namespace: ns,
        labelSelector: 'app=plain',
        fieldSelector: 'spec.nodeName=node-0',
      }).items;
      assert.notEqual(replaced.metadata.name, failing.metadata.name);
      assert.deepEqual(await messages(ns, 'FailedDaemonPod'), [
        `Found failed daemon pod ${ns}/${failing.metadata.name} on node node-0, will try to kill it`,
      ]);
      assert.ok((await messages(ns, 'SuccessfulDelete')).includes(`Deleted pod: ${failing.metadata.name}`));
    } finally {
      await ok('PATCH', '/api/v1/nodes/node-1', {spec: {unschedulable: null}}, mergePatch);
      await ok('PATCH', '/api/v1/nodes/node-2', {spec: {taints: null}}, mergePatch);
      await ok('DELETE', `/apis/apps/v1/namespaces/${ns}/daemonsets/plain`);
      await ok('DELETE', `/apis/apps/v1/namespaces/${ns}/daemonsets/tolerant`);
    }
  });

  it("honours the template's required node affinity, which the daemon pods' node term replaces", async () => {
    const ns = await namespace();
    const affinity = {
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: [{matchExpressions: [{key: 'disk', operator: 'NotIn', values: ['ssd']}]}],
        },
        preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, preference: {matchExpressions: [{key: 'disk', operator: 'Exists'}]}}],
      },
    };
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('picky', {}, {affinity}));
    // A plain pod with the same affinity is bound by the scheduler to the one node it allows.
    await ok('POST', `/api/v1/namespaces/${ns}/pods`, {metadata: {name: 'plain'}, spec: {affinity, containers: [{name: 'c', image: 'x'}]}});
    await server.settle();
    assert.equal(server.store.get('pods', ns, 'plain').spec.nodeName, 'node-2');
    const [daemon] = server.store.list('pods', {namespace: ns, labelSelector: 'app=picky'}).items;
    assert.equal(daemon.spec.nodeName, 'node-2');
    assert.deepEqual(daemon.spec.affinity.nodeAffinity, {
      ...affinity.nodeAffinity,
      requiredDuringSchedulingIgnoredDuringExecution: {
        nodeSelectorTerms: [{matchFields: [{key: 'metadata.name', operator: 'In', values: ['node-2']}]}],
      },
    });
    assert.equal(status(ns, 'picky').desiredNumberScheduled, 1);
  });

  it('rolls a new template out at most maxUnavailable nodes at a time (rounded up), with revisions', async () => {
    const ns = await namespace();
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('roll'));
    await kubeletRound(ns);
    const first = server.store.list('pods', {namespace: ns}).items.map((p) => p.metadata.name);
    assert.equal(first.length, 3);
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/daemonsets/roll`,
      {spec: {template: {spec: {containers: [{name: 'agent', image: 'agent:2'}]}}}},
      strategicPatch,
    );
    const ds = server.store.get('daemonsets', ns, 'roll');
    assert.deepEqual([ds.metadata.generation, ds.metadata.annotations!['deprecated.daemonset.template.generation']], [2, '2']);
    let rounds = 0;
    for (;;) {
      await server.settle();
      // Nodes without an available pod: none ready, or only one being deleted.
      const down = ['node-0', 'node-1', 'node-2'].filter(
        (node) => !(podsByNode(ns).get(node) ?? []).some((p) => p.status?.phase === 'Running'),
      );
      assert.ok(down.length <= 1, `at most maxUnavailable (1) node without an available pod: ${down}`);
      const current = status(ns, 'roll');
      if (current.updatedNumberScheduled === 3 && current.numberAvailable === 3 && current.observedGeneration === 2) break;
      assert.ok(++rounds < 20, `rollout finished: ${JSON.stringify(current)}`);
      await kubeletRound(ns);
    }
    const pods = server.store.list('pods', {namespace: ns}).items;
    assert.deepEqual(
      pods.map((p) => [p.spec.containers[0].image, p.metadata.labels!['pod-template-generation']]),
      [
        ['agent:2', '2'],
        ['agent:2', '2'],
        ['agent:2', '2'],
      ],
    );
    assert.ok(pods.every((p) => !first.includes(p.metadata.name)));
    const revisions = server.store
      .list('controllerrevisions', {namespace: ns})
      .items.map((r) => [r.revision, r.data.spec.template.spec.containers[0].image]);
    assert.deepEqual(revisions.sort(), [
      [1, 'agent:1'],
      [2, 'agent:2'],
    ]);

    // maxUnavailable 50% of 3 nodes is 2 (rounded up, as kube-controller-manager does for DaemonSets).
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/daemonsets/roll`,
      {
        spec: {
          updateStrategy: {rollingUpdate: {maxUnavailable: '50%'}},
          template: {spec: {containers: [{name: 'agent', image: 'agent:3'}]}},
        },
      },
      strategicPatch,
    );
    await server.settle();
    const deleting = server.store.list('pods', {namespace: ns}).items.filter((p) => p.metadata.deletionTimestamp);
    assert.equal(deleting.length, 2);
  });

  it('surges: a new pod beside the old one, which goes once the new one is available', async () => {
    const ns = await namespace();
    const updateStrategy = {type: 'RollingUpdate', rollingUpdate: {maxSurge: 1, maxUnavailable: 0}};
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('surge', {updateStrategy}));
    await kubeletRound(ns);
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/daemonsets/surge`,
      {spec: {template: {metadata: {annotations: {v: '2'}}}}},
      strategicPatch,
    );
    await server.settle();
    const doubled = [...podsByNode(ns)].filter(([, pods]) => pods.length === 2);
    assert.equal(doubled.length, 1, 'one node (maxSurge 1) has its new pod beside the old one');
    let rounds = 0;
    for (;;) {
      const byNode = podsByNode(ns);
      for (const node of ['node-0', 'node-1', 'node-2'])
        assert.ok(
          (byNode.get(node) ?? []).some((p) => p.status?.phase === 'Running'),
          `${node} always has an available pod`,
        );
      const current = status(ns, 'surge');
      if (current.updatedNumberScheduled === 3 && current.numberAvailable === 3 && [...byNode.values()].every((pods) => pods.length === 1))
        break;
      assert.ok(++rounds < 20, `rollout finished: ${JSON.stringify(current)}`);
      await kubeletRound(ns);
    }
    assert.ok(
      [...podsByNode(ns).values()].flat().every((p) => p.metadata.annotations?.v === '2'),
      'the running pods are the new template',
    );
  });

  it('OnDelete: a template change waits for the user to delete pods', async () => {
    const ns = await namespace();
    await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('manual', {updateStrategy: {type: 'OnDelete'}}));
    await kubeletRound(ns);
    assert.deepEqual(server.store.get('daemonsets', ns, 'manual').spec.updateStrategy, {type: 'OnDelete'});
    await ok(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/daemonsets/manual`,
      {spec: {template: {spec: {containers: [{name: 'agent', image: 'agent:2'}]}}}},
      strategicPatch,
    );
    await kubeletRound(ns);
    await kubeletRound(ns);
    const images = () =>
      server.store
        .list('pods', {namespace: ns})
        .items.map((p) => p.spec.containers[0].image)
        .sort();
    assert.deepEqual(images(), ['agent:1', 'agent:1', 'agent:1'], 'nothing rolls by itself');
    assert.equal(status(ns, 'manual').updatedNumberScheduled, undefined, 'no pod is up to date (0 is left out)');
    const [one] = server.store.list('pods', {namespace: ns}).items;
    await ok('DELETE', `/api/v1/namespaces/${ns}/pods/${one.metadata.name}`);
    await kubeletRound(ns);
    await kubeletRound(ns);
    assert.deepEqual(images(), ['agent:1', 'agent:1', 'agent:2'], 'the deleted pod came back with the new template');
    assert.equal(status(ns, 'manual').updatedNumberScheduled, 1);
  });

  it('is served to @kubernetes/client-node: create, patch, read status, list, delete', async () => {
    const ns = await namespace();
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    const apps = kc.makeApiClient(AppsV1Api);
    const created = await apps.createNamespacedDaemonSet({
      namespace: ns,
      body: daemonSet('client', {}, {nodeSelector: {disk: 'hdd'}}) as V1DaemonSet,
    });
    assert.equal(created.spec?.updateStrategy?.type, 'RollingUpdate');
    await kubeletRound(ns);
    const read = await apps.readNamespacedDaemonSetStatus({name: 'client', namespace: ns});
    assert.deepEqual(
      [read.status?.desiredNumberScheduled, read.status?.numberReady, read.status?.numberAvailable, read.status?.observedGeneration],
      [1, 1, 1, 1],
    );
    const patched = await apps.patchNamespacedDaemonSet(
      {name: 'client', namespace: ns, body: {spec: {template: {spec: {containers: [{name: 'agent', image: 'agent:2'}]}}}}},
      setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
    );
    assert.equal(patched.metadata?.generation, 2);
    for (let i = 0; i < 4; i++) await kubeletRound(ns);
    const listed = await apps.listDaemonSetForAllNamespaces({fieldSelector: `metadata.namespace=${ns}`});
    assert.deepEqual(
      listed.items.map((ds) => [ds.metadata?.name, ds.status?.updatedNumberScheduled, ds.status?.numberAvailable]),
      [['client', 1, 1]],
    );
    const revisions = await apps.listNamespacedControllerRevision({namespace: ns});
    assert.deepEqual(revisions.items.map((r) => r.revision).sort(), [1, 2]);
    await apps.deleteNamespacedDaemonSet({name: 'client', namespace: ns});
    await kubeletRound(ns);
    assert.equal(server.store.list('pods', {namespace: ns}).items.length, 0);
  });

  it('defaults DaemonSets and refuses what kube-apiserver refuses, naming the field', async () => {
    const ns = await namespace();
    const created = await ok('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, daemonSet('good'));
    assert.deepEqual(created.spec.updateStrategy, {type: 'RollingUpdate', rollingUpdate: {maxUnavailable: 1, maxSurge: 0}});
    assert.equal(created.spec.revisionHistoryLimit, 10);
    assert.equal(created.spec.replicas, undefined);
    assert.equal(created.spec.template.spec.restartPolicy, 'Always');
    assert.equal(created.metadata.annotations['deprecated.daemonset.template.generation'], '1');
    assert.deepEqual(created.status, {currentNumberScheduled: 0, numberMisscheduled: 0, desiredNumberScheduled: 0, numberReady: 0});

    const refused = async (body: KubeObject) => {
      const answer = await api('POST', `/apis/apps/v1/namespaces/${ns}/daemonsets`, body);
      assert.equal(answer.status, 422, JSON.stringify(answer.body));
      return {message: answer.body.message as string, fields: answer.body.details.causes.map((c: any) => c.field)};
    };
    const noSelector = daemonSet('no-selector');
    delete noSelector.spec.selector;
    // kube-apiserver's words: a DaemonSet without a selector selects nothing, so its template's labels do not match.
    const missing = await refused(noSelector);
    assert.deepEqual(missing.fields, ['spec.template.metadata.labels']);
    assert.match(missing.message, /`selector` does not match template `labels`/);
    const mismatched = daemonSet('mismatched');
    mismatched.spec.template.metadata.labels = {app: 'other'};
    assert.equal(
      (await refused(mismatched)).message,
      'DaemonSet.apps "mismatched" is invalid: spec.template.metadata.labels: Invalid value: {"app":"other"}: `selector` does not match template `labels`',
    );
    const empty = await refused(daemonSet('empty', {selector: {}}));
    assert.match(empty.message, /spec.selector: Invalid value: \{\}: empty selector is invalid for daemonset/);
    assert.equal(
      (await refused(daemonSet('never', {}, {restartPolicy: 'Never'}))).message,
      'DaemonSet.apps "never" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"',
    );
    const both = await refused(daemonSet('both', {updateStrategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 1}}}));
    assert.match(
      both.message,
      /spec.updateStrategy.rollingUpdate.maxSurge: Invalid value: 1: may not be set when maxUnavailable is non-zero/,
    );
    const neither = await refused(daemonSet('neither', {updateStrategy: {rollingUpdate: {maxSurge: 0, maxUnavailable: '0%'}}}));
    assert.deepEqual(neither.fields, ['spec.updateStrategy.rollingUpdate.maxUnavailable']);
    assert.match(neither.message, /Required value: cannot be 0 when maxSurge is 0/);
    const strategy = await refused(daemonSet('strategy', {updateStrategy: {type: 'Recreate'}}));
    assert.deepEqual(strategy.fields, ['spec.updateStrategy']);
    assert.match(strategy.message, /supported values: "RollingUpdate", "OnDelete"/);

    const moved = await api(
      'PATCH',
      `/apis/apps/v1/namespaces/${ns}/daemonsets/good`,
      {spec: {selector: {matchLabels: {app: 'x'}}, template: {metadata: {labels: {app: 'x'}}}}},
      mergePatch,
    );
    assert.equal(moved.status, 422);
    assert.match(moved.body.message, /spec.selector: Invalid value: .*field is immutable/);
  });
});

describe('DaemonSets in protobuf, as Go clients send them', () => {
  const varint = (n: number): Buffer => {
    const out: number[] = [];
    for (; n > 0x7f; n = Math.floor(n / 128)) out.push((n & 0x7f) | 0x80);
    out.push(n);
    return Buffer.from(out);
  };
  const bytes = (field: number, body: Buffer) => Buffer.concat([varint((field << 3) | 2), varint(body.length), body]);
  const str = (field: number, text: string) => bytes(field, Buffer.from(text));
  const int = (field: number, n: number) => Buffer.concat([varint(field << 3), varint(n)]);
  const msg = (field: number, ...parts: Buffer[]) => bytes(field, Buffer.concat(parts));
  const label = (field: number, key: string, value: string) => msg(field, str(1, key), str(2, value));

  it('reads inline embeddings (a probe handler, a volume source), zero bounds and the status counts Go writes', () => {
    const probe = msg(11, msg(1, msg(2, str(1, '/healthz'), msg(2, int(2, 10271)))), int(4, 10));
    const container = Buffer.concat([str(1, 'agent'), str(2, 'agent:1'), probe]);
    const volume = msg(1, str(1, 'tmp'), msg(2, msg(2)));
    const template = Buffer.concat([msg(1, label(11, 'app', 'agent')), msg(2, volume, msg(2, container))]);
    const strategy = msg(3, str(1, 'RollingUpdate'), msg(2, msg(1, int(2, 0)), msg(2, int(2, 1))));
    const spec = Buffer.concat([msg(1, label(1, 'app', 'agent')), msg(2, template), strategy, int(4, 0), int(6, 0)]);
    const status = msg(3, int(1, 0), int(2, 0), int(3, 0), int(4, 0), int(6, 0));
    const raw = Buffer.concat([msg(1, str(1, 'agent')), msg(2, spec), status]);
    const envelope = Buffer.concat([Buffer.from('k8s\0', 'latin1'), msg(1, str(1, 'apps/v1'), str(2, 'DaemonSet')), bytes(2, raw)]);
    assert.deepEqual(decodeProtobufObject(envelope), {
      apiVersion: 'apps/v1',
      kind: 'DaemonSet',
      metadata: {name: 'agent'},
      spec: {
        selector: {matchLabels: {app: 'agent'}},
        template: {
          metadata: {labels: {app: 'agent'}},
          spec: {
            volumes: [{name: 'tmp', emptyDir: {}}],
            containers: [{name: 'agent', image: 'agent:1', readinessProbe: {httpGet: {path: '/healthz', port: 10271}, periodSeconds: 10}}],
          },
        },
        updateStrategy: {type: 'RollingUpdate', rollingUpdate: {maxUnavailable: 0, maxSurge: 1}},
        revisionHistoryLimit: 0,
      },
      status: {currentNumberScheduled: 0, numberMisscheduled: 0, desiredNumberScheduled: 0, numberReady: 0},
    });
  });
});

describe('kubectl 1.34 and DaemonSets', () => {
  let dir: string;
  const kubectl = async (...args: string[]) => {
    const r = await execa(currentKubectl(), ['--kubeconfig', join(dir, 'kubeconfig'), ...args], {
      env: {HOME: dir},
      extendEnv: false,
      reject: false,
      timeout: 30000,
    });
    return {stdout: String(r.stdout), stderr: String(r.stderr), exitCode: r.exitCode ?? -1};
  };
  const run = async (...args: string[]) => {
    const r = await kubectl(...args);
    assert.equal(r.exitCode, 0, `kubectl ${args.join(' ')}: ${r.stderr}`);
    return r.stdout;
  };
  /** kubectl's columns as objects keyed by header. */
  const rows = (text: string): Array<Record<string, string>> => {
    const [header, ...lines] = text.trim().split('\n');
    const starts = [...header.matchAll(/\S+(?: \S+)*/g)].map((m) => m.index!);
    const names = starts.map((s, i) => header.slice(s, starts[i + 1]).trim());
    return lines.map((line) => Object.fromEntries(names.map((n, i) => [n, line.slice(starts[i], starts[i + 1]).trim()])));
  };

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'proxyctl-kubectl-ds-'));
    server = await startApiServer({port: 0});
    await server.writeKubeconfig(join(dir, 'kubeconfig'));
    for (const name of ['node-0', 'node-1', 'node-2']) addNode(name, {'kubernetes.io/os': 'linux'});
  });
  after(async () => {
    await server?.stop();
    if (dir) await rm(dir, {recursive: true, force: true});
  });

  it('applies manifests/observe/ (ServiceAccount, RBAC, DaemonSet) and applies it again unchanged', async () => {
    const first = await run('apply', '-f', join(repo, 'manifests/observe/'));
    assert.deepEqual(first.trim().split('\n'), [
      'daemonset.apps/proxyctl-observer created',
      'serviceaccount/proxyctl-observer created',
      'clusterrole.rbac.authorization.k8s.io/proxyctl-observer created',
      'clusterrolebinding.rbac.authorization.k8s.io/proxyctl-observer created',
      'role.rbac.authorization.k8s.io/proxyctl-observer created',
      'rolebinding.rbac.authorization.k8s.io/proxyctl-observer created',
    ]);
    const second = await run('apply', '-f', join(repo, 'manifests/observe/'));
    assert.deepEqual(
      second.trim().split('\n'),
      first
        .trim()
        .split('\n')
        .map((line) => line.replace(/created$/, 'unchanged')),
    );
    await server.settle();
    const pods = server.store.list('pods', {namespace: 'kube-system', labelSelector: 'app.kubernetes.io/component=observer'}).items;
    assert.deepEqual(pods.map((p) => p.spec.nodeName).sort(), ['node-0', 'node-1', 'node-2']);
    assert.ok(pods.every((p) => p.spec.hostNetwork === true && p.spec.serviceAccountName === 'proxyctl-observer'));
  });

  it('prints DaemonSets with their counts, waits for a rollout, restarts it, and shows and undoes its history', async () => {
    const table = rows(await run('get', 'ds', '-n', 'kube-system'));
    assert.deepEqual(table, [
      {
        NAME: 'proxyctl-observer',
        DESIRED: '3',
        CURRENT: '3',
        READY: '0',
        'UP-TO-DATE': '3',
        AVAILABLE: '0',
        'NODE SELECTOR': 'kubernetes.io/os=linux',
        AGE: table[0].AGE,
      },
    ]);
    await kubeletRound('kube-system');
    const wide = rows(await run('get', 'daemonsets', '-n', 'kube-system', '-o', 'wide'));
    assert.deepEqual(
      [wide[0].READY, wide[0].AVAILABLE, wide[0].CONTAINERS, wide[0].IMAGES, wide[0].SELECTOR],
      ['3', '3', 'proxyctl-observer', 'proxyctl-agent:0.1.0', 'app.kubernetes.io/component=observer,app.kubernetes.io/name=proxyctl-agent'],
    );
    assert.match(await run('get', 'all', '-n', 'kube-system'), /daemonset\.apps\/proxyctl-observer/);
    assert.equal(
      await run('rollout', 'status', 'ds/proxyctl-observer', '-n', 'kube-system', '--timeout=10s'),
      'daemon set "proxyctl-observer" successfully rolled out',
    );

    assert.equal(
      await run('rollout', 'restart', 'ds/proxyctl-observer', '-n', 'kube-system'),
      'daemonset.apps/proxyctl-observer restarted',
    );
    const rollout = execa(
      currentKubectl(),
      ['--kubeconfig', join(dir, 'kubeconfig'), 'rollout', 'status', 'ds/proxyctl-observer', '-n', 'kube-system', '--timeout=20s'],
      {
        env: {HOME: dir},
        extendEnv: false,
        reject: false,
      },
    );
    for (let i = 0; i < 10; i++) await kubeletRound('kube-system');
    const watched = await rollout;
    assert.equal(watched.exitCode, 0, String(watched.stderr));
    assert.match(String(watched.stdout), /daemon set "proxyctl-observer" successfully rolled out$/);
    const restarted = server.store.list('pods', {namespace: 'kube-system'}).items;
    assert.equal(restarted.length, 3);
    assert.ok(restarted.every((p) => p.metadata.annotations?.['kubectl.kubernetes.io/restartedAt']));

    const history = await run('rollout', 'history', 'ds/proxyctl-observer', '-n', 'kube-system');
    assert.match(history, /^REVISION\s+CHANGE-CAUSE\n1\s+<none>\n2\s+<none>$/m);
    assert.match(
      await run('get', 'controllerrevisions', '-n', 'kube-system'),
      /proxyctl-observer-\w+\s+daemonset\.apps\/proxyctl-observer\s+2\s+/,
    );
    assert.equal(
      await run('rollout', 'undo', 'ds/proxyctl-observer', '-n', 'kube-system', '--to-revision=2'),
      'daemonset.apps/proxyctl-observer skipped rollback (current template already matches revision 2)',
    );
    assert.equal(await run('rollout', 'undo', 'ds/proxyctl-observer', '-n', 'kube-system'), 'daemonset.apps/proxyctl-observer rolled back');
    for (let i = 0; i < 10; i++) await kubeletRound('kube-system');
    const undone = server.store.list('pods', {namespace: 'kube-system'}).items;
    assert.ok(
      undone.every((p) => !p.metadata.annotations?.['kubectl.kubernetes.io/restartedAt']),
      'the template of revision 1 again',
    );
    assert.match(await run('rollout', 'history', 'ds/proxyctl-observer', '-n', 'kube-system'), /^2\s+<none>\n3\s+<none>$/m);

    assert.equal(
      await run('delete', 'ds', 'proxyctl-observer', '-n', 'kube-system'),
      'daemonset.apps "proxyctl-observer" deleted from kube-system namespace',
    );
    await kubeletRound('kube-system');
    assert.deepEqual(server.store.list('pods', {namespace: 'kube-system'}).items, []);
  });
});
