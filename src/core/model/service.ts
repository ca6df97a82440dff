// Service -> the service ports of one IP family, as kube-proxy's serviceToServiceMap and
// newBaseServiceInfo derive them, with every field checked.
//
// A bad value drops the smallest part whose loss leaves the rest meaning what it said: a bad
// externalIP or load-balancer ingress entry drops that entry, a bad port drops that port, and a bad
// value that shapes every port (clusterIP, policies, session affinity, source ranges) drops the
// whole service. Source ranges in particular: dropping bad ones could leave an empty list, which
// means "allow everyone".
import {parseCIDR, parseIP} from './ip.ts';
import {
  describe,
  invalid,
  isJsonObject,
  ObjectProblems,
  optionalArray,
  optionalInteger,
  optionalString,
  listOrNone,
  readObjectHeader,
  readPortEntry,
  stringMap,
} from './object-reader.ts';
import {
  headlessLabel,
  loadBalancerSourceRangesAnnotation,
  serviceProxyNameLabel,
  topologyAwareHintsAnnotation,
  topologyModeAnnotation,
} from './objects.ts';
import type {IPFamily, Problem, Protocol, ServicePort} from './types.ts';

/** ServicePortDefinition is a ServicePort before its endpoints are attached. */
export type ServicePortDefinition = Omit<
  ServicePort,
  'endpoints' | 'clusterEndpoints' | 'localEndpoints' | 'allReachableEndpoints' | 'topologyApplied' | 'topologyMode' | 'hasAnyEndpoints'
>;

export interface ServiceDefinition {
  namespace: string;
  name: string;
  /**
   * The service asked for topology-aware routing (topology-mode or topology-aware-hints annotation
   * not empty/disabled, or spec.trafficDistribution set). Only consulted when ModelOptions asks for
   * the pre-1.33 rule that hints need the service's opt-in.
   */
  topologyOptIn: boolean;
  ports: ServicePortDefinition[];
}

export interface ServiceReadOptions {
  family: IPFamily;
  /** Services labelled service.kubernetes.io/service-proxy-name are ours only with this value. */
  serviceProxyName?: string;
  /** Fall back to the service.beta.kubernetes.io/load-balancer-source-ranges annotation. */
  sourceRangesFromAnnotation: boolean;
}

const serviceTypes = new Set(['ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName']);
const protocols = new Set<string>(['TCP', 'UDP', 'SCTP']);
const trafficPolicies = new Set(['Cluster', 'Local']);
/** kube-proxy's default for sessionAffinityConfig.clientIP.timeoutSeconds (3 hours). */
export const defaultStickyTimeoutSeconds = 10800;
const maxStickyTimeoutSeconds = 86400;

/**
 * readService returns the service ports of the given family, or undefined when the service
 * yields none: skipped on purpose (ExternalName, headless, no clusterIP, another proxy's, only
 * the other family) or because it is invalid (then a Problem says why).
 */
export function readService(raw: unknown, options: ServiceReadOptions, sink: Problem[]): ServiceDefinition | undefined {
  const header = readObjectHeader(raw, 'Service', sink, {notObject: 'skipped', unnamed: 'service skipped'});
  if (!header) return undefined;
  const {object, metadata, name, namespace, problems} = header;

  const labels = stringMap(metadata.labels);
  const proxyName = labels[serviceProxyNameLabel];
  if (proxyName !== undefined && proxyName !== options.serviceProxyName) return undefined;
  if (headlessLabel in labels) return undefined;

  if (!isJsonObject(object.spec)) {
    problems.add('spec', object.spec === undefined ? 'missing' : 'not an object', 'service skipped');
    return undefined;
  }
  const spec = object.spec;

  const typeValue = optionalString(spec.type);
  if (typeValue === invalid || (typeValue !== undefined && !serviceTypes.has(typeValue))) {
    problems.add('spec.type', `unknown type ${describe(spec.type)}`, 'service skipped');
    return undefined;
  }
  const type = typeValue ?? 'ClusterIP';
  if (type === 'ExternalName') return undefined;

  const clusterIP = readClusterIP(spec, options.family, problems);
  if (clusterIP === undefined) return undefined;

  const externalPolicy = readPolicy(spec, 'externalTrafficPolicy', problems);
  const internalPolicy = readPolicy(spec, 'internalTrafficPolicy', problems);
  if (externalPolicy === invalid || internalPolicy === invalid) return undefined;

  const sessionAffinity = readSessionAffinity(spec, problems);
  if (sessionAffinity === invalid) return undefined;

  const sourceRanges = readSourceRanges(spec, stringMap(metadata.annotations), options, problems);

  const externalIPs = readExternalIPs(spec, options.family, problems);
  const loadBalancerIPs = readLoadBalancerIPs(object.status, options.family, problems);

  // apiservice.ExternalPolicyLocal: the policy only counts on NodePort and LoadBalancer services,
  // and on ClusterIP services that have externalIPs (ExternalIPs counted before family filtering).
  const hasExternalIPs = Array.isArray(spec.externalIPs) && spec.externalIPs.length > 0;
  const typeAcceptsExternal = type === 'NodePort' || type === 'LoadBalancer' || (type === 'ClusterIP' && hasExternalIPs);
  const externalLocalRequested = typeAcceptsExternal && externalPolicy === 'Local';
  const healthCheckNodePort = type === 'LoadBalancer' && externalLocalRequested ? readHealthCheckNodePort(spec, problems) : 0;

  const annotations = stringMap(metadata.annotations);
  const hintsAnnotation = annotations[topologyModeAnnotation] ?? annotations[topologyAwareHintsAnnotation] ?? '';
  const trafficDistribution = optionalString(spec.trafficDistribution);
  const topologyOptIn =
    (hintsAnnotation !== '' && hintsAnnotation !== 'disabled' && hintsAnnotation !== 'Disabled') ||
    (typeof trafficDistribution === 'string' && trafficDistribution !== '');

  const ports: ServicePortDefinition[] = [];
  const portsValue = optionalArray(spec.ports);
  if (portsValue === invalid) {
    problems.add('spec.ports', 'not a list', 'service skipped');
    return undefined;
  }
  const seenNames = new Set<string>();
  for (const [index, value] of (portsValue ?? []).entries()) {
    const field = `spec.ports[${index}]`;
    const read = readPortEntry(value, field, problems);
    if (!read) continue;
    const {entry: portValue, name: portName} = read;
    const nameOfPort = portName ?? '';
    const detail = nameOfPort === '' ? '' : ` port ${nameOfPort}`;
    if (seenNames.has(nameOfPort)) {
      const what = nameOfPort === '' ? 'a second unnamed port' : `duplicate port name ${describe(nameOfPort)}`;
      problems.add(`${field}.name`, what, 'port skipped', detail);
      continue;
    }
    seenNames.add(nameOfPort);
    const protocolValue = optionalString(portValue.protocol);
    if (protocolValue === invalid || (protocolValue !== undefined && !protocols.has(protocolValue))) {
      problems.add(`${field}.protocol`, `unknown protocol ${describe(portValue.protocol)}`, 'port skipped', detail);
      continue;
    }
    const protocol = (protocolValue ?? 'TCP') as Protocol;
    const port = optionalInteger(portValue.port, 1, 65535);
    if (port === undefined || port === invalid) {
      const cause = port === undefined ? 'missing' : `${describe(portValue.port)} is not in 1-65535`;
      problems.add(`${field}.port`, cause, 'port skipped', detail);
      continue;
    }
    let nodePort = optionalInteger(portValue.nodePort, 0, 65535);
    if (nodePort === invalid) {
      problems.add(`${field}.nodePort`, `${describe(portValue.nodePort)} is not in 1-65535`, 'port skipped', detail);
      continue;
    }
    nodePort ??= 0;
    if (nodePort !== 0 && type !== 'NodePort' && type !== 'LoadBalancer') {
      problems.add(`${field}.nodePort`, `nodePort ${nodePort} on a ${type} service`, 'nodePort ignored', detail);
      nodePort = 0;
    }
    const externallyAccessible = nodePort !== 0 || loadBalancerIPs.length > 0 || externalIPs.length > 0;
    const internalPolicyLocal = internalPolicy === 'Local';
    const externalPolicyLocal = externalLocalRequested && externallyAccessible;
    ports.push({
      namespace,
      serviceName: name,
      portName: nameOfPort,
      key: servicePortKey(namespace, name, nameOfPort),
      protocol,
      clusterIP,
      port,
      nodePort,
      externalIPs: [...externalIPs],
      loadBalancerIPs: [...loadBalancerIPs],
      loadBalancerSourceRanges: [...sourceRanges.ranges],
      loadBalancerSourceRangesInvalid: sourceRanges.invalid,
      externalPolicyLocal,
      internalPolicyLocal,
      healthCheckNodePort,
      ...(sessionAffinity === undefined ? {} : {sessionAffinity: {...sessionAffinity}}),
      externallyAccessible,
      usesClusterEndpoints: !internalPolicyLocal || externallyAccessible,
      usesLocalEndpoints: internalPolicyLocal || externalPolicyLocal,
    });
  }
  return {namespace, name, topologyOptIn, ports};
}

/** servicePortKey is kube-proxy's ServicePortName string: "namespace/name" plus ":port" if named. */
export function servicePortKey(namespace: string, name: string, portName: string): string {
  return portName === '' ? `${namespace}/${name}` : `${namespace}/${name}:${portName}`;
}

/**
 * readClusterIP picks the clusterIP of the family, like proxyutil.GetClusterIPByFamily, after
 * checking clusterIP, clusterIPs and ipFamilies agree. Undefined: no clusterIP of this family
 * (headless, unset, or single-stack of the other family), or invalid (with a Problem).
 */
function readClusterIP(spec: Record<string, unknown>, family: IPFamily, problems: ObjectProblems): string | undefined {
  const single = optionalString(spec.clusterIP);
  if (single === invalid) {
    problems.add('spec.clusterIP', `${describe(spec.clusterIP)} is not an IP address`, 'service skipped');
    return undefined;
  }
  const listValue = optionalArray(spec.clusterIPs);
  if (listValue === invalid || (listValue ?? []).some((entry) => typeof entry !== 'string')) {
    problems.add('spec.clusterIPs', `${describe(spec.clusterIPs)} is not a list of addresses`, 'service skipped');
    return undefined;
  }
  const list = (listValue ?? []) as string[];
  if (single === 'None' || list[0] === 'None') return undefined;
  const clusterIPs = list.length > 0 ? list : single ? [single] : [];
  const fieldOf = (index: number) => (list.length > 0 ? `spec.clusterIPs[${index}]` : 'spec.clusterIP');
  if (clusterIPs.length === 0) return undefined;
  if (single && list.length > 0 && single !== list[0]) {
    problems.add('spec.clusterIP', `${describe(single)} differs from spec.clusterIPs[0] ${describe(list[0])}`, 'service skipped');
    return undefined;
  }
  if (clusterIPs.length > 2) {
    problems.add('spec.clusterIPs', `${clusterIPs.length} addresses, at most 2 (one per family)`, 'service skipped');
    return undefined;
  }
  const familiesValue = optionalArray(spec.ipFamilies);
  if (familiesValue === invalid || (familiesValue ?? []).some((entry) => entry !== 'IPv4' && entry !== 'IPv6')) {
    problems.add('spec.ipFamilies', `${describe(spec.ipFamilies)} is not a list of IPv4/IPv6`, 'service skipped');
    return undefined;
  }
  const families = (familiesValue ?? []) as IPFamily[];
  const parsed = [];
  for (const [index, text] of clusterIPs.entries()) {
    const ip = parseIP(text);
    if (!ip) {
      problems.add(fieldOf(index), `${describe(text)} is not an IP address`, 'service skipped');
      return undefined;
    }
    const declared = families[index];
    if (declared !== undefined && declared !== ip.family) {
      problems.add(fieldOf(index), `${ip.text} is not an ${declared} address as spec.ipFamilies[${index}] says`, 'service skipped');
      return undefined;
    }
    parsed.push(ip);
  }
  if (parsed.length === 2 && parsed[0].family === parsed[1].family) {
    problems.add('spec.clusterIPs', `both addresses are ${parsed[0].family}`, 'service skipped');
    return undefined;
  }
  return parsed.find((ip) => ip.family === family)?.text;
}

function readPolicy(
  spec: Record<string, unknown>,
  field: 'externalTrafficPolicy' | 'internalTrafficPolicy',
  problems: ObjectProblems,
): 'Cluster' | 'Local' | undefined | typeof invalid {
  const value = optionalString(spec[field]);
  if (value === undefined) return undefined;
  if (value === invalid || !trafficPolicies.has(value)) {
    problems.add(`spec.${field}`, `unknown policy ${describe(spec[field])}`, 'service skipped');
    return invalid;
  }
  return value as 'Cluster' | 'Local';
}

function readSessionAffinity(
  spec: Record<string, unknown>,
  problems: ObjectProblems,
): {timeoutSeconds: number} | undefined | typeof invalid {
  const affinity = optionalString(spec.sessionAffinity);
  if (affinity === undefined || affinity === 'None') return undefined;
  if (affinity !== 'ClientIP') {
    problems.add('spec.sessionAffinity', `unknown affinity ${describe(spec.sessionAffinity)}`, 'service skipped');
    return invalid;
  }
  const config = isJsonObject(spec.sessionAffinityConfig) ? spec.sessionAffinityConfig : {};
  const clientIP = isJsonObject(config.clientIP) ? config.clientIP : {};
  const timeout = optionalInteger(clientIP.timeoutSeconds, 1, maxStickyTimeoutSeconds);
  if (timeout === invalid) {
    problems.add(
      'spec.sessionAffinityConfig.clientIP.timeoutSeconds',
      `${describe(clientIP.timeoutSeconds)} is not in 1-${maxStickyTimeoutSeconds}`,
      'service skipped',
    );
    return invalid;
  }
  return {timeoutSeconds: timeout ?? defaultStickyTimeoutSeconds};
}

/** What the load-balancer IPs pass, when one entry of the ranges cannot be read: nothing (fail closed). */
const closedFirewall = 'load-balancer IPs closed to every client; cluster IP, NodePorts and external IPs kept';

/**
 * readSourceRanges returns the family's CIDRs of spec.loadBalancerSourceRanges (whitespace
 * trimmed, as kube-proxy tolerates it). kube-proxy itself ignores the old annotation; cloud
 * providers read it when the field is empty, and so do we when asked. A list with an entry that is
 * no CIDR is `invalid`: the firewall cannot be known, so the load-balancer IPs it guards admit
 * nobody, while the addresses it does not govern keep working.
 */
function readSourceRanges(
  spec: Record<string, unknown>,
  annotations: Record<string, string>,
  options: ServiceReadOptions,
  problems: ObjectProblems,
): {ranges: string[]; invalid: boolean} {
  const listValue = optionalArray(spec.loadBalancerSourceRanges);
  if (listValue === invalid) {
    problems.add('spec.loadBalancerSourceRanges', 'not a list', closedFirewall);
    return {ranges: [], invalid: true};
  }
  let entries: Array<{text: unknown; field: string}> = (listValue ?? []).map((text, index) => ({
    text,
    field: `spec.loadBalancerSourceRanges[${index}]`,
  }));
  const annotation = annotations[loadBalancerSourceRangesAnnotation];
  if (entries.length === 0 && options.sourceRangesFromAnnotation && annotation !== undefined && annotation.trim() !== '') {
    const field = `metadata.annotations[${loadBalancerSourceRangesAnnotation}]`;
    entries = annotation.split(',').map((text) => ({text, field}));
  }
  const ranges: string[] = [];
  for (const entry of entries) {
    const cidr = typeof entry.text === 'string' ? parseCIDR(entry.text.trim()) : undefined;
    if (!cidr) {
      problems.add(entry.field, `${describe(entry.text)} is not a CIDR`, closedFirewall);
      return {ranges: [], invalid: true};
    }
    if (cidr.family === options.family && !ranges.includes(cidr.text)) ranges.push(cidr.text);
  }
  return {ranges, invalid: false};
}

function readExternalIPs(spec: Record<string, unknown>, family: IPFamily, problems: ObjectProblems): string[] {
  const ips: string[] = [];
  for (const [index, text] of listOrNone(spec.externalIPs, 'spec.externalIPs', 'externalIPs ignored', problems).entries()) {
    const ip = typeof text === 'string' ? parseIP(text) : undefined;
    if (!ip) {
      problems.add(`spec.externalIPs[${index}]`, `${describe(text)} is not an IP address`, 'address ignored');
      continue;
    }
    if (ip.family === family && !ips.includes(ip.text)) ips.push(ip.text);
  }
  return ips;
}

/** readLoadBalancerIPs keeps ingress IPs of the family whose ipMode is VIP or unset (proxyutil.IsVIPMode). */
function readLoadBalancerIPs(status: unknown, family: IPFamily, problems: ObjectProblems): string[] {
  const loadBalancer = isJsonObject(status) && isJsonObject(status.loadBalancer) ? status.loadBalancer : {};
  const ips: string[] = [];
  for (const [index, ingress] of listOrNone(
    loadBalancer.ingress,
    'status.loadBalancer.ingress',
    'load-balancer IPs ignored',
    problems,
  ).entries()) {
    const field = `status.loadBalancer.ingress[${index}]`;
    if (!isJsonObject(ingress)) {
      problems.add(field, 'not an object', 'entry ignored');
      continue;
    }
    const ipText = optionalString(ingress.ip);
    if (ipText === undefined || ipText === '') continue; // hostname-only ingress: nothing to route
    const ip = ipText === invalid ? undefined : parseIP(ipText);
    if (!ip) {
      problems.add(`${field}.ip`, `${describe(ingress.ip)} is not an IP address`, 'entry ignored');
      continue;
    }
    const mode = optionalString(ingress.ipMode);
    if (mode === invalid || (mode !== undefined && mode !== 'VIP' && mode !== 'Proxy')) {
      problems.add(`${field}.ipMode`, `unknown ipMode ${describe(ingress.ipMode)}`, 'entry ignored');
      continue;
    }
    if (mode === 'Proxy') continue; // the load balancer proxies; packets never carry this IP here
    if (ip.family === family && !ips.includes(ip.text)) ips.push(ip.text);
  }
  return ips;
}

function readHealthCheckNodePort(spec: Record<string, unknown>, problems: ObjectProblems): number {
  const value = optionalInteger(spec.healthCheckNodePort, 0, 65535);
  if (value === invalid) {
    problems.add('spec.healthCheckNodePort', `${describe(spec.healthCheckNodePort)} is not in 1-65535`, 'health check port ignored');
    return 0;
  }
  return value ?? 0;
}
