// Node -> what the proxy needs of its own node for one IP family: name, zone, addresses, pod CIDRs.
import {parseCIDR, parseIP} from './ip.ts';
import {describe, invalid, isJsonObject, listOrNone, optionalArray, readObjectHeader, stringMap} from './object-reader.ts';
import {zoneLabel} from './objects.ts';
import type {IPFamily, Problem} from './types.ts';

export interface NodeDefinition {
  name: string;
  /** topology.kubernetes.io/zone label, when set. */
  zone?: string;
  /** status.addresses of the family, canonical, in the order given. */
  internalIPs: string[];
  externalIPs: string[];
  /** spec.podCIDRs (or the older spec.podCIDR) of the family, canonical. */
  podCIDRs: string[];
}

/** readNode returns the node's facts of one family, or undefined (with a Problem) if it has no name. */
export function readNode(raw: unknown, family: IPFamily, sink: Problem[]): NodeDefinition | undefined {
  const header = readObjectHeader(raw, 'Node', sink, {notObject: 'node ignored', unnamed: 'node ignored'});
  if (!header) return undefined;
  const {object, metadata, name, problems} = header;
  const node: NodeDefinition = {name, internalIPs: [], externalIPs: [], podCIDRs: []};
  const zone = stringMap(metadata.labels)[zoneLabel];
  if (zone) node.zone = zone;

  const status = isJsonObject(object.status) ? object.status : {};
  for (const [index, entry] of listOrNone(status.addresses, 'status.addresses', 'addresses ignored', problems).entries()) {
    const field = `status.addresses[${index}]`;
    if (!isJsonObject(entry)) {
      problems.add(field, 'not an object', 'address ignored');
      continue;
    }
    if (entry.type !== 'InternalIP' && entry.type !== 'ExternalIP') continue; // Hostname, InternalDNS, ...
    const ip = typeof entry.address === 'string' ? parseIP(entry.address) : undefined;
    if (!ip) {
      problems.add(`${field}.address`, `${describe(entry.address)} is not an IP address`, 'address ignored');
      continue;
    }
    if (ip.family !== family) continue;
    const list = entry.type === 'InternalIP' ? node.internalIPs : node.externalIPs;
    if (!list.includes(ip.text)) list.push(ip.text);
  }

  const spec = isJsonObject(object.spec) ? object.spec : {};
  const podCIDRs = optionalArray(spec.podCIDRs);
  const cidrEntries: Array<{text: unknown; field: string}> = [];
  if (podCIDRs === invalid) problems.add('spec.podCIDRs', 'not a list', 'pod CIDRs ignored');
  else if (podCIDRs && podCIDRs.length > 0) podCIDRs.forEach((text, index) => cidrEntries.push({text, field: `spec.podCIDRs[${index}]`}));
  else if (spec.podCIDR !== undefined && spec.podCIDR !== '') cidrEntries.push({text: spec.podCIDR, field: 'spec.podCIDR'});
  for (const {text, field} of cidrEntries) {
    const cidr = typeof text === 'string' ? parseCIDR(text) : undefined;
    if (!cidr) {
      problems.add(field, `${describe(text)} is not a CIDR`, 'pod CIDR ignored');
      continue;
    }
    if (cidr.family === family && !node.podCIDRs.includes(cidr.text)) node.podCIDRs.push(cidr.text);
  }
  return node;
}
