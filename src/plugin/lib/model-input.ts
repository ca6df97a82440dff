// Offline input for `render`: manifests read from files, turned into the ProxyModel of one node
// and one IP family, with every skipped object reported against the file it came from.
import {readFile} from 'node:fs/promises';
import {
  buildProxyModel,
  inputWarnings,
  parseCIDR,
  parseManifests,
  type EndpointSliceInput,
  type IPFamily,
  type LocalDetector,
  type ModelOptions,
  type NftablesLayout,
  type NodeInput,
  type ProxyConfig,
  type ProxyModel,
  type ServiceInput,
} from '../../core/model/index.ts';

/** The kube-proxy settings `render` takes as flags; unset ones come from the file's Node or defaults. */
export interface OfflineSettings {
  family: IPFamily;
  nodeName?: string;
  nodeIPs?: string[];
  clusterCIDRs?: string[];
  masqueradeAll?: boolean;
  masqueradeBit?: number;
  nodePortAddresses?: string[];
  detectLocal?: 'cluster-cidr' | 'node-cidr' | 'bridge-interface' | 'interface-name-prefix' | 'none';
  podBridgeInterface?: string;
  podInterfaceNamePrefix?: string;
  localhostNodePorts?: boolean;
  /** nftables mode's layout: proxyctl's own (default) or kube-proxy's. */
  nftablesLayout?: NftablesLayout;
  /** The cluster's service CIDRs (kube-apiserver --service-cluster-ip-range, ServiceCIDR objects). */
  serviceCIDRs?: string[];
  /** iptables mode: the nfacct objects the node holds. */
  nfacctCounters?: string[];
  /** iptables mode: MASQUERADE --random-fully is known. */
  randomFully?: boolean;
}

export interface OfflineModel {
  model: ProxyModel;
  /** The service CIDRs of the model's family, for nftables mode's drop of unused service addresses. */
  serviceCIDRs: string[];
  /** One sentence per skipped object or unreadable document, each naming the file. */
  problems: string[];
  /** One sentence per object that is valid but most likely not meant so (see inputWarnings). */
  warnings: string[];
}

/** InputError: the input cannot be used at all (unreadable file, contradictory flags). */
export class InputError extends Error {}

export async function readOfflineModel(files: string[], settings: OfflineSettings): Promise<OfflineModel> {
  const problems: string[] = [];
  const services: ServiceInput[] = [];
  const endpointSlices: EndpointSliceInput[] = [];
  const nodes: NodeInput[] = [];
  // Model problems name the object, not the file: remember where each object came from.
  const sourceOf = new Map<string, string>();
  for (const file of files) {
    let text: string;
    try {
      text = file === '-' ? await readStdin() : await readFile(file, 'utf8');
    } catch (error) {
      throw new InputError(
        `cannot read ${file}: ${(error as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (error as Error).message}`,
      );
    }
    const source = file === '-' ? 'stdin' : file;
    const parsed = parseManifests(text, source);
    problems.push(...parsed.problems.map((problem) => problem.message));
    for (const object of [...parsed.services, ...parsed.endpointSlices, ...parsed.nodes]) {
      sourceOf.set(objectKey(object), source);
    }
    services.push(...(parsed.services as ServiceInput[]));
    endpointSlices.push(...(parsed.endpointSlices as EndpointSliceInput[]));
    nodes.push(...(parsed.nodes as NodeInput[]));
  }

  const serviceCIDRs = familyServiceCIDRs(settings);
  const node = pickNode(nodes, settings.nodeName);
  const model = buildProxyModel({services, endpointSlices, node}, modelOptions(settings));
  for (const problem of model.problems) {
    const source = sourceOf.get(`${problem.kind}/${problem.namespace ?? ''}/${problem.name}`);
    problems.push(source ? `${source}: ${problem.message} (field ${problem.field})` : `${problem.message} (field ${problem.field})`);
  }
  const warnings = inputWarnings({files, services, endpointSlices, sourceOf: (object) => sourceOf.get(objectKey(object))}, model);
  return {model, problems, warnings, serviceCIDRs};
}

/** The --service-cidr values of the rendered family; a value that is no CIDR is refused. */
function familyServiceCIDRs(settings: OfflineSettings): string[] {
  const cidrs = (settings.serviceCIDRs ?? []).map((text) => {
    const cidr = parseCIDR(text.trim());
    if (!cidr) throw new InputError(`--service-cidr ${text}: not a CIDR (like 10.96.0.0/12 or fd00:10:96::/112)`);
    return cidr;
  });
  return cidrs.filter((cidr) => cidr.family === settings.family).map((cidr) => cidr.text);
}

function objectKey(object: unknown): string {
  const {kind, metadata} = object as {kind?: string; metadata?: {name?: string; namespace?: string}};
  return `${kind}/${kind === 'Node' ? '' : (metadata?.namespace ?? 'default')}/${metadata?.name ?? ''}`;
}

/** The Node the rules are for: the one named by --node-name, or the only one in the input. */
function pickNode(nodes: NodeInput[], nodeName: string | undefined): NodeInput | undefined {
  if (nodeName !== undefined) return nodes.find((node) => node.metadata?.name === nodeName);
  if (nodes.length > 1) {
    const names = nodes.map((node) => node.metadata?.name).join(', ');
    throw new InputError(`the input holds several Nodes (${names}): say which one the rules are for with --node-name`);
  }
  return nodes[0];
}

function modelOptions(settings: OfflineSettings): ModelOptions {
  const config: Partial<ProxyConfig> = {};
  if (settings.masqueradeAll !== undefined) config.masqueradeAll = settings.masqueradeAll;
  if (settings.masqueradeBit !== undefined) config.masqueradeBit = settings.masqueradeBit;
  if (settings.nodePortAddresses !== undefined) config.nodePortAddresses = settings.nodePortAddresses;
  if (settings.localhostNodePorts !== undefined) config.localhostNodePorts = settings.localhostNodePorts;
  if (settings.nftablesLayout !== undefined) config.nftablesLayout = settings.nftablesLayout;
  if (settings.nfacctCounters !== undefined || settings.randomFully !== undefined) {
    config.iptablesFeatures = {
      nfacctCounters: settings.nfacctCounters ?? [],
      randomFully: settings.randomFully ?? true,
      conntrackTCPLiberal: false,
    };
  }
  const detector = interfaceDetector(settings);
  if (detector) config.localDetector = detector;
  const detectLocalMode = ({'cluster-cidr': 'ClusterCIDR', 'node-cidr': 'NodeCIDR', none: 'None'} as const)[
    settings.detectLocal as 'cluster-cidr' | 'node-cidr' | 'none'
  ];
  if (settings.detectLocal === 'cluster-cidr' && !settings.clusterCIDRs?.length) {
    throw new InputError('--detect-local cluster-cidr needs --cluster-cidr');
  }
  return {
    family: settings.family,
    nodeName: settings.nodeName,
    nodeIPs: settings.nodeIPs,
    clusterCIDRs: settings.clusterCIDRs,
    detectLocalMode,
    config,
  };
}

function interfaceDetector(settings: OfflineSettings): LocalDetector | undefined {
  if (settings.detectLocal === 'bridge-interface') {
    if (!settings.podBridgeInterface) throw new InputError('--detect-local bridge-interface needs --pod-bridge-interface');
    return {mode: 'BridgeInterface', interfaceName: settings.podBridgeInterface};
  }
  if (settings.detectLocal === 'interface-name-prefix') {
    if (!settings.podInterfaceNamePrefix) throw new InputError('--detect-local interface-name-prefix needs --pod-interface-name-prefix');
    return {mode: 'InterfaceNamePrefix', interfacePrefix: settings.podInterfaceNamePrefix};
  }
  return undefined;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}
