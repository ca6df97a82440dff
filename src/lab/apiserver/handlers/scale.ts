// The scale subresource of Deployments and ReplicaSets (autoscaling/v1 Scale), which `kubectl
// scale` reads and writes: a view of spec.replicas, status.replicas and the selector.
import {badField, badRequest, conflict, invalid, unsupportedMediaType} from '../api-error.ts';
import type {KubeObject} from '../object-log.ts';
import {applyJsonPatch, applyMergePatch, patchTypes} from '../patch.ts';
import {labelSelectorText} from '../selectors.ts';
import type {ResourceHandler} from './context.ts';
import {readBody} from './request-body.ts';
import {sendJson} from './response.ts';

function scaleOf(obj: KubeObject): KubeObject {
  const {name, namespace, uid, resourceVersion, creationTimestamp} = obj.metadata;
  return {
    kind: 'Scale',
    apiVersion: 'autoscaling/v1',
    metadata: {name, namespace, uid, resourceVersion, creationTimestamp},
    spec: {replicas: obj.spec?.replicas ?? 0},
    status: {replicas: obj.status?.replicas ?? 0, selector: labelSelectorText(obj.spec?.selector)},
  };
}

function wantedReplicas(scale: any, name: string): number {
  const replicas = scale?.spec?.replicas ?? 0;
  if (!Number.isInteger(replicas))
    throw badField('spec.replicas', `Scale in version "v1" cannot be handled as a Scale: spec.replicas must be an integer`);
  if (replicas < 0)
    throw invalid('Scale', 'autoscaling', name, [
      {type: 'FieldValueInvalid', field: 'spec.replicas', message: `Invalid value: ${replicas}: must be greater than or equal to 0`},
    ]);
  return replicas;
}

export const scaleSubresource: ResourceHandler = async ({store}, {req, res, route, writeOptions}) => {
  const {type, namespace} = route;
  const name = route.name!;
  const current = store.get(type, namespace, name);
  if (req.method === 'GET') {
    sendJson(res, 200, scaleOf(current));
    return;
  }
  const body = await readBody(req);
  let scale: any;
  if (req.method === 'PUT') scale = body;
  else if (req.method === 'PATCH') {
    const mediaType = (req.headers['content-type'] ?? '').split(';')[0].trim();
    const base = scaleOf(current);
    if (mediaType === patchTypes.merge || mediaType === patchTypes.strategic) scale = applyMergePatch(base, body);
    else if (mediaType === patchTypes.json) scale = applyJsonPatch(base, body);
    else throw unsupportedMediaType(mediaType);
  } else throw badRequest(`${req.method} is not supported on ${type.resource}/scale`);
  const expected = scale?.metadata?.resourceVersion;
  const replicas = wantedReplicas(scale, name);
  if (req.method === 'PUT' && expected && expected !== current.metadata.resourceVersion) throw conflict(type.resource, type.group, name);
  const updated = store.mutate(type, namespace, name, (obj) => void (obj.spec.replicas = replicas), {dryRun: writeOptions.dryRun});
  sendJson(res, 200, scaleOf(updated));
};
