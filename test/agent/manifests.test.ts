// The Kubernetes manifests: the ConfigMap's settings load, and the DaemonSet has what a kube-proxy
// replacement needs (host network, capabilities, xtables lock, probes on the healthz port).
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {test} from 'node:test';
import {parseAllDocuments} from 'yaml';
import {loadAgentConfig} from '../../src/agent/config/load-config.ts';

const documents = (file: string): any[] => parseAllDocuments(readFileSync(new URL(`../../manifests/${file}`, import.meta.url), 'utf8')).map((document) => document.toJS());

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
  assert.equal(daemonSet.metadata.namespace, 'kube-system');
  assert.equal(daemonSet.spec.template.metadata.labels['app.kubernetes.io/name'], 'proxyctl-agent');
  assert.equal(daemonSet.spec.updateStrategy.type, 'RollingUpdate');
  assert.equal(pod.hostNetwork, true);
  assert.equal(pod.priorityClassName, 'system-node-critical');
  assert.ok(pod.tolerations.some((toleration: any) => toleration.operator === 'Exists'));
  assert.ok(container.securityContext.privileged || ['NET_ADMIN', 'NET_RAW'].every((cap) => container.securityContext.capabilities.add.includes(cap)));
  assert.deepEqual([container.readinessProbe.httpGet.path, container.readinessProbe.httpGet.port], ['/healthz', 10256]);
  assert.deepEqual([container.livenessProbe.httpGet.path, container.livenessProbe.httpGet.port], ['/livez', 10256]);
  const mounts = Object.fromEntries(container.volumeMounts.map((mount: any) => [mount.mountPath, mount]));
  assert.ok(mounts['/run/xtables.lock']);
  assert.equal(mounts['/lib/modules'].readOnly, true);
  const volumes = Object.fromEntries(pod.volumes.map((volume: any) => [volume.name, volume]));
  assert.equal(volumes['xtables-lock'].hostPath.path, '/run/xtables.lock');
  assert.ok(container.args.includes('--config=/etc/proxyctl-agent/config.conf'));
});

test('the image has the netfilter tools on Node 24 (Debian)', () => {
  const dockerfile = readFileSync(new URL('../../manifests/Dockerfile', import.meta.url), 'utf8');
  assert.match(dockerfile, /^FROM node:24-bookworm/m);
  for (const pkg of ['iptables', 'nftables', 'ipset', 'ipvsadm', 'conntrack']) assert.match(dockerfile, new RegExp(`\\b${pkg}\\b`));
});
