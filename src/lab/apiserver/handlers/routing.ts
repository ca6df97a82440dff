// Resource paths (/api/v1/namespaces/NS/pods/NAME/status, /apis/GROUP/VERSION/watch/...) to the
// resource, namespace, name and subresource they name, and HTTP methods to Kubernetes verbs.
import {methodNotAllowed} from '../api-error.ts';
import {findResource, type ResourceType} from '../resources.ts';

export interface Route {
  type: ResourceType;
  namespace?: string;
  name?: string;
  subresource?: string;
  watch: boolean;
}

export function parseRoute(pathname: string, search: URLSearchParams): Route | undefined {
  const parts = pathname.split('/').filter(Boolean);
  let groupName = '';
  let version: string;
  let rest: string[];
  if (parts[0] === 'api' && parts.length >= 3) {
    version = parts[1];
    rest = parts.slice(2);
  } else if (parts[0] === 'apis' && parts.length >= 4) {
    groupName = parts[1];
    version = parts[2];
    rest = parts.slice(3);
  } else return undefined;
  let watch = search.get('watch') === '1' || search.get('watch') === 'true';
  if (rest[0] === 'watch') {
    watch = true;
    rest = rest.slice(1);
  }
  let namespace: string | undefined;
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    const inner = findResource(groupName, version, rest[2]);
    if (inner?.namespaced) {
      namespace = decodeURIComponent(rest[1]);
      rest = rest.slice(2);
    }
  }
  const type = findResource(groupName, version, rest[0] ?? '');
  if (!type || rest.length > 3) return undefined;
  const name = rest[1] !== undefined ? decodeURIComponent(rest[1]) : undefined;
  const subresource = rest[2];
  if (subresource !== undefined && !type.subresources.includes(subresource)) return undefined;
  return {type, namespace, name, subresource, watch};
}

export function verbOf(method: string, route: Route): string {
  switch (method) {
    case 'GET':
    case 'HEAD':
      return route.watch ? 'watch' : route.name ? 'get' : 'list';
    case 'POST':
      return 'create';
    case 'PUT':
      return 'update';
    case 'PATCH':
      return 'patch';
    case 'DELETE':
      return route.name ? 'delete' : 'deletecollection';
    default:
      throw methodNotAllowed();
  }
}
