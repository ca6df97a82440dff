// Objects that are valid but most likely not what the user meant, since they render to nothing
// or to rules that do not do what the object seems to ask: kube-proxy ignores them without a word.
// Each warning names the object (and its file); the model is built all the same.
import {parseIP} from './ip.ts';
import type {IPFamily, ProxyModel} from './types.ts';

/** kube-apiserver's default --service-node-port-range. */
const defaultNodePortRange = {low: 30000, high: 32767};

export interface WarnedInput {
  files: string[];
  services: unknown[];
  endpointSlices: unknown[];
  /** Where each object came from: the file, by objectKey. */
  sourceOf(object: unknown): string | undefined;
}

interface Meta {
  name: string;
  namespace: string;
  labels: Record<string, unknown>;
}

function metaOf(object: unknown): Meta {
  const metadata = (object as {metadata?: {name?: unknown; namespace?: unknown; labels?: unknown}} | undefined)?.metadata ?? {};
  const labels = typeof metadata.labels === 'object' && metadata.labels !== null ? (metadata.labels as Record<string, unknown>) : {};
  return {name: String(metadata.name ?? ''), namespace: typeof metadata.namespace === 'string' ? metadata.namespace : 'default', labels};
}

function listOf(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}

/** inputWarnings lists the warnings for the objects of a render, one sentence each. */
export function inputWarnings(input: WarnedInput, model: ProxyModel): string[] {
  const warnings: string[] = [];
  const where = (object: unknown, what: string): string => {
    const source = input.sourceOf(object);
    return source ? `${source}: ${what}` : what;
  };
  if (input.services.length === 0 && input.endpointSlices.length === 0) {
    warnings.push(`no Service or EndpointSlice in ${input.files.join(', ')}: the rules hold only the proxy's fixed chains`);
    return warnings;
  }
  const portNames = new Map<string, string[]>();
  for (const service of input.services) {
    const meta = metaOf(service);
    const spec = ((service as {spec?: Record<string, unknown>}).spec ?? {}) as Record<string, unknown>;
    const name = `Service ${meta.namespace}/${meta.name}`;
    const ports = listOf(spec.ports);
    portNames.set(
      `${meta.namespace}/${meta.name}`,
      ports.map((port) => String((port as {name?: unknown} | null)?.name ?? '')),
    );
    const otherFamily = serviceOfOtherFamily(spec, model.family);
    if (otherFamily)
      warnings.push(
        where(
          service,
          `${name} has no ${model.family} cluster IP (${otherFamily}): it is not in these rules; render it ` +
            `with --ip-family ${model.family === 'IPv4' ? 'ipv6' : 'ipv4'}`,
        ),
      );
    for (const port of ports) {
      const nodePort = (port as {nodePort?: unknown} | null)?.nodePort;
      if (typeof nodePort !== 'number' || nodePort === 0) continue;
      if (nodePort < defaultNodePortRange.low || nodePort > defaultNodePortRange.high) {
        const portName = (port as {name?: unknown}).name;
        warnings.push(
          where(
            service,
            `${name}${portName ? ` port ${String(portName)}` : ''}: nodePort ${nodePort} is outside the default ` +
              `node-port range ${defaultNodePortRange.low}-${defaultNodePortRange.high}; kube-apiserver would ` +
              `refuse it unless its --service-node-port-range allows it`,
          ),
        );
      }
    }
  }
  for (const slice of input.endpointSlices)
    warnings.push(...sliceWarnings(slice, portNames, model.family).map((text) => where(slice, text)));
  return warnings;
}

/** The other family's cluster IPs, when the service has cluster IPs but none of `family`; undefined otherwise. */
function serviceOfOtherFamily(spec: Record<string, unknown>, family: IPFamily): string | undefined {
  if (spec.type === 'ExternalName') return undefined;
  const listed = listOf(spec.clusterIPs).filter((ip): ip is string => typeof ip === 'string');
  const addresses = listed.length > 0 ? listed : typeof spec.clusterIP === 'string' ? [spec.clusterIP] : [];
  const parsed = addresses.map((text) => parseIP(text)).filter((ip) => ip !== undefined);
  if (parsed.length === 0 || parsed.some((ip) => ip.family === family)) return undefined;
  return parsed.map((ip) => ip.text).join(', ');
}

function sliceWarnings(slice: unknown, portNames: Map<string, string[]>, family: IPFamily): string[] {
  const meta = metaOf(slice);
  const name = `EndpointSlice ${meta.namespace}/${meta.name}`;
  const addressType = (slice as {addressType?: unknown}).addressType;
  if (addressType === 'FQDN') return [`${name} has addressType FQDN, which kube-proxy does not proxy: its endpoints are ignored`];
  if (addressType !== family) return [];
  const serviceName = meta.labels['kubernetes.io/service-name'];
  if (typeof serviceName !== 'string') return [];
  const names = portNames.get(`${meta.namespace}/${serviceName}`);
  if (names === undefined)
    return [`${name} belongs to Service ${meta.namespace}/${serviceName}, which is not in the input: its endpoints are not used`];
  const warnings: string[] = [];
  for (const port of listOf((slice as {ports?: unknown}).ports)) {
    const portName = String((port as {name?: unknown} | null)?.name ?? '');
    if (!names.includes(portName)) {
      const shown = (text: string): string => (text === '' ? '(unnamed)' : `"${text}"`);
      warnings.push(
        `${name}: port ${shown(portName)} matches no port of Service ${meta.namespace}/${serviceName} ` +
          `(${names.map(shown).join(', ')}): its endpoints are not used for it`,
      );
    }
  }
  return warnings;
}
