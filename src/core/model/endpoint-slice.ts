// EndpointSlice -> checked ports and endpoints of one IP family, as kube-proxy's
// EndpointSliceCache reads them. Bad ports and endpoints are dropped one by one; a slice that
// cannot be tied to a service is dropped whole.
import {parseIP} from './ip.ts';
import {
  describe,
  invalid,
  isJsonObject,
  ObjectProblems,
  optionalArray,
  optionalBoolean,
  optionalInteger,
  optionalString,
  readObjectHeader,
  readPortEntry,
  stringMap,
} from './object-reader.ts';
import {serviceNameLabel} from './objects.ts';
import type {IPFamily, Problem, Protocol} from './types.ts';

export interface SlicePort {
  /** Matches the service port's name; "" for an unnamed port. */
  name: string;
  protocol: Protocol;
  port: number;
}

/** SliceEndpoint is an endpoint before it is resolved to a port. */
export interface SliceEndpoint {
  ip: string;
  ready: boolean;
  serving: boolean;
  terminating: boolean;
  nodeName?: string;
  zone?: string;
  zoneHints?: string[];
  nodeHints?: string[];
  podName?: string;
  podNamespace?: string;
}

export interface SliceDefinition {
  namespace: string;
  name: string;
  serviceName: string;
  ports: SlicePort[];
  endpoints: SliceEndpoint[];
}

const protocols = new Set<string>(['TCP', 'UDP', 'SCTP']);
const addressTypes = new Set(['IPv4', 'IPv6', 'FQDN']);

/**
 * readEndpointSlice returns the slice's ports and endpoints, or undefined when the slice is of
 * another address type (FQDN, or the other family: ignored, as kube-proxy does) or unusable
 * (with a Problem).
 */
export function readEndpointSlice(raw: unknown, family: IPFamily, sink: Problem[]): SliceDefinition | undefined {
  const header = readObjectHeader(raw, 'EndpointSlice', sink, {notObject: 'skipped', unnamed: 'slice skipped'});
  if (!header) return undefined;
  const {object, metadata, name, namespace, problems} = header;

  const addressType = optionalString(object.addressType);
  if (addressType === undefined || addressType === invalid || !addressTypes.has(addressType)) {
    const cause = addressType === undefined ? 'missing' : `unknown address type ${describe(object.addressType)}`;
    problems.add('addressType', cause, 'slice skipped');
    return undefined;
  }
  if (addressType !== family) return undefined;

  const serviceName = stringMap(metadata.labels)[serviceNameLabel];
  if (serviceName === undefined || serviceName === '') {
    problems.add(`metadata.labels[${serviceNameLabel}]`, 'missing, so the slice belongs to no service', 'slice skipped');
    return undefined;
  }

  const ports = readSlicePorts(object.ports, problems);
  if (ports === undefined) return undefined;
  const endpoints = readSliceEndpoints(object.endpoints, family, namespace, problems);
  if (endpoints === undefined) return undefined;
  return {namespace, name, serviceName, ports, endpoints};
}

function readSlicePorts(value: unknown, problems: ObjectProblems): SlicePort[] | undefined {
  const list = optionalArray(value);
  if (list === invalid) {
    problems.add('ports', 'not a list', 'slice skipped');
    return undefined;
  }
  const ports: SlicePort[] = [];
  for (const [index, value] of (list ?? []).entries()) {
    const field = `ports[${index}]`;
    // kube-proxy ignores a port without a name; the controller always writes one, but files
    // written by hand leave it out for a single unnamed service port, which means "".
    const read = readPortEntry(value, field, problems);
    if (!read) continue;
    const {entry, name} = read;
    const protocol = optionalString(entry.protocol);
    if (protocol === invalid || (protocol !== undefined && !protocols.has(protocol))) {
      problems.add(`${field}.protocol`, `unknown protocol ${describe(entry.protocol)}`, 'port skipped');
      continue;
    }
    const port = optionalInteger(entry.port, 1, 65535);
    if (port === undefined || port === invalid) {
      const cause = port === undefined ? 'missing (kube-proxy does not support "all ports")' : `${describe(entry.port)} is not in 1-65535`;
      problems.add(`${field}.port`, cause, 'port skipped');
      continue;
    }
    const slicePort: SlicePort = {name: name ?? '', protocol: (protocol ?? 'TCP') as Protocol, port};
    if (ports.some((seen) => seen.name === slicePort.name && seen.protocol === slicePort.protocol)) {
      problems.add(field, `duplicate port ${describe(slicePort.name)}/${slicePort.protocol}`, 'port skipped');
      continue;
    }
    ports.push(slicePort);
  }
  return ports;
}

function readSliceEndpoints(
  value: unknown,
  family: IPFamily,
  sliceNamespace: string,
  problems: ObjectProblems,
): SliceEndpoint[] | undefined {
  const list = optionalArray(value);
  if (list === invalid) {
    problems.add('endpoints', 'not a list', 'slice skipped');
    return undefined;
  }
  const endpoints: SliceEndpoint[] = [];
  const entries = list ?? [];
  // Indexed, with the field name made only for a problem: at 10,000 services this loop reads
  // 100,000 endpoints before the first sync, and an iterator or a string per endpoint shows.
  for (let index = 0; index < entries.length; index++) {
    const entry = entries[index];
    if (!isJsonObject(entry)) {
      problems.add(endpointField(index), 'not an object', 'endpoint skipped');
      continue;
    }
    // Only the first address counts: kube-proxy (and the API) treat the rest as the same pod.
    const addresses = optionalArray(entry.addresses);
    if (addresses === undefined || addresses === invalid || addresses.length === 0) {
      problems.add(endpointField(index, '.addresses'), addresses === invalid ? 'not a list' : 'empty', 'endpoint skipped');
      continue;
    }
    const ip = typeof addresses[0] === 'string' ? parseIP(addresses[0]) : undefined;
    if (!ip) {
      problems.add(endpointField(index, '.addresses[0]'), `${describe(addresses[0])} is not an IP address`, 'endpoint skipped');
      continue;
    }
    if (ip.family !== family) {
      problems.add(endpointField(index, '.addresses[0]'), `${ip.text} is not an ${family} address`, 'endpoint skipped');
      continue;
    }
    const conditions = entry.conditions === undefined || entry.conditions === null ? {} : entry.conditions;
    if (!isJsonObject(conditions)) {
      problems.add(endpointField(index, '.conditions'), 'not an object', 'endpoint skipped');
      continue;
    }
    const ready = optionalBoolean(conditions.ready);
    const serving = optionalBoolean(conditions.serving);
    const terminating = optionalBoolean(conditions.terminating);
    const badCondition =
      ready === invalid ? 'ready' : serving === invalid ? 'serving' : terminating === invalid ? 'terminating' : undefined;
    if (badCondition) {
      problems.add(
        endpointField(index, `.conditions.${badCondition}`),
        `${describe(conditions[badCondition])} is not true or false`,
        'endpoint skipped',
      );
      continue;
    }
    const nodeName = optionalString(entry.nodeName);
    const zone = optionalString(entry.zone);
    if (nodeName === invalid || zone === invalid) {
      const bad = nodeName === invalid ? 'nodeName' : 'zone';
      problems.add(endpointField(index, `.${bad}`), `${describe(entry[bad])} is not a name`, 'endpoint skipped');
      continue;
    }
    const hints = entry.hints === undefined || entry.hints === null ? noHints : readHints(entry.hints, endpointField(index), problems);
    if (hints === invalid) continue;
    const endpoint: SliceEndpoint = {
      ip: ip.text,
      // kube-proxy's defaults: unset ready and serving mean true, unset terminating false.
      ready: ready !== false,
      serving: serving !== false,
      terminating: terminating === true,
    };
    if (nodeName) endpoint.nodeName = nodeName;
    if (zone) endpoint.zone = zone;
    if (hints.zones) endpoint.zoneHints = hints.zones;
    if (hints.nodes) endpoint.nodeHints = hints.nodes;
    const targetRef = isJsonObject(entry.targetRef) ? entry.targetRef : undefined;
    if (targetRef && (targetRef.kind === undefined || targetRef.kind === 'Pod') && typeof targetRef.name === 'string') {
      endpoint.podName = targetRef.name;
      endpoint.podNamespace = typeof targetRef.namespace === 'string' && targetRef.namespace !== '' ? targetRef.namespace : sliceNamespace;
    }
    endpoints.push(endpoint);
  }
  return endpoints;
}

/** "endpoints[INDEX]" and what follows, for a problem's field. */
function endpointField(index: number, rest = ''): string {
  return `endpoints[${index}]${rest}`;
}

const noHints: {zones?: string[]; nodes?: string[]} = Object.freeze({});

/** readHints returns forZones / forNodes names; an empty list counts as no hints, as in kube-proxy. */
function readHints(value: unknown, field: string, problems: ObjectProblems): {zones?: string[]; nodes?: string[]} | typeof invalid {
  if (value === undefined || value === null) return noHints;
  if (!isJsonObject(value)) {
    problems.add(`${field}.hints`, 'not an object', 'endpoint skipped');
    return invalid;
  }
  const out: {zones?: string[]; nodes?: string[]} = {};
  for (const [key, target] of [
    ['forZones', 'zones'],
    ['forNodes', 'nodes'],
  ] as const) {
    const list = optionalArray(value[key]);
    if (list === invalid) {
      problems.add(`${field}.hints.${key}`, 'not a list', 'endpoint skipped');
      return invalid;
    }
    const names: string[] = [];
    for (const [index, hint] of (list ?? []).entries()) {
      const hintName = isJsonObject(hint) ? hint.name : undefined;
      if (typeof hintName !== 'string' || hintName === '') {
        problems.add(`${field}.hints.${key}[${index}].name`, `${describe(hintName)} is not a name`, 'endpoint skipped');
        return invalid;
      }
      if (!names.includes(hintName)) names.push(hintName);
    }
    if (names.length > 0) out[target] = names.sort();
  }
  return out;
}
