// examples/cluster.yaml reads cleanly and gives the model its README promises.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {test} from 'node:test';
import {endpointKey} from '../../../src/core/model/endpoint.ts';
import {buildProxyModel} from '../../../src/core/model/build.ts';
import {parseManifests} from '../../../src/core/model/manifests.ts';

const path = new URL('../../../examples/cluster.yaml', import.meta.url);

test('examples/cluster.yaml: node-1 sees demoapp, nginx (Local), dns (UDP+TCP) and empty', () => {
  const parsed = parseManifests(readFileSync(path, 'utf8'), 'examples/cluster.yaml');
  assert.deepEqual(parsed.problems, []);
  assert.equal(parsed.nodes.length, 1);
  const model = buildProxyModel(
    {services: parsed.services, endpointSlices: parsed.endpointSlices, node: parsed.nodes[0]},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
  );
  assert.deepEqual(model.problems, []);
  assert.equal(model.nodeName, 'node-1');
  assert.deepEqual(model.nodeIPs, ['10.240.0.11']);
  assert.deepEqual(model.config.localDetector, {mode: 'ClusterCIDR', cidrs: ['10.244.0.0/16']});

  const summary = model.servicePorts.map((port) => ({
    port: `${port.key}/${port.protocol}`,
    vip: `${port.clusterIP}:${port.port}`,
    nodePort: port.nodePort,
    endpoints: port.endpoints.map((e) => `${endpointKey(e)}${e.isLocal ? ' local' : ''}`),
    local: port.localEndpoints.map((e) => endpointKey(e)),
    externalPolicyLocal: port.externalPolicyLocal,
  }));
  assert.deepEqual(summary, [
    {
      port: 'default/demoapp:http/TCP',
      vip: '10.96.0.10:80',
      nodePort: 0,
      endpoints: ['10.244.0.10:8080', '10.244.0.11:8080', '10.244.1.10:8080 local'],
      local: [],
      externalPolicyLocal: false,
    },
    {port: 'default/empty:http/TCP', vip: '10.96.0.99:80', nodePort: 0, endpoints: [], local: [], externalPolicyLocal: false},
    {
      port: 'default/nginx:http/TCP',
      vip: '10.96.0.80:80',
      nodePort: 30080,
      endpoints: ['10.244.0.20:80', '10.244.1.20:80 local'],
      local: ['10.244.1.20:80'],
      externalPolicyLocal: true,
    },
    {
      port: 'kube-system/dns:dns/UDP',
      vip: '10.96.0.53:53',
      nodePort: 0,
      endpoints: ['10.244.0.3:53', '10.244.1.3:53 local'],
      local: [],
      externalPolicyLocal: false,
    },
    {
      port: 'kube-system/dns:dns-tcp/TCP',
      vip: '10.96.0.53:53',
      nodePort: 0,
      endpoints: ['10.244.0.3:53', '10.244.1.3:53 local'],
      local: [],
      externalPolicyLocal: false,
    },
  ]);
  const empty = model.servicePorts.find((port) => port.serviceName === 'empty');
  assert.equal(empty?.hasAnyEndpoints, false);
});
