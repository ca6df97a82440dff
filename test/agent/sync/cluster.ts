// Small Service / EndpointSlice / Node objects for agent tests, and an in-memory ClusterObjects.
import type {ClusterObjects} from '../../../src/agent/watch/cluster-objects.ts';

export function service(
  name: string,
  clusterIP: string,
  options: {
    protocol?: string;
    port?: number;
    type?: string;
    nodePort?: number;
    externalTrafficPolicy?: string;
    healthCheckNodePort?: number;
  } = {},
) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name, namespace: 'default'},
    spec: {
      type: options.type ?? 'ClusterIP',
      clusterIP,
      clusterIPs: [clusterIP],
      ports: [
        {
          name: 'p',
          protocol: options.protocol ?? 'TCP',
          port: options.port ?? 80,
          targetPort: 8080,
          ...(options.nodePort ? {nodePort: options.nodePort} : {}),
        },
      ],
      ...(options.externalTrafficPolicy ? {externalTrafficPolicy: options.externalTrafficPolicy} : {}),
      ...(options.healthCheckNodePort ? {healthCheckNodePort: options.healthCheckNodePort} : {}),
    },
  };
}

export function slice(
  name: string,
  serviceName: string,
  ips: string[],
  options: {protocol?: string; nodeName?: string; triggerTime?: string} = {},
) {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name,
      namespace: 'default',
      labels: {'kubernetes.io/service-name': serviceName},
      ...(options.triggerTime ? {annotations: {'endpoints.kubernetes.io/last-change-trigger-time': options.triggerTime}} : {}),
    },
    addressType: 'IPv4',
    ports: [{name: 'p', protocol: options.protocol ?? 'TCP', port: 8080}],
    endpoints: ips.map((ip) => ({addresses: [ip], conditions: {ready: true}, nodeName: options.nodeName ?? 'node-2'})),
  };
}

export function node(name = 'node-1') {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name},
    spec: {podCIDRs: ['10.244.1.0/24']},
    status: {addresses: [{type: 'InternalIP', address: '10.240.0.11'}]},
  };
}

export class MemoryObjects implements ClusterObjects {
  servicesByName = new Map<string, unknown>();
  slicesByName = new Map<string, unknown>();
  nodeObject: unknown = node();

  constructor(init: {services?: Array<{metadata: {name: string}}>; slices?: Array<{metadata: {name: string}}>} = {}) {
    for (const item of init.services ?? []) this.servicesByName.set(item.metadata.name, item);
    for (const item of init.slices ?? []) this.slicesByName.set(item.metadata.name, item);
  }

  services(): unknown[] {
    return [...this.servicesByName.values()];
  }
  endpointSlices(): unknown[] {
    return [...this.slicesByName.values()];
  }
  node(): unknown {
    return this.nodeObject;
  }
}
