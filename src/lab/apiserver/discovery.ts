// Discovery documents (/version, /api, /apis, group versions).
import {resourceTypes, servedGroups} from './resources.ts';

export const serverVersion = {
  major: '1',
  minor: '34',
  gitVersion: 'v1.34.0-proxyctl-lab',
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2025-08-27T00:00:00Z',
  goVersion: 'go1.24.6',
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
