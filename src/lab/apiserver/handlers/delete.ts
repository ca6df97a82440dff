// The delete and deletecollection verbs.
import type {KubeObject} from '../object-log.ts';
import type {ResourceType} from '../resources.ts';
import type {ResourceHandler} from './context.ts';
import {deleteOptionsOf} from './request-body.ts';
import {listJson, sendJson, sendObject, sendText} from './response.ts';

export const deleteObject: ResourceHandler = async ({store}, {req, res, url, route, dryRun}) => {
  const {type} = route;
  const deleteOptions = await deleteOptionsOf(req, url);
  const {object, gone} = store.delete(type, route.namespace, route.name!, {...deleteOptions, dryRun});
  if (type.deleteReturnsObject || !gone) sendObject(req, res, url, type, 200, object);
  else sendJson(res, 200, successStatus(type, object));
};

export const deleteCollection: ResourceHandler = async ({store, log}, {req, res, url, route, dryRun}) => {
  const {type} = route;
  const deleteOptions = await deleteOptionsOf(req, url);
  const deleted = store.deleteCollection(
    type,
    {
      namespace: route.namespace,
      labelSelector: url.searchParams.get('labelSelector') ?? undefined,
      fieldSelector: url.searchParams.get('fieldSelector') ?? undefined,
    },
    {...deleteOptions, dryRun},
  );
  sendText(res, 200, listJson(type, deleted, {resourceVersion: String(log.currentRevision)}));
};

function successStatus(type: ResourceType, obj: KubeObject): Record<string, unknown> {
  const details: Record<string, unknown> = {name: obj.metadata.name, kind: type.resource, uid: obj.metadata.uid};
  if (type.group) details.group = type.group;
  return {kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', details};
}
