// TokenReview, SelfSubjectReview, (Self/Local)SubjectAccessReview and SelfSubjectRulesReview: answered
// from the access tables, never stored.
import type {AccessControl, Attributes, UserInfo} from '../access-control.ts';
import {badRequest, fieldError, invalid} from '../api-error.ts';
import {groupVersion, type ResourceType} from '../resources.ts';

export function answerReview(
  access: AccessControl,
  type: ResourceType,
  body: any,
  requester: UserInfo,
  namespace?: string,
): Record<string, unknown> {
  if (!body || typeof body !== 'object') throw badRequest('the body of the request must be a JSON object');
  const base = {
    kind: type.kind,
    apiVersion: groupVersion(type),
    metadata: {...(body.metadata ?? {}), creationTimestamp: null},
    spec: body.spec ?? {},
  };
  if (type.resource === 'tokenreviews') {
    const token = body.spec?.token;
    if (!token) throw invalid('TokenReview', type.group, '', [fieldError.required('spec.token')]);
    const user = access.authenticate(token);
    return {
      ...base,
      status: user
        ? {authenticated: true, user: {username: user.username, uid: user.uid, groups: user.groups}, audiences: body.spec?.audiences}
        : {authenticated: false, user: {}, error: 'invalid bearer token'},
    };
  }
  if (type.resource === 'selfsubjectreviews') {
    return {...base, status: {userInfo: {username: requester.username, uid: requester.uid, groups: requester.groups}}};
  }
  const spec = body.spec ?? {};
  if (type.resource === 'selfsubjectrulesreviews') {
    if (!spec.namespace) throw badRequest('no namespace on request');
    return {...base, status: {...access.rulesFor(requester, spec.namespace), incomplete: false}};
  }
  let subject: UserInfo;
  if (type.resource === 'selfsubjectaccessreviews') subject = requester;
  else {
    if (!spec.user && !spec.groups?.length) {
      throw invalid(type.kind, type.group, '', [fieldError.invalid('spec.user', '', 'at least one of user or group must be specified')]);
    }
    subject = {username: spec.user ?? '', uid: spec.uid, groups: spec.groups ?? []};
  }
  const ra = spec.resourceAttributes;
  const nra = spec.nonResourceAttributes;
  if (!ra && !nra)
    throw invalid(type.kind, type.group, '', [
      fieldError.required('spec.resourceAttributes', 'exactly one of nonResourceAttributes or resourceAttributes must be specified'),
    ]);
  if (type.resource === 'localsubjectaccessreviews' && ra?.namespace !== namespace) {
    throw invalid(type.kind, type.group, '', [
      fieldError.invalid('spec.resourceAttributes.namespace', ra?.namespace ?? '', 'must match metadata.namespace'),
    ]);
  }
  const attrs: Attributes = ra
    ? {
        user: subject,
        verb: ra.verb ?? '',
        group: ra.group ?? '',
        resource: ra.resource ?? '',
        subresource: ra.subresource || undefined,
        namespace: ra.namespace || undefined,
        name: ra.name || undefined,
      }
    : {user: subject, verb: nra.verb ?? '', path: nra.path ?? ''};
  const decision = access.authorize(attrs);
  return {...base, status: decision.allowed ? {allowed: true, reason: decision.reason} : {allowed: false}};
}
