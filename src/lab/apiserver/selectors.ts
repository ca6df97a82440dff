// Label and field selectors: parsing of the query-string forms and matching against objects.
import {badRequest} from './api-error.ts';

export type LabelRequirement = {key: string; op: 'in' | 'notin'; values: string[]} | {key: string; op: 'exists' | '!exists'};

export type Labels = Record<string, string> | undefined;

/** Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`; "=" and "==" mean "in" with one value, "!=" means "notin". */
export function parseLabelSelector(text: string): LabelRequirement[] {
  const requirements: LabelRequirement[] = [];
  for (const term of splitTerms(text)) {
    const t = term.trim();
    if (!t) continue;
    let m: RegExpMatchArray | null;
    if ((m = t.match(/^([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)$/))) {
      const values = m[3]
        .split(',')
        .map((v) => v.trim())
        .filter((v) => v !== '');
      requirements.push({key: checkKey(m[1]), op: m[2] as 'in' | 'notin', values: values.map(checkValue)});
    } else if ((m = t.match(/^([^\s!=()]+)\s*(==|!=|=)\s*([^\s!=()]*)$/))) {
      requirements.push({key: checkKey(m[1]), op: m[2] === '!=' ? 'notin' : 'in', values: [checkValue(m[3])]});
    } else if ((m = t.match(/^!\s*([^\s!=()]+)$/))) {
      requirements.push({key: checkKey(m[1]), op: '!exists'});
    } else if ((m = t.match(/^([^\s!=()]+)$/))) {
      requirements.push({key: checkKey(m[1]), op: 'exists'});
    } else {
      throw badRequest(`unable to parse requirement: found '${t}', expected: in, notin, =, ==, !=, gt, lt`);
    }
  }
  return requirements;
}

function splitTerms(text: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let current = '';
  for (const ch of text) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      terms.push(current);
      current = '';
    } else current += ch;
  }
  terms.push(current);
  return terms;
}

const keyPattern = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const valuePattern = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

function checkKey(key: string): string {
  if (!keyPattern.test(key)) throw badRequest(`unable to parse requirement: invalid label key "${key}"`);
  return key;
}

function checkValue(value: string): string {
  if (value.length > 63 || !valuePattern.test(value)) throw badRequest(`unable to parse requirement: invalid label value: "${value}"`);
  return value;
}

export function matchesLabels(requirements: LabelRequirement[], labels: Labels): boolean {
  for (const r of requirements) {
    const has = labels !== undefined && Object.hasOwn(labels, r.key);
    switch (r.op) {
      case 'exists':
        if (!has) return false;
        break;
      case '!exists':
        if (has) return false;
        break;
      case 'in':
        if (!has || !r.values.includes(labels![r.key])) return false;
        break;
      case 'notin':
        if (has && r.values.includes(labels![r.key])) return false;
        break;
    }
  }
  return true;
}

/** A Service-style selector map: every pair must match; an empty map matches nothing here (callers decide). */
export function matchesSelectorMap(selector: Record<string, string>, labels: Labels): boolean {
  for (const [k, v] of Object.entries(selector)) {
    if (!labels || labels[k] !== v) return false;
  }
  return true;
}

export interface FieldRequirement {
  field: string;
  value: string;
  negate: boolean;
}

/** Field paths each resource can be selected by, besides metadata.name and metadata.namespace. */
const selectableFields: Record<string, string[]> = {
  pods: [
    'spec.nodeName',
    'spec.restartPolicy',
    'spec.schedulerName',
    'spec.serviceAccountName',
    'spec.hostNetwork',
    'status.phase',
    'status.podIP',
    'status.nominatedNodeName',
  ],
  events: [
    'involvedObject.kind',
    'involvedObject.namespace',
    'involvedObject.name',
    'involvedObject.uid',
    'involvedObject.apiVersion',
    'involvedObject.resourceVersion',
    'involvedObject.fieldPath',
    'reason',
    'reportingComponent',
    'source',
    'type',
  ],
  nodes: ['spec.unschedulable'],
  namespaces: ['status.phase'],
  services: ['spec.clusterIP', 'spec.type'],
};

export function parseFieldSelector(text: string, resource: string): FieldRequirement[] {
  const requirements: FieldRequirement[] = [];
  const allowed = new Set(['metadata.name', 'metadata.namespace', ...(selectableFields[resource] ?? [])]);
  for (const term of text.split(',')) {
    const t = term.trim();
    if (!t) continue;
    const m = t.match(/^([^=!]+)(==|!=|=)(.*)$/);
    if (!m) throw badRequest(`invalid selector: '${text}'; can't understand '${t}'`);
    const field = m[1].trim();
    if (!allowed.has(field)) throw badRequest(`field label not supported: ${field}`);
    requirements.push({field, value: m[3].trim(), negate: m[2] === '!='});
  }
  return requirements;
}

function fieldValue(obj: Record<string, any>, field: string): string {
  if (field === 'source') return obj.source?.component ?? '';
  let cur: any = obj;
  for (const part of field.split('.')) cur = cur?.[part];
  if (cur === undefined || cur === null) return field === 'spec.hostNetwork' || field === 'spec.unschedulable' ? 'false' : '';
  return String(cur);
}

export function matchesFields(requirements: FieldRequirement[], obj: Record<string, any>): boolean {
  for (const r of requirements) {
    const equal = fieldValue(obj, r.field) === r.value;
    if (equal === r.negate) return false;
  }
  return true;
}

/** A metav1.LabelSelector ({matchLabels, matchExpressions}) as requirements. */
export function labelSelectorRequirements(selector: {matchLabels?: Record<string, string>; matchExpressions?: any[]}): LabelRequirement[] {
  const requirements: LabelRequirement[] = Object.entries(selector.matchLabels ?? {}).map(([key, value]) => ({
    key,
    op: 'in' as const,
    values: [value],
  }));
  for (const expression of selector.matchExpressions ?? []) {
    const op = String(expression.operator ?? '').toLowerCase();
    if (op === 'in' || op === 'notin') requirements.push({key: expression.key, op, values: expression.values ?? []});
    else if (op === 'exists') requirements.push({key: expression.key, op: 'exists'});
    else if (op === 'doesnotexist') requirements.push({key: expression.key, op: '!exists'});
  }
  return requirements;
}

/** matchesLabelSelector: an empty selector matches nothing, as controllers read it. */
export function matchesLabelSelector(selector: any, labels: Labels): boolean {
  const requirements = labelSelectorRequirements(selector ?? {});
  return requirements.length > 0 && matchesLabels(requirements, labels);
}

/** The query-string form of a LabelSelector ("app=web,tier in (a,b)"), as a Scale's status.selector. */
export function labelSelectorText(selector: any): string {
  return labelSelectorRequirements(selector ?? {})
    .map((r) => {
      if (r.op === 'exists') return r.key;
      if (r.op === '!exists') return `!${r.key}`;
      const {values} = r as {values: string[]};
      return r.op === 'in' && values.length === 1 ? `${r.key}=${values[0]}` : `${r.key} ${r.op} (${values.join(',')})`;
    })
    .join(',');
}
