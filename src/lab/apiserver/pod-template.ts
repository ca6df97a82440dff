// Pod templates as the Deployment controller compares and names them: equal when they say the same
// once Go's zero values (null, {}, []) and the pod-template-hash label are left out, and named by a
// hash of that form in kube-controller-manager's alphabet.
import {createHash} from 'node:crypto';

export const templateHashLabel = 'pod-template-hash';
const safeAlphabet = 'bcdfghjklmnpqrstvwxz2456789';

function withoutZeroValues(value: unknown): unknown {
  if (Array.isArray(value)) {
    const items = value.map(withoutZeroValues);
    return items.length > 0 ? items : undefined;
  }
  if (value && typeof value === 'object') {
    const entries = Object.keys(value)
      .sort()
      .map((key) => [key, withoutZeroValues((value as Record<string, unknown>)[key])] as const)
      .filter(([, inner]) => inner !== undefined);
    return entries.length > 0 ? Object.fromEntries(entries) : undefined;
  }
  return value === null ? undefined : value;
}

/** comparableTemplate: the template's canonical text, without zero values and the hash label. */
export function comparableTemplate(template: any): string {
  const copy = structuredClone(template ?? {});
  if (copy.metadata?.labels) delete copy.metadata.labels[templateHashLabel];
  return JSON.stringify(withoutZeroValues(copy) ?? {});
}

export function sameTemplate(a: any, b: any): boolean {
  return comparableTemplate(a) === comparableTemplate(b);
}

/** templateHash: ten or fewer characters of [bcdfghjklmnpqrstvwxz2456789], as a ReplicaSet name's suffix. */
export function templateHash(template: any): string {
  const number = createHash('sha256').update(comparableTemplate(template)).digest().readUInt32BE(0);
  return [...String(number)].map((digit) => safeAlphabet[digit.charCodeAt(0) % safeAlphabet.length]).join('');
}
