// ipvsRulesBackend's desired state: the rendered state itself, which must be what its text, as the
// API shows it, reads back to (RulesBackend.desired promises parse(render(model))).
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {ipvsRulesBackend, parseIpvsStateText} from '../../../src/agent/api/rules/ipvs.ts';
import {buildProxyModel, type IPFamily} from '../../../src/core/model/index.ts';
import {node, service, slice} from '../../core/model/cluster-objects.ts';

function model(family: IPFamily) {
  const v6 = family === 'IPv6';
  const ip = (v4: string, v6Address: string) => (v6 ? v6Address : v4);
  const services = [
    service('web', {clusterIP: ip('10.96.0.10', 'fd00:96::10'), ipFamilies: [family]}),
    service('sticky', {
      clusterIP: ip('10.96.0.11', 'fd00:96::11'),
      ipFamilies: [family],
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}},
    }),
    service(
      'lb',
      {
        type: 'LoadBalancer',
        clusterIP: ip('10.96.0.14', 'fd00:96::14'),
        ipFamilies: [family],
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30081}],
        externalTrafficPolicy: 'Local',
        loadBalancerSourceRanges: [ip('203.0.113.0/24', '2001:db8:1::/64')],
        externalIPs: [ip('198.51.100.7', '2001:db8::7')],
      },
      {status: {loadBalancer: {ingress: [{ip: ip('198.51.100.30', '2001:db8::30')}]}}},
    ),
    service('dns', {
      clusterIP: ip('10.96.0.53', 'fd00:96::53'),
      ipFamilies: [family],
      ports: [{name: 'dns', protocol: 'UDP', port: 53, targetPort: 53}],
    }),
  ];
  const addressType = v6 ? {addressType: 'IPv6' as const} : {};
  const slices = [
    slice(
      'web-1',
      'web',
      [
        {ip: ip('10.244.1.2', 'fd00:10:244:1::2'), node: 'node-1'},
        {ip: ip('10.244.2.2', 'fd00:10:244:2::2'), node: 'node-2'},
      ],
      addressType,
    ),
    slice('sticky-1', 'sticky', [{ip: ip('10.244.1.3', 'fd00:10:244:1::3'), node: 'node-1'}], addressType),
    slice('lb-1', 'lb', [{ip: ip('10.244.1.5', 'fd00:10:244:1::5'), node: 'node-1', pod: 'lb-1'}], addressType),
    slice('dns-1', 'dns', [{ip: ip('10.244.2.6', 'fd00:10:244:2::6'), node: 'node-2'}], {
      ...addressType,
      ports: [{name: 'dns', protocol: 'UDP', port: 53}],
    }),
  ];
  const built = buildProxyModel(
    {services, endpointSlices: slices, node: node('node-1')},
    {family, nodeName: 'node-1', clusterCIDRs: [v6 ? 'fd00:10:244::/48' : '10.244.0.0/16']},
  );
  assert.deepEqual(built.problems, []);
  return built;
}

for (const family of ['IPv4', 'IPv6'] as const) {
  test(`ipvs desired state (${family}): the rendered state is what its text reads back to`, () => {
    const backend = ipvsRulesBackend({scheduler: 'lc'});
    const proxyModel = model(family);
    const desired = backend.desired!(proxyModel);
    const text = backend.render(proxyModel);
    assert.deepEqual(desired, parseIpvsStateText(text));
    assert.deepEqual(desired, backend.parse(text));
    // What the test covers: affinity's persistence, several address kinds, both protocols, the scheduler.
    const servers = (desired as ReturnType<typeof parseIpvsStateText>).virtualServers;
    assert.ok(servers.some((server) => server.persistenceTimeout === 600));
    assert.ok(servers.some((server) => server.protocol === 'UDP'));
    assert.ok(servers.every((server) => server.scheduler === 'lc' && server.servicePort !== ''));
    assert.ok(servers.length >= 5, `${servers.length} servers`);
    assert.equal(backend.desired!(proxyModel), desired, 'made once per model');
  });
}
