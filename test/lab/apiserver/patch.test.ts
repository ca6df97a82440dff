// PATCH bodies: JSON merge patch, JSON patch and strategic merge patch as kubectl sends them.
import {describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {applyJsonPatch, applyMergePatch, applyStrategicMergePatch} from '../../../src/lab/apiserver/patch.ts';

const service = {
  metadata: {name: 'web', labels: {app: 'web', tier: 'front'}},
  spec: {
    selector: {app: 'web'},
    ports: [
      {name: 'http', port: 80, targetPort: 8080},
      {name: 'https', port: 443, targetPort: 8443},
    ],
  },
};

describe('patches', () => {
  it('merge patch: maps merge, null deletes, lists replace', () => {
    const out = applyMergePatch(service, {metadata: {labels: {tier: null, team: 'a'}}, spec: {ports: [{port: 81}]}});
    assert.deepEqual(out.metadata.labels, {app: 'web', team: 'a'});
    assert.deepEqual(out.spec.ports, [{port: 81}]);
    assert.deepEqual(service.metadata.labels, {app: 'web', tier: 'front'}, 'the original is untouched');
  });

  it('strategic merge patch: service ports merge by port, $patch delete removes one', () => {
    const out = applyStrategicMergePatch(
      service,
      {
        spec: {
          ports: [
            {port: 443, targetPort: 9443},
            {port: 8080, name: 'alt'},
            {port: 80, $patch: 'delete'},
          ],
        },
      },
      'Service',
    );
    assert.deepEqual(out.spec.ports, [
      {name: 'https', port: 443, targetPort: 9443},
      {port: 8080, name: 'alt'},
    ]);
  });

  it('strategic merge patch: $setElementOrder, $retainKeys and $patch replace as kubectl apply sends them', () => {
    const ordered = applyStrategicMergePatch(
      service,
      {spec: {'$setElementOrder/ports': [{port: 443}, {port: 80}], ports: [{port: 80, targetPort: 'http'}]}},
      'Service',
    );
    assert.deepEqual(
      ordered.spec.ports.map((p: any) => [p.port, p.targetPort]),
      [
        [443, 8443],
        [80, 'http'],
      ],
    );
    const replaced = applyStrategicMergePatch(service, {spec: {selector: {$patch: 'replace', app: 'api'}}}, 'Service');
    assert.deepEqual(replaced.spec.selector, {app: 'api'});
    const retained = applyStrategicMergePatch(
      {spec: {strategy: {type: 'RollingUpdate', rollingUpdate: {maxSurge: 1}}}},
      {spec: {strategy: {$retainKeys: ['type'], type: 'Recreate'}}},
      'Deployment',
    );
    assert.deepEqual(retained.spec.strategy, {type: 'Recreate'});
  });

  it('strategic merge patch: pod containers merge by name and their ports by containerPort', () => {
    const pod = {
      spec: {
        containers: [
          {name: 'app', image: 'a:1', ports: [{containerPort: 80}]},
          {name: 'side', image: 's:1'},
        ],
      },
    };
    const out = applyStrategicMergePatch(
      pod,
      {spec: {containers: [{name: 'app', image: 'a:2', ports: [{containerPort: 9090, name: 'metrics'}]}]}},
      'Pod',
    );
    assert.deepEqual(out.spec.containers, [
      {name: 'app', image: 'a:2', ports: [{containerPort: 80}, {containerPort: 9090, name: 'metrics'}]},
      {name: 'side', image: 's:1'},
    ]);
  });

  it('JSON patch: add, replace, remove, move, copy and test', () => {
    const out = applyJsonPatch(service, [
      {op: 'add', path: '/metadata/labels/team', value: 'a'},
      {op: 'replace', path: '/spec/ports/0/port', value: 8000},
      {op: 'remove', path: '/spec/ports/1'},
      {op: 'copy', from: '/metadata/labels/app', path: '/metadata/labels/copy'},
      {op: 'move', from: '/metadata/labels/tier', path: '/metadata/labels/layer'},
      {op: 'test', path: '/spec/selector/app', value: 'web'},
      {op: 'add', path: '/spec/ports/-', value: {port: 1}},
    ]);
    assert.deepEqual(out.metadata.labels, {app: 'web', team: 'a', copy: 'web', layer: 'front'});
    assert.deepEqual(
      out.spec.ports.map((p: any) => p.port),
      [8000, 1],
    );
    assert.throws(() => applyJsonPatch(service, [{op: 'test', path: '/spec/selector/app', value: 'x'}]), /test failed/);
    assert.throws(() => applyJsonPatch(service, [{op: 'remove', path: '/spec/nothing'}]), /nonexistent|missing/);
  });
});
