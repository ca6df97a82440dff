// The second link of the handler chain: may this user do this verb on this resource or path.
import {forbiddenReason, type AccessControl, type Attributes} from '../access-control.ts';
import {ApiError, forbidden} from '../api-error.ts';

export function authorize(access: AccessControl, attrs: Attributes): void {
  if (access.authorize(attrs).allowed) return;
  if (attrs.path !== undefined) throw new ApiError(403, 'Forbidden', `forbidden: ${forbiddenReason(attrs)}`);
  throw forbidden(attrs.resource ?? '', attrs.group ?? '', attrs.name ?? '', forbiddenReason(attrs));
}
