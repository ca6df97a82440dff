// How a lab kubelet runs a pod of the proxyctl-agent or kube-proxy image: which images it
// recognises, the kubelet's $(VAR) expansion of args, its configMap volumes, and the command it
// starts: the pod's own args (paths under a mount pointed into the volume), then the node's
// namespace, the service account's kubeconfig, and each server moved to a loopback port the lab
// chose (the container ports stay the pod's, mapped to those).
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import type {KubeObject} from '../../src/lab/apiserver/object-log.ts';
import {mkdtemp, readFile, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {startApiServer} from '../../src/lab/apiserver/server.ts';
import {agentImage, agentLaunch, containerEnv, expandReferences} from '../../src/lab/kubelet/agent-container.ts';
import {pointIntoVolumes, writeConfigMapVolumes} from '../../src/lab/kubelet/config-volumes.ts';
import {kubeProxyConfigMapObject, kubeProxyObjects, standInConfiguration} from '../../src/lab/lab-objects.ts';

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
  it("recognises proxyctl-agent's and kube-proxy's images by their repository name, whatever the registry, tag or digest", () => {
    for (const image of [
      'proxyctl-agent:0.1.0',
      'ghcr.io/acme/proxyctl-agent:v2',
      'registry:5000/x/proxyctl-agent@sha256:abc',
      'proxyctl-agent',
    ])
      assert.equal(agentImage(observerPod([], image)), 'proxyctl-agent', image);
    for (const image of ['registry.k8s.io/kube-proxy:v1.34.0', 'kube-proxy'])
      assert.equal(agentImage(observerPod([], image)), 'kube-proxy', image);
    for (const image of ['nginx', 'proxyctl-agent-debug:1', 'acme/proxyctl:agent', 'registry.k8s.io/kube-proxy-amd64x:1'])
      assert.equal(agentImage(observerPod([], image)), undefined, image);
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

  it("gives kube-proxy's pod its ConfigMap at the mount path its command names, and the agent reads its ports there", async () => {
    const server = await startApiServer({port: 0});
    const podDirectory = await mkdtemp(join(tmpdir(), 'pxt-volumes-'));
    try {
      const configuration = standInConfiguration('nftables', '10.244.0.0/16');
      server.store.create('configmaps', kubeProxyConfigMapObject(`${configuration}healthzBindAddress: 0.0.0.0:10266\n`), 'kube-system');
      const daemonSet = kubeProxyObjects().find((object) => object.kind === 'DaemonSet')!;
      const pod: KubeObject = {
        metadata: {name: 'kube-proxy-x1', namespace: 'kube-system', uid: 'u-2'},
        spec: {...structuredClone(daemonSet.spec.template.spec), nodeName: 'node-1'},
      };
      const mounts = await writeConfigMapVolumes(pod, pod.spec.containers[0], server.store, podDirectory);
      assert.deepEqual(mounts, [{mountPath: '/var/lib/kube-proxy', directory: join(podDirectory, 'volumes/kube-proxy')}]);
      assert.match(await readFile(join(podDirectory, 'volumes/kube-proxy/config.conf'), 'utf8'), /mode: nftables/);
      const launch = await agentLaunch(pod, {netns: 'ns', podIP: '10.240.0.11', kubeconfig: 'k', mounts});
      assert.ok(launch.command.includes(`--config=${join(podDirectory, 'volumes/kube-proxy/config.conf')}`), launch.command.join(' '));
      assert.ok(launch.command.includes('--hostname-override=node-1'));
      // kube-proxy's own layout in nftables mode; healthz where its config file puts it (10266), metrics at kube-proxy's default.
      assert.deepEqual(launch.command.slice(launch.command.indexOf('--nftables-layout'), launch.command.indexOf('--nftables-layout') + 2), [
        '--nftables-layout',
        'kube-proxy',
      ]);
      assert.deepEqual([...launch.loopbackPorts.keys()].sort(), [10249, 10260, 10266]);
      // A ConfigMap that is not there is the kubelet's FailedMount.
      server.store.delete('configmaps', 'kube-system', 'kube-proxy');
      await assert.rejects(
        writeConfigMapVolumes(pod, pod.spec.containers[0], server.store, podDirectory),
        /MountVolume.SetUp failed for volume "kube-proxy" : configmap "kube-proxy" not found/,
      );
    } finally {
      await server.stop();
      await rm(podDirectory, {recursive: true, force: true});
    }
  });

  it('points only whole paths under a mount path into the volume', () => {
    const mounts = [{mountPath: '/etc/agent', directory: '/run/lab/pods/u/volumes/config'}];
    assert.equal(pointIntoVolumes('--config=/etc/agent/config.conf', mounts), '--config=/run/lab/pods/u/volumes/config/config.conf');
    assert.equal(pointIntoVolumes('/etc/agent', mounts), '/run/lab/pods/u/volumes/config');
    assert.equal(pointIntoVolumes('--config=/etc/agents/x', mounts), '--config=/etc/agents/x');
    assert.equal(pointIntoVolumes('--x=/opt/etc/agent/y', mounts), '--x=/opt/etc/agent/y');
  });
});
