// Which conntrack entries to delete after a sync, as kube-proxy's conntrack cleanup does for UDP:
// an entry keeps sending packets to the endpoint it was DNATed to, so when that endpoint goes, or
// the service address changes, or a service that had no endpoints gets some (packets were being
// dropped, and the entry would keep dropping them), the entries must go.
import type {ProxyModel, ServicePort} from '../../core/model/index.ts';
import {servicePortIdentity} from '../../core/model/index.ts';
import type {ConntrackFilter} from '../host/host.ts';

/** Protocols whose stale entries break traffic (TCP connections fail and reconnect by themselves). */
const cleanedProtocols = new Set(['UDP']);

/** planConntrackCleanup compares the model applied before with the one applied now. */
export function planConntrackCleanup(previous: ProxyModel | undefined, next: ProxyModel): ConntrackFilter[] {
  if (previous === undefined) return [];
  const family = next.family;
  const filters = new Map<string, ConntrackFilter>();
  const add = (filter: Omit<ConntrackFilter, 'family' | 'protocol'>) => {
    const full: ConntrackFilter = {family, protocol: 'UDP', ...filter};
    filters.set(JSON.stringify(full), full);
  };
  // Only cleaned protocols' ports matter: maps of every port would cost each sync time for ports never cleaned.
  const cleaned = (model: ProxyModel): ServicePort[] => model.servicePorts.filter((port) => cleanedProtocols.has(port.protocol));
  const [previousCleaned, nextCleaned] = [cleaned(previous), cleaned(next)];
  const nextPorts = new Map(nextCleaned.map((port) => [servicePortIdentity(port), port]));
  const previousPorts = new Map(previousCleaned.map((port) => [servicePortIdentity(port), port]));

  for (const before of previousCleaned) {
    const after = nextPorts.get(servicePortIdentity(before));
    // The model builder keeps the objects of service ports that did not change.
    if (after === before) continue;
    const beforeAddresses = serviceAddresses(before);
    const afterAddresses = after ? new Set(serviceAddresses(after)) : new Set<string>();

    // Service deleted, port or address changed: every entry to the old address and port.
    for (const address of beforeAddresses) {
      if (!after || after.port !== before.port || !afterAddresses.has(address)) add({origDst: address, dport: before.port});
    }
    if (before.nodePort !== 0 && (!after || after.nodePort !== before.nodePort)) add({dport: before.nodePort});
    if (!after) continue;

    // Endpoints no longer used: entries DNATed to them, through any address of the service.
    const stillUsed = new Set(usedEndpoints(after).map((endpoint) => endpoint.ip));
    for (const endpoint of usedEndpoints(before)) {
      if (stillUsed.has(endpoint.ip)) continue;
      for (const address of afterAddresses) add({origDst: address, dstNat: endpoint.ip});
      if (after.nodePort !== 0) add({dport: after.nodePort, dstNat: endpoint.ip});
    }
  }

  // Services that just got endpoints: entries made while packets were dropped.
  for (const after of nextCleaned) {
    const before = previousPorts.get(servicePortIdentity(after));
    if (before === after) continue;
    const hadEndpoints = before !== undefined && usedEndpoints(before).length > 0;
    if (hadEndpoints || usedEndpoints(after).length === 0) continue;
    for (const address of serviceAddresses(after)) add({origDst: address, dport: after.port});
    if (after.nodePort !== 0) add({dport: after.nodePort});
  }
  return [...filters.values()];
}

function serviceAddresses(port: ServicePort): string[] {
  return [port.clusterIP, ...port.externalIPs, ...port.loadBalancerIPs].filter((address) => address !== '');
}

function usedEndpoints(port: ServicePort) {
  return port.allReachableEndpoints;
}
