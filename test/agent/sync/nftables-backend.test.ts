// The nftables RulesBackend the agent API answers with: a render parses back, diffs equal to itself,
// and a dropped element shows up under its service.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {nftablesBackend, parseNftablesText} from '../../../src/agent/api/rules/nftables.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {MemoryObjects, service, slice} from './cluster.ts';

test('nftables backend: render, parse, diff and trace agree', () => {
  const objects = new MemoryObjects({services: [service('web', '10.96.0.10')], slices: [slice('web-1', 'web', ['10.244.2.5'])]});
  const model = buildProxyModel(
    {services: objects.services(), endpointSlices: objects.endpointSlices(), node: objects.node()},
    {family: 'IPv4', nodeName: 'node-1'},
  );
  const script = nftablesBackend.render(model);
  const desired = nftablesBackend.parse(script);
  assert.equal(nftablesBackend.diff(desired, nftablesBackend.parse(script)).equal, true);

  const tampered = nftablesBackend.parse(script.replace(/^add element ip kube-proxy service-ips .*$/m, ''));
  const drift = nftablesBackend.diff(desired, tampered);
  assert.equal(drift.equal, false);
  assert.deepEqual(
    drift.groups.map((group) => [group.servicePort, group.added.length, group.removed.length]),
    [['default/web:p', 1, 0]],
  );
  assert.deepEqual(nftablesBackend.diff(desired, tampered, 'default/other').groups, []);

  const result = nftablesBackend.trace(
    desired,
    {srcIP: '10.244.1.9', dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
    {localAddresses: []},
  );
  assert.deepEqual(
    result.branches.map((branch) => branch.endpoint),
    ['10.244.2.5:8080'],
  );
  assert.equal(parseNftablesText('{"nftables": []}').chains.size, 0, 'an empty listing (no table yet) is an empty table');
});
