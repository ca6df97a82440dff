// The get and list verbs.
import {toTable} from '../table-printer.ts';
import type {ResourceHandler} from './context.ts';
import {listJson, sendJson, sendObject, sendText, tableRequest} from './response.ts';
import {present} from './served-version.ts';

export const getObject: ResourceHandler = ({store}, {req, res, url, route}) => {
  const obj = store.get(route.type, route.namespace, route.name!);
  sendObject(req, res, url, route.type, 200, obj);
};

export const listObjects: ResourceHandler = ({store}, {req, res, url, route}) => {
  const {type} = route;
  const result = store.list(type, {
    namespace: route.namespace,
    labelSelector: url.searchParams.get('labelSelector') ?? undefined,
    fieldSelector: url.searchParams.get('fieldSelector') ?? undefined,
    limit: url.searchParams.has('limit') ? Number(url.searchParams.get('limit')) : undefined,
    continue: url.searchParams.get('continue') ?? undefined,
  });
  const meta: Record<string, unknown> = {resourceVersion: result.resourceVersion};
  if (result.continue) {
    meta.continue = result.continue;
    meta.remainingItemCount = result.remainingItemCount;
  }
  const table = tableRequest(req, url);
  if (table) {
    sendJson(
      res,
      200,
      toTable(
        type.kind,
        result.items.map((o) => present(type, o)),
        result.resourceVersion,
        table,
        Date.now(),
        result.continue ? {continue: result.continue} : {},
      ),
    );
    return;
  }
  sendText(res, 200, listJson(type, result.items, meta));
};
