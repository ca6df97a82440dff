// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go): which endpoints Cluster and Local
// traffic policies may use on this node, with the ready -> serving-terminating fallback and
// topology hints.
import {endpointKey} from './endpoint.ts';
import type {Endpoint, ServicePort} from './types.ts';

export type TopologyMode = ServicePort['topologyMode'];

export interface CategorizeInput {
  /** Sorted, deduplicated endpoints of one service port. */
  endpoints: Endpoint[];
  usesClusterEndpoints: boolean;
  usesLocalEndpoints: boolean;
  nodeName: string;
  /** This node's zone label; "" when the node has none. */
  zone: string;
  /** False turns topology off whatever the hints say (the service did not opt in). */
  topologyAllowed: boolean;
}

export interface Categorized {
  clusterEndpoints: Endpoint[];
  localEndpoints: Endpoint[];
  allReachableEndpoints: Endpoint[];
  hasAnyEndpoints: boolean;
  topologyMode: TopologyMode;
}

const servingTerminating = (endpoint: Endpoint) => endpoint.serving && endpoint.terminating;

export function categorizeEndpoints(input: CategorizeInput): Categorized {
  const {endpoints, nodeName, zone} = input;
  const result: Categorized = {
    clusterEndpoints: [],
    localEndpoints: [],
    allReachableEndpoints: [],
    hasAnyEndpoints: false,
    topologyMode: '',
  };
  if (endpoints.length === 0) return result;

  if (input.usesClusterEndpoints) {
    const mode = input.topologyAllowed ? topologyModeFromHints(endpoints, nodeName, zone) : '';
    result.topologyMode = mode;
    result.clusterEndpoints = endpoints.filter((endpoint) => endpoint.ready && availableForTopology(endpoint, mode, nodeName, zone));
    // Topology was already ignored if it left no ready endpoint, so an empty set here means no
    // ready endpoint anywhere: fall back to the ones still serving while terminating.
    if (result.clusterEndpoints.length === 0) result.clusterEndpoints = endpoints.filter(servingTerminating);
    if (result.clusterEndpoints.length > 0) result.hasAnyEndpoints = true;
  }

  if (!input.usesLocalEndpoints) {
    result.allReachableEndpoints = result.clusterEndpoints;
    return result;
  }

  let localReady = false;
  let localServingTerminating = false;
  for (const endpoint of endpoints) {
    if (endpoint.ready) {
      result.hasAnyEndpoints = true;
      if (endpoint.isLocal) localReady = true;
    } else if (servingTerminating(endpoint)) {
      result.hasAnyEndpoints = true;
      if (endpoint.isLocal) localServingTerminating = true;
    }
  }
  let localUsesTerminating = false;
  if (localReady) {
    result.localEndpoints = endpoints.filter((endpoint) => endpoint.isLocal && endpoint.ready);
  } else if (localServingTerminating) {
    localUsesTerminating = true;
    result.localEndpoints = endpoints.filter((endpoint) => endpoint.isLocal && servingTerminating(endpoint));
  }

  if (!input.usesClusterEndpoints) {
    result.allReachableEndpoints = result.localEndpoints;
    return result;
  }
  if (result.topologyMode === '' && !localUsesTerminating) {
    // Every ready endpoint is in clusterEndpoints, and localEndpoints holds only ready ones.
    result.allReachableEndpoints = result.clusterEndpoints;
    return result;
  }
  const union = new Map<string, Endpoint>();
  for (const endpoint of [...result.clusterEndpoints, ...result.localEndpoints]) union.set(endpointKey(endpoint), endpoint);
  // kube-proxy builds this union from a Go map (random order); sorting keeps our output stable.
  result.allReachableEndpoints = [...union.entries()].sort(([a], [b]) => compareStrings(a, b)).map(([, endpoint]) => endpoint);
  return result;
}

/**
 * topologyModeFromHints: PreferSameNode when every ready endpoint has node hints and one names
 * this node; else PreferSameZone when every ready endpoint has zone hints and one names this
 * node's zone; else no topology.
 */
export function topologyModeFromHints(endpoints: Endpoint[], nodeName: string, zone: string): TopologyMode {
  let anyReady = false;
  let allNodeHints = true;
  let hintForNode = false;
  let allZoneHints = true;
  let hintForZone = false;
  for (const endpoint of endpoints) {
    if (!endpoint.ready) continue;
    anyReady = true;
    if (!endpoint.nodeHints || endpoint.nodeHints.length === 0) allNodeHints = false;
    else if (endpoint.nodeHints.includes(nodeName)) hintForNode = true;
    if (!endpoint.zoneHints || endpoint.zoneHints.length === 0) allZoneHints = false;
    else if (endpoint.zoneHints.includes(zone)) hintForZone = true;
  }
  if (!anyReady) return '';
  if (allNodeHints && hintForNode) return 'PreferSameNode';
  if (allZoneHints && hintForZone) return 'PreferSameZone';
  return '';
}

function availableForTopology(endpoint: Endpoint, mode: TopologyMode, nodeName: string, zone: string): boolean {
  if (mode === 'PreferSameNode') return endpoint.nodeHints?.includes(nodeName) ?? false;
  if (mode === 'PreferSameZone') return endpoint.zoneHints?.includes(zone) ?? false;
  return true;
}

/** compareStrings orders by UTF-16 code units, which for addresses is Go's byte order. */
export function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
