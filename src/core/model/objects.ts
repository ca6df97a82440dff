// Loose shapes of the Kubernetes objects the model reads (Service, discovery.k8s.io/v1
// EndpointSlice, Node). Every field is optional: they describe what we hope to find, and the
// readers check each value before using it, because the objects come from files and watches we
// do not control.

export interface ObjectMetaInput {
  name?: string;
  namespace?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface ServicePortInput {
  name?: string;
  protocol?: string;
  port?: number;
  targetPort?: number | string;
  nodePort?: number;
  appProtocol?: string;
}

export interface ServiceInput {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMetaInput;
  spec?: {
    type?: string;
    clusterIP?: string;
    clusterIPs?: string[];
    ipFamilies?: string[];
    ipFamilyPolicy?: string;
    ports?: ServicePortInput[];
    selector?: Record<string, string>;
    externalIPs?: string[];
    externalName?: string;
    loadBalancerIP?: string;
    loadBalancerSourceRanges?: string[];
    externalTrafficPolicy?: string;
    internalTrafficPolicy?: string;
    healthCheckNodePort?: number;
    sessionAffinity?: string;
    sessionAffinityConfig?: {clientIP?: {timeoutSeconds?: number}};
    trafficDistribution?: string;
    publishNotReadyAddresses?: boolean;
    allocateLoadBalancerNodePorts?: boolean;
  };
  status?: {
    loadBalancer?: {
      ingress?: Array<{ip?: string; hostname?: string; ipMode?: string}>;
    };
  };
}

export interface EndpointInput {
  addresses?: string[];
  conditions?: {ready?: boolean; serving?: boolean; terminating?: boolean};
  hostname?: string;
  nodeName?: string;
  zone?: string;
  hints?: {forZones?: Array<{name?: string}>; forNodes?: Array<{name?: string}>};
  targetRef?: {kind?: string; name?: string; namespace?: string; uid?: string};
}

export interface EndpointPortInput {
  name?: string;
  protocol?: string;
  port?: number;
  appProtocol?: string;
}

export interface EndpointSliceInput {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMetaInput;
  addressType?: string;
  endpoints?: EndpointInput[];
  ports?: EndpointPortInput[];
}

export interface NodeInput {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMetaInput;
  spec?: {podCIDR?: string; podCIDRs?: string[]};
  status?: {addresses?: Array<{type?: string; address?: string}>};
}

/** Label that links an EndpointSlice to its Service. */
export const serviceNameLabel = 'kubernetes.io/service-name';
/** Label that hands a Service to another proxy; kube-proxy ignores such services. */
export const serviceProxyNameLabel = 'service.kubernetes.io/service-proxy-name';
/** Label of headless services (and their slices); kube-proxy's informers exclude them. */
export const headlessLabel = 'service.kubernetes.io/headless';
/** Node label carrying the node's zone, matched against endpoint zone hints. */
export const zoneLabel = 'topology.kubernetes.io/zone';
export const topologyModeAnnotation = 'service.kubernetes.io/topology-mode';
export const topologyAwareHintsAnnotation = 'service.kubernetes.io/topology-aware-hints';
export const loadBalancerSourceRangesAnnotation = 'service.beta.kubernetes.io/load-balancer-source-ranges';
