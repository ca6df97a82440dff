// Synthetic clusters for benchmarks: N ClusterIP services with M ready endpoints each, spread over
// a few nodes, as the API server would hand them to the proxy.
import type {EndpointSliceInput, NodeInput, ServiceInput} from '../src/core/model/index.ts';

export interface Workload {
  services: ServiceInput[];
  endpointSlices: EndpointSliceInput[];
  node: NodeInput;
  /** What the figures are about, e.g. "10,000 services x 10 endpoints". */
  label: string;
}

export const benchNodeName = 'bench-node';
export const benchNodeIP = '10.240.0.2';
export const benchClusterCIDR = '10.128.0.0/9';

/** serviceIP numbers services from 10.0.0.1 up (a /8 holds 16M, far more than any workload). */
export function serviceIP(index: number): string {
  const n = index + 1;
  return `10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n & 255}`;
}

/** endpointIP gives each (service, endpoint) its own pod address inside the cluster CIDR. */
export function endpointIP(serviceIndex: number, endpointIndex: number, endpointsPerService: number): string {
  const n = serviceIndex * endpointsPerService + endpointIndex + 1;
  return `10.${128 + ((n >> 16) & 127)}.${(n >> 8) & 255}.${n & 255}`;
}

export function makeWorkload(serviceCount: number, endpointsPerService: number): Workload {
  const services: ServiceInput[] = [];
  const endpointSlices: EndpointSliceInput[] = [];
  for (let s = 0; s < serviceCount; s++) {
    const name = `svc-${s}`;
    services.push({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name, namespace: 'bench'},
      spec: {
        type: 'ClusterIP',
        clusterIP: serviceIP(s),
        clusterIPs: [serviceIP(s)],
        ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080}],
      },
    });
    endpointSlices.push(endpointSliceFor(s, endpointsPerService));
  }
  const node: NodeInput = {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {name: benchNodeName},
    status: {addresses: [{type: 'InternalIP', address: benchNodeIP}]},
  };
  return {services, endpointSlices, node, label: `${serviceCount.toLocaleString('en-US')} services x ${endpointsPerService} endpoints`};
}

/** endpointSliceFor is service s's slice; `generation` changes one endpoint's address per step. */
export function endpointSliceFor(s: number, endpointsPerService: number, generation = 0): EndpointSliceInput {
  const endpoints = [];
  for (let e = 0; e < endpointsPerService; e++) {
    // Replaced endpoints come from 10.255.0.0/16, which no original endpoint uses.
    const ip = e === 0 && generation > 0 ? `10.255.${(generation >> 8) & 255}.${generation & 255}` : endpointIP(s, e, endpointsPerService);
    endpoints.push({addresses: [ip], nodeName: e % 3 === 0 ? benchNodeName : `other-${e % 3}`, conditions: {ready: true}});
  }
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {name: `svc-${s}-abcde`, namespace: 'bench', labels: {'kubernetes.io/service-name': `svc-${s}`}},
    addressType: 'IPv4',
    ports: [{name: 'http', protocol: 'TCP', port: 8080}],
    endpoints,
  };
}
