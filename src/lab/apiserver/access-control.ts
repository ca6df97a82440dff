// Authentication by bearer token and authorization by a static grant table plus the stored RBAC objects.
import type {ObjectLog, KubeObject} from './object-log.ts';

export interface UserInfo {
  username: string;
  uid?: string;
  groups: string[];
}

export interface UserEntry {
  name: string;
  token: string;
  groups?: string[];
}

/** A static grant: `verbs` x `resources` (with "pods/portforward" style subresources) x `namespaces`; "*" matches all. */
export interface Grant {
  user?: string;
  group?: string;
  verbs: string[];
  resources: string[];
  namespaces?: string[];
  apiGroups?: string[];
}

export interface Attributes {
  user: UserInfo;
  verb: string;
  /** Resource requests. */
  group?: string;
  resource?: string;
  subresource?: string;
  namespace?: string;
  name?: string;
  /** Non-resource requests ("/version", "/healthz"). */
  path?: string;
}

export interface Decision {
  allowed: boolean;
  reason: string;
}

export const anonymousUser: UserInfo = {username: 'system:anonymous', groups: ['system:unauthenticated']};

// kube-apiserver's default bindings: system:public-info-viewer lets everyone, anonymous included,
// read the health checks and the version; system:discovery lets authenticated users read discovery.
const publicInfoPaths = ['/version', '/healthz', '/livez', '/readyz'];
const discoveryPaths = ['/api', '/apis', '/openapi'];
// system:basic-user, bound to every authenticated user: asking what one may do, and who one is.
const basicUserRules: ResourceRule[] = [
  {verbs: ['create'], apiGroups: ['authorization.k8s.io'], resources: ['selfsubjectaccessreviews', 'selfsubjectrulesreviews']},
  {verbs: ['create'], apiGroups: ['authentication.k8s.io'], resources: ['selfsubjectreviews']},
];

function matches(list: string[] | undefined, value: string): boolean {
  return list === undefined || list.includes('*') || list.includes(value);
}

export class AccessControl {
  private readonly users = new Map<string, UserEntry>();
  private readonly grants: Grant[] = [];
  private readonly log: ObjectLog;

  constructor(log: ObjectLog, users: UserEntry[] = [], grants: Grant[] = []) {
    this.log = log;
    for (const u of users) this.addUser(u);
    this.grants.push(...grants);
  }

  addUser(user: UserEntry): void {
    this.users.set(user.token, user);
  }

  addGrant(grant: Grant): void {
    this.grants.push(grant);
  }

  userByName(name: string): UserEntry | undefined {
    return [...this.users.values()].find((u) => u.name === name);
  }

  authenticate(token: string): UserInfo | undefined {
    const entry = this.users.get(token);
    if (!entry) return undefined;
    return {username: entry.name, uid: entry.name, groups: [...(entry.groups ?? []), 'system:authenticated']};
  }

  authorize(a: Attributes): Decision {
    const groups = a.user.groups;
    if (groups.includes('system:masters')) return {allowed: true, reason: 'system:masters'};
    if (a.path !== undefined) {
      const under = (paths: string[]) => paths.some((p) => a.path === p || a.path!.startsWith(`${p}/`));
      if (under(publicInfoPaths)) return {allowed: true, reason: 'system:public-info-viewer'};
      if (groups.includes('system:authenticated') && under(discoveryPaths)) return {allowed: true, reason: 'system:discovery'};
      return this.rbac(a);
    }
    const resource = a.subresource ? `${a.resource}/${a.subresource}` : (a.resource ?? '');
    const basicUser = basicUserRules.some(
      (r) => r.verbs.includes(a.verb) && r.apiGroups.includes(a.group ?? '') && r.resources.includes(resource),
    );
    if (basicUser && groups.includes('system:authenticated')) return {allowed: true, reason: 'system:basic-user'};
    for (const g of this.grants) {
      if (g.user !== undefined && g.user !== a.user.username) continue;
      if (g.group !== undefined && !groups.includes(g.group)) continue;
      if (g.user === undefined && g.group === undefined) continue;
      if (!matches(g.verbs, a.verb) || !matches(g.resources, resource) || !matches(g.apiGroups, a.group ?? '')) continue;
      if (g.namespaces && !(a.namespace && matches(g.namespaces, a.namespace))) continue;
      return {allowed: true, reason: `granted to ${g.user ?? `group ${g.group}`}`};
    }
    return this.rbac(a);
  }

  /** Stored Roles/ClusterRoles bound to the user, one of its groups, or its service account. */
  private rbac(a: Attributes): Decision {
    const ruleAllows = (rule: any): boolean => {
      if (!matches(rule.verbs ?? [], a.verb)) return false;
      if (a.path !== undefined)
        return (
          Array.isArray(rule.nonResourceURLs) &&
          rule.nonResourceURLs.some((u: string) => u === a.path || (u.endsWith('*') && a.path!.startsWith(u.slice(0, -1))))
        );
      if (!matches(rule.apiGroups ?? [], a.group ?? '')) return false;
      const resource = a.subresource ? `${a.resource}/${a.subresource}` : (a.resource ?? '');
      const resources: string[] = rule.resources ?? [];
      const resourceOk =
        resources.includes('*') ||
        resources.includes(resource) ||
        (a.subresource !== undefined && resources.includes(`*/${a.subresource}`));
      if (!resourceOk) return false;
      if (Array.isArray(rule.resourceNames) && rule.resourceNames.length > 0 && !(a.name && rule.resourceNames.includes(a.name)))
        return false;
      return true;
    };
    for (const bound of this.boundRules(a.user, a.namespace)) {
      if (bound.rules.some(ruleAllows)) return {allowed: true, reason: `RBAC: allowed by ${bound.binding}`};
    }
    return {allowed: false, reason: ''};
  }

  /** The rules of the stored roles bound to `user`: cluster-wide ones, then those of `namespace`. */
  private *boundRules(user: UserInfo, namespace: string | undefined): Generator<{rules: any[]; binding: string}> {
    const subjectMatches = (s: any, bindingNamespace?: string) => {
      if (s.kind === 'User') return s.name === user.username;
      if (s.kind === 'Group') return user.groups.includes(s.name);
      if (s.kind === 'ServiceAccount') return user.username === `system:serviceaccount:${s.namespace ?? bindingNamespace}:${s.name}`;
      return false;
    };
    const roleRules = (ref: any, roleNamespace?: string): any[] => {
      const role: KubeObject | undefined =
        ref?.kind === 'ClusterRole'
          ? this.log.get('rbac.authorization.k8s.io/clusterroles', undefined, ref.name)
          : this.log.get('rbac.authorization.k8s.io/roles', roleNamespace, ref?.name);
      return Array.isArray(role?.rules) ? role.rules : [];
    };
    for (const binding of this.log.list('rbac.authorization.k8s.io/clusterrolebindings')) {
      if ((binding.subjects ?? []).some((s: any) => subjectMatches(s)))
        yield {rules: roleRules(binding.roleRef), binding: `ClusterRoleBinding "${binding.metadata.name}"`};
    }
    if (!namespace) return;
    for (const binding of this.log.list('rbac.authorization.k8s.io/rolebindings', namespace)) {
      if ((binding.subjects ?? []).some((s: any) => subjectMatches(s, namespace)))
        yield {rules: roleRules(binding.roleRef, namespace), binding: `RoleBinding "${binding.metadata.name}/${namespace}"`};
    }
  }

  /**
   * What `user` may do in `namespace`, as SelfSubjectRulesReview lists it: system:masters everything,
   * the default roles every authenticated user has (system:basic-user, system:discovery,
   * system:public-info-viewer), the static grants, then the stored RBAC rules.
   */
  rulesFor(user: UserInfo, namespace: string): {resourceRules: ResourceRule[]; nonResourceRules: NonResourceRule[]} {
    if (user.groups.includes('system:masters'))
      return {
        resourceRules: [{verbs: ['*'], apiGroups: ['*'], resources: ['*']}],
        nonResourceRules: [{verbs: ['*'], nonResourceURLs: ['*']}],
      };
    const resourceRules: ResourceRule[] = [];
    const nonResourceRules: NonResourceRule[] = [];
    if (user.groups.includes('system:authenticated')) {
      resourceRules.push(...basicUserRules);
      nonResourceRules.push({verbs: ['get'], nonResourceURLs: discoveryPaths.flatMap((p) => [p, `${p}/*`])});
    }
    nonResourceRules.push({verbs: ['get'], nonResourceURLs: publicInfoPaths});
    for (const g of this.grants) {
      if (g.user === undefined && g.group === undefined) continue;
      if (g.user !== undefined && g.user !== user.username) continue;
      if (g.group !== undefined && !user.groups.includes(g.group)) continue;
      if (g.namespaces && !matches(g.namespaces, namespace)) continue;
      resourceRules.push({verbs: g.verbs, apiGroups: g.apiGroups ?? ['*'], resources: g.resources});
    }
    for (const {rules} of this.boundRules(user, namespace)) {
      for (const rule of rules) {
        if (Array.isArray(rule.nonResourceURLs) && rule.nonResourceURLs.length > 0)
          nonResourceRules.push({verbs: rule.verbs ?? [], nonResourceURLs: rule.nonResourceURLs});
        if (Array.isArray(rule.resources) && rule.resources.length > 0)
          resourceRules.push({
            verbs: rule.verbs ?? [],
            apiGroups: rule.apiGroups ?? [],
            resources: rule.resources,
            ...(rule.resourceNames?.length ? {resourceNames: rule.resourceNames} : {}),
          });
      }
    }
    return {resourceRules, nonResourceRules};
  }
}

export interface ResourceRule {
  verbs: string[];
  apiGroups: string[];
  resources: string[];
  resourceNames?: string[];
}

export interface NonResourceRule {
  verbs: string[];
  nonResourceURLs: string[];
}

/** kube-apiserver's wording: `User "bob" cannot create resource "pods/portforward" in API group "" in the namespace "default"`. */
export function forbiddenReason(a: Attributes): string {
  if (a.path !== undefined) return `User "${a.user.username}" cannot ${a.verb} path "${a.path}"`;
  const resource = a.subresource ? `${a.resource}/${a.subresource}` : a.resource;
  const scope = a.namespace ? ` in the namespace "${a.namespace}"` : ' at the cluster scope';
  return `User "${a.user.username}" cannot ${a.verb} resource "${resource}" in API group "${a.group ?? ''}"${scope}`;
}
