// The IPv6 proxier's rules: bracketed endpoint strings, IPv6 detectors and NodePort addresses,
// no localhost NodePorts.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {buildProxyModel, type ModelOptions, type ProxyModel} from '../../../src/core/model/index.ts';
import {
  endpointChainName,
  renderIptables,
  renderJumpRules,
  serviceExternalChainName,
  servicePortChainName,
} from '../../../src/core/iptables/index.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

const web = {key: 'default/web:http', protocol: 'TCP'} as const;
const SVC = servicePortChainName(web);
const EXT = serviceExternalChainName(web);

function dualStackModel(options: Partial<ModelOptions> = {}, spec: Record<string, unknown> = {}): ProxyModel {
  const web = service('web', {
    type: 'NodePort',
    clusterIP: '10.96.0.10',
    clusterIPs: ['10.96.0.10', 'fd00:96::10'],
    ipFamilies: ['IPv4', 'IPv6'],
    ipFamilyPolicy: 'PreferDualStack',
    ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
    ...spec,
  });
  const v4 = slice('web-v4', 'web', [{ip: '10.244.1.5', node: 'node-1'}]);
  const v6 = slice(
    'web-v6',
    'web',
    [
      {ip: 'fd00:10:244:1::5', node: 'node-1'},
      {ip: 'FD00:10:244:2:0:0:0:5', node: 'node-2'},
    ],
    {addressType: 'IPv6'},
  );
  const m = buildProxyModel(
    {services: [web], endpointSlices: [v4, v6], node: node('node-1')},
    {family: 'IPv6', clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56'], ...options},
  );
  assert.deepEqual(m.problems, []);
  return m;
}

function natRules(text: string, chain: string): string[] {
  return text
    .slice(text.indexOf('*nat'))
    .split('\n')
    .filter((line) => line.startsWith(`-A ${chain} `));
}

describe('IPv6 render', () => {
  it('writes the IPv6 addresses of the service and brackets endpoints as Go joins host and port', () => {
    const text = renderIptables(dualStackModel());
    const sep = (ep: string): string => endpointChainName(web, ep);
    assert.deepEqual(natRules(text, 'KUBE-SERVICES'), [
      `-A KUBE-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d fd00:96::10 --dport 80 -j ${SVC}`,
      // ::1 never takes NodePorts (the kernel will not route it to another host).
      '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS',
    ]);
    assert.deepEqual(natRules(text, SVC), [
      `-A ${SVC} -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d fd00:96::10 --dport 80 ! -s fd00:10:244::/56 -j KUBE-MARK-MASQ`,
      `-A ${SVC} -m comment --comment "default/web:http -> [fd00:10:244:1::5]:8080" -m statistic --mode random --probability 0.5000000000 -j ${sep('[fd00:10:244:1::5]:8080')}`,
      `-A ${SVC} -m comment --comment "default/web:http -> [fd00:10:244:2::5]:8080" -j ${sep('[fd00:10:244:2::5]:8080')}`,
    ]);
    assert.deepEqual(natRules(text, sep('[fd00:10:244:2::5]:8080')), [
      `-A ${sep('[fd00:10:244:2::5]:8080')} -m comment --comment default/web:http -s fd00:10:244:2::5 -j KUBE-MARK-MASQ`,
      `-A ${sep('[fd00:10:244:2::5]:8080')} -m comment --comment default/web:http -m tcp -p tcp -j DNAT --to-destination [fd00:10:244:2::5]:8080`,
    ]);
    assert.deepEqual(natRules(text, 'KUBE-NODEPORTS'), [
      `-A KUBE-NODEPORTS -m comment --comment default/web:http -m tcp -p tcp --dport 30080 -j ${EXT}`,
    ]);
    assert.doesNotMatch(text, /10\.96\.0\.10|10\.244\.1\.5/, 'nothing of the IPv4 family');
  });

  it('never writes the localhost NodePort firewall or its jumps', () => {
    const m = dualStackModel({config: {localhostNodePorts: true}});
    const text = renderIptables(m, {includeJumps: true});
    assert.doesNotMatch(text, /KUBE-FIREWALL|127\.0\.0\.0/);
    assert.ok(!renderJumpRules(m).some((jump) => jump.rule.includes('KUBE-FIREWALL')));
  });

  it('lists the node IPv6 addresses inside nodePortAddresses and skips ::1', () => {
    const text = renderIptables(dualStackModel({config: {nodePortAddresses: ['fd00:10:240::/64', '::1/128', '10.240.0.0/24']}}));
    assert.deepEqual(natRules(text, 'KUBE-SERVICES').slice(1), [
      '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -d fd00:10:240::11 -j KUBE-NODEPORTS',
    ]);
  });

  it('takes the primary IPv6 node address for nodePortAddresses primary', () => {
    const text = renderIptables(dualStackModel({config: {nodePortAddresses: ['primary']}}));
    assert.match(natRules(text, 'KUBE-SERVICES')[1], / -d fd00:10:240::11 -j KUBE-NODEPORTS$/);
  });

  it('matches the IPv6 pod CIDR in the EXT chain of an externalTrafficPolicy Local service', () => {
    const local = dualStackModel({}, {externalTrafficPolicy: 'Local'});
    const ext = natRules(renderIptables(local), EXT);
    assert.equal(
      ext[0],
      `-A ${EXT} -m comment --comment "pod traffic for default/web:http external destinations" -s fd00:10:244::/56 -j ${SVC}`,
    );
  });
});
