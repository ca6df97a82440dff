// buildProxyModel: Services + EndpointSlices + this Node -> the ProxyModel of one IP family,
// deriving what kube-proxy's service and endpoint change trackers and CategorizeEndpoints derive.
// Pure: never throws on bad objects; each one is skipped with a Problem and the rest is used.
import {categorizeEndpoints, compareStrings} from './categorize.ts';
import {resolveProxyConfig} from './config.ts';
import {endpointKey} from './endpoint.ts';
import {readEndpointSlice, type SliceDefinition, type SliceEndpoint} from './endpoint-slice.ts';
import {parseIP} from './ip.ts';
import {readNode, type NodeDefinition} from './node.ts';
import {describe, ObjectProblems} from './object-reader.ts';
import {readService, type ServiceDefinition, type ServicePortDefinition} from './service.ts';
import {notePortPositions, positionsOf, servicePortIdentity} from './changes.ts';
import type {Endpoint, IPFamily, Problem, ProxyConfig, ProxyModel, ServicePort} from './types.ts';

export interface ModelObjects {
  services: unknown[];
  endpointSlices: unknown[];
  /** This proxy's own Node object. */
  node?: unknown;
}

export interface ModelOptions {
  family: IPFamily;
  /** This node's name, matched against endpoints' nodeName. Default: the Node's metadata.name. */
  nodeName?: string;
  /** Override of the node's addresses. Default: the Node's InternalIPs, then ExternalIPs, of the family. */
  nodeIPs?: string[];
  /** Settings; unset ones take defaultProxyConfig()'s values. */
  config?: Partial<ProxyConfig>;
  /**
   * kube-proxy's --cluster-cidr. When given and config.localDetector is not, the detector is
   * ClusterCIDR with those of the family.
   */
  clusterCIDRs?: string[];
  /**
   * kube-proxy's --detect-local-mode, used when config.localDetector is not given. 'NodeCIDR'
   * takes the Node's spec.podCIDRs of the family. Default: ClusterCIDR if clusterCIDRs are
   * given, else None.
   */
  detectLocalMode?: 'ClusterCIDR' | 'NodeCIDR' | 'None';
  /**
   * Services labelled service.kubernetes.io/service-proxy-name are skipped unless the label has
   * this value. Unlabelled services are always ours.
   */
  serviceProxyName?: string;
  /**
   * Before Kubernetes 1.33 kube-proxy used hints only when the service opted in (topology-mode /
   * topology-aware-hints annotation, or spec.trafficDistribution). Newer kube-proxy trusts the
   * hints alone, which is the default here; true restores the older rule.
   */
  topologyNeedsServiceOptIn?: boolean;
  /**
   * Read service.beta.kubernetes.io/load-balancer-source-ranges when spec.loadBalancerSourceRanges
   * is empty, as cloud providers do. kube-proxy does not, hence off by default.
   */
  sourceRangesFromAnnotation?: boolean;
}

export function buildProxyModel(objects: ModelObjects, options: ModelOptions): ProxyModel {
  return new ProxyModelBuilder(options).build(objects);
}

/** What one object read to: its definition (undefined when skipped) and the problems found in it. */
interface ObjectRead<T> {
  value: T | undefined;
  problems: Problem[];
  /** "namespace/name" of the value, made once: every build looks each object up by it. */
  id?: string;
}

/**
 * What the builder keeps of an EndpointSlice between builds: enough to group it by service and to
 * tell it unchanged. Its ports and endpoints are in the model's service ports already; keeping
 * them too would hold every endpoint twice, so they are read again from `object` on the rare
 * build that recomputes an unchanged slice's service (its Service changed, or the node's zone).
 */
interface SliceSummary {
  namespace: string;
  name: string;
  serviceName: string;
  /** "namespace/serviceName": the service it belongs to. */
  serviceId: string;
  object: unknown;
}

/** The service ports of one service as last computed, and the inputs they were computed from. */
interface ServicePortsEntry {
  service: ServiceDefinition;
  slices: SliceSummary[];
  ports: ServicePort[];
  /** The build that last found this service: entries older than the current build are gone. */
  built: number;
}

type SliceReading = Reading<SliceSummary>;

/** The service ports of the last build, in order, and what tells whether the next can keep that order. */
interface PreviousBuild {
  servicePorts: ServicePort[];
  services: number;
  /** Where each of servicePorts stands, once someone needed it: the same for every build that keeps the order. */
  positions: Map<string, number> | undefined;
  /** The last model's copy of servicePorts. */
  modelPorts: readonly ServicePort[];
}

/** Objects a build may find replaced in a list and still work from the last build's; more and it reads the list whole. */
const replacedAtMost = 64;

/**
 * replacedIndexes: where `next` holds other items than `last`, when both are as long and at most
 * replacedAtMost differ; undefined otherwise.
 */
function replacedIndexes(last: readonly unknown[], next: readonly unknown[]): number[] | undefined {
  if (last.length !== next.length) return undefined;
  const indexes: number[] = [];
  for (let index = 0; index < next.length; index++) {
    if (next[index] === last[index]) continue;
    if (indexes.push(index) > replacedAtMost) return undefined;
  }
  return indexes;
}

/**
 * ProxyModelBuilder builds what buildProxyModel builds, over and over as the objects change, for
 * a proxy that needs the model at every sync. An object is read once and its reading kept while
 * the caller passes that same object (by identity: objects must be replaced, never changed in
 * place; of an EndpointSlice only its SliceSummary is kept), and a service whose Service and
 * EndpointSlices are the same readings as at the previous build keeps its ServicePort objects.
 * When a list holds the objects of the previous build in the same places, a few replaced, only
 * those are looked at; a build then costs the work for what changed, and changedServicePorts on
 * two consecutive models compares only what was redone.
 */
export class ProxyModelBuilder {
  readonly #options: ModelOptions;
  readonly #services = new ObjectListReader<ServiceDefinition>('Service');
  readonly #slices = new ObjectListReader<SliceSummary>('EndpointSlice');
  #ports = new Map<string, ServicePortsEntry>();
  /** What the service ports were computed against: node name and zone. */
  #portsContext = '';
  #previous: PreviousBuild | undefined;
  #generation = 0;
  /** The slices of the last build, in order, and their grouping by service. */
  #sliceGroups: {slices: readonly SliceReading[]; byService: Map<string, SliceSummary[]>} | undefined;

  constructor(options: ModelOptions) {
    this.#options = options;
  }

  build(objects: ModelObjects): ProxyModel {
    const options = this.#options;
    const problems: Problem[] = [];
    const configProblems = new ObjectProblems(problems, 'Config', 'proxy');
    let family: IPFamily = options.family;
    if (family !== 'IPv4' && family !== 'IPv6') {
      configProblems.add('family', `${describe(family)} is not IPv4 or IPv6`, 'IPv4 used');
      family = 'IPv4';
    }

    let node: NodeDefinition | undefined =
      objects.node === undefined || objects.node === null ? undefined : readNode(objects.node, family, problems);
    if (node && options.nodeName !== undefined && options.nodeName !== node.name) {
      new ObjectProblems(problems, 'Node', node.name).add(
        'metadata.name',
        `not this proxy's node ${describe(options.nodeName)}`,
        'its addresses, zone and pod CIDRs ignored',
      );
      node = undefined;
    }
    const nodeName = options.nodeName ?? node?.name ?? '';
    const nodeIPs = resolveNodeIPs(options.nodeIPs, node, family, configProblems);
    const config = resolveProxyConfig(
      {family, config: options.config, clusterCIDRs: options.clusterCIDRs, detectLocalMode: options.detectLocalMode},
      node,
      problems,
    );
    const zone = node?.zone ?? '';
    const context = `${family}\n${nodeName}\n${zone}`;
    if (context !== this.#portsContext) {
      this.#ports = new Map();
      this.#previous = undefined;
      this.#portsContext = context;
    }

    const readOneService = (object: unknown, sink: Problem[]) =>
      readService(
        object,
        {family, serviceProxyName: options.serviceProxyName, sourceRangesFromAnnotation: options.sourceRangesFromAnnotation ?? false},
        sink,
      );
    const services = this.#services.read(listOf(objects.services, 'services', configProblems), readOneService, problems);
    // Slices read in this build, so that their service ports need not read them again.
    const sliceDefinitions = new Map<SliceSummary, SliceDefinition>();
    const readOneSlice = (object: unknown, sink: Problem[]): SliceSummary | undefined => {
      const definition = readEndpointSlice(object, family, sink);
      if (!definition) return undefined;
      const summary: SliceSummary = {
        namespace: definition.namespace,
        name: definition.name,
        serviceName: definition.serviceName,
        serviceId: `${definition.namespace}/${definition.serviceName}`,
        object,
      };
      sliceDefinitions.set(summary, definition);
      return summary;
    };
    const sliceDefinition = (summary: SliceSummary): SliceDefinition =>
      // Read before without fault, and objects are never changed in place: the same reading again.
      sliceDefinitions.get(summary) ??
      readEndpointSlice(summary.object, family, []) ?? {
        namespace: summary.namespace,
        name: summary.name,
        serviceName: summary.serviceName,
        ports: [],
        endpoints: [],
      };
    const slices = this.#slices.read(listOf(objects.endpointSlices, 'endpointSlices', configProblems), readOneSlice, problems);
    const {byService: slicesByService, regrouped} = this.#groupSlices(slices);

    // Kept from build to build: at 10,000 services, a new map each build was most of its cost.
    const ports = this.#ports;
    const generation = ++this.#generation;
    const previous = this.#previous;
    // The previous model's order still holds when every service kept the same service ports.
    let samePorts = previous !== undefined && previous.services === services.length;
    const replaced = new Map<ServicePort, ServicePort>();
    const visit = (id: string, service: ServiceDefinition): void => {
      const serviceSlices = slicesByService.get(id) ?? [];
      const known = ports.get(id);
      if (known && known.service === service && sameItems(known.slices, serviceSlices)) {
        known.built = generation;
        return;
      }
      const entry: ServicePortsEntry = {
        service,
        slices: serviceSlices,
        ports: this.#servicePorts(service, serviceSlices.map(sliceDefinition), nodeName, zone),
        built: generation,
      };
      ports.set(id, entry);
      if (
        samePorts &&
        known &&
        known.ports.length === entry.ports.length &&
        known.ports.every((port, index) => port.key === entry.ports[index].key && port.protocol === entry.ports[index].protocol)
      ) {
        known.ports.forEach((port, index) => replaced.set(port, entry.ports[index]));
      } else {
        samePorts = false;
      }
    };
    const replacedServices = this.#services.changedAt;
    if (samePorts && replacedServices !== undefined && regrouped !== undefined && ports.size === services.length) {
      // The same services in the same places, a few replaced by ones of the same name, and a few
      // slices replaced: only their services can have changed. The other entries are the last
      // build's, and none went away.
      for (const index of replacedServices) visit(services[index].id, services[index].value);
      for (const id of regrouped) {
        const known = ports.get(id);
        if (known) visit(id, known.service);
      }
    } else {
      // Indexed: this runs over every service, and a for-of loop that V8 has not optimized yet
      // allocates an iterator result per step (at 10,000 services, most of a build's garbage).
      for (let index = 0; index < services.length; index++) visit(services[index].id, services[index].value);
      // Each service is found once: more entries than services means some went away.
      if (ports.size !== services.length) for (const [id, entry] of ports) if (entry.built !== generation) ports.delete(id);
    }

    const {servicePorts, positions} = this.#orderPorts(samePorts ? previous : undefined, replaced);

    const model: ProxyModel = {family, nodeName, nodeIPs, config, servicePorts: [...servicePorts], problems: sortProblems(problems)};
    if (node?.zone) model.nodeZone = node.zone;
    if (positions) notePortPositions(model.servicePorts, positions);
    this.#previous = {servicePorts, services: services.length, positions, modelPorts: model.servicePorts};
    return model;
  }

  /**
   * #orderPorts: the model's service ports in order. Given the previous build (when every service
   * kept the same service ports), the replaced ports take their places in its order; otherwise
   * every entry's ports are sorted afresh.
   */
  #orderPorts(
    previous: PreviousBuild | undefined,
    replaced: Map<ServicePort, ServicePort>,
  ): {servicePorts: ServicePort[]; positions: Map<string, number> | undefined} {
    let servicePorts: ServicePort[];
    let positions: Map<string, number> | undefined;
    if (previous) {
      // Ports replaced by ports of the same identity: in their places.
      positions = previous.positions ?? positionsOf(previous.servicePorts);
      notePortPositions(previous.modelPorts, positions);
      servicePorts = previous.servicePorts.slice();
      for (const [was, is] of replaced) {
        const position = positions.get(servicePortIdentity(was));
        if (position === undefined || servicePorts[position] !== was) {
          // Two ports of one identity (the model names such problems): by object, then.
          servicePorts = previous.servicePorts.map((port) => replaced.get(port) ?? port);
          break;
        }
        servicePorts[position] = is;
      }
    } else {
      servicePorts = [];
      for (const entry of this.#ports.values()) servicePorts.push(...entry.ports);
      servicePorts.sort((a, b) => compareStrings(a.key, b.key) || compareStrings(a.protocol, b.protocol));
    }
    return {servicePorts, positions};
  }

  /**
   * #groupSlices: the slices of each service ("namespace/name"), sorted by name. A build that
   * got the same slices as the last one in the same order, a few replaced, regroups those alone;
   * groups are replaced, never changed, since entries compare them by identity.
   */
  #groupSlices(slices: readonly SliceReading[]): {byService: Map<string, SliceSummary[]>; regrouped?: Set<string>} {
    const last = this.#sliceGroups;
    const changedAt = last && replacedIndexes(last.slices, slices);
    let byService: Map<string, SliceSummary[]>;
    let regrouped: Set<string> | undefined;
    if (last && changedAt) {
      byService = last.byService;
      regrouped = new Set();
      // All the slices that left first, then those that came: a slice can have moved to another place.
      for (const index of changedAt) {
        const was = last.slices[index].value;
        const rest = (byService.get(was.serviceId) ?? []).filter((slice) => slice !== was);
        if (rest.length > 0) byService.set(was.serviceId, rest);
        else byService.delete(was.serviceId);
        regrouped.add(was.serviceId);
      }
      for (const index of changedAt) {
        const is = slices[index].value;
        byService.set(
          is.serviceId,
          [...(byService.get(is.serviceId) ?? []), is].sort((a, b) => compareStrings(a.name, b.name)),
        );
        regrouped.add(is.serviceId);
      }
    } else {
      byService = new Map();
      for (const {value: slice} of slices) {
        const group = byService.get(slice.serviceId);
        if (group) group.push(slice);
        else byService.set(slice.serviceId, [slice]);
      }
      for (const group of byService.values()) if (group.length > 1) group.sort((a, b) => compareStrings(a.name, b.name));
    }
    this.#sliceGroups = {slices, byService};
    return {byService, regrouped};
  }

  #servicePorts(service: ServiceDefinition, slices: SliceDefinition[], nodeName: string, zone: string): ServicePort[] {
    const topologyAllowed = !this.#options.topologyNeedsServiceOptIn || service.topologyOptIn;
    return service.ports.map((definition) => {
      const endpoints = endpointsForPort(definition, slices, nodeName);
      const categorized = categorizeEndpoints({
        endpoints,
        usesClusterEndpoints: definition.usesClusterEndpoints,
        usesLocalEndpoints: definition.usesLocalEndpoints,
        nodeName,
        zone,
        topologyAllowed,
      });
      return {
        ...definition,
        endpoints,
        clusterEndpoints: categorized.clusterEndpoints,
        localEndpoints: categorized.localEndpoints,
        allReachableEndpoints: categorized.allReachableEndpoints,
        topologyApplied: categorized.topologyMode !== '',
        topologyMode: categorized.topologyMode,
        hasAnyEndpoints: categorized.hasAnyEndpoints,
      };
    });
  }
}

type Reading<T> = ObjectRead<T> & {value: T; id: string};

/**
 * ObjectListReader reads one kind's list of objects from build to build: it reads each object (or
 * takes its earlier reading), adds its problems to the build's, and keeps the first of several
 * objects with the same namespace and name. When the last build's list was read without a problem
 * and this one holds the same objects in the same places, a few replaced by objects of the same
 * name, only those are looked at: a lookup and a name check per object would cost every build
 * time in proportion to the cluster, not to the change.
 */
class ObjectListReader<T extends {namespace: string; name: string}> {
  readonly #kind: 'Service' | 'EndpointSlice';
  readonly #reads = new WeakMap<object, ObjectRead<T>>();
  /** The list as the last build got it. */
  #raw: readonly unknown[] | undefined;
  /** Its readings; undefined when some object had a problem or came twice: the next build reads the list whole. */
  #values: Reading<T>[] | undefined;
  #changedAt: readonly number[] | undefined;

  constructor(kind: 'Service' | 'EndpointSlice') {
    this.#kind = kind;
  }

  /**
   * Where the list just read held other objects than the one read before, of the same names, when
   * it was read from that one's readings; undefined when it was read whole.
   */
  get changedAt(): readonly number[] | undefined {
    return this.#changedAt;
  }

  read(raw: unknown[], read: (object: unknown, sink: Problem[]) => T | undefined, sink: Problem[]): Reading<T>[] {
    const readOne = (object: unknown): ObjectRead<T> => {
      const cacheable = typeof object === 'object' && object !== null;
      let reading = cacheable ? this.#reads.get(object) : undefined;
      if (!reading) {
        const problems: Problem[] = [];
        reading = {value: read(object, problems), problems};
        if (cacheable) this.#reads.set(object, reading);
      }
      return reading;
    };
    const replaced = this.#values && this.#raw ? replacedInPlace(this.#raw, raw, this.#values, readOne) : undefined;
    // A copy: the caller may change its list afterwards.
    this.#raw = raw.slice();
    this.#changedAt = replaced?.changedAt;
    if (replaced) return (this.#values = replaced.values);

    const seen = new Set<string>();
    // The readings themselves, kept from build to build: no new object per object per build.
    const values: Reading<T>[] = [];
    let clean = true;
    for (const object of raw) {
      const reading = readOne(object);
      for (const problem of reading.problems) sink.push(problem);
      const value = reading.value;
      if (reading.problems.length > 0 || !value) clean = false;
      if (!value) continue;
      const id = (reading.id ??= `${value.namespace}/${value.name}`);
      if (seen.has(id)) {
        clean = false;
        new ObjectProblems(sink, this.#kind, value.name, value.namespace).add('metadata.name', 'given twice', 'second copy skipped');
        continue;
      }
      seen.add(id);
      values.push(reading as Reading<T>);
    }
    this.#values = clean ? values : undefined;
    return values;
  }
}

/**
 * replacedInPlace: `last`, the readings of `lastRaw` (one per object, all without a problem), for
 * `raw` when it holds the same objects in the same places but for a few replaced by objects of the
 * same name read without a problem, with where those are; undefined otherwise.
 */
function replacedInPlace<T extends {namespace: string; name: string}>(
  lastRaw: readonly unknown[],
  raw: readonly unknown[],
  last: readonly Reading<T>[],
  readOne: (object: unknown) => ObjectRead<T>,
): {values: Reading<T>[]; changedAt: readonly number[]} | undefined {
  const changedAt = last.length === raw.length ? replacedIndexes(lastRaw, raw) : undefined;
  if (!changedAt) return undefined;
  let values: Reading<T>[] | undefined;
  for (const index of changedAt) {
    const reading = readOne(raw[index]);
    const value = reading.value;
    if (!value || reading.problems.length > 0) return undefined;
    reading.id ??= `${value.namespace}/${value.name}`;
    if (reading.id !== last[index].id) return undefined;
    (values ??= [...last])[index] = reading as Reading<T>;
  }
  return {values: values ?? [...last], changedAt};
}

function sameItems<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((item, index) => item === b[index]);
}

function listOf(value: unknown, field: string, problems: ObjectProblems): unknown[] {
  if (value === undefined || value === null) return [];
  if (Array.isArray(value)) return value;
  problems.add(field, 'not a list of objects', 'none used');
  return [];
}

function resolveNodeIPs(
  override: string[] | undefined,
  node: NodeDefinition | undefined,
  family: IPFamily,
  problems: ObjectProblems,
): string[] {
  if (override === undefined) return node ? unique([...node.internalIPs, ...node.externalIPs]) : [];
  const ips: string[] = [];
  for (const [index, text] of (Array.isArray(override) ? override : []).entries()) {
    const ip = typeof text === 'string' ? parseIP(text) : undefined;
    if (!ip) problems.add(`nodeIPs[${index}]`, `${describe(text)} is not an IP address`, 'address ignored');
    else if (ip.family === family) ips.push(ip.text);
  }
  return unique(ips);
}

/**
 * endpointsForPort resolves the port of every endpoint of the service's slices that carry a port
 * of the same name and protocol. An endpoint seen twice (moving between slices, or an IP reused
 * by a new pod while the old one terminates) keeps the first copy unless a later one is not
 * terminating, as kube-proxy prefers the running pod. Sorted by key like kube-proxy's byEndpoint.
 */
function endpointsForPort(definition: ServicePortDefinition, slices: SliceDefinition[], nodeName: string): Endpoint[] {
  const byKey = new Map<string, Endpoint>();
  for (const slice of slices) {
    const slicePort = slice.ports.find((port) => port.name === definition.portName && port.protocol === definition.protocol);
    if (!slicePort) continue;
    for (const source of slice.endpoints) {
      const key = endpointKey({ip: source.ip, port: slicePort.port});
      if (byKey.has(key) && source.terminating) continue;
      byKey.set(key, new EndpointObject(source, slicePort.port, nodeName !== '' && source.nodeName === nodeName));
    }
  }
  return [...byKey.entries()].sort(([a], [b]) => compareStrings(a, b)).map(([, endpoint]) => endpoint);
}

/**
 * EndpointObject makes the model's Endpoint, a plain object like a literal's (its prototype is
 * Object.prototype, so it compares, prints and clones the same). It is a constructor because V8
 * then keeps room inside the object for every property the constructor may set; the properties
 * set only for some endpoints (nodeName, zone, hints, pod) would otherwise be added to a literal
 * afterwards and go to a separate array, more memory for every endpoint.
 */
const EndpointObject = function (this: Endpoint, source: SliceEndpoint, port: number, isLocal: boolean) {
  this.ip = source.ip;
  this.port = port;
  this.ready = source.ready;
  this.serving = source.serving;
  this.terminating = source.terminating;
  this.isLocal = isLocal;
  if (source.nodeName !== undefined) this.nodeName = source.nodeName;
  if (source.zone !== undefined) this.zone = source.zone;
  if (source.zoneHints) this.zoneHints = [...source.zoneHints];
  if (source.nodeHints) this.nodeHints = [...source.nodeHints];
  if (source.podName !== undefined) this.podName = source.podName;
  if (source.podNamespace !== undefined) this.podNamespace = source.podNamespace;
} as unknown as new (
  source: SliceEndpoint,
  port: number,
  isLocal: boolean,
) => Endpoint;
EndpointObject.prototype = Object.prototype;

const problemKindOrder: Problem['kind'][] = ['Config', 'Node', 'Service', 'EndpointSlice'];

/** sortProblems orders by kind, namespace and name, keeping each object's problems in field order found. */
function sortProblems(problems: Problem[]): Problem[] {
  return [...problems].sort(
    (a, b) =>
      problemKindOrder.indexOf(a.kind) - problemKindOrder.indexOf(b.kind) ||
      compareStrings(a.namespace ?? '', b.namespace ?? '') ||
      compareStrings(a.name, b.name),
  );
}

function unique(values: string[]): string[] {
  return [...new Set(values)];
}
