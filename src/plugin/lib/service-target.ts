// What `trace` needs from the API server: the Service and the port asked for, its endpoints with
// their pods, nodes and conditions (to label the tracer's branches and warn about them), and the
// packet's source (a pod, an address, or the node itself).
import {CoreV1Api, DiscoveryV1Api, type KubeConfig, type V1Service} from '@kubernetes/client-node';
import {isIP} from 'node:net';
import {joinHostPort} from '../../core/model/ip.ts';
import type {Protocol} from '../../core/model/types.ts';
import {apiError} from './agent-pods.ts';
import {labExternalClient} from './lab-client.ts';
import {PluginError} from './plugin-error.ts';
import type {EndpointInfo} from './trace-text.ts';

/** Pods (and Nodes) of the lab carry the network namespace they live in. */
export const netnsAnnotation = 'lab.proxyctl.dev/netns';

export interface ServiceTarget {
  namespace: string;
  name: string;
  type: string;
  /** "namespace/name:port" (":port" left out when the port has no name), as the rules' comments say. */
  servicePort: string;
  portName: string;
  port: number;
  protocol: Protocol;
  clusterIPs: string[];
  nodePort?: number;
  externalIPs: string[];
  loadBalancerIPs: string[];
  externalTrafficPolicy: string;
  internalTrafficPolicy: string;
  /** "ip:port" -> the pod and node behind it. */
  endpoints: Map<string, EndpointInfo & {ip: string}>;
}

export interface PacketSource {
  ip: string;
  /** The node the packet enters (the pod's node); undefined for a bare address. */
  node?: string;
  /** Network namespace to probe from, when known (lab pods). */
  netns?: string;
  pod?: string;
  /** The lab's external client the packet comes from, by name. */
  externalClient?: string;
}

function notFound(error: unknown): boolean {
  return (error as {code?: number}).code === 404;
}

/** splitName reads "NAME" (in defaultNamespace) or "NAMESPACE/NAME". */
export function splitName(reference: string, defaultNamespace: string): {namespace: string; name: string} {
  const parts = reference.split('/');
  if (parts.length === 1 && parts[0]) return {namespace: defaultNamespace, name: parts[0]};
  if (parts.length === 2 && parts[0] && parts[1]) return {namespace: parts[0], name: parts[1]};
  throw new PluginError(`${JSON.stringify(reference)}: must be NAME or NAMESPACE/NAME`);
}

/** splitServiceReference reads NAME or NAMESPACE/NAME, either with :PORT. */
export function splitServiceReference(reference: string, defaultNamespace: string): {namespace: string; name: string; port?: string} {
  const colon = reference.lastIndexOf(':');
  const named = splitName(colon >= 0 ? reference.slice(0, colon) : reference, defaultNamespace);
  return colon >= 0 ? {...named, port: reference.slice(colon + 1)} : named;
}

function pickPort(service: V1Service, wanted: string | undefined, label: string) {
  const ports = service.spec?.ports ?? [];
  if (ports.length === 0) throw new PluginError(`service ${label} has no ports`);
  const describe = () => ports.map((port) => `${port.name ? `${port.name}=` : ''}${port.port}/${port.protocol ?? 'TCP'}`).join(', ');
  if (wanted === undefined) {
    if (ports.length === 1) return ports[0];
    throw new PluginError(`service ${label} has ${ports.length} ports (${describe()}): pick one with --port NAME|NUMBER`);
  }
  const found = ports.find((port) => port.name === wanted || String(port.port) === wanted);
  if (!found) throw new PluginError(`service ${label} has no port ${wanted} (ports: ${describe()})`);
  return found;
}

async function readService(config: KubeConfig, namespace: string, name: string): Promise<V1Service> {
  try {
    return await config.makeApiClient(CoreV1Api).readNamespacedService({namespace, name});
  } catch (error) {
    if (notFound(error))
      throw new PluginError(`service ${namespace}/${name} not found: check the name, or give its namespace with -n or as NAMESPACE/NAME`);
    throw apiError(config, `read service ${namespace}/${name}`, error);
  }
}

export async function resolveService(
  config: KubeConfig,
  reference: string,
  defaultNamespace: string,
  wantedPort: string | undefined,
): Promise<ServiceTarget> {
  const {namespace, name} = splitName(reference, defaultNamespace);
  const label = `${namespace}/${name}`;
  // The slices are listed by the service's name, so both requests go out together.
  const slicesListed = config
    .makeApiClient(DiscoveryV1Api)
    .listNamespacedEndpointSlice({namespace, labelSelector: `kubernetes.io/service-name=${name}`});
  slicesListed.catch(() => undefined); // awaited below; a service that cannot be read is the error to show
  const service = await readService(config, namespace, name);
  const spec = service.spec ?? {};
  if (spec.type === 'ExternalName')
    throw new PluginError(`service ${label} is of type ExternalName: it is a DNS name, no proxy rule handles it`);
  if (!spec.clusterIP || spec.clusterIP === 'None')
    throw new PluginError(`service ${label} is headless (clusterIP None): clients reach its pods directly, no proxy rule handles it`);
  const port = pickPort(service, wantedPort, label);
  const portName = port.name ?? '';
  const protocol = (port.protocol ?? 'TCP') as Protocol;

  const endpoints = new Map<string, EndpointInfo & {ip: string}>();
  try {
    const slices = await slicesListed;
    for (const slice of slices.items) {
      const slicePort = (slice.ports ?? []).find(
        (candidate) => (candidate.name ?? '') === portName && (candidate.protocol ?? 'TCP') === protocol,
      );
      if (!slicePort?.port) continue;
      for (const endpoint of slice.endpoints ?? []) {
        const conditions = endpoint.conditions ?? {};
        for (const ip of endpoint.addresses ?? []) {
          endpoints.set(joinHostPort(ip, slicePort.port), {
            ip,
            pod: endpoint.targetRef?.name,
            node: endpoint.nodeName,
            ready: conditions.ready !== false,
            terminating: conditions.terminating === true,
          });
        }
      }
    }
  } catch (error) {
    throw apiError(config, `list the endpoint slices of service ${label}`, error);
  }

  return {
    namespace,
    name,
    type: spec.type ?? 'ClusterIP',
    servicePort: portName ? `${label}:${portName}` : label,
    portName,
    port: port.port,
    protocol,
    clusterIPs: spec.clusterIPs ?? [spec.clusterIP],
    nodePort: port.nodePort,
    externalIPs: spec.externalIPs ?? [],
    loadBalancerIPs: (service.status?.loadBalancer?.ingress ?? []).map((ingress) => ingress.ip).filter((ip): ip is string => Boolean(ip)),
    externalTrafficPolicy: spec.externalTrafficPolicy ?? 'Cluster',
    internalTrafficPolicy: spec.internalTrafficPolicy ?? 'Cluster',
    endpoints,
  };
}

/**
 * resolveServiceKey reads diff's --service (NAME, NAMESPACE/NAME, either with :PORT) into the key the
 * rules' comments use ("namespace/name" or "namespace/name:portname"), after checking with the API
 * server that the Service (and the port) exist.
 */
export async function resolveServiceKey(config: KubeConfig, reference: string, defaultNamespace: string): Promise<string> {
  const {namespace, name, port: wantedPort} = splitServiceReference(reference, defaultNamespace);
  const label = `${namespace}/${name}`;
  const service = await readService(config, namespace, name);
  if (wantedPort === undefined) return label;
  const port = pickPort(service, wantedPort, label);
  return port.name ? `${label}:${port.name}` : label;
}

/** resolveSource reads --from: a pod (NAME or NAMESPACE/NAME), an IP address, or the lab's external client. */
export async function resolveSource(config: KubeConfig, from: string, defaultNamespace: string): Promise<PacketSource> {
  if (isIP(from) !== 0) return {ip: from};
  const {namespace, name} = splitName(from, defaultNamespace);
  let pod;
  try {
    pod = await config.makeApiClient(CoreV1Api).readNamespacedPod({namespace, name});
  } catch (error) {
    if (notFound(error)) {
      const client = from.includes('/') ? undefined : await labExternalClient(config, from);
      if (client) return {ip: client.ip, node: client.node, netns: client.netns, externalClient: client.name};
      throw new PluginError(
        `--from ${from}: pod ${namespace}/${name} not found (give an IP address, the pod as NAMESPACE/NAME, or in a lab its external client, client-0)`,
      );
    }
    throw apiError(config, `read pod ${namespace}/${name}`, error);
  }
  const ip = pod.status?.podIP;
  if (!ip)
    throw new PluginError(`--from ${from}: pod ${namespace}/${name} has no IP address yet (phase ${pod.status?.phase ?? 'unknown'})`);
  if (pod.spec?.hostNetwork)
    throw new PluginError(
      `--from ${from}: pod ${namespace}/${name} uses the host network: trace from its node instead (--node ${pod.spec.nodeName})`,
    );
  return {ip, node: pod.spec?.nodeName, netns: pod.metadata?.annotations?.[netnsAnnotation], pod: `${namespace}/${name}`};
}

/** The node's primary address (first InternalIP), the source of packets the node sends itself. */
export async function nodeAddress(config: KubeConfig, node: string, family: 4 | 6): Promise<string> {
  let object;
  try {
    object = await config.makeApiClient(CoreV1Api).readNode({name: node});
  } catch (error) {
    if (notFound(error)) throw new PluginError(`node ${node} not found: check the name (kubectl get nodes)`);
    throw apiError(config, `read node ${node}`, error);
  }
  const addresses = (object.status?.addresses ?? []).filter((address) => isIP(address.address) === family);
  const chosen = addresses.find((address) => address.type === 'InternalIP') ?? addresses[0];
  if (!chosen) throw new PluginError(`node ${node} has no IPv${family} address in its status: give the source with --from IP`);
  return chosen.address;
}

/** Warnings about the endpoints themselves (the rules cannot say why an endpoint is missing). */
export function endpointWarnings(target: ServiceTarget): string[] {
  const warnings: string[] = [];
  if (target.endpoints.size === 0)
    warnings.push(
      `service ${target.servicePort} has no endpoints: no pod matches its selector, or none is ready; new connections are refused`,
    );
  for (const [key, info] of target.endpoints) {
    const who = info.pod ? `${key} (pod ${info.pod})` : key;
    if (info.terminating) warnings.push(`endpoint ${who} is terminating: it gets new connections only while no other endpoint is ready`);
    else if (!info.ready) warnings.push(`endpoint ${who} is not ready: it gets no new connections`);
  }
  return warnings;
}
