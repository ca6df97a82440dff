// EndpointSlices: validation of discovery.k8s.io/v1 and conversion to and from v1beta1 (which kubectl 1.20 knows).
import {isIPv4, isIPv6} from 'node:net';
import {fieldError, type FieldError} from './api-error.ts';
import type {KubeObject} from './object-log.ts';
import {dns1123LabelErrors, dns1123SubdomainErrors, portNumberErrors, specialAddressErrors, validateObjectMeta} from './name-rules.ts';

const addressTypes = ['FQDN', 'IPv4', 'IPv6'];
// kube-apiserver's limits per slice (pkg/apis/discovery/validation).
const maxEndpoints = 1000;
const maxPorts = 100;
const protocols = ['SCTP', 'TCP', 'UDP'];

export function defaultEndpointSlice(slice: KubeObject): void {
  for (const p of Array.isArray(slice.ports) ? slice.ports : []) if (p && typeof p === 'object') p.protocol ??= 'TCP';
  for (const e of Array.isArray(slice.endpoints) ? slice.endpoints : []) if (e && typeof e === 'object') e.conditions ??= {};
}

export function validateEndpointSlice(slice: KubeObject, options: {allowSpecialAddresses?: boolean} = {}): FieldError[] {
  const errors = validateObjectMeta(slice, 'dns1123-subdomain');
  const add = (e: FieldError) => errors.push(e);
  if (!slice.addressType) add(fieldError.required('addressType'));
  else if (!addressTypes.includes(slice.addressType)) add(fieldError.notSupported('addressType', slice.addressType, addressTypes));
  const endpoints: any[] = Array.isArray(slice.endpoints) ? slice.endpoints : [];
  if (endpoints.length > maxEndpoints) add(fieldError.tooMany('endpoints', endpoints.length, maxEndpoints));
  else
    endpoints.forEach((ep, i) => {
      const path = `endpoints[${i}]`;
      const addresses: unknown[] = Array.isArray(ep?.addresses) ? ep.addresses : [];
      if (addresses.length === 0) add(fieldError.required(`${path}.addresses`, 'must contain at least 1 address'));
      else if (addresses.length > 100) add(fieldError.tooMany(`${path}.addresses`, addresses.length, 100));
      addresses.forEach((address, j) => {
        const ap = `${path}.addresses[${j}]`;
        const text = String(address);
        if (slice.addressType === 'IPv4' && !isIPv4(text)) add(fieldError.invalid(ap, address, 'must be a valid IPv4 address'));
        if (slice.addressType === 'IPv6' && !isIPv6(text)) add(fieldError.invalid(ap, address, 'must be a valid IPv6 address'));
        if (
          !options.allowSpecialAddresses &&
          ((slice.addressType === 'IPv4' && isIPv4(text)) || (slice.addressType === 'IPv6' && isIPv6(text)))
        ) {
          for (const msg of specialAddressErrors(text)) add(fieldError.invalid(ap, address, msg));
        }
        if (slice.addressType === 'FQDN') for (const msg of dns1123SubdomainErrors(text)) add(fieldError.invalid(ap, address, msg));
      });
      if (ep?.hostname) for (const msg of dns1123LabelErrors(ep.hostname)) add(fieldError.invalid(`${path}.hostname`, ep.hostname, msg));
      if (ep?.nodeName)
        for (const msg of dns1123SubdomainErrors(ep.nodeName)) add(fieldError.invalid(`${path}.nodeName`, ep.nodeName, msg));
    });
  const ports: any[] = Array.isArray(slice.ports) ? slice.ports : [];
  if (ports.length > maxPorts) {
    add(fieldError.tooMany('ports', ports.length, maxPorts));
    return errors;
  }
  const names = new Set<string>();
  ports.forEach((p, i) => {
    const path = `ports[${i}]`;
    const name = p?.name ?? '';
    if (name) for (const msg of dns1123LabelErrors(name)) add(fieldError.invalid(`${path}.name`, name, msg));
    if (names.has(name)) add(fieldError.duplicate(`${path}.name`, name));
    names.add(name);
    if (p?.port !== undefined && p.port !== null)
      for (const msg of portNumberErrors(p.port)) add(fieldError.invalid(`${path}.port`, p.port, msg));
    if (!p?.protocol) add(fieldError.required(`${path}.protocol`));
    else if (!protocols.includes(p.protocol)) add(fieldError.notSupported(`${path}.protocol`, p.protocol, protocols));
  });
  return errors;
}

const zoneLabel = 'topology.kubernetes.io/zone';
const hostnameLabel = 'kubernetes.io/hostname';

/** v1 (stored) -> v1beta1: zone and nodeName go back into the topology map. */
export function endpointSliceToV1beta1(slice: KubeObject): KubeObject {
  const {endpoints, ...rest} = slice;
  const out: KubeObject = {...rest, apiVersion: 'discovery.k8s.io/v1beta1'};
  if (Array.isArray(endpoints)) {
    out.endpoints = endpoints.map((ep: any) => {
      const {zone, deprecatedTopology, ...e} = ep;
      const topology: Record<string, string> = {...(deprecatedTopology ?? {})};
      if (zone) topology[zoneLabel] = zone;
      if (ep.nodeName) topology[hostnameLabel] = ep.nodeName;
      return Object.keys(topology).length > 0 ? {...e, topology} : e;
    });
  }
  return out;
}

/** v1beta1 -> v1 (stored). */
export function endpointSliceFromV1beta1(slice: KubeObject): KubeObject {
  const {endpoints, ...rest} = slice;
  const out: KubeObject = {...rest, apiVersion: 'discovery.k8s.io/v1'};
  if (Array.isArray(endpoints)) {
    out.endpoints = endpoints.map((ep: any) => {
      const {topology, ...e} = ep ?? {};
      if (topology && typeof topology === 'object') {
        const rest2: Record<string, string> = {...topology};
        if (rest2[zoneLabel]) e.zone = rest2[zoneLabel];
        if (rest2[hostnameLabel] && !e.nodeName) e.nodeName = rest2[hostnameLabel];
        delete rest2[zoneLabel];
        delete rest2[hostnameLabel];
        if (Object.keys(rest2).length > 0) e.deprecatedTopology = rest2;
      }
      return e;
    });
  }
  return out;
}
