// planConntrackCleanup: which UDP conntrack entries a change makes stale (kube-proxy's rules).
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {planConntrackCleanup} from '../../../src/agent/sync/conntrack-cleanup.ts';
import {node, service, slice} from './cluster.ts';

const model = (services: unknown[], slices: unknown[]) =>
  buildProxyModel({services, endpointSlices: slices, node: node()}, {family: 'IPv4', nodeName: 'node-1'});
const dns = (clusterIP = '10.96.0.53', options = {}) => service('dns', clusterIP, {protocol: 'UDP', port: 53, ...options});
const dnsSlice = (ips: string[]) => slice('dns-1', 'dns', ips, {protocol: 'UDP'});

const rows: Array<{name: string; before: ReturnType<typeof model> | undefined; after: ReturnType<typeof model>; expected: object[]}> = [
  {name: 'first sync: nothing', before: undefined, after: model([dns()], [dnsSlice(['10.244.2.3'])]), expected: []},
  {
    name: 'nothing changed',
    before: model([dns()], [dnsSlice(['10.244.2.3'])]),
    after: model([dns()], [dnsSlice(['10.244.2.3'])]),
    expected: [],
  },
  {
    name: 'scaled to zero: entries to the removed endpoint',
    before: model([dns()], [dnsSlice(['10.244.2.3'])]),
    after: model([dns()], [dnsSlice([])]),
    expected: [{family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.53', dstNat: '10.244.2.3'}],
  },
  {
    name: 'from no endpoints to some: entries to the service address',
    before: model([dns()], [dnsSlice([])]),
    after: model([dns()], [dnsSlice(['10.244.2.3'])]),
    expected: [{family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.53', dport: 53}],
  },
  {
    name: 'clusterIP changed: entries to the old address',
    before: model([dns('10.96.0.53')], [dnsSlice(['10.244.2.3'])]),
    after: model([dns('10.96.0.54')], [dnsSlice(['10.244.2.3'])]),
    expected: [{family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.53', dport: 53}],
  },
  {
    name: 'NodePort service deleted: entries to the service address and the node port',
    before: model([dns('10.96.0.53', {type: 'NodePort', nodePort: 30053})], [dnsSlice(['10.244.2.3'])]),
    after: model([], [dnsSlice(['10.244.2.3'])]),
    expected: [
      {family: 'IPv4', protocol: 'UDP', origDst: '10.96.0.53', dport: 53},
      {family: 'IPv4', protocol: 'UDP', dport: 30053},
    ],
  },
  {
    name: 'TCP endpoints removed: nothing (TCP recovers by itself)',
    before: model([service('web', '10.96.0.10')], [slice('web-1', 'web', ['10.244.2.5'])]),
    after: model([service('web', '10.96.0.10')], [slice('web-1', 'web', [])]),
    expected: [],
  },
];

for (const row of rows) {
  test(`conntrack: ${row.name}`, () => {
    assert.deepEqual(planConntrackCleanup(row.before, row.after), row.expected);
  });
}
