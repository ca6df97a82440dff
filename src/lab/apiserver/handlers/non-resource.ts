// Paths that name no resource: the health checks, /version, discovery (/api, /apis, resource lists)
// and the OpenAPI documents (v2, v3).
import type {IncomingMessage, ServerResponse} from 'node:http';
import {pathNotFound} from '../api-error.ts';
import {coreVersions, group, groupList, resourceList, serverVersion} from '../discovery.ts';
import {openApiV2, openApiV2Protobuf} from '../openapi-v2.ts';
import {sendJson} from './response.ts';
import {openApiV3Document, openApiV3Index} from '../openapi-v3.ts';

export const healthPaths = new Set(['/healthz', '/livez', '/readyz']);

// kube-apiserver names the type application/com.github.proto-openapi.spec.v2@v1.0+protobuf, which Go's
// mime parser (and so client-go 1.20) rejects; a generic binary type decodes the same.
const protobufOpenApi = 'application/octet-stream';

export function sendHealth(res: ServerResponse): void {
  res.writeHead(200, {'content-type': 'text/plain; charset=utf-8', 'content-length': 2});
  res.end('ok');
}

/** The document at `pathname`, or undefined when it names no such document (a resource path). */
export function nonResourceDocument(
  pathname: string,
  req: IncomingMessage,
  hostPort: string,
): Record<string, unknown> | Buffer | undefined {
  switch (pathname) {
    case '/version':
      return serverVersion;
    case '/api':
      return coreVersions(hostPort);
    case '/apis':
      return groupList();
    case '/api/v1':
      return resourceList('', 'v1');
    case '/openapi/v2':
      return (req.headers.accept ?? '').includes('protobuf') ? openApiV2Protobuf() : openApiV2();
  }
  if (pathname === '/openapi/v3') return openApiV3Index();
  if (pathname.startsWith('/openapi/v3/')) {
    const document = openApiV3Document(pathname.slice('/openapi/v3/'.length));
    if (!document) throw pathNotFound();
    return document;
  }
  const m = pathname.match(/^\/apis\/([^/]+)(?:\/([^/]+))?$/);
  if (m) {
    const doc = m[2] ? resourceList(m[1], m[2]) : group(m[1]);
    if (!doc) throw pathNotFound();
    return doc;
  }
  return undefined;
}

export function sendDocument(res: ServerResponse, document: Record<string, unknown> | Buffer): void {
  if (Buffer.isBuffer(document)) {
    res.writeHead(200, {'content-type': protobufOpenApi, 'content-length': document.length});
    res.end(document);
  } else sendJson(res, 200, document);
}
