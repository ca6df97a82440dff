// ServiceCIDRs (networking.k8s.io/v1): validation as kube-apiserver words it, and the default
// `kubernetes` object that names the server's own service range.
import {fieldError, type FieldError} from './api-error.ts';
import {Cidr} from './ip-allocator.ts';
import type {KubeObject} from './object-log.ts';
import {validateObjectMeta} from './name-rules.ts';

/** The name kube-apiserver gives the ServiceCIDR of its --service-cluster-ip-range. */
export const defaultServiceCIDRName = 'kubernetes';

const cidrMessage = 'must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)';

/** cidrErrors: the messages of validation.IsValidCIDR for one value (none when it is a CIDR). */
export function cidrErrors(value: unknown): string[] {
  if (typeof value !== 'string') return [cidrMessage];
  try {
    new Cidr(value);
    return value.trim() === value && value.includes('/') ? [] : [cidrMessage];
  } catch {
    return [cidrMessage];
  }
}

export function validateServiceCIDR(obj: KubeObject, old: KubeObject | undefined): FieldError[] {
  const errors = validateObjectMeta(obj, 'dns1123-subdomain');
  const cidrs: unknown[] = Array.isArray(obj.spec?.cidrs) ? obj.spec.cidrs : [];
  if (cidrs.length === 0) return [...errors, fieldError.required('spec.cidrs', 'at least one CIDR required')];
  if (cidrs.length > 2) return [...errors, fieldError.invalid('spec.cidrs', obj.spec, 'may only hold up to 2 values')];
  cidrs.forEach((cidr, index) => {
    for (const message of cidrErrors(cidr)) errors.push(fieldError.invalid(`spec.cidrs[${index}]`, cidr, message));
  });
  if (errors.length > 0) return errors;
  const families = cidrs.map((cidr) => new Cidr(cidr as string).family);
  if (families.length === 2 && families[0] === families[1]) {
    errors.push(
      fieldError.invalid(
        'spec.cidrs',
        obj.spec,
        'may specify no more than one IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64',
      ),
    );
  }
  const before: unknown[] = Array.isArray(old?.spec?.cidrs) ? old.spec.cidrs : [];
  // kube-apiserver lets a single-family ServiceCIDR gain the other family, and nothing else change.
  const grows = before.length === 1 && cidrs.length === 2 && cidrs[0] === before[0];
  if (old && !grows && JSON.stringify(before) !== JSON.stringify(cidrs))
    errors.push(fieldError.invalid('spec.cidrs', cidrs, 'field is immutable'));
  return errors;
}

/** The status kube-apiserver's ServiceCIDR controller gives a range it can allocate from. */
export function readyServiceCIDRStatus(now: string): Record<string, unknown> {
  return {conditions: [{type: 'Ready', status: 'True', lastTransitionTime: now, reason: '', message: 'Kubernetes Service CIDR is ready'}]};
}

/** The ServiceCIDR kube-apiserver keeps for its own service range (--service-cluster-ip-range). */
export function defaultServiceCIDR(cidrs: string[]): KubeObject {
  return {metadata: {name: defaultServiceCIDRName}, spec: {cidrs}};
}
