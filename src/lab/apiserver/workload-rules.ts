// apps/v1 Deployments, ReplicaSets, DaemonSets and ControllerRevisions: the defaults and the
// validation kube-apiserver applies (selector required, immutable and matching the template's labels;
// replicas; rolling-update bounds; a DaemonSet's restartPolicy and update strategy).
import {fieldError, type FieldError} from './api-error.ts';
import {validateObjectMeta} from './name-rules.ts';
import type {KubeObject} from './object-log.ts';
import {defaultPod, validatePod} from './pod-rules.ts';
import {labelSelectorRequirements, matchesLabels} from './selectors.ts';

/**
 * The DaemonSet's template generation: kube-apiserver keeps it in this annotation of apps/v1
 * DaemonSets (1 at creation, raised with each template change), and the controller labels daemon
 * pods with it (pod-template-generation).
 */
export const templateGenerationAnnotation = 'deprecated.daemonset.template.generation';

export function defaultWorkload(obj: KubeObject): void {
  if (obj.kind === 'DaemonSet') return defaultDaemonSet(obj);
  if (obj.kind === 'ControllerRevision') return;
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
  defaultTemplate(spec);
  if (obj.status === undefined) obj.status = {};
}

/** A pod template gets the defaults of the pod it describes. */
function defaultTemplate(spec: Record<string, any>): void {
  spec.template ??= {};
  spec.template.metadata ??= {};
  spec.template.spec ??= {};
  const template: KubeObject = {metadata: {name: 'template'}, spec: spec.template.spec};
  defaultPod(template);
}

/** A new DaemonSet's status, as Go writes an empty DaemonSetStatus: these four counts have no omitempty. */
export function emptyDaemonSetStatus(): Record<string, number> {
  return {currentNumberScheduled: 0, numberMisscheduled: 0, desiredNumberScheduled: 0, numberReady: 0};
}

/** kube's DaemonSet defaults: RollingUpdate one node at a time, no surge; ten revisions kept. No replicas. */
function defaultDaemonSet(obj: KubeObject): void {
  const spec = (obj.spec ??= {});
  spec.revisionHistoryLimit ??= 10;
  spec.updateStrategy ??= {};
  spec.updateStrategy.type ||= 'RollingUpdate';
  if (spec.updateStrategy.type === 'RollingUpdate') {
    spec.updateStrategy.rollingUpdate ??= {};
    spec.updateStrategy.rollingUpdate.maxUnavailable ??= 1;
    spec.updateStrategy.rollingUpdate.maxSurge ??= 0;
  }
  defaultTemplate(spec);
  if (obj.status === undefined) obj.status = emptyDaemonSetStatus();
}

/**
 * The template generation of a DaemonSet write: at creation the one given, at least 1; on update
 * that of the stored object, plus one when the template changes (whatever the writer put in the
 * annotation, as kube-apiserver ignores it).
 */
export function setTemplateGeneration(next: KubeObject, old: KubeObject | undefined): void {
  const generationOf = (obj: KubeObject) =>
    Math.max(0, Math.trunc(Number(obj.metadata.annotations?.[templateGenerationAnnotation] ?? 0)) || 0);
  let generation = Math.max(1, generationOf(next));
  if (old) {
    generation = generationOf(old);
    if (canonical(next.spec?.template) !== canonical(old.spec?.template)) generation++;
  }
  next.metadata.annotations = {...(next.metadata.annotations ?? {}), [templateGenerationAnnotation]: String(generation)};
}

function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, inner) =>
    inner && typeof inner === 'object' && !Array.isArray(inner)
      ? Object.fromEntries(
          Object.keys(inner)
            .sort()
            .map((key) => [key, inner[key]]),
        )
      : inner,
  );
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
  if (obj.kind === 'DaemonSet') return validateDaemonSet(obj, old);
  if (obj.kind === 'ControllerRevision') return validateControllerRevision(obj, old);
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
  errors.push(...templateErrors(obj));
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

/** The errors of the pod a template describes, named under spec.template. */
function templateErrors(obj: KubeObject): FieldError[] {
  const podErrors = validatePod({metadata: {name: obj.metadata.name ?? 'x'}, spec: obj.spec?.template?.spec ?? {}});
  return podErrors.filter((error) => error.field.startsWith('spec.')).map((error) => ({...error, field: `spec.template.${error.field}`}));
}

function nonNegative(field: string, value: unknown): FieldError[] {
  return typeof value === 'number' && value < 0 ? [fieldError.invalid(field, value, 'must be greater than or equal to 0')] : [];
}

/** A rolling-update bound's number as kube reads it for the "which one is set" rule: "5%" is 5, a bad string 0. */
function boundValue(value: unknown): number {
  if (typeof value === 'number') return value;
  if (typeof value === 'string' && /^\d+%?$/.test(value)) return Number(value.replace('%', ''));
  return 0;
}

/**
 * kube-apiserver's DaemonSet validation. Unlike a Deployment's, a missing selector is not "Required":
 * it selects nothing, so the template's labels do not match it.
 */
export function validateDaemonSet(obj: KubeObject, old: KubeObject | undefined): FieldError[] {
  const errors = validateObjectMeta(obj, 'dns1123-subdomain');
  const spec = obj.spec ?? {};
  const selector = spec.selector;
  const requirements = selector ? labelSelectorRequirements(selector) : [];
  const labels = spec.template?.metadata?.labels;
  if (!selector || (requirements.length > 0 && !matchesLabels(requirements, labels)))
    errors.push(fieldError.invalid('spec.template.metadata.labels', labels ?? {}, '`selector` does not match template `labels`'));
  if (selector && requirements.length === 0)
    errors.push(fieldError.invalid('spec.selector', selector, 'empty selector is invalid for daemonset'));
  errors.push(...templateErrors(obj));
  const restartPolicy = spec.template?.spec?.restartPolicy;
  if (restartPolicy !== 'Always') errors.push(fieldError.notSupported('spec.template.spec.restartPolicy', restartPolicy ?? '', ['Always']));
  if (spec.template?.spec?.activeDeadlineSeconds !== undefined)
    errors.push(fieldError.forbidden('spec.template.spec.activeDeadlineSeconds', 'activeDeadlineSeconds in DaemonSet is not Supported'));
  errors.push(...nonNegative('spec.minReadySeconds', spec.minReadySeconds));
  errors.push(...updateStrategyErrors(spec.updateStrategy ?? {}));
  errors.push(...nonNegative('spec.revisionHistoryLimit', spec.revisionHistoryLimit));
  if (old && JSON.stringify(old.spec?.selector) !== JSON.stringify(selector))
    errors.push(fieldError.invalid('spec.selector', selector ?? null, 'field is immutable'));
  return errors;
}

/** RollingUpdate needs exactly one of maxUnavailable and maxSurge; OnDelete takes no bounds (and ignores any). */
function updateStrategyErrors(strategy: Record<string, any>): FieldError[] {
  const field = 'spec.updateStrategy';
  if (strategy.type === 'OnDelete') return [];
  if (strategy.type !== 'RollingUpdate') return [fieldError.notSupported(field, strategy, ['RollingUpdate', 'OnDelete'])];
  const rolling = strategy.rollingUpdate;
  if (!rolling) return [fieldError.required(`${field}.rollingUpdate`)];
  const errors = [
    ...boundErrors(`${field}.rollingUpdate.maxUnavailable`, rolling.maxUnavailable),
    ...boundErrors(`${field}.rollingUpdate.maxSurge`, rolling.maxSurge),
  ];
  const hasUnavailable = boundValue(rolling.maxUnavailable) !== 0;
  const hasSurge = boundValue(rolling.maxSurge) !== 0;
  if (hasUnavailable && hasSurge)
    errors.push(fieldError.invalid(`${field}.rollingUpdate.maxSurge`, rolling.maxSurge, 'may not be set when maxUnavailable is non-zero'));
  else if (!hasUnavailable && !hasSurge)
    errors.push(fieldError.required(`${field}.rollingUpdate.maxUnavailable`, 'cannot be 0 when maxSurge is 0'));
  return errors;
}

/** A ControllerRevision holds data (required, immutable) and a non-negative revision number. */
function validateControllerRevision(obj: KubeObject, old: KubeObject | undefined): FieldError[] {
  const errors = validateObjectMeta(obj, 'dns1123-subdomain');
  if (obj.data === undefined || obj.data === null) errors.push(fieldError.required('data', 'data is mandatory'));
  errors.push(...nonNegative('revision', obj.revision));
  if (old && canonical(old.data) !== canonical(obj.data)) errors.push(fieldError.invalid('data', obj.data ?? null, 'field is immutable'));
  return errors;
}
