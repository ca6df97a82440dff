// Pods: the defaults and the basic validation kube-apiserver applies (names, containers, ports, updates).
import {fieldError, type FieldError} from './api-error.ts';
import type {KubeObject} from './object-log.ts';
import {dns1123LabelErrors, portNameErrors, portNumberErrors, validateObjectMeta} from './name-rules.ts';

const protocols = ['SCTP', 'TCP', 'UDP'];

export function defaultPod(pod: KubeObject): void {
  const spec = (pod.spec ??= {});
  spec.restartPolicy ??= 'Always';
  spec.dnsPolicy ??= 'ClusterFirst';
  spec.terminationGracePeriodSeconds ??= 30;
  spec.schedulerName ??= 'default-scheduler';
  spec.serviceAccountName ??= 'default';
  for (const list of [spec.containers, spec.initContainers]) {
    if (!Array.isArray(list)) continue;
    for (const c of list) {
      if (!c || typeof c !== 'object') continue;
      c.terminationMessagePath ??= '/dev/termination-log';
      c.terminationMessagePolicy ??= 'File';
      c.imagePullPolicy ??= 'IfNotPresent';
      if (Array.isArray(c.ports)) for (const p of c.ports) if (p && typeof p === 'object') p.protocol ??= 'TCP';
    }
  }
}

export function validatePod(pod: KubeObject): FieldError[] {
  const errors = validateObjectMeta(pod, 'dns1123-subdomain');
  const spec = pod.spec ?? {};
  const containers: any[] = Array.isArray(spec.containers) ? spec.containers : [];
  if (containers.length === 0) errors.push(fieldError.required('spec.containers'));
  const names = new Set<string>();
  const check = (list: any[], field: string) =>
    list.forEach((c, i) => {
      const path = `${field}[${i}]`;
      if (!c?.name) errors.push(fieldError.required(`${path}.name`));
      else {
        for (const msg of dns1123LabelErrors(c.name)) errors.push(fieldError.invalid(`${path}.name`, c.name, msg));
        if (names.has(c.name)) errors.push(fieldError.duplicate(`${path}.name`, c.name));
        names.add(c.name);
      }
      if (!c?.image) errors.push(fieldError.required(`${path}.image`));
      const portNames = new Set<string>();
      (Array.isArray(c?.ports) ? c.ports : []).forEach((p: any, j: number) => {
        const pp = `${path}.ports[${j}]`;
        for (const msg of portNumberErrors(p?.containerPort))
          errors.push(fieldError.invalid(`${pp}.containerPort`, p?.containerPort ?? 0, msg));
        if (p?.hostPort !== undefined && p.hostPort !== 0)
          for (const msg of portNumberErrors(p.hostPort)) errors.push(fieldError.invalid(`${pp}.hostPort`, p.hostPort, msg));
        if (p?.protocol && !protocols.includes(p.protocol)) errors.push(fieldError.notSupported(`${pp}.protocol`, p.protocol, protocols));
        if (p?.name) {
          for (const msg of portNameErrors(p.name)) errors.push(fieldError.invalid(`${pp}.name`, p.name, msg));
          if (portNames.has(p.name)) errors.push(fieldError.duplicate(`${pp}.name`, p.name));
          portNames.add(p.name);
        }
      });
    });
  check(containers, 'spec.containers');
  if (Array.isArray(spec.initContainers)) check(spec.initContainers, 'spec.initContainers');
  return errors;
}

const mutableSpecMessage =
  'pod updates may not change fields other than ' +
  '`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` ' +
  '(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set ' +
  'to 1 if it was previously negative)';

/** A pod's spec is fixed after creation except images, deadlines, added tolerations and a first nodeName. */
export function validatePodUpdate(pod: KubeObject, old: KubeObject): FieldError[] {
  const errors = validatePod(pod);
  const comparable = (spec: any) => {
    const copy = structuredClone(spec ?? {});
    for (const list of [copy.containers, copy.initContainers]) if (Array.isArray(list)) for (const c of list) if (c) delete c.image;
    delete copy.activeDeadlineSeconds;
    delete copy.tolerations;
    return JSON.stringify(copy);
  };
  const next = structuredClone(pod.spec ?? {});
  if (!old.spec?.nodeName && next.nodeName) delete next.nodeName;
  const before = structuredClone(old.spec ?? {});
  delete before.nodeName;
  if (next.nodeName === undefined) delete next.nodeName;
  if (
    comparable({...next, nodeName: undefined}) !== comparable({...before, nodeName: undefined}) ||
    (old.spec?.nodeName && pod.spec?.nodeName !== old.spec.nodeName)
  ) {
    errors.push(fieldError.forbidden('spec', mutableSpecMessage));
  }
  return errors;
}
