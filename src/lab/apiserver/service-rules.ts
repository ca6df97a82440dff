// Services: defaulting, validation and ClusterIP / NodePort allocation as kube-apiserver does them.
import {isIP} from 'node:net';
import {fieldError, internalError, invalid, type ApiError, type FieldError} from './api-error.ts';
import type {IPFamily} from '../../core/model/types.ts';
import {ClusterIPAllocator, ipFamilyOf, NodePortAllocator} from './ip-allocator.ts';
import type {KubeObject} from './object-log.ts';
import {cidrErrors} from './servicecidr-rules.ts';
import {
  dns1123LabelErrors,
  dns1123SubdomainErrors,
  portNameErrors,
  portNumberErrors,
  validateLabels,
  validateObjectMeta,
} from './name-rules.ts';

export interface ServiceNetwork {
  /** One allocator per configured family; the first is the cluster's primary family. */
  clusterIPs: ClusterIPAllocator[];
  nodePorts: NodePortAllocator;
}

const sourceRangesAnnotation = 'service.beta.kubernetes.io/load-balancer-source-ranges';
const serviceTypes = ['ClusterIP', 'ExternalName', 'LoadBalancer', 'NodePort'];
const protocols = ['SCTP', 'TCP', 'UDP'];
const affinities = ['ClientIP', 'None'];
const trafficPolicies = ['Cluster', 'Local'];
const familyPolicies = ['PreferDualStack', 'RequireDualStack', 'SingleStack'];
const trafficDistributions = ['PreferClose', 'PreferSameNode', 'PreferSameZone'];

function isExternal(spec: Record<string, any>): boolean {
  return (
    spec.type === 'NodePort' ||
    spec.type === 'LoadBalancer' ||
    (spec.type === 'ClusterIP' && Array.isArray(spec.externalIPs) && spec.externalIPs.length > 0)
  );
}

/** A LoadBalancer with externalTrafficPolicy Local gets a healthCheckNodePort (kube-apiserver's NeedsHealthCheck). */
function needsHealthCheck(spec: Record<string, any> | undefined): boolean {
  return spec?.type === 'LoadBalancer' && spec.externalTrafficPolicy === 'Local';
}

function needsNodePorts(spec: Record<string, any>): boolean {
  return spec.type === 'NodePort' || (spec.type === 'LoadBalancer' && spec.allocateLoadBalancerNodePorts !== false);
}

/** Fills the fields kube-apiserver defaults; `old` lets updates keep what was allocated before. */
export function defaultService(svc: KubeObject, old: KubeObject | undefined, network: ServiceNetwork): void {
  const spec = (svc.spec ??= {});
  spec.type ??= 'ClusterIP';
  spec.sessionAffinity ??= 'None';
  if (spec.sessionAffinity === 'ClientIP') {
    spec.sessionAffinityConfig ??= {};
    spec.sessionAffinityConfig.clientIP ??= {};
    spec.sessionAffinityConfig.clientIP.timeoutSeconds ??= 10800;
  }
  if (Array.isArray(spec.ports)) {
    for (const port of spec.ports) {
      if (port && typeof port === 'object') {
        port.protocol ??= 'TCP';
        if (port.targetPort === undefined || port.targetPort === 0 || port.targetPort === '') port.targetPort = port.port;
      }
    }
  }
  if (spec.type === 'ExternalName') {
    return;
  }
  if (isExternal(spec) && spec.type !== 'ClusterIP') spec.externalTrafficPolicy ??= 'Cluster';
  spec.internalTrafficPolicy ??= 'Cluster';
  if (spec.type === 'LoadBalancer') spec.allocateLoadBalancerNodePorts ??= true;

  const oldSpec = old?.spec;
  if (oldSpec && oldSpec.type !== 'ExternalName') {
    // Updates that leave allocated values out keep them (kube-apiserver's patchAllocatedValues).
    if (!spec.clusterIP && !spec.clusterIPs && oldSpec.clusterIP) {
      spec.clusterIP = oldSpec.clusterIP;
      spec.clusterIPs = oldSpec.clusterIPs;
    }
    if (!spec.ipFamilies && oldSpec.ipFamilies) spec.ipFamilies = oldSpec.ipFamilies;
    if (!spec.ipFamilyPolicy && oldSpec.ipFamilyPolicy) spec.ipFamilyPolicy = oldSpec.ipFamilyPolicy;
    if (needsNodePorts(spec) && needsNodePorts(oldSpec) && Array.isArray(spec.ports) && Array.isArray(oldSpec.ports)) {
      for (const port of spec.ports) {
        if (!port || port.nodePort) continue;
        const before =
          oldSpec.ports.find((p: any) => p.port === port.port && p.protocol === port.protocol) ??
          (spec.ports.length === 1 && oldSpec.ports.length === 1 ? oldSpec.ports[0] : undefined);
        if (before?.nodePort) port.nodePort = before.nodePort;
      }
    }
    if (!needsNodePorts(spec) && needsNodePorts(oldSpec) && Array.isArray(spec.ports)) {
      // Leaving NodePort/LoadBalancer wipes the node ports that were allocated for it.
      for (const port of spec.ports) {
        if (port && oldSpec.ports?.some((p: any) => p.nodePort === port.nodePort)) delete port.nodePort;
      }
    }
    const healthCheck = needsHealthCheck(spec);
    if (healthCheck && !spec.healthCheckNodePort && oldSpec.healthCheckNodePort) spec.healthCheckNodePort = oldSpec.healthCheckNodePort;
    // Fields that only a former type needed go with it (kube-apiserver's dropTypeDependentFields).
    if (!healthCheck && spec.healthCheckNodePort && spec.healthCheckNodePort === oldSpec.healthCheckNodePort)
      delete spec.healthCheckNodePort;
    if (
      spec.type !== 'LoadBalancer' &&
      oldSpec.type === 'LoadBalancer' &&
      spec.allocateLoadBalancerNodePorts === oldSpec.allocateLoadBalancerNodePorts
    ) {
      delete spec.allocateLoadBalancerNodePorts;
    }
    if (!isExternal(spec) && isExternal(oldSpec) && spec.externalTrafficPolicy === oldSpec.externalTrafficPolicy)
      delete spec.externalTrafficPolicy;
  }

  if (spec.clusterIP && !spec.clusterIPs) spec.clusterIPs = [spec.clusterIP];
  if (!spec.clusterIP && Array.isArray(spec.clusterIPs) && spec.clusterIPs.length > 0) spec.clusterIP = spec.clusterIPs[0];

  const clusterFamilies = network.clusterIPs.map((a) => a.cidr.family);
  if (!spec.ipFamilies || spec.ipFamilies.length === 0) {
    const fromIPs = (spec.clusterIPs ?? [])
      .filter((ip: string) => ip !== 'None')
      .map((ip: string) => ipFamilyOf(ip))
      .filter(Boolean);
    if (fromIPs.length > 0) spec.ipFamilies = fromIPs;
    else if ((spec.ipFamilyPolicy === 'PreferDualStack' || spec.ipFamilyPolicy === 'RequireDualStack') && clusterFamilies.length > 1)
      spec.ipFamilies = [...clusterFamilies];
    else spec.ipFamilies = [clusterFamilies[0]];
  } else if (
    (spec.ipFamilyPolicy === 'PreferDualStack' || spec.ipFamilyPolicy === 'RequireDualStack') &&
    spec.ipFamilies.length === 1 &&
    clusterFamilies.length > 1
  ) {
    spec.ipFamilies = [spec.ipFamilies[0], clusterFamilies.find((f) => f !== spec.ipFamilies[0])];
  }
  spec.ipFamilyPolicy ??= spec.ipFamilies.length > 1 ? 'RequireDualStack' : 'SingleStack';
}

function duplicatePortText(protocol: string, port: number): string {
  return (
    `core.ServicePort{Name:"", Protocol:"${protocol}", AppProtocol:(*string)(nil), Port:${port}, ` +
    `TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:""}, NodePort:0}`
  );
}

export function validateService(svc: KubeObject, old: KubeObject | undefined, network: ServiceNetwork): FieldError[] {
  const errors = validateObjectMeta(svc, 'dns1035-label');
  const spec = svc.spec ?? {};
  const add = (e: FieldError) => errors.push(e);
  const headless = spec.clusterIP === 'None';

  if (!serviceTypes.includes(spec.type)) add(fieldError.notSupported('spec.type', spec.type, serviceTypes));
  const ports: any[] = Array.isArray(spec.ports) ? spec.ports : [];
  if (ports.length === 0 && !headless && spec.type !== 'ExternalName') add(fieldError.required('spec.ports'));

  if (spec.type === 'ExternalName') {
    if (spec.clusterIP) add(fieldError.forbidden('spec.clusterIP', 'may not be set for ExternalName services'));
    if (!spec.externalName) add(fieldError.required('spec.externalName'));
    else {
      const name = String(spec.externalName).replace(/\.$/, '');
      for (const msg of dns1123SubdomainErrors(name)) add(fieldError.invalid('spec.externalName', spec.externalName, msg));
    }
  }
  if ((spec.type === 'NodePort' || spec.type === 'LoadBalancer') && headless) {
    add(fieldError.invalid('spec.clusterIPs[0]', 'None', `may not be set to 'None' for ${spec.type} services`));
  }

  const names = new Set<string>();
  const seenPorts = new Set<string>();
  const seenNodePorts = new Set<string>();
  ports.forEach((port, i) => {
    const path = `spec.ports[${i}]`;
    if (!port || typeof port !== 'object') {
      add(fieldError.invalid(path, port, 'must be an object'));
      return;
    }
    if (ports.length > 1 && !port.name) add(fieldError.required(`${path}.name`));
    else if (port.name) {
      for (const msg of dns1123LabelErrors(port.name)) add(fieldError.invalid(`${path}.name`, port.name, msg));
      if (names.has(port.name)) add(fieldError.duplicate(`${path}.name`, port.name));
      names.add(port.name);
    }
    for (const msg of portNumberErrors(port.port)) add(fieldError.invalid(`${path}.port`, port.port, msg));
    if (!port.protocol) add(fieldError.required(`${path}.protocol`));
    else if (!protocols.includes(port.protocol)) add(fieldError.notSupported(`${path}.protocol`, port.protocol, protocols));
    if (typeof port.targetPort === 'number') {
      for (const msg of portNumberErrors(port.targetPort)) add(fieldError.invalid(`${path}.targetPort`, port.targetPort, msg));
    } else if (typeof port.targetPort === 'string') {
      for (const msg of portNameErrors(port.targetPort)) add(fieldError.invalid(`${path}.targetPort`, port.targetPort, msg));
    }
    if (port.nodePort !== undefined && port.nodePort !== 0) {
      if (spec.type === 'ClusterIP') add(fieldError.forbidden(`${path}.nodePort`, "may not be used when `type` is 'ClusterIP'"));
      const key = `${port.protocol}/${port.nodePort}`;
      if (seenNodePorts.has(key)) add(fieldError.duplicate(`${path}.nodePort`, port.nodePort));
      seenNodePorts.add(key);
    }
    const portKey = `${port.protocol}/${port.port}`;
    if (seenPorts.has(portKey))
      errors.push({type: 'FieldValueDuplicate', field: path, message: `Duplicate value: ${duplicatePortText(port.protocol, port.port)}`});
    seenPorts.add(portKey);
  });

  if (spec.selector !== undefined) errors.push(...validateLabels(spec.selector, 'spec.selector'));

  if (!affinities.includes(spec.sessionAffinity)) add(fieldError.notSupported('spec.sessionAffinity', spec.sessionAffinity, affinities));
  if (spec.sessionAffinity === 'ClientIP') {
    const timeout = spec.sessionAffinityConfig?.clientIP?.timeoutSeconds;
    if (typeof timeout !== 'number' || timeout <= 0 || timeout > 86400) {
      add(fieldError.invalid('spec.sessionAffinityConfig.clientIP.timeoutSeconds', timeout, 'must be greater than 0 and less than 86400'));
    }
  } else if (spec.sessionAffinity === 'None' && spec.sessionAffinityConfig) {
    add(fieldError.forbidden('spec.sessionAffinityConfig', 'must not be set when session affinity is None'));
  }

  const clusterIPs: string[] = Array.isArray(spec.clusterIPs) ? spec.clusterIPs : [];
  if (spec.clusterIP && clusterIPs.length > 0 && clusterIPs[0] !== spec.clusterIP) {
    add(fieldError.invalid('spec.clusterIPs', clusterIPs, 'first value must match `clusterIP`'));
  }
  clusterIPs.forEach((ip, i) => {
    if (ip === 'None' && i === 0) return;
    if (!isIP(ip)) add(fieldError.invalid(`spec.clusterIPs[${i}]`, ip, "must be empty, 'None', or a valid IP address"));
  });
  if (clusterIPs.length === 2 && ipFamilyOf(clusterIPs[0]) === ipFamilyOf(clusterIPs[1])) {
    add(fieldError.invalid('spec.clusterIPs', clusterIPs, 'may specify no more than one IP for each IP family'));
  }

  (spec.externalIPs ?? []).forEach((ip: string, i: number) => {
    if (!isIP(ip)) add(fieldError.invalid(`spec.externalIPs[${i}]`, ip, 'must be a valid IP address'));
  });

  if (spec.externalTrafficPolicy !== undefined && spec.externalTrafficPolicy !== '') {
    if (!isExternal(spec))
      add(
        fieldError.invalid('spec.externalTrafficPolicy', spec.externalTrafficPolicy, 'may only be set for externally-accessible services'),
      );
    else if (!trafficPolicies.includes(spec.externalTrafficPolicy))
      add(fieldError.notSupported('spec.externalTrafficPolicy', spec.externalTrafficPolicy, trafficPolicies));
  }
  if (spec.type !== 'ExternalName' && spec.internalTrafficPolicy !== undefined && !trafficPolicies.includes(spec.internalTrafficPolicy)) {
    add(fieldError.notSupported('spec.internalTrafficPolicy', spec.internalTrafficPolicy, trafficPolicies));
  }
  if (spec.healthCheckNodePort && !needsHealthCheck(spec)) {
    add(
      fieldError.invalid(
        'spec.healthCheckNodePort',
        spec.healthCheckNodePort,
        "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
      ),
    );
  }
  errors.push(...validateSourceRanges(svc));
  if (spec.trafficDistribution !== undefined && !trafficDistributions.includes(spec.trafficDistribution)) {
    add(fieldError.notSupported('spec.trafficDistribution', spec.trafficDistribution, trafficDistributions));
  }

  if (spec.type !== 'ExternalName') {
    const families: string[] = Array.isArray(spec.ipFamilies) ? spec.ipFamilies : [];
    const clusterFamilies = network.clusterIPs.map((a) => a.cidr.family as string);
    if (!familyPolicies.includes(spec.ipFamilyPolicy))
      add(fieldError.notSupported('spec.ipFamilyPolicy', spec.ipFamilyPolicy, familyPolicies));
    families.forEach((family, i) => {
      if (family !== 'IPv4' && family !== 'IPv6') add(fieldError.notSupported(`spec.ipFamilies[${i}]`, family, ['IPv4', 'IPv6']));
      else if (!clusterFamilies.includes(family))
        add(fieldError.invalid(`spec.ipFamilies[${i}]`, family, 'not configured on this cluster'));
      if (families.indexOf(family) !== i) add(fieldError.duplicate(`spec.ipFamilies[${i}]`, family));
    });
    if (spec.ipFamilyPolicy === 'SingleStack' && families.length > 1)
      add(fieldError.invalid('spec.ipFamilies', families, 'when spec.ipFamilyPolicy is SingleStack, ipFamilies must have only one value'));
    if (spec.ipFamilyPolicy === 'RequireDualStack' && clusterFamilies.length < 2)
      add(fieldError.invalid('spec.ipFamilyPolicy', spec.ipFamilyPolicy, 'Cluster is not configured for dual-stack services'));
    clusterIPs.forEach((ip, i) => {
      if (ip === 'None' || !isIP(ip)) return;
      if (families[i] && ipFamilyOf(ip) !== families[i])
        add(fieldError.invalid(`spec.clusterIPs[${i}]`, ip, `expected an ${families[i]} value as indicated by \`ipFamilies[${i}]\``));
    });
  }

  if (
    old &&
    old.spec?.type !== 'ExternalName' &&
    spec.type !== 'ExternalName' &&
    old.spec?.clusterIP &&
    spec.clusterIP !== old.spec.clusterIP
  ) {
    add(fieldError.invalid('spec.clusterIP', spec.clusterIP ?? '', 'field is immutable'));
  }
  errors.push(...validateServiceStatus(svc));
  return errors;
}

/**
 * spec.loadBalancerSourceRanges, or else the annotation that predates it: LoadBalancers only, each
 * entry a CIDR (space-padding allowed, a historical accident kube-apiserver keeps). The field path
 * is spelt as kube-apiserver spells it.
 */
function validateSourceRanges(svc: KubeObject): FieldError[] {
  const errors: FieldError[] = [];
  const spec = svc.spec ?? {};
  const ranges: string[] = Array.isArray(spec.loadBalancerSourceRanges) ? spec.loadBalancerSourceRanges : [];
  const annotation = svc.metadata.annotations?.[sourceRangesAnnotation];
  const forbidden = "may only be used when `type` is 'LoadBalancer'";
  if (ranges.length > 0) {
    if (spec.type !== 'LoadBalancer') errors.push(fieldError.forbidden('spec.LoadBalancerSourceRanges', forbidden));
    ranges.forEach((range, i) => {
      for (const msg of cidrErrors(range.trim())) errors.push(fieldError.invalid(`spec.LoadBalancerSourceRanges[${i}]`, range.trim(), msg));
    });
  } else if (typeof annotation === 'string') {
    const field = `metadata.annotations[${sourceRangesAnnotation}]`;
    if (spec.type !== 'LoadBalancer') errors.push(fieldError.forbidden(field, forbidden));
    const text = annotation.trim();
    if (text !== '')
      for (const range of text.split(','))
        for (const msg of cidrErrors(range.trim())) errors.push(fieldError.invalid(field, range.trim(), msg));
  }
  return errors;
}

/** status.loadBalancer as kube-apiserver's ValidateLoadBalancerStatus checks it (on create and on /status). */
export function validateServiceStatus(svc: KubeObject): FieldError[] {
  const errors: FieldError[] = [];
  const ingress: any[] = Array.isArray(svc.status?.loadBalancer?.ingress) ? svc.status.loadBalancer.ingress : [];
  ingress.forEach((entry, i) => {
    const path = `status.loadBalancer.ingress[${i}]`;
    if (entry?.ip) {
      if (!isIP(entry.ip))
        errors.push(fieldError.invalid(`${path}.ip`, entry.ip, 'must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)'));
    } else if (entry?.ipMode) errors.push(fieldError.forbidden(`${path}.ipMode`, 'may not be specified when `ip` is not set'));
    if (entry?.hostname) {
      for (const msg of dns1123SubdomainErrors(entry.hostname)) errors.push(fieldError.invalid(`${path}.hostname`, entry.hostname, msg));
      if (isIP(entry.hostname))
        errors.push(fieldError.invalid(`${path}.hostname`, entry.hostname, 'must be a DNS name, not an IP address'));
    }
  });
  return errors;
}

/** What a service holds in the allocators. */
function heldAddresses(svc: KubeObject | undefined): {ips: string[]; nodePorts: number[]} {
  const spec = svc?.spec;
  if (!spec || spec.type === 'ExternalName') return {ips: [], nodePorts: []};
  const ips = (spec.clusterIPs ?? []).filter((ip: string) => ip && ip !== 'None');
  const nodePorts = [
    ...new Set<number>((spec.ports ?? []).map((p: any) => p?.nodePort).filter((p: unknown) => typeof p === 'number' && p > 0)),
  ];
  if (spec.healthCheckNodePort) nodePorts.push(spec.healthCheckNodePort);
  return {ips, nodePorts};
}

/**
 * Takes the ClusterIPs and NodePorts `svc` asks for (allocating the missing ones) and gives back what `old`
 * held and `svc` no longer does. On failure nothing changes and the 422 error says why.
 */
export function allocateServiceAddresses(svc: KubeObject, old: KubeObject | undefined, network: ServiceNetwork): ApiError | undefined {
  const spec = svc.spec;
  const before = heldAddresses(old);
  const taken: Array<() => void> = [];
  const rollback = () => taken.forEach((undo) => undo());
  const errors: FieldError[] = [];
  const allocatorFor = (family: string) => network.clusterIPs.find((a) => a.cidr.family === family);

  if (spec.type !== 'ExternalName' && spec.clusterIP !== 'None') {
    const families: IPFamily[] = spec.ipFamilies;
    const ips: string[] = [...(spec.clusterIPs ?? [])];
    families.forEach((family, i) => {
      const allocator = allocatorFor(family);
      if (!allocator) return;
      const ip = ips[i];
      if (ip) {
        if (before.ips.includes(ip)) return;
        const failure = allocator.allocate(ip);
        if (failure) errors.push(fieldError.invalid('spec.clusterIPs', spec.clusterIPs, `failed to allocate IP ${ip}: ${failure}`));
        else taken.push(() => allocator.release(ip));
      } else {
        const next = allocator.allocateNext();
        if (!next) {
          if (spec.ipFamilyPolicy !== 'PreferDualStack' || i === 0)
            errors.push(fieldError.invalid('spec.clusterIPs', [], `failed to allocate a serviceIP: range is full`));
          return;
        }
        taken.push(() => allocator.release(next));
        ips[i] = next;
      }
    });
    if (errors.length === 0) {
      spec.clusterIPs = ips.slice(0, families.length);
      spec.clusterIP = spec.clusterIPs[0];
    }
  } else if (spec.clusterIP === 'None') {
    spec.clusterIPs = ['None'];
  }

  if (errors.length === 0 && spec.type !== 'ExternalName') {
    const mine = new Set<number>(); // TCP and UDP ports of one service may share a node port
    const wantNodePorts = needsNodePorts(spec);
    (spec.ports ?? []).forEach((port: any, i: number) => {
      if (!wantNodePorts && !port.nodePort) return;
      if (port.nodePort) {
        if (before.nodePorts.includes(port.nodePort) || mine.has(port.nodePort)) {
          mine.add(port.nodePort);
          return;
        }
        const failure = network.nodePorts.allocate(port.nodePort);
        if (failure) errors.push(fieldError.invalid(`spec.ports[${i}].nodePort`, port.nodePort, failure));
        else {
          const p = port.nodePort;
          taken.push(() => network.nodePorts.release(p));
          mine.add(p);
        }
      } else {
        const next = network.nodePorts.allocateNext();
        if (next === undefined) errors.push(fieldError.invalid(`spec.ports[${i}].nodePort`, 0, 'range is full'));
        else {
          taken.push(() => network.nodePorts.release(next));
          port.nodePort = next;
          mine.add(next);
        }
      }
    });
    if (errors.length === 0 && needsHealthCheck(spec)) {
      // kube-apiserver's allocHealthCheckNodePort and updateHealthCheckNodePort, with their answers:
      // a port that cannot be had is an internal error (500), a changed one is refused (422).
      const oldPort = old?.spec?.healthCheckNodePort;
      if (needsHealthCheck(old?.spec) && spec.healthCheckNodePort !== oldPort) {
        errors.push(
          fieldError.invalid(
            'spec.healthCheckNodePort',
            spec.healthCheckNodePort ?? 0,
            'cannot change healthCheckNodePort on loadBalancer service with externalTraffic=Local during update',
          ),
        );
      } else if (spec.healthCheckNodePort) {
        const p = spec.healthCheckNodePort;
        if (!before.nodePorts.includes(p)) {
          const failure = network.nodePorts.allocate(p);
          if (failure) {
            rollback();
            return internalError(`failed to allocate requested HealthCheck NodePort ${p}: ${failure}`);
          }
          taken.push(() => network.nodePorts.release(p));
        }
      } else {
        const next = network.nodePorts.allocateNext();
        if (next === undefined) {
          rollback();
          return internalError('failed to allocate a HealthCheck NodePort 0: range is full');
        }
        taken.push(() => network.nodePorts.release(next));
        spec.healthCheckNodePort = next;
      }
    } else if (spec.healthCheckNodePort && old?.spec?.healthCheckNodePort === spec.healthCheckNodePort) {
      delete spec.healthCheckNodePort;
    }
  }

  if (errors.length > 0) {
    rollback();
    return invalid('Service', '', svc.metadata.name, errors);
  }
  const after = heldAddresses(svc);
  for (const ip of before.ips) if (!after.ips.includes(ip)) network.clusterIPs.forEach((a) => a.release(ip));
  for (const p of before.nodePorts) if (!after.nodePorts.includes(p)) network.nodePorts.release(p);
  return undefined;
}

export function releaseServiceAddresses(svc: KubeObject, network: ServiceNetwork): void {
  const held = heldAddresses(svc);
  for (const ip of held.ips) network.clusterIPs.forEach((a) => a.release(ip));
  for (const p of held.nodePorts) network.nodePorts.release(p);
}
