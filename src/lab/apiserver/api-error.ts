// Kubernetes Status errors and field errors, worded the way kube-apiserver words them.

/** reason and field are left out when empty, as Go's omitempty does. */
export interface StatusCause {
  reason?: string;
  message: string;
  field?: string;
}

export interface StatusObject {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, unknown>;
  status: 'Failure' | 'Success';
  message?: string;
  reason?: string;
  details?: {name?: string; group?: string; kind?: string; uid?: string; causes?: StatusCause[]; retryAfterSeconds?: number};
  code: number;
}

/** An error that the HTTP layer turns into a Status response. */
export class ApiError extends Error {
  readonly code: number;
  readonly reason: string;
  readonly details: StatusObject['details'];

  constructor(code: number, reason: string, message: string, details?: StatusObject['details']) {
    super(message);
    this.code = code;
    this.reason = reason;
    this.details = details;
  }

  toStatus(): StatusObject {
    const status: StatusObject = {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: this.message,
      reason: this.reason,
      code: this.code,
    };
    if (this.details) status.details = this.details;
    return status;
  }
}

/** Group-qualified resource as kube-apiserver prints it: "services", "endpointslices.discovery.k8s.io". */
export function qualifiedResource(resource: string, group: string): string {
  return group ? `${resource}.${group}` : resource;
}

function detailsFor(resource: string, group: string, name: string): StatusObject['details'] {
  const details: NonNullable<StatusObject['details']> = {name, kind: resource};
  if (group) details.group = group;
  return details;
}

export function notFound(resource: string, group: string, name: string): ApiError {
  return new ApiError(404, 'NotFound', `${qualifiedResource(resource, group)} "${name}" not found`, detailsFor(resource, group, name));
}

export function alreadyExists(resource: string, group: string, name: string): ApiError {
  return new ApiError(
    409,
    'AlreadyExists',
    `${qualifiedResource(resource, group)} "${name}" already exists`,
    detailsFor(resource, group, name),
  );
}

export function conflict(
  resource: string,
  group: string,
  name: string,
  why = 'the object has been modified; please apply your changes to the latest version and try again',
): ApiError {
  return new ApiError(
    409,
    'Conflict',
    `Operation cannot be fulfilled on ${qualifiedResource(resource, group)} "${name}": ${why}`,
    detailsFor(resource, group, name),
  );
}

export function badRequest(message: string): ApiError {
  return new ApiError(400, 'BadRequest', message);
}

/** 400 about one field of the body (a name that does not match the URL, say), the field in details.causes. */
export function badField(field: string, message: string): ApiError {
  return new ApiError(400, 'BadRequest', message, {causes: [{reason: 'FieldValueInvalid', message, field}]});
}

export function methodNotAllowed(): ApiError {
  return new ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource');
}

export function pathNotFound(): ApiError {
  return new ApiError(404, 'NotFound', 'the server could not find the requested resource');
}

export function gone(message: string): ApiError {
  return new ApiError(410, 'Expired', message);
}

/** kube-apiserver's errors.NewInternalError: 500, the cause in the message and as the one cause. */
export function internalError(cause: string): ApiError {
  return new ApiError(500, 'InternalError', `Internal error occurred: ${cause}`, {causes: [{message: cause}]});
}

export function unauthorized(): ApiError {
  return new ApiError(401, 'Unauthorized', 'Unauthorized');
}

export function forbidden(resource: string, group: string, name: string, why: string): ApiError {
  const subject = name ? `${qualifiedResource(resource, group)} "${name}"` : qualifiedResource(resource, group);
  return new ApiError(403, 'Forbidden', `${subject} is forbidden: ${why}`, detailsFor(resource, group, name));
}

export function unsupportedMediaType(contentType: string): ApiError {
  return new ApiError(
    415,
    'UnsupportedMediaType',
    `the body of the request was in an unknown format - accepted media types include: ` +
      `application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got ${contentType})`,
  );
}

/** 406, as kube-apiserver answers an Accept header naming no type it can write. */
export function notAcceptable(accepted: string[]): ApiError {
  return new ApiError(406, 'NotAcceptable', `only the following media types are accepted: ${accepted.join(', ')}`);
}

// ---- field errors (k8s.io/apimachinery/pkg/util/validation/field) ----

export type FieldErrorType =
  | 'FieldValueInvalid'
  | 'FieldValueRequired'
  | 'FieldValueDuplicate'
  | 'FieldValueNotSupported'
  | 'FieldValueForbidden'
  | 'FieldValueTooMany'
  | 'FieldValueTooLong'
  | 'InternalError';

export interface FieldError {
  type: FieldErrorType;
  field: string;
  message: string;
}

/** Renders a value the way Go's field errors print it (%#v for strings and slices, %v for numbers). */
export function goValue(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (value.every((v) => typeof v === 'string')) return `[]string{${value.map((v) => JSON.stringify(v)).join(', ')}}`;
    return `[]interface {}{${value.map(goValue).join(', ')}}`;
  }
  if (value === null || value === undefined) return '"null"';
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value);
}

export const fieldError = {
  invalid: (field: string, value: unknown, detail: string): FieldError => ({
    type: 'FieldValueInvalid',
    field,
    message: `Invalid value: ${goValue(value)}${detail ? `: ${detail}` : ''}`,
  }),
  required: (field: string, detail = ''): FieldError => ({
    type: 'FieldValueRequired',
    field,
    message: detail ? `Required value: ${detail}` : 'Required value',
  }),
  duplicate: (field: string, value: unknown): FieldError => ({
    type: 'FieldValueDuplicate',
    field,
    message: `Duplicate value: ${goValue(value)}`,
  }),
  notSupported: (field: string, value: unknown, supported: string[]): FieldError => ({
    type: 'FieldValueNotSupported',
    field,
    message: `Unsupported value: ${goValue(value)}: supported values: ${supported.map((s) => JSON.stringify(s)).join(', ')}`,
  }),
  forbidden: (field: string, detail: string): FieldError => ({type: 'FieldValueForbidden', field, message: `Forbidden: ${detail}`}),
  tooMany: (field: string, actual: number, max: number): FieldError => ({
    type: 'FieldValueTooMany',
    field,
    message: `Too many: ${actual}: must have at most ${max} items`,
  }),
};

/**
 * 422 Invalid: `Service "web" is invalid: spec.ports[0].nodePort: Invalid value: ...`; a kind of a
 * named group is qualified by it (`DaemonSet.apps "agent" is invalid: ...`), as kube-apiserver words it.
 */
export function invalid(kind: string, group: string, name: string, errors: FieldError[]): ApiError {
  const parts = errors.map((e) => `${e.field}: ${e.message}`);
  const summary = parts.length === 1 ? parts[0] : `[${parts.join(', ')}]`;
  const details: NonNullable<StatusObject['details']> = {
    name,
    kind,
    causes: errors.map((e) => ({reason: e.type, message: e.message, field: e.field})),
  };
  if (group) details.group = group;
  return new ApiError(422, 'Invalid', `${group ? `${kind}.${group}` : kind} "${name}" is invalid: ${summary}`, details);
}
