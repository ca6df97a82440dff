// buildProxyModel: Services + EndpointSlices + this Node -> the ProxyModel of one IP family,
// deriving what kube-proxy's service and endpoint change trackers and CategorizeEndpoints derive.
// Pure: never throws on bad objects; each one is skipped with a Problem and the rest is used.
import {categorizeEndpoints, compareStrings} from './categorize.ts';
import {resolveProxyConfig} from './config.ts';
import {readEndpointSlice, type SliceDefinition} from './endpoint-slice.ts';
import {joinHostPort, parseIP} from './ip.ts';
import {readNode, type NodeDefinition} from './node.ts';
import {describe, ObjectProblems} from './object-reader.ts';
import {readService, type ServiceDefinition, type ServicePortDefinition} from './service.ts';
import type {Endpoint, IPFamily, Problem, ProxyConfig, ProxyModel, ServicePort} from './types.ts';

export interface ModelObjects {
  services: unknown[];
  endpointSlices: unknown[];
  /** This proxy's own Node object. */
  node?: unknown;
}

export interface ModelOptions {
  family: IPFamily;
  /** This node's name, matched against endpoints' nodeName. Default: the Node's metadata.name. */
  nodeName?: string;
  /** Override of the node's addresses. Default: the Node's InternalIPs, then ExternalIPs, of the family. */
  nodeIPs?: string[];
  /** Settings; unset ones take defaultProxyConfig()'s values. */
  config?: Partial<ProxyConfig>;
  /**
   * kube-proxy's --cluster-cidr. When given and config.localDetector is not, the detector is
   * ClusterCIDR with those of the family.
   */
  clusterCIDRs?: string[];
  /**
   * kube-proxy's --detect-local-mode, used when config.localDetector is not given. 'NodeCIDR'
   * takes the Node's spec.podCIDRs of the family. Default: ClusterCIDR if clusterCIDRs are
   * given, else None.
   */
  detectLocalMode?: 'ClusterCIDR' | 'NodeCIDR' | 'None';
  /**
   * Services labelled service.kubernetes.io/service-proxy-name are skipped unless the label has
   * this value. Unlabelled services are always ours.
   */
  serviceProxyName?: string;
  /**
   * Before Kubernetes 1.33 kube-proxy used hints only when the service opted in (topology-mode /
   * topology-aware-hints annotation, or spec.trafficDistribution). Newer kube-proxy trusts the
   * hints alone, which is the default here; true restores the older rule.
   */
  topologyNeedsServiceOptIn?: boolean;
  /**
   * Read service.beta.kubernetes.io/load-balancer-source-ranges when spec.loadBalancerSourceRanges
   * is empty, as cloud providers do. kube-proxy does not, hence off by default.
   */
  sourceRangesFromAnnotation?: boolean;
}

export function buildProxyModel(objects: ModelObjects, options: ModelOptions): ProxyModel {
  const problems: Problem[] = [];
  const configProblems = new ObjectProblems(problems, 'Config', 'proxy');
  let family: IPFamily = options.family;
  if (family !== 'IPv4' && family !== 'IPv6') {
    configProblems.add('family', `${describe(family)} is not IPv4 or IPv6`, 'IPv4 used');
    family = 'IPv4';
  }

  let node: NodeDefinition | undefined = objects.node === undefined || objects.node === null ? undefined : readNode(objects.node, family, problems);
  if (node && options.nodeName !== undefined && options.nodeName !== node.name) {
    new ObjectProblems(problems, 'Node', node.name).add(
      'metadata.name',
      `not this proxy's node ${describe(options.nodeName)}`,
      'its addresses, zone and pod CIDRs ignored',
    );
    node = undefined;
  }
  const nodeName = options.nodeName ?? node?.name ?? '';
  const nodeIPs = resolveNodeIPs(options.nodeIPs, node, family, configProblems);
  const config = resolveProxyConfig(
    {family, config: options.config, clusterCIDRs: options.clusterCIDRs, detectLocalMode: options.detectLocalMode},
    node,
    problems,
  );

  const services = readServices(listOf(objects.services, 'services', configProblems), family, options, problems);
  const slicesByService = readSlices(listOf(objects.endpointSlices, 'endpointSlices', configProblems), family, problems);

  const servicePorts: ServicePort[] = [];
  for (const service of services) {
    const slices = slicesByService.get(`${service.namespace}/${service.name}`) ?? [];
    const topologyAllowed = !options.topologyNeedsServiceOptIn || service.topologyOptIn;
    for (const definition of service.ports) {
      const endpoints = endpointsForPort(definition, slices, nodeName);
      const categorized = categorizeEndpoints({
        endpoints,
        usesClusterEndpoints: definition.usesClusterEndpoints,
        usesLocalEndpoints: definition.usesLocalEndpoints,
        nodeName,
        zone: node?.zone ?? '',
        topologyAllowed,
      });
      servicePorts.push({
        ...definition,
        endpoints,
        clusterEndpoints: categorized.clusterEndpoints,
        localEndpoints: categorized.localEndpoints,
        allReachableEndpoints: categorized.allReachableEndpoints,
        topologyApplied: categorized.topologyMode !== '',
        topologyMode: categorized.topologyMode,
        hasAnyEndpoints: categorized.hasAnyEndpoints,
      });
    }
  }
  servicePorts.sort((a, b) => compareStrings(a.key, b.key) || compareStrings(a.protocol, b.protocol));

  const model: ProxyModel = {family, nodeName, nodeIPs, config, servicePorts, problems: sortProblems(problems)};
  if (node?.zone) model.nodeZone = node.zone;
  return model;
}

function listOf(value: unknown, field: string, problems: ObjectProblems): unknown[] {
  if (value === undefined || value === null) return [];
  if (Array.isArray(value)) return value;
  problems.add(field, 'not a list of objects', 'none used');
  return [];
}

function resolveNodeIPs(override: string[] | undefined, node: NodeDefinition | undefined, family: IPFamily, problems: ObjectProblems): string[] {
  if (override === undefined) return node ? unique([...node.internalIPs, ...node.externalIPs]) : [];
  const ips: string[] = [];
  for (const [index, text] of (Array.isArray(override) ? override : []).entries()) {
    const ip = typeof text === 'string' ? parseIP(text) : undefined;
    if (!ip) problems.add(`nodeIPs[${index}]`, `${describe(text)} is not an IP address`, 'address ignored');
    else if (ip.family === family) ips.push(ip.text);
  }
  return unique(ips);
}

function readServices(raw: unknown[], family: IPFamily, options: ModelOptions, problems: Problem[]): ServiceDefinition[] {
  const seen = new Set<string>();
  const services: ServiceDefinition[] = [];
  for (const object of raw) {
    const service = readService(
      object,
      {family, serviceProxyName: options.serviceProxyName, sourceRangesFromAnnotation: options.sourceRangesFromAnnotation ?? false},
      problems,
    );
    if (!service) continue;
    const id = `${service.namespace}/${service.name}`;
    if (seen.has(id)) {
      new ObjectProblems(problems, 'Service', service.name, service.namespace).add('metadata.name', 'given twice', 'second copy skipped');
      continue;
    }
    seen.add(id);
    services.push(service);
  }
  return services;
}

/** readSlices groups usable slices by "namespace/serviceName", each group sorted by slice name. */
function readSlices(raw: unknown[], family: IPFamily, problems: Problem[]): Map<string, SliceDefinition[]> {
  const seen = new Set<string>();
  const byService = new Map<string, SliceDefinition[]>();
  for (const object of raw) {
    const slice = readEndpointSlice(object, family, problems);
    if (!slice) continue;
    const id = `${slice.namespace}/${slice.name}`;
    if (seen.has(id)) {
      new ObjectProblems(problems, 'EndpointSlice', slice.name, slice.namespace).add('metadata.name', 'given twice', 'second copy skipped');
      continue;
    }
    seen.add(id);
    const serviceId = `${slice.namespace}/${slice.serviceName}`;
    const group = byService.get(serviceId) ?? [];
    group.push(slice);
    byService.set(serviceId, group);
  }
  for (const group of byService.values()) group.sort((a, b) => compareStrings(a.name, b.name));
  return byService;
}

/**
 * endpointsForPort resolves the port of every endpoint of the service's slices that carry a port
 * of the same name and protocol. An endpoint seen twice (moving between slices, or an IP reused
 * by a new pod while the old one terminates) keeps the first copy unless a later one is not
 * terminating, as kube-proxy prefers the running pod. Sorted by key like kube-proxy's byEndpoint.
 */
function endpointsForPort(definition: ServicePortDefinition, slices: SliceDefinition[], nodeName: string): Endpoint[] {
  const byKey = new Map<string, Endpoint>();
  for (const slice of slices) {
    const slicePort = slice.ports.find((port) => port.name === definition.portName && port.protocol === definition.protocol);
    if (!slicePort) continue;
    for (const source of slice.endpoints) {
      const key = joinHostPort(source.ip, slicePort.port);
      if (byKey.has(key) && source.terminating) continue;
      const endpoint: Endpoint = {
        ip: source.ip,
        port: slicePort.port,
        ready: source.ready,
        serving: source.serving,
        terminating: source.terminating,
        isLocal: nodeName !== '' && source.nodeName === nodeName,
        key,
      };
      if (source.nodeName !== undefined) endpoint.nodeName = source.nodeName;
      if (source.zone !== undefined) endpoint.zone = source.zone;
      if (source.zoneHints) endpoint.zoneHints = [...source.zoneHints];
      if (source.nodeHints) endpoint.nodeHints = [...source.nodeHints];
      if (source.podName !== undefined) endpoint.podName = source.podName;
      if (source.podNamespace !== undefined) endpoint.podNamespace = source.podNamespace;
      byKey.set(key, endpoint);
    }
  }
  return [...byKey.values()].sort((a, b) => compareStrings(a.key, b.key));
}

const problemKindOrder: Problem['kind'][] = ['Config', 'Node', 'Service', 'EndpointSlice'];

/** sortProblems orders by kind, namespace and name, keeping each object's problems in field order found. */
function sortProblems(problems: Problem[]): Problem[] {
  return [...problems].sort(
    (a, b) =>
      problemKindOrder.indexOf(a.kind) - problemKindOrder.indexOf(b.kind) ||
      compareStrings(a.namespace ?? '', b.namespace ?? '') ||
      compareStrings(a.name, b.name),
  );
}

function unique(values: string[]): string[] {
  return [...new Set(values)];
}
