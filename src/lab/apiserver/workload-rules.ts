// apps/v1 Deployments and ReplicaSets: the defaults and the validation kube-apiserver applies
// (selector required, immutable and matching the template's labels; replicas; rolling-update bounds).
import {fieldError, type FieldError} from './api-error.ts';
import {validateObjectMeta} from './name-rules.ts';
import type {KubeObject} from './object-log.ts';
import {defaultPod, validatePod} from './pod-rules.ts';
import {labelSelectorRequirements, matchesLabels} from './selectors.ts';

export function defaultWorkload(obj: KubeObject): void {
  const spec = (obj.spec ??= {});
  spec.replicas ??= 1;
  spec.revisionHistoryLimit ??= 10;
  if (obj.kind === 'Deployment') {
    spec.progressDeadlineSeconds ??= 600;
    spec.strategy ??= {};
    spec.strategy.type ??= 'RollingUpdate';
    if (spec.strategy.type === 'RollingUpdate') {
      spec.strategy.rollingUpdate ??= {};
      spec.strategy.rollingUpdate.maxSurge ??= '25%';
      spec.strategy.rollingUpdate.maxUnavailable ??= '25%';
    }
  } else delete spec.revisionHistoryLimit;
  spec.template ??= {};
  spec.template.metadata ??= {};
  spec.template.spec ??= {};
  const template: KubeObject = {metadata: {name: 'template'}, spec: spec.template.spec};
  defaultPod(template);
  if (obj.status === undefined) obj.status = {};
}

/** intOrPercent: a rolling-update bound of total replicas ("25%" or 2), rounded up or down as kube-controller-manager does. */
export function intOrPercent(value: number | string | undefined, total: number, roundUp: boolean): number {
  if (value === undefined) return 0;
  if (typeof value === 'number') return value;
  const match = /^(\d+)%$/.exec(value);
  if (!match) return Number.NaN;
  const exact = (Number(match[1]) * total) / 100;
  return roundUp ? Math.ceil(exact) : Math.floor(exact);
}

function boundErrors(field: string, value: unknown): FieldError[] {
  if (value === undefined) return [];
  if (typeof value === 'number') return value < 0 ? [fieldError.invalid(field, value, 'must be greater than or equal to 0')] : [];
  if (typeof value === 'string' && /^\d+%$/.test(value))
    return Number(value.slice(0, -1)) > 100 ? [fieldError.invalid(field, value, 'must not be greater than 100%')] : [];
  return [
    fieldError.invalid(
      field,
      value,
      "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
    ),
  ];
}

export function validateWorkload(obj: KubeObject, old: KubeObject | undefined): FieldError[] {
  const errors = validateObjectMeta(obj, 'dns1123-subdomain');
  const spec = obj.spec ?? {};
  if (typeof spec.replicas === 'number' && spec.replicas < 0)
    errors.push(fieldError.invalid('spec.replicas', spec.replicas, 'must be greater than or equal to 0'));
  const selector = spec.selector;
  const requirements = selector ? labelSelectorRequirements(selector) : [];
  if (!selector) errors.push(fieldError.required('spec.selector'));
  else if (requirements.length === 0)
    errors.push(fieldError.invalid('spec.selector', selector, 'empty selector is invalid for deployment'));
  const labels = spec.template?.metadata?.labels;
  if (requirements.length > 0 && !matchesLabels(requirements, labels))
    errors.push(fieldError.invalid('spec.template.metadata.labels', labels ?? {}, '`selector` does not match template `labels`'));
  if (old && JSON.stringify(old.spec?.selector) !== JSON.stringify(selector))
    errors.push(fieldError.invalid('spec.selector', selector, 'field is immutable'));
  const podErrors = validatePod({metadata: {name: obj.metadata.name ?? 'x'}, spec: spec.template?.spec ?? {}});
  for (const error of podErrors) if (error.field.startsWith('spec.')) errors.push({...error, field: `spec.template.${error.field}`});
  const rolling = spec.strategy?.rollingUpdate;
  if (spec.strategy?.type === 'Recreate' && rolling)
    errors.push(fieldError.forbidden('spec.strategy.rollingUpdate', "may not be specified when strategy `type` is 'Recreate'"));
  if (rolling) {
    errors.push(...boundErrors('spec.strategy.rollingUpdate.maxSurge', rolling.maxSurge));
    errors.push(...boundErrors('spec.strategy.rollingUpdate.maxUnavailable', rolling.maxUnavailable));
    if (intOrPercent(rolling.maxSurge, 100, true) === 0 && intOrPercent(rolling.maxUnavailable, 100, false) === 0)
      errors.push(
        fieldError.invalid('spec.strategy.rollingUpdate.maxUnavailable', rolling.maxUnavailable, 'may not be 0 when `maxSurge` is 0'),
      );
  }
  return errors;
}
