// How a lab kubelet runs a pod of the proxyctl-agent image: which images it recognises, the
// kubelet's $(VAR) expansion of args, and the command it starts: the pod's own args, then the
// node's namespace, the service account's kubeconfig, and each server moved to a loopback port the
// lab chose (the container ports stay the pod's, mapped to those).
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import type {KubeObject} from '../../src/lab/apiserver/object-log.ts';
import {agentLaunch, containerEnv, expandReferences, runsAgentImage} from '../../src/lab/kubelet/agent-container.ts';

function observerPod(args: string[], image = 'proxyctl-agent:0.1.0'): KubeObject {
  return {
    metadata: {name: 'proxyctl-observer-x7k2p', namespace: 'kube-system', uid: 'u-1'},
    spec: {
      nodeName: 'node-1',
      hostNetwork: true,
      serviceAccountName: 'proxyctl-observer',
      containers: [
        {
          name: 'proxyctl-observer',
          image,
          args,
          env: [
            {name: 'NODE_NAME', valueFrom: {fieldRef: {fieldPath: 'spec.nodeName'}}},
            {name: 'GREETING', value: 'on $(NODE_NAME)'},
          ],
        },
      ],
    },
  };
}

describe('lab kubelet: pods of the proxyctl-agent image', () => {
  it('recognises the image by its repository name, whatever the registry, tag or digest', () => {
    for (const image of [
      'proxyctl-agent:0.1.0',
      'ghcr.io/acme/proxyctl-agent:v2',
      'registry:5000/x/proxyctl-agent@sha256:abc',
      'proxyctl-agent',
    ])
      assert.equal(runsAgentImage(observerPod([], image)), true, image);
    for (const image of ['nginx', 'proxyctl-agent-debug:1', 'acme/proxyctl:agent', 'registry.k8s.io/kube-proxy:v1.34.0'])
      assert.equal(runsAgentImage(observerPod([], image)), false, image);
  });

  it('expands $(VAR) as the kubelet does: defined names replaced, others kept, $$ a literal $', () => {
    const env = new Map([['NODE_NAME', 'node-1']]);
    assert.equal(expandReferences('--hostname-override=$(NODE_NAME)', env), '--hostname-override=node-1');
    assert.equal(expandReferences('$(MISSING) and $$(NODE_NAME)', env), '$(MISSING) and $(NODE_NAME)');
    const pod = observerPod([]);
    assert.deepEqual(
      [...containerEnv(pod, pod.spec.containers[0], '10.240.0.11')],
      [
        ['NODE_NAME', 'node-1'],
        ['GREETING', 'on node-1'],
      ],
    );
  });

  it("starts the agent with the pod's args, the node's namespace, its kubeconfig, and its servers on free loopback ports", async () => {
    const pod = observerPod(['--observe', '--hostname-override=$(NODE_NAME)', '--metrics-bind-address=0.0.0.0:10272']);
    const launch = await agentLaunch(pod, {netns: 'pxl-demo.node-1', podIP: '10.240.0.11', kubeconfig: '/run/sa.kubeconfig'});
    const args = launch.command.slice(launch.command.indexOf('--observe'));
    assert.deepEqual(args.slice(0, 7), [
      '--observe',
      '--hostname-override=node-1',
      '--metrics-bind-address=0.0.0.0:10272',
      '--netns',
      'pxl-demo.node-1',
      '--kubeconfig',
      '/run/sa.kubeconfig',
    ]);
    // The observer's own container ports (10271 healthz, 10272 metrics, 10270 api), each mapped.
    assert.deepEqual([...launch.loopbackPorts.keys()].sort(), [10270, 10271, 10272]);
    for (const [server, containerPort] of [
      ['healthz', 10271],
      ['metrics', 10272],
      ['api', 10270],
    ] as const) {
      const loopback = launch.loopbackPorts.get(containerPort)!;
      assert.equal(launch.servers[server], loopback);
      // Later flags win: the lab's come last.
      assert.equal(args[args.lastIndexOf(`--${server}-bind-address`) + 1], `127.0.0.1:${loopback}`);
    }
  });

  it('leaves settings the agent refuses to the agent, which exits and says why in its log', async () => {
    const launch = await agentLaunch(observerPod(['--no-such-flag']), {netns: 'ns', podIP: '10.240.0.11', kubeconfig: 'k'});
    assert.equal(launch.loopbackPorts.size, 0);
    assert.ok(launch.command.includes('--no-such-flag'));
  });
});
