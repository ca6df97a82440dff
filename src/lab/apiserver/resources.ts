// The catalogue of resources the embedded API server serves: group, version, kind, scope, verbs.

export interface ResourceType {
  group: string;
  version: string;
  /** Plural, as in URLs: "services". */
  resource: string;
  singular: string;
  kind: string;
  namespaced: boolean;
  shortNames: string[];
  verbs: string[];
  subresources: string[];
  categories?: string[];
  /** Several served versions share one storage; the key names it ("discovery.k8s.io/endpointslices"). */
  storageKey: string;
  /** DELETE answers with the deleted object (true) or with a Success Status (false), as kube-apiserver does per resource. */
  deleteReturnsObject: boolean;
  /** Spec and status are written separately (PUT /status). */
  hasStatus: boolean;
}

export const storedVerbs = ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch'];

function stored(
  group: string,
  version: string,
  resource: string,
  kind: string,
  namespaced: boolean,
  extra: Partial<
    Pick<ResourceType, 'shortNames' | 'subresources' | 'deleteReturnsObject' | 'hasStatus' | 'categories' | 'verbs' | 'storageKey'>
  > = {},
): ResourceType {
  return {
    group,
    version,
    resource,
    singular: kind.toLowerCase(),
    kind,
    namespaced,
    shortNames: extra.shortNames ?? [],
    verbs: extra.verbs ?? storedVerbs,
    subresources: extra.subresources ?? [],
    categories: extra.categories,
    storageKey: extra.storageKey ?? (group ? `${group}/${resource}` : resource),
    deleteReturnsObject: extra.deleteReturnsObject ?? false,
    hasStatus: extra.hasStatus ?? false,
  };
}

const createOnly = ['create'];

export const resourceTypes: ResourceType[] = [
  stored('', 'v1', 'namespaces', 'Namespace', false, {
    shortNames: ['ns'],
    subresources: ['status', 'finalize'],
    deleteReturnsObject: true,
    hasStatus: true,
  }),
  stored('', 'v1', 'nodes', 'Node', false, {shortNames: ['no'], subresources: ['status'], hasStatus: true}),
  stored('', 'v1', 'pods', 'Pod', true, {
    shortNames: ['po'],
    subresources: ['status', 'portforward', 'binding', 'log'],
    deleteReturnsObject: true,
    hasStatus: true,
    categories: ['all'],
  }),
  stored('', 'v1', 'services', 'Service', true, {
    shortNames: ['svc'],
    subresources: ['status'],
    deleteReturnsObject: true,
    hasStatus: true,
    categories: ['all'],
  }),
  stored('', 'v1', 'endpoints', 'Endpoints', true, {shortNames: ['ep']}),
  stored('', 'v1', 'configmaps', 'ConfigMap', true, {shortNames: ['cm']}),
  stored('', 'v1', 'events', 'Event', true, {shortNames: ['ev']}),
  stored('', 'v1', 'serviceaccounts', 'ServiceAccount', true, {shortNames: ['sa'], deleteReturnsObject: true}),
  // events.k8s.io/v1 is the same storage as core/v1 Events, converted (event-versions.ts).
  stored('events.k8s.io', 'v1', 'events', 'Event', true, {shortNames: ['ev'], storageKey: 'events'}),
  stored('apps', 'v1', 'deployments', 'Deployment', true, {
    shortNames: ['deploy'],
    subresources: ['status', 'scale'],
    hasStatus: true,
    categories: ['all'],
  }),
  stored('apps', 'v1', 'replicasets', 'ReplicaSet', true, {
    shortNames: ['rs'],
    subresources: ['status', 'scale'],
    hasStatus: true,
    categories: ['all'],
  }),
  stored('apps', 'v1', 'daemonsets', 'DaemonSet', true, {
    shortNames: ['ds'],
    subresources: ['status'],
    hasStatus: true,
    categories: ['all'],
  }),
  // The DaemonSet controller's template history (`kubectl rollout history|undo daemonset`).
  stored('apps', 'v1', 'controllerrevisions', 'ControllerRevision', true),
  stored('discovery.k8s.io', 'v1', 'endpointslices', 'EndpointSlice', true),
  // kubectl 1.20 knows EndpointSlices only as v1beta1 (describe uses it); served from the same storage, converted.
  stored('discovery.k8s.io', 'v1beta1', 'endpointslices', 'EndpointSlice', true),
  stored('networking.k8s.io', 'v1', 'servicecidrs', 'ServiceCIDR', false, {subresources: ['status'], hasStatus: true}),
  stored('authentication.k8s.io', 'v1', 'tokenreviews', 'TokenReview', false, {verbs: createOnly}),
  stored('authentication.k8s.io', 'v1', 'selfsubjectreviews', 'SelfSubjectReview', false, {verbs: createOnly}),
  stored('authorization.k8s.io', 'v1', 'subjectaccessreviews', 'SubjectAccessReview', false, {verbs: createOnly}),
  stored('authorization.k8s.io', 'v1', 'selfsubjectaccessreviews', 'SelfSubjectAccessReview', false, {verbs: createOnly}),
  stored('authorization.k8s.io', 'v1', 'selfsubjectrulesreviews', 'SelfSubjectRulesReview', false, {verbs: createOnly}),
  stored('authorization.k8s.io', 'v1', 'localsubjectaccessreviews', 'LocalSubjectAccessReview', true, {verbs: createOnly}),
  stored('rbac.authorization.k8s.io', 'v1', 'clusterroles', 'ClusterRole', false),
  stored('rbac.authorization.k8s.io', 'v1', 'clusterrolebindings', 'ClusterRoleBinding', false),
  stored('rbac.authorization.k8s.io', 'v1', 'roles', 'Role', true),
  stored('rbac.authorization.k8s.io', 'v1', 'rolebindings', 'RoleBinding', true),
];

/** Review resources are answered, never stored. */
export function isReview(type: ResourceType): boolean {
  return type.verbs.length === 1 && type.verbs[0] === 'create';
}

export function groupVersion(type: Pick<ResourceType, 'group' | 'version'>): string {
  return type.group ? `${type.group}/${type.version}` : type.version;
}

export interface GroupInfo {
  name: string;
  versions: string[];
  preferred: string;
}

export function servedGroups(): GroupInfo[] {
  const groups = new Map<string, string[]>();
  for (const t of resourceTypes) {
    if (!t.group) continue;
    const versions = groups.get(t.group) ?? [];
    if (!versions.includes(t.version)) versions.push(t.version);
    groups.set(t.group, versions);
  }
  return [...groups].map(([name, versions]) => ({name, versions, preferred: versions[0]}));
}

export function findResource(group: string, version: string, resource: string): ResourceType | undefined {
  return resourceTypes.find((t) => t.group === group && t.version === version && t.resource === resource);
}

/** The type used to store a resource (the first version listed). */
export function storageType(storageKey: string): ResourceType {
  const type = resourceTypes.find((t) => t.storageKey === storageKey);
  if (!type) throw new Error(`unknown storage ${storageKey}`);
  return type;
}

/** Short programmatic names ("pods", "endpointslices") to storage types. */
export function resolveResourceName(name: string): ResourceType {
  const type = resourceTypes.find((t) => t.storageKey === name || t.resource === name || t.kind === name);
  if (!type) throw new Error(`unknown resource ${name}`);
  return storageType(type.storageKey);
}
