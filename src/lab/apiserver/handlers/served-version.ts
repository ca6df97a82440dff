// Objects between the version a request names and the stored one: EndpointSlices are stored as
// discovery.k8s.io/v1 and served as v1beta1 too, for kubectl 1.20.
import {badField, badRequest} from '../api-error.ts';
import {endpointSliceFromV1beta1, endpointSliceToV1beta1} from '../endpointslice-rules.ts';
import {eventFromEventsV1, eventToEventsV1, isEventsV1} from '../event-versions.ts';
import type {KubeObject} from '../object-log.ts';
import {groupVersion, type ResourceType} from '../resources.ts';

export function checkKind(type: ResourceType, body: KubeObject): void {
  if (body.kind !== undefined && body.kind !== type.kind) {
    throw badField('kind', `the object provided is unrecognized (must be of type ${type.kind}): ${body.kind} is not ${type.kind}`);
  }
  if (body.apiVersion !== undefined && body.apiVersion !== groupVersion(type)) {
    throw badField(
      'apiVersion',
      `the API version in the data (${body.apiVersion}) does not match the expected API version (${groupVersion(type)})`,
    );
  }
}

/** Incoming objects in a served version that is not the storage version are converted. */
export function accept(type: ResourceType, body: any): KubeObject {
  if (!body || typeof body !== 'object' || Array.isArray(body)) throw badRequest('the body of the request must be a JSON object');
  if (isV1beta1Slice(type)) {
    const converted = endpointSliceFromV1beta1(body);
    converted.apiVersion = body.apiVersion;
    return converted;
  }
  if (isEventsV1(type)) return {...eventFromEventsV1(body), apiVersion: body.apiVersion};
  return body;
}

export function present(type: ResourceType, obj: KubeObject): KubeObject {
  if (isV1beta1Slice(type)) return endpointSliceToV1beta1(obj);
  if (isEventsV1(type)) return eventToEventsV1(obj);
  return obj;
}

export function isV1beta1Slice(type: ResourceType): boolean {
  return type.group === 'discovery.k8s.io' && type.version === 'v1beta1';
}
