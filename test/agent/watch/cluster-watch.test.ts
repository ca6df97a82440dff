// ClusterWatch against the embedded API server, through a real kubeconfig and client-node: the
// store follows Services, EndpointSlices and only this node's Node, and survives the API server
// going away and coming back.
import assert from 'node:assert/strict';
import {mkdtemp, rm} from 'node:fs/promises';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {test} from 'node:test';
import {memoryLogger} from '../../../src/agent/log.ts';
import {ClusterWatch} from '../../../src/agent/watch/cluster-watch.ts';
import {createKubernetesClient, loadKubeConfig} from '../../../src/agent/watch/kubernetes-client.ts';
import {startApiServer} from '../../../src/lab/apiserver/server.ts';

async function until(what: string, check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const node = (name: string) => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: {name},
  status: {addresses: [{type: 'InternalIP', address: '10.240.0.11'}]},
});
const service = (name: string, labels: Record<string, string> = {}) => ({
  apiVersion: 'v1',
  kind: 'Service',
  metadata: {name, namespace: 'default', labels},
  spec: {ports: [{port: 80, targetPort: 8080, protocol: 'TCP'}], selector: {app: name}},
});
const names = (items: unknown[]) => items.map((item: any) => `${item.metadata.namespace ?? ''}/${item.metadata.name}`).sort();

test('the store follows the API server, and recovers after it comes back', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'pxa-watch-'));
  t.after(() => rm(dir, {recursive: true, force: true}));
  let server = await startApiServer({port: 0});
  const port = server.port;
  t.after(() => server.stop());
  server.store.create('nodes', node('node-1'));
  server.store.create('nodes', node('node-2'));
  server.store.create('services', service('web'), 'default');
  server.store.create('services', service('other-proxy', {'service.kubernetes.io/service-proxy-name': 'someone-else'}), 'default');
  await server.settle();
  const kubeconfig = join(dir, 'kubeconfig');
  await server.writeKubeconfig(kubeconfig);

  const log = memoryLogger();
  const synced = new Set<string>();
  const watch = new ClusterWatch({
    client: createKubernetesClient(loadKubeConfig(kubeconfig)),
    nodeName: 'node-1',
    log,
    watchdogMs: 60_000,
    backoffInitialMs: 100,
    backoffMaxMs: 400,
    onSynced: (kind) => synced.add(kind),
  });
  t.after(() => watch.stop());
  watch.start();
  await until('initial lists', () => synced.size === 3);

  assert.deepEqual(names(watch.store.services()), ['default/kubernetes', 'default/web'], 'a service of another proxy is not ours');
  assert.equal((watch.store.node() as any).metadata.name, 'node-1');
  assert.equal(watch.store.size.Node, 1, 'only our own Node');

  server.store.create('services', service('late'), 'default');
  await until('the new service', () => names(watch.store.services()).includes('default/late'));

  await server.stop();
  await until('a failed request logged', () => log.lines.some((line) => line.includes('API server request failed')));
  server = await startApiServer({port, adminToken: server.adminToken});
  server.store.create('nodes', node('node-1'));
  server.store.create('services', service('after-restart'), 'default');
  await until(
    'the store to match the new server',
    () => names(watch.store.services()).join() === ['default/after-restart', 'default/kubernetes'].join(),
    15_000,
  ).catch((error) => assert.fail(`${error.message}; log:\n${log.lines.slice(-12).join('\n')}`));
});

test('ServiceCIDRs are watched only when asked for (nftables mode); the store lists their CIDRs as they change', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'pxa-watch-'));
  t.after(() => rm(dir, {recursive: true, force: true}));
  const server = await startApiServer({port: 0, serviceCIDR: '10.96.0.0/12,fd00:10:96::/112'});
  t.after(() => server.stop());
  server.store.create('nodes', node('node-1'));
  const kubeconfig = join(dir, 'kubeconfig');
  await server.writeKubeconfig(kubeconfig);
  const start = (serviceCIDRs: boolean) => {
    const synced = new Set<string>();
    const watch = new ClusterWatch({
      client: createKubernetesClient(loadKubeConfig(kubeconfig)),
      nodeName: 'node-1',
      log: memoryLogger(),
      watchdogMs: 60_000,
      serviceCIDRs,
      onSynced: (kind) => synced.add(kind),
    });
    t.after(() => watch.stop());
    watch.start();
    return {watch, synced};
  };

  const iptablesMode = start(false);
  const nftablesMode = start(true);
  await until('initial lists', () => iptablesMode.synced.size === 3 && nftablesMode.synced.size === 4);
  assert.ok(!iptablesMode.synced.has('ServiceCIDR'));
  assert.deepEqual(iptablesMode.watch.store.serviceCIDRs(), []);
  assert.deepEqual(nftablesMode.watch.store.serviceCIDRs(), ['10.96.0.0/12', 'fd00:10:96::/112'], "the API server's own ServiceCIDR");

  const store = nftablesMode.watch.store;
  const seen: string[] = [];
  store.onChange((kind, type, object) => {
    if (kind === 'ServiceCIDR') seen.push(`${type} ${(object as any).metadata.name}`);
  });
  server.store.create('servicecidrs', {metadata: {name: 'extra'}, spec: {cidrs: ['10.200.0.0/16']}});
  await until('the new ServiceCIDR', () => store.serviceCIDRs().includes('10.200.0.0/16'));
  server.store.delete('servicecidrs', undefined, 'kubernetes');
  await until('the deleted ServiceCIDR', () => store.serviceCIDRs().join() === '10.200.0.0/16');
  assert.deepEqual(seen, ['ADDED extra', 'DELETED kubernetes']);
});
