// Writing answers: JSON objects, lists, Tables (kubectl's `as=Table`) and Status errors.
import type {IncomingMessage, ServerResponse} from 'node:http';
import {ApiError, notAcceptable} from '../api-error.ts';
import type {KubeObject} from '../object-log.ts';
import {groupVersion, type ResourceType} from '../resources.ts';
import {toTable, type IncludeObject} from '../table-printer.ts';
import {present} from './served-version.ts';

/**
 * Answers are JSON (Tables and watch streams too): an Accept header that allows neither JSON nor any
 * type is a 406. Clients that prefer protobuf also accept JSON (kubectl sends "protobuf,json").
 */
export function checkAccept(req: IncomingMessage): void {
  const accept = req.headers.accept;
  if (!accept) return;
  const ranges = accept.split(',').map((range) => range.split(';')[0].trim().toLowerCase());
  if (ranges.some((r) => r === '' || r === 'application/json' || r === '*/*' || r === 'application/*')) return;
  throw notAcceptable(['application/json']);
}

export function tableRequest(req: IncomingMessage, url: URL): IncludeObject | undefined {
  const acceptHeader = req.headers.accept ?? '';
  const first = acceptHeader.split(',')[0];
  if (!first.includes('as=Table')) return undefined;
  const include = url.searchParams.get('includeObject');
  return include === 'None' || include === 'Object' ? include : 'Metadata';
}

export function sendObject(req: IncomingMessage, res: ServerResponse, url: URL, type: ResourceType, code: number, obj: KubeObject): void {
  const table = tableRequest(req, url);
  const shown = present(type, obj);
  if (table) sendJson(res, code, toTable(type.kind, [shown], obj.metadata.resourceVersion ?? '', table));
  else sendJson(res, code, shown);
}

export function listJson(type: ResourceType, items: KubeObject[], meta: Record<string, unknown>): string {
  const parts = items.map((o) => JSON.stringify(present(type, o)));
  // The items are spliced in as text, already serialised once each.
  const head = `"kind":${JSON.stringify(`${type.kind}List`)},"apiVersion":${JSON.stringify(groupVersion(type))}`;
  return `{${head},"metadata":${JSON.stringify(meta)},"items":[${parts.join(',')}]}`;
}

export function sendJson(res: ServerResponse, code: number, body: unknown): void {
  sendText(res, code, JSON.stringify(body));
}

export function sendText(res: ServerResponse, code: number, text: string): void {
  res.writeHead(code, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-cache, private',
  });
  res.end(text);
}

export function sendError(res: ServerResponse, err: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const apiError =
    err instanceof ApiError
      ? err
      : new ApiError(500, 'InternalError', `Internal error occurred: ${(err as Error)?.message ?? String(err)}`);
  if (!(err instanceof ApiError)) process.emitWarning(`api server: ${(err as Error)?.stack ?? String(err)}`);
  sendJson(res, apiError.code, apiError.toStatus());
}
