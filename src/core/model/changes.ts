// Which service ports changed between two models, for partial syncs.
import type {ProxyModel, ServicePort} from './types.ts';

/**
 * servicePortIdentity names a service port across models: its kube-proxy ServicePortName string
 * plus the protocol, e.g. "default/dns:dns-tcp/TCP" or "default/web/TCP" for an unnamed port.
 */
export function servicePortIdentity(port: Pick<ServicePort, 'key' | 'protocol'>): string {
  // Service ports are never changed in place, and the builder hands the same objects from build to
  // build: each sync names every port several times, at 10,000 services 10,000 strings a time.
  let identity = identities.get(port);
  if (identity === undefined) identities.set(port, (identity = `${port.key}/${port.protocol}`));
  return identity;
}

const identities = new WeakMap<object, string>();

/**
 * Where each port of a list of service ports stands, by servicePortIdentity. ProxyModelBuilder
 * notes it for the lists it builds and hands it on from build to build while the order holds, so
 * that a partial sync finds its few ports without looking at the other 10,000 (four or five times
 * a sync, on two models).
 */
const portPositions = new WeakMap<readonly ServicePort[], ReadonlyMap<string, number>>();

/** notePortPositions: `positions` tells where each port of `ports` stands; `ports` is never changed afterwards. */
export function notePortPositions(ports: readonly ServicePort[], positions: ReadonlyMap<string, number>): void {
  portPositions.set(ports, positions);
}

/** positionsOf: where each port of `ports` stands, by servicePortIdentity. */
export function positionsOf(ports: readonly ServicePort[]): Map<string, number> {
  const positions = new Map<string, number>();
  for (let index = 0; index < ports.length; index++) positions.set(servicePortIdentity(ports[index]), index);
  return positions;
}

/**
 * portsWithIdentities: the model's service ports whose servicePortIdentity is in `wanted`, in
 * model order. A partial sync's work goes to these alone. Looked up by position where the
 * builder noted them; otherwise one filter over the ports, which allocates nothing per port,
 * where a loop that is not yet optimized makes an iterator result per step.
 */
export function portsWithIdentities(model: Pick<ProxyModel, 'servicePorts'>, wanted: ReadonlySet<string>): ServicePort[] {
  const ports = model.servicePorts;
  const positions = portPositions.get(ports);
  if (positions !== undefined && positions.size === ports.length && wanted.size * 16 < ports.length) {
    const found: number[] = [];
    let consistent = true;
    for (const identity of wanted) {
      const position = positions.get(identity);
      if (position === undefined) continue;
      // A list changed after its positions were noted is searched whole.
      if (servicePortIdentity(ports[position]) !== identity) consistent = false;
      found.push(position);
    }
    if (consistent) return found.sort((a, b) => a - b).map((position) => ports[position]);
  }
  return ports.filter((port) => wanted.has(servicePortIdentity(port)));
}

/**
 * changedServicePorts returns the identities (servicePortIdentity) of the service ports added,
 * removed or changed in any field, endpoints included, from previous to next. Without a previous
 * model, or when something node-wide changed (family, node name, node IPs, zone, config), every
 * service port of both models is returned: the caller then needs a full sync anyway.
 */
export function changedServicePorts(previous: ProxyModel | undefined, next: ProxyModel): Set<string> {
  const changed = new Set<string>();
  if (previous !== undefined && !nodeWideChange(previous, next) && changedInPlace(previous.servicePorts, next.servicePorts, changed))
    return changed;
  changed.clear();
  const nextPorts = new Map(next.servicePorts.map((port) => [servicePortIdentity(port), port]));
  if (previous === undefined || nodeWideChange(previous, next)) {
    for (const port of previous?.servicePorts ?? []) changed.add(servicePortIdentity(port));
    for (const identity of nextPorts.keys()) changed.add(identity);
    return changed;
  }
  const previousPorts = new Map(previous.servicePorts.map((port) => [servicePortIdentity(port), port]));
  for (const [identity, port] of previousPorts) {
    const after = nextPorts.get(identity);
    if (after === undefined || !deepEqual(port, after)) changed.add(identity);
  }
  for (const identity of nextPorts.keys()) if (!previousPorts.has(identity)) changed.add(identity);
  return changed;
}

/**
 * changedInPlace adds to `changed` the ports that differ between two lists holding the same ports
 * in the same order, as the builder's models do while no port comes or goes: a port that is the
 * same object in both is unchanged, so only the others are compared. False when the lists do not
 * line up; `changed` then holds part of the answer.
 */
function changedInPlace(previous: readonly ServicePort[], next: readonly ServicePort[], changed: Set<string>): boolean {
  if (previous.length !== next.length) return false;
  for (let index = 0; index < next.length; index++) {
    const before = previous[index];
    const after = next[index];
    if (before === after) continue;
    if (before.key !== after.key || before.protocol !== after.protocol) return false;
    if (!deepEqual(before, after)) changed.add(servicePortIdentity(after));
  }
  return true;
}

/** nodeWideChange: something outside the service ports changed, so every port's rules may differ. */
export function nodeWideChange(previous: ProxyModel, next: ProxyModel): boolean {
  return (
    previous.family !== next.family ||
    previous.nodeName !== next.nodeName ||
    previous.nodeZone !== next.nodeZone ||
    !deepEqual(previous.nodeIPs, next.nodeIPs) ||
    !deepEqual(previous.config, next.config)
  );
}

/**
 * deepEqual compares plain JSON-like values structurally; key order does not matter, and a key
 * holding undefined equals a missing key (a model that went through JSON loses those).
 */
function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) {
    return a.length === b.length && a.every((item, index) => deepEqual(item, b[index]));
  }
  const left = a as Record<string, unknown>;
  const right = b as Record<string, unknown>;
  const keys = new Set([...Object.keys(left), ...Object.keys(right)]);
  for (const key of keys) if (!deepEqual(left[key], right[key])) return false;
  return true;
}
