// Discovery documents (/version, /api, /apis, group versions) and a small OpenAPI v2 document.
import {groupVersion, resourceTypes, servedGroups, type ResourceType} from './resources.ts';

export const serverVersion = {
  major: '1',
  minor: '31',
  gitVersion: 'v1.31.0-proxyctl-lab',
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2024-08-13T00:00:00Z',
  goVersion: 'go1.22.5',
  compiler: 'gc',
  platform: 'linux/amd64',
};

const subresourceInfo: Record<string, {kind: string; verbs: string[]; group?: string; version?: string}> = {
  status: {kind: '', verbs: ['get', 'patch', 'update']},
  portforward: {kind: 'PodPortForwardOptions', verbs: ['create', 'get']},
  binding: {kind: 'Binding', verbs: ['create']},
  finalize: {kind: 'Namespace', verbs: ['update']},
  log: {kind: 'Pod', verbs: ['get']},
  scale: {kind: 'Scale', verbs: ['get', 'patch', 'update'], group: 'autoscaling', version: 'v1'},
};

export function coreVersions(hostPort: string): Record<string, unknown> {
  return {kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [{clientCIDR: '0.0.0.0/0', serverAddress: hostPort}]};
}

function groupDoc(name: string, versions: string[], preferred: string): Record<string, unknown> {
  const gv = (v: string) => ({groupVersion: `${name}/${v}`, version: v});
  return {name, versions: versions.map(gv), preferredVersion: gv(preferred)};
}

export function groupList(): Record<string, unknown> {
  return {kind: 'APIGroupList', apiVersion: 'v1', groups: servedGroups().map((g) => groupDoc(g.name, g.versions, g.preferred))};
}

export function group(name: string): Record<string, unknown> | undefined {
  const g = servedGroups().find((x) => x.name === name);
  if (!g) return undefined;
  return {kind: 'APIGroup', apiVersion: 'v1', ...groupDoc(g.name, g.versions, g.preferred)};
}

export function resourceList(groupName: string, version: string): Record<string, unknown> | undefined {
  const types = resourceTypes.filter((t) => t.group === groupName && t.version === version);
  if (types.length === 0) return undefined;
  const resources: Record<string, unknown>[] = [];
  for (const t of types) {
    const entry: Record<string, unknown> = {
      name: t.resource,
      singularName: t.singular,
      namespaced: t.namespaced,
      kind: t.kind,
      verbs: t.verbs,
    };
    if (t.shortNames.length > 0) entry.shortNames = t.shortNames;
    if (t.categories) entry.categories = t.categories;
    resources.push(entry);
    for (const sub of t.subresources) {
      const info = subresourceInfo[sub];
      resources.push({
        name: `${t.resource}/${sub}`,
        singularName: '',
        namespaced: t.namespaced,
        kind: info.kind || t.kind,
        verbs: info.verbs,
        ...(info.group ? {group: info.group, version: info.version} : {}),
      });
    }
  }
  return {kind: 'APIResourceList', apiVersion: 'v1', groupVersion: groupName ? `${groupName}/${version}` : version, resources};
}

// ---- OpenAPI v2 ----

function definitionName(t: ResourceType): string {
  const groupPart = t.group === '' ? 'core' : t.group.split('.')[0] === 'rbac' ? 'rbac' : t.group.split('.')[0];
  return `io.k8s.api.${groupPart}.${t.version}.${t.kind}`;
}

/**
 * A small but valid Swagger 2.0 document: one open-ended definition per served kind, tagged with its
 * group/version/kind. It tells tools which kinds exist; it does not describe their fields.
 */
export function openApiV2(): Record<string, unknown> {
  const definitions: Record<string, unknown> = {
    'io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta': {
      type: 'object',
      description: 'Standard object metadata.',
      additionalProperties: true,
    },
  };
  const paths: Record<string, unknown> = {};
  for (const t of resourceTypes) {
    const defName = definitionName(t);
    definitions[defName] = {
      description: `${t.kind} (${groupVersion(t)}).`,
      type: 'object',
      properties: {
        apiVersion: {type: 'string'},
        kind: {type: 'string'},
        metadata: {$ref: '#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta'},
      },
      additionalProperties: true,
      'x-kubernetes-group-version-kind': [{group: t.group, version: t.version, kind: t.kind}],
    };
    const base = t.group ? `/apis/${t.group}/${t.version}` : `/api/${t.version}`;
    const collection = t.namespaced ? `${base}/namespaces/{namespace}/${t.resource}` : `${base}/${t.resource}`;
    paths[collection] = {
      get: {operationId: `list${t.kind}`, responses: {'200': {description: 'OK'}}},
      post: {operationId: `create${t.kind}`, responses: {'201': {description: 'Created'}}},
    };
  }
  return {swagger: '2.0', info: {title: 'Kubernetes', version: serverVersion.gitVersion}, paths, definitions};
}

// gnostic's openapi_v2.Document in protobuf, as kubectl 1.20 requests it. Only `swagger` (field 1) and
// `info` (field 2: title 1, version 2) are encoded: with no definitions kubectl skips client-side
// schema validation and `kubectl apply` uses its compiled-in patch metadata; the server validates.
function protoString(field: number, value: string): Buffer {
  const bytes = Buffer.from(value, 'utf8');
  return Buffer.concat([Buffer.from([(field << 3) | 2]), varint(bytes.length), bytes]);
}

function protoMessage(field: number, body: Buffer): Buffer {
  return Buffer.concat([Buffer.from([(field << 3) | 2]), varint(body.length), body]);
}

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return Buffer.from(out);
}

export function openApiV2Protobuf(): Buffer {
  return Buffer.concat([
    protoString(1, '2.0'),
    protoMessage(2, Buffer.concat([protoString(1, 'Kubernetes'), protoString(2, serverVersion.gitVersion)])),
  ]);
}
