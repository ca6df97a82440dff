// Who may use an agent that listens beyond loopback: bearer tokens checked with TokenReview, then
// SubjectAccessReview on the node's nodes/proxy subresource, as the kubelet checks its own API.
import {AuthenticationV1Api, AuthorizationV1Api, type KubeConfig} from '#client-node';
import type {Access} from '../../protocol/methods.ts';

export interface ReviewedUser {
  username: string;
  uid?: string;
  groups: string[];
}

export interface TokenReviewAnswer {
  authenticated: boolean;
  user?: ReviewedUser;
  /** Why the token was not accepted, when the reviewer says. */
  error?: string;
}

/** ResourceAttributes as authorization.k8s.io/v1 SubjectAccessReview names them. */
export interface ResourceAttributes {
  verb: string;
  group: string;
  resource: string;
  subresource?: string;
  name?: string;
  namespace?: string;
}

export interface AccessAnswer {
  allowed: boolean;
  reason?: string;
}

/** AccessReviewer asks the API server about a caller; tests give a stub. */
export interface AccessReviewer {
  tokenReview(token: string): Promise<TokenReviewAnswer>;
  subjectAccessReview(user: string, groups: string[], attributes: ResourceAttributes): Promise<AccessAnswer>;
}

/**
 * The attributes a caller needs on this node. Reading (status, rules, diff, trace, events) is `get`
 * on nodes/proxy; acting (sync, probe) is `create`, as the kubelet maps GET and POST on its own API.
 */
export function nodeProxyAttributes(nodeName: string, access: Access): ResourceAttributes {
  return {verb: access === 'read' ? 'get' : 'create', group: '', resource: 'nodes', subresource: 'proxy', name: nodeName};
}

export function describeAttributes(a: ResourceAttributes): string {
  return `${a.verb} ${a.resource}${a.subresource ? `/${a.subresource}` : ''}${a.name ? ` ${a.name}` : ''}`;
}

/** An AccessReviewer that posts TokenReviews and SubjectAccessReviews to the cluster's API server. */
export function kubernetesAccessReviewer(kubeConfig: KubeConfig): AccessReviewer {
  const authentication = kubeConfig.makeApiClient(AuthenticationV1Api);
  const authorization = kubeConfig.makeApiClient(AuthorizationV1Api);
  return {
    async tokenReview(token) {
      const review = await authentication.createTokenReview({
        body: {apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: {token}},
      });
      const status = review.status ?? {};
      if (!status.authenticated || !status.user?.username) return {authenticated: false, error: status.error};
      return {authenticated: true, user: {username: status.user.username, uid: status.user.uid, groups: status.user.groups ?? []}};
    },
    async subjectAccessReview(user, groups, attributes) {
      const review = await authorization.createSubjectAccessReview({
        body: {apiVersion: 'authorization.k8s.io/v1', kind: 'SubjectAccessReview', spec: {user, groups, resourceAttributes: attributes}},
      });
      return {allowed: review.status?.allowed === true, reason: review.status?.reason};
    },
  };
}
