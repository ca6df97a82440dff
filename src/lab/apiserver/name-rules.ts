// Name and metadata checks shared by every kind, with kube-apiserver's messages.
import {ipFamilyOf, ipToBigInt} from './ip-allocator.ts';
import {fieldError, type FieldError} from './api-error.ts';
import type {KubeObject} from './object-log.ts';

const dns1123LabelRe = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const dns1123SubdomainRe = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const dns1035LabelRe = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;

/** nameFormErrors: kube-apiserver's complaints about a name of a form with a length limit and a pattern. */
function nameFormErrors(value: string, maxLength: number, pattern: RegExp, mismatch: string): string[] {
  const errs: string[] = [];
  if (value.length > maxLength) errs.push(`must be no more than ${maxLength} characters`);
  if (!pattern.test(value)) errs.push(mismatch);
  return errs;
}

export function dns1123LabelErrors(value: string): string[] {
  return nameFormErrors(
    value,
    63,
    dns1123LabelRe,
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must " +
      "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for " +
      "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
  );
}

export function dns1123SubdomainErrors(value: string): string[] {
  return nameFormErrors(
    value,
    253,
    dns1123SubdomainRe,
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and " +
      "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is " +
      "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
  );
}

export function dns1035LabelErrors(value: string): string[] {
  return nameFormErrors(
    value,
    63,
    dns1035LabelRe,
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an " +
      "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex " +
      "used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
  );
}

/** IANA_SVC_NAME, the form of container port names and named targetPorts. */
export function portNameErrors(value: string): string[] {
  const errs: string[] = [];
  if (value.length > 15) errs.push('must be no more than 15 characters');
  if (!/^[-a-z0-9]+$/.test(value)) errs.push('must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)');
  if (value.includes('--')) errs.push('must not contain consecutive hyphens');
  if (!/[a-z]/.test(value)) errs.push('must contain at least one letter (a-z)');
  if (value.startsWith('-') || value.endsWith('-')) errs.push('must not begin or end with a hyphen');
  return errs;
}

export function portNumberErrors(value: unknown): string[] {
  return typeof value === 'number' && Number.isInteger(value) && value >= 1 && value <= 65535
    ? []
    : ['must be between 1 and 65535, inclusive'];
}

/**
 * kube-apiserver's ValidateNonSpecialIP: addresses a proxy must never send service traffic to
 * (the node itself, or its metadata service) are refused for endpoints.
 */
export function specialAddressErrors(ip: string): string[] {
  const family = ipFamilyOf(ip);
  if (!family) return [];
  const value = ipToBigInt(ip);
  const v4 = family === 'IPv4';
  const inRange = (base: string, prefix: number) => {
    const width = v4 ? 32 : 128;
    return ipFamilyOf(base) === family && value >> BigInt(width - prefix) === ipToBigInt(base) >> BigInt(width - prefix);
  };
  if (value === 0n) return ['may not be unspecified (0.0.0.0, ::)'];
  if (v4 ? inRange('127.0.0.0', 8) : value === 1n) return ['may not be in the loopback range (127.0.0.0/8, ::1/128)'];
  if (v4 ? inRange('169.254.0.0', 16) : inRange('fe80::', 10)) return ['may not be in the link-local range (169.254.0.0/16, fe80::/10)'];
  if (v4 ? inRange('224.0.0.0', 24) : inRange('ff02::', 16))
    return ['may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)'];
  return [];
}

export type NameRule = 'dns1123-subdomain' | 'dns1123-label' | 'dns1035-label' | 'any';

const labelValueRe = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const qualifiedNameRe = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;

function labelKeyErrors(key: string): string[] {
  const slash = key.lastIndexOf('/');
  const name = slash >= 0 ? key.slice(slash + 1) : key;
  const prefix = slash >= 0 ? key.slice(0, slash) : '';
  const errs: string[] = [];
  if (prefix && dns1123SubdomainErrors(prefix).length > 0) errs.push('prefix part ' + dns1123SubdomainErrors(prefix)[0]);
  if (name.length === 0 || name.length > 63 || !qualifiedNameRe.test(name)) {
    errs.push(
      "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an " +
        "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
    );
  }
  return errs;
}

export function validateLabels(labels: unknown, field: string): FieldError[] {
  if (labels === undefined || labels === null) return [];
  const errors: FieldError[] = [];
  for (const [k, v] of Object.entries(labels as Record<string, unknown>)) {
    for (const msg of labelKeyErrors(k)) errors.push(fieldError.invalid(field, k, msg));
    if (typeof v !== 'string' || v.length > 63 || !labelValueRe.test(v)) {
      errors.push(
        fieldError.invalid(
          `${field}`,
          v,
          "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and " +
            "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', " +
            "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        ),
      );
    }
  }
  return errors;
}

export function validateObjectMeta(obj: KubeObject, rule: NameRule): FieldError[] {
  const errors: FieldError[] = [];
  const name = obj.metadata?.name;
  if (!name) {
    errors.push(fieldError.required('metadata.name', 'name or generateName is required'));
  } else if (rule !== 'any') {
    const check = rule === 'dns1123-label' ? dns1123LabelErrors : rule === 'dns1035-label' ? dns1035LabelErrors : dns1123SubdomainErrors;
    for (const msg of check(name)) errors.push(fieldError.invalid('metadata.name', name, msg));
  }
  errors.push(...validateLabels(obj.metadata?.labels, 'metadata.labels'));
  return errors;
}
