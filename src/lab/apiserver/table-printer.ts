// Server-side printing: meta.k8s.io/v1 Table responses, which `kubectl get` asks for and prints as columns.
import type {KubeObject} from './object-log.ts';
import {labelSelectorText} from './selectors.ts';

interface Column {
  name: string;
  type: string;
  format?: string;
  description: string;
  priority: number;
  cell: (obj: KubeObject, now: number) => unknown;
}

/** kubectl's short durations: 45s, 5m10s, 3h, 12d. */
export function humanDuration(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 10) return s % 60 === 0 ? `${m}m` : `${m}m${s % 60}s`;
  if (m < 180) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 8) return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
  if (h < 48) return `${h}h`;
  if (h < 192) return h % 24 === 0 ? `${Math.floor(h / 24)}d` : `${Math.floor(h / 24)}d${h % 24}h`;
  if (h < 24 * 365 * 2) return `${Math.floor(h / 24)}d`;
  return `${Math.floor(h / 24 / 365)}y`;
}

const name: Column = {
  name: 'Name',
  type: 'string',
  format: 'name',
  description: 'Name must be unique within a namespace.',
  priority: 0,
  cell: (o) => o.metadata.name,
};
const age: Column = {
  name: 'Age',
  type: 'string',
  description: 'CreationTimestamp is a timestamp representing the server time when this object was created.',
  priority: 0,
  cell: (o, now) => (o.metadata.creationTimestamp ? humanDuration(now - Date.parse(o.metadata.creationTimestamp)) : '<unknown>'),
};

function servicePorts(svc: KubeObject): string {
  const ports: any[] = svc.spec?.ports ?? [];
  if (ports.length === 0) return '<none>';
  return ports.map((p) => (p.nodePort ? `${p.port}:${p.nodePort}/${p.protocol ?? 'TCP'}` : `${p.port}/${p.protocol ?? 'TCP'}`)).join(',');
}

function serviceExternalIP(svc: KubeObject): string {
  const spec = svc.spec ?? {};
  if (spec.type === 'ExternalName') return spec.externalName ?? '<none>';
  const ips: string[] = [...(spec.externalIPs ?? [])];
  if (spec.type === 'LoadBalancer') {
    for (const ing of svc.status?.loadBalancer?.ingress ?? []) ips.push(ing.ip ?? ing.hostname);
    if (ips.length === 0) return '<pending>';
  }
  return ips.length > 0 ? ips.join(',') : '<none>';
}

function selectorText(selector: Record<string, string> | undefined): string {
  if (!selector || Object.keys(selector).length === 0) return '<none>';
  return Object.entries(selector)
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
}

/** Labels as kubectl formats them (labels.FormatLabels): k=v pairs sorted by key, or <none>. */
function sortedLabelsText(labels: Record<string, string> | undefined): string {
  const keys = Object.keys(labels ?? {}).sort();
  return keys.length > 0 ? keys.map((key) => `${key}=${labels![key]}`).join(',') : '<none>';
}

function podReady(pod: KubeObject): string {
  const total = pod.spec?.containers?.length ?? 0;
  const ready = (pod.status?.containerStatuses ?? []).filter((c: any) => c.ready).length;
  return `${ready}/${total}`;
}

/** kubectl's STATUS of a pod: Terminating, else a container's waiting or terminated reason, else the phase. */
function podStatus(pod: KubeObject): string {
  if (pod.metadata.deletionTimestamp) return 'Terminating';
  let reason = pod.status?.reason ?? pod.status?.phase ?? 'Unknown';
  for (const container of pod.status?.containerStatuses ?? []) {
    const state = container.state ?? {};
    if (state.waiting?.reason) reason = state.waiting.reason;
    else if (state.terminated)
      reason =
        state.terminated.reason ??
        (state.terminated.signal ? `Signal:${state.terminated.signal}` : `ExitCode:${state.terminated.exitCode}`);
  }
  return reason;
}

function templateColumns(): Column[] {
  const containers = (o: KubeObject) => (o.spec?.template?.spec?.containers ?? []) as any[];
  return [
    col(
      'Containers',
      (o) =>
        containers(o)
          .map((c) => c.name)
          .join(','),
      1,
    ),
    col(
      'Images',
      (o) =>
        containers(o)
          .map((c) => c.image)
          .join(','),
      1,
    ),
    col('Selector', (o) => labelSelectorText(o.spec?.selector) || '<none>', 1),
  ];
}

function sliceEndpoints(slice: KubeObject): string {
  const addresses: string[] = (slice.endpoints ?? []).flatMap((e: any) => e.addresses ?? []);
  if (addresses.length === 0) return '<none>';
  const shown = addresses.slice(0, 3).join(',');
  return addresses.length > 3 ? `${shown} + ${addresses.length - 3} more...` : shown;
}

function nodeStatus(node: KubeObject): string {
  const ready = (node.status?.conditions ?? []).find((c: any) => c.type === 'Ready');
  const text = ready?.status === 'True' ? 'Ready' : 'NotReady';
  return node.spec?.unschedulable ? `${text},SchedulingDisabled` : text;
}

function nodeRoles(node: KubeObject): string {
  const roles = Object.keys(node.metadata.labels ?? {})
    .filter((k) => k.startsWith('node-role.kubernetes.io/'))
    .map((k) => k.slice('node-role.kubernetes.io/'.length));
  return roles.length > 0 ? roles.join(',') : '<none>';
}

const col = (n: string, cell: Column['cell'], priority = 0, type = 'string'): Column => ({name: n, type, description: n, priority, cell});

const columnsByKind: Record<string, Column[]> = {
  Service: [
    name,
    col('Type', (o) => o.spec?.type ?? 'ClusterIP'),
    col('Cluster-IP', (o) => o.spec?.clusterIP || '<none>'),
    col('External-IP', serviceExternalIP),
    col('Port(s)', servicePorts),
    age,
    col('Selector', (o) => selectorText(o.spec?.selector), 1),
  ],
  Pod: [
    name,
    col('Ready', podReady),
    col('Status', podStatus),
    col('Restarts', (o) => (o.status?.containerStatuses ?? []).reduce((n: number, c: any) => n + (c.restartCount ?? 0), 0), 0, 'integer'),
    age,
    col('IP', (o) => o.status?.podIP ?? '<none>', 1),
    col('Node', (o) => o.spec?.nodeName ?? '<none>', 1),
  ],
  EndpointSlice: [
    name,
    col('AddressType', (o) => o.addressType),
    col('Ports', (o) =>
      o.ports?.length
        ? o.ports.map((p: any) => (p.port === undefined || p.port === null ? '<unset>' : String(p.port))).join(',')
        : '<unset>',
    ),
    col('Endpoints', sliceEndpoints),
    age,
  ],
  Node: [
    name,
    col('Status', nodeStatus),
    col('Roles', nodeRoles),
    age,
    col('Version', (o) => o.status?.nodeInfo?.kubeletVersion ?? ''),
    col('Internal-IP', (o) => (o.status?.addresses ?? []).find((a: any) => a.type === 'InternalIP')?.address ?? '<none>', 1),
  ],
  Deployment: [
    name,
    col('Ready', (o) => `${o.status?.readyReplicas ?? 0}/${o.spec?.replicas ?? 0}`),
    col('Up-to-date', (o) => o.status?.updatedReplicas ?? 0, 0, 'integer'),
    col('Available', (o) => o.status?.availableReplicas ?? 0, 0, 'integer'),
    age,
    ...templateColumns(),
  ],
  ReplicaSet: [
    name,
    col('Desired', (o) => o.spec?.replicas ?? 0, 0, 'integer'),
    col('Current', (o) => o.status?.replicas ?? 0, 0, 'integer'),
    col('Ready', (o) => o.status?.readyReplicas ?? 0, 0, 'integer'),
    age,
    ...templateColumns(),
  ],
  DaemonSet: [
    name,
    col('Desired', (o) => o.status?.desiredNumberScheduled ?? 0, 0, 'integer'),
    col('Current', (o) => o.status?.currentNumberScheduled ?? 0, 0, 'integer'),
    col('Ready', (o) => o.status?.numberReady ?? 0, 0, 'integer'),
    col('Up-to-date', (o) => o.status?.updatedNumberScheduled ?? 0, 0, 'integer'),
    col('Available', (o) => o.status?.numberAvailable ?? 0, 0, 'integer'),
    col('Node Selector', (o) => sortedLabelsText(o.spec?.template?.spec?.nodeSelector)),
    age,
    ...templateColumns(),
  ],
  ControllerRevision: [
    name,
    col('Controller', (o) => {
      const owner = (o.metadata.ownerReferences ?? []).find((ref) => ref.controller === true);
      if (!owner) return '<none>';
      const group = String(owner.apiVersion ?? '').includes('/') ? `.${String(owner.apiVersion).split('/')[0]}` : '';
      return `${String(owner.kind).toLowerCase()}${group}/${owner.name}`;
    }),
    col('Revision', (o) => o.revision ?? 0, 0, 'integer'),
    age,
  ],
  ServiceCIDR: [name, col('CIDRs', (o) => (Array.isArray(o.spec?.cidrs) ? o.spec.cidrs.join(',') : '')), age],
  Namespace: [name, col('Status', (o) => o.status?.phase ?? 'Active'), age],
  // core/v1 names first, then events.k8s.io/v1's (the same events, served converted).
  Event: [
    col('Last Seen', (o, now) => {
      const t = o.lastTimestamp ?? o.deprecatedLastTimestamp ?? o.eventTime ?? o.metadata.creationTimestamp;
      return t ? humanDuration(now - Date.parse(t)) : '<unknown>';
    }),
    col('Type', (o) => o.type ?? ''),
    col('Reason', (o) => o.reason ?? ''),
    col('Object', (o) => {
      const about = o.involvedObject ?? o.regarding;
      return `${String(about?.kind ?? '').toLowerCase()}/${about?.name ?? ''}`;
    }),
    col('Message', (o) => o.message ?? o.note ?? ''),
  ],
  ConfigMap: [name, col('Data', (o) => Object.keys(o.data ?? {}).length + Object.keys(o.binaryData ?? {}).length, 0, 'integer'), age],
  ServiceAccount: [name, col('Secrets', (o) => (o.secrets ?? []).length, 0, 'integer'), age],
  Endpoints: [
    name,
    col('Endpoints', (o) => {
      const list = (o.subsets ?? []).flatMap((s: any) =>
        (s.addresses ?? []).flatMap((a: any) => (s.ports ?? [{port: ''}]).map((p: any) => `${a.ip}:${p.port}`)),
      );
      return list.length > 0 ? list.slice(0, 3).join(',') + (list.length > 3 ? ` + ${list.length - 3} more...` : '') : '<none>';
    }),
    age,
  ],
};

export type IncludeObject = 'None' | 'Metadata' | 'Object';

function rowObject(obj: KubeObject, include: IncludeObject): unknown {
  if (include === 'None') return undefined;
  if (include === 'Object') return obj;
  return {kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: obj.metadata};
}

export function toTable(
  kind: string,
  objects: KubeObject[],
  resourceVersion: string,
  include: IncludeObject,
  now = Date.now(),
  extraMeta: Record<string, unknown> = {},
): Record<string, unknown> {
  const columns = columnsByKind[kind] ?? [name, age];
  return {
    kind: 'Table',
    apiVersion: 'meta.k8s.io/v1',
    metadata: {resourceVersion, ...extraMeta},
    columnDefinitions: columns.map(({cell: _cell, ...def}) => ({format: '', ...def})),
    rows: objects.map((o) => ({cells: columns.map((c) => c.cell(o, now)), object: rowObject(o, include)})),
  };
}
