// Names of the per-service objects in the kube-proxy table, computed as kube-proxy's nftables
// proxier computes them ("HASH-namespace/name/protocol/port"), so its chains and ours compare.
import type {Endpoint, ServicePort} from '../model/types.ts';
import {base32Alphabet, sha256Base32} from '../name-hash.ts';

/** nft's limit on object names is 256; kube-proxy keeps 16 for the longest prefix. */
const nameBaseLengthMax = 256 - 16;

export const tableName = 'kube-proxy';

/** Chain and set name prefixes of per-service objects (kube-proxy's). */
export const namePrefixes = {
  clusterPolicy: 'service-',
  localPolicy: 'local-',
  external: 'external-',
  firewall: 'firewall-',
  endpoint: 'endpoint-',
  affinity: 'affinity-',
} as const;

function hashAndTruncate(name: string): string {
  const hashed = `${sha256Base32(name, 8)}-${name}`;
  return hashed.length > nameBaseLengthMax ? `${hashed.slice(0, nameBaseLengthMax - 3)}...` : hashed;
}

/** servicePortNameBase: "HASH-ns/name/proto/port" for a service port. */
export function servicePortNameBase(port: Pick<ServicePort, 'namespace' | 'serviceName' | 'portName' | 'protocol'>): string {
  return hashAndTruncate(`${port.namespace}/${port.serviceName}/${port.protocol.toLowerCase()}/${port.portName}`);
}

/** The chains of a service port, one per traffic policy and entry point, named as kube-proxy names them. */
export interface ServicePortChains {
  cluster: string;
  local: string;
  external: string;
  firewall: string;
}

export function servicePortChains(port: Pick<ServicePort, 'namespace' | 'serviceName' | 'portName' | 'protocol'>): ServicePortChains {
  const base = servicePortNameBase(port);
  return {
    cluster: namePrefixes.clusterPolicy + base,
    local: namePrefixes.localPolicy + base,
    external: namePrefixes.external + base,
    firewall: namePrefixes.firewall + base,
  };
}

/** endpointNameBase: "HASH-ns/name/proto/port__ip/port" (IPv6 colons become dots). */
export function endpointNameBase(
  port: Pick<ServicePort, 'namespace' | 'serviceName' | 'portName' | 'protocol'>,
  endpoint: Pick<Endpoint, 'ip' | 'port'>,
): string {
  const ip = endpoint.ip.replaceAll(':', '.');
  return hashAndTruncate(`${port.namespace}/${port.serviceName}/${port.protocol.toLowerCase()}/${port.portName}__${ip}/${endpoint.port}`);
}

/**
 * How many endpoint-choice maps per protocol. The kernel checks every element of a data map
 * against every rule bound to it, so one map for all services costs elements x rules; many small
 * maps cost a set each. Spreading service ports over this many maps
 * keeps both small.
 */
export const endpointMapShards = 256;

/** endpointMapShard: the map a per-service chain picks endpoints from, from the hash in its name. */
export function endpointMapShard(chainName: string): number {
  const hash = /-([A-Z2-7]{8})-/.exec(chainName)?.[1] ?? 'AAAAAAAA';
  const value = base32Alphabet.indexOf(hash[0]) * 32 * 32 + base32Alphabet.indexOf(hash[1]) * 32 + base32Alphabet.indexOf(hash[2]);
  return value % endpointMapShards;
}

/** isServiceChainName: per-service chains always hold a "/", the fixed ones never do. */
export function isServiceChainName(name: string): boolean {
  return name.includes('/');
}

export function isAffinitySetName(name: string): boolean {
  return name.startsWith(namePrefixes.affinity);
}
