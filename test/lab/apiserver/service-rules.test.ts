// Service defaults, validation and address allocation, through the programmatic store.
import {after, before, describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {startApiServer, type ApiServer} from '../../../src/lab/apiserver/server.ts';
import {ApiError} from '../../../src/lab/apiserver/api-error.ts';

let server: ApiServer;
const create = (name: string, spec: Record<string, unknown>) =>
  server.store.create('services', {metadata: {name, namespace: 'default'}, spec}, 'default');
const rejection = (fn: () => unknown): string => {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ApiError);
    return err.message;
  }
  assert.fail('expected a rejection');
};

describe('service rules', () => {
  before(async () => {
    server = await startApiServer({port: 0, nodePortRange: '30000-30002'});
  });
  after(async () => {
    await server.stop();
  });

  it('releases node ports and the health check port when a LoadBalancer becomes ClusterIP', () => {
    const lb = create('lb', {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      ports: [
        {name: 'a', port: 80},
        {name: 'b', port: 81, protocol: 'UDP'},
      ],
    });
    assert.deepEqual(
      lb.spec.ports.map((p: any) => p.nodePort),
      [30000, 30001],
    );
    assert.equal(lb.spec.healthCheckNodePort, 30002);
    assert.equal(lb.spec.allocateLoadBalancerNodePorts, true);
    assert.equal(
      rejection(() => create('full', {type: 'NodePort', ports: [{port: 80}]})),
      'Service "full" is invalid: spec.ports[0].nodePort: Invalid value: 0: range is full',
    );
    const cip = server.store.patch('services', 'default', 'lb', 'application/merge-patch+json', {spec: {type: 'ClusterIP'}});
    assert.deepEqual(
      cip.spec.ports.map((p: any) => p.nodePort),
      [undefined, undefined],
    );
    assert.equal(cip.spec.healthCheckNodePort, undefined);
    assert.equal(cip.spec.externalTrafficPolicy, undefined);
    assert.equal(cip.spec.clusterIP, lb.spec.clusterIP, 'the ClusterIP stays');
    const np = create('np', {type: 'NodePort', ports: [{port: 80, nodePort: 30001}]});
    assert.equal(np.spec.ports[0].nodePort, 30001);
    assert.equal(
      rejection(() => create('np2', {type: 'NodePort', ports: [{port: 80, nodePort: 30001}]})),
      'Service "np2" is invalid: spec.ports[0].nodePort: Invalid value: 30001: provided port is already allocated',
    );
    server.store.delete('services', 'default', 'np');
    assert.equal(
      create('np3', {type: 'NodePort', ports: [{port: 80, nodePort: 30001}]}).spec.ports[0].nodePort,
      30001,
      'released on delete',
    );
  });

  it('defaults session affinity, headless and ExternalName services', () => {
    const sticky = create('sticky', {sessionAffinity: 'ClientIP', ports: [{port: 80}]});
    assert.equal(sticky.spec.sessionAffinityConfig.clientIP.timeoutSeconds, 10800);
    assert.match(
      rejection(() =>
        create('sticky2', {sessionAffinity: 'ClientIP', sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}, ports: [{port: 80}]}),
      ),
      /spec\.sessionAffinityConfig\.clientIP\.timeoutSeconds: Invalid value: 0: must be greater than 0 and less than 86400$/,
    );
    const headless = create('headless', {clusterIP: 'None', selector: {app: 'x'}});
    assert.deepEqual(headless.spec.clusterIPs, ['None']);
    const ext = create('ext', {type: 'ExternalName', externalName: 'db.example.com'});
    assert.equal(ext.spec.clusterIP, undefined);
    assert.equal(ext.spec.ipFamilies, undefined);
    assert.equal(rejection(() => create('ext2', {type: 'ExternalName', externalName: 'Not_A_Name'})).split(': ')[1], 'spec.externalName');
  });

  it('keeps the ClusterIP immutable and checks families against the cluster', () => {
    const svc = create('fixed', {ports: [{port: 80}]});
    assert.match(
      rejection(() =>
        server.store.patch('services', 'default', 'fixed', 'application/merge-patch+json', {
          spec: {clusterIP: '10.96.9.9', clusterIPs: ['10.96.9.9']},
        }),
      ),
      /spec\.clusterIP: Invalid value: "10\.96\.9\.9": field is immutable/,
    );
    assert.equal(server.store.get('services', 'default', 'fixed').spec.clusterIP, svc.spec.clusterIP);
    assert.equal(
      rejection(() => create('v6', {ipFamilies: ['IPv6'], ports: [{port: 80}]})),
      'Service "v6" is invalid: spec.ipFamilies[0]: Invalid value: "IPv6": not configured on this cluster',
    );
    assert.equal(
      rejection(() => create('dual', {ipFamilyPolicy: 'RequireDualStack', ports: [{port: 80}]})),
      'Service "dual" is invalid: spec.ipFamilyPolicy: Invalid value: "RequireDualStack": Cluster is not configured for dual-stack services',
    );
    assert.equal(create('prefer', {ipFamilyPolicy: 'PreferDualStack', ports: [{port: 80}]}).spec.ipFamilies.length, 1);
    assert.match(
      rejection(() =>
        create('dup', {
          ports: [
            {name: 'a', port: 80},
            {name: 'b', port: 80},
          ],
        }),
      ),
      /spec\.ports\[1\]: Duplicate value: core\.ServicePort\{Name:"", Protocol:"TCP", .*Port:80,/,
    );
  });
});

describe('healthCheckNodePort, as kube-apiserver allocates and checks it', () => {
  let hc: ApiServer;
  const createIn = (name: string, spec: Record<string, unknown>) =>
    hc.store.create('services', {metadata: {name, namespace: 'default'}, spec}, 'default');
  const failure = (fn: () => unknown): {code: number; reason: string; message: string} => {
    try {
      fn();
    } catch (err) {
      assert.ok(err instanceof ApiError);
      return {code: err.code, reason: err.reason, message: err.message};
    }
    assert.fail('expected a rejection');
  };
  const patchSpec = (name: string, spec: Record<string, unknown>) =>
    hc.store.patch('services', 'default', name, 'application/merge-patch+json', {spec});
  before(async () => {
    hc = await startApiServer({port: 0, nodePortRange: '30000-30004'});
  });
  after(async () => {
    await hc.stop();
  });

  it('is allocated from the NodePort range for a LoadBalancer with externalTrafficPolicy Local only', () => {
    const local = createIn('local', {type: 'LoadBalancer', externalTrafficPolicy: 'Local', ports: [{port: 80}]});
    assert.equal(local.spec.ports[0].nodePort, 30000);
    assert.equal(local.spec.healthCheckNodePort, 30001, 'the next free node port');
    const nodePortLocal = createIn('np-local', {type: 'NodePort', externalTrafficPolicy: 'Local', ports: [{port: 80}]});
    assert.equal(nodePortLocal.spec.healthCheckNodePort, undefined, 'a NodePort service has no load balancer to answer');
    const cluster = createIn('lb-cluster', {type: 'LoadBalancer', ports: [{port: 80}], allocateLoadBalancerNodePorts: false});
    assert.equal(cluster.spec.healthCheckNodePort, undefined);
    assert.deepEqual(
      failure(() => createIn('np-hc', {type: 'NodePort', externalTrafficPolicy: 'Local', healthCheckNodePort: 30004, ports: [{port: 80}]})),
      {
        code: 422,
        reason: 'Invalid',
        message:
          "Service \"np-hc\" is invalid: spec.healthCheckNodePort: Invalid value: 30004: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
      },
    );
  });

  it('takes a requested port; one taken or out of range is an internal error, as kube-apiserver answers', () => {
    assert.deepEqual(
      failure(() =>
        createIn('taken', {
          type: 'LoadBalancer',
          externalTrafficPolicy: 'Local',
          healthCheckNodePort: 30001,
          allocateLoadBalancerNodePorts: false,
          ports: [{port: 80}],
        }),
      ),
      {
        code: 500,
        reason: 'InternalError',
        message: 'Internal error occurred: failed to allocate requested HealthCheck NodePort 30001: provided port is already allocated',
      },
    );
    assert.deepEqual(
      failure(() =>
        createIn('outside', {
          type: 'LoadBalancer',
          externalTrafficPolicy: 'Local',
          healthCheckNodePort: 32000,
          allocateLoadBalancerNodePorts: false,
          ports: [{port: 80}],
        }),
      ),
      {
        code: 500,
        reason: 'InternalError',
        message:
          'Internal error occurred: failed to allocate requested HealthCheck NodePort 32000: provided port is not in the valid range. The range of valid ports is 30000-30004',
      },
    );
    assert.equal(hc.store.tryGet('services', 'default', 'outside'), undefined, 'nothing stored');
    const chosen = createIn('chosen', {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: 30004,
      allocateLoadBalancerNodePorts: false,
      ports: [{port: 80}],
    });
    assert.equal(chosen.spec.healthCheckNodePort, 30004);
  });

  it('cannot be changed while needed; is released when the policy goes back to Cluster, and allocated again when it returns', () => {
    assert.deepEqual(
      failure(() => patchSpec('chosen', {healthCheckNodePort: 30003})),
      {
        code: 422,
        reason: 'Invalid',
        message:
          'Service "chosen" is invalid: spec.healthCheckNodePort: Invalid value: 30003: cannot change healthCheckNodePort on loadBalancer service with externalTraffic=Local during update',
      },
    );
    assert.equal(patchSpec('chosen', {ports: [{port: 81}]}).spec.healthCheckNodePort, 30004, 'kept by an update that leaves it out');
    const toCluster = patchSpec('chosen', {externalTrafficPolicy: 'Cluster'});
    assert.equal(toCluster.spec.healthCheckNodePort, undefined);
    const reused = createIn('reuse', {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: 30004,
      allocateLoadBalancerNodePorts: false,
      ports: [{port: 80}],
    });
    assert.equal(reused.spec.healthCheckNodePort, 30004, 'released with the policy change');
    const back = patchSpec('chosen', {externalTrafficPolicy: 'Local'});
    assert.equal(back.spec.healthCheckNodePort, 30003, 'the next free node port');
  });

  it('a full range is an internal error and leaves nothing allocated', () => {
    // 30000-30004 are all taken now (local: 2, np-local: 1, reuse: 1, chosen: 1).
    assert.deepEqual(
      failure(() =>
        createIn('full', {type: 'LoadBalancer', externalTrafficPolicy: 'Local', allocateLoadBalancerNodePorts: false, ports: [{port: 80}]}),
      ),
      {code: 500, reason: 'InternalError', message: 'Internal error occurred: failed to allocate a HealthCheck NodePort 0: range is full'},
    );
    hc.store.delete('services', 'default', 'reuse');
    assert.equal(
      createIn('fits', {type: 'LoadBalancer', externalTrafficPolicy: 'Local', allocateLoadBalancerNodePorts: false, ports: [{port: 80}]})
        .spec.healthCheckNodePort,
      30004,
      'released on delete',
    );
  });
});
