// Checked reads of untrusted JSON values, and the Problem log that names object and field.
import type {Problem} from './types.ts';

export type JsonObject = Record<string, unknown>;

/** invalid marks a value that is present but of the wrong type or out of range. */
export const invalid: unique symbol = Symbol('invalid');
export type Invalid = typeof invalid;

export function isJsonObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** optionalString: undefined when absent (or null), invalid when not a string. */
export function optionalString(value: unknown): string | undefined | Invalid {
  if (value === undefined || value === null) return undefined;
  return typeof value === 'string' ? value : invalid;
}

export function optionalBoolean(value: unknown): boolean | undefined | Invalid {
  if (value === undefined || value === null) return undefined;
  return typeof value === 'boolean' ? value : invalid;
}

/** optionalInteger: a whole number within [min, max]; invalid otherwise. */
export function optionalInteger(value: unknown, min: number, max: number): number | undefined | Invalid {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) return invalid;
  return value;
}

/** optionalArray: undefined when absent, invalid when not an array. */
export function optionalArray(value: unknown): unknown[] | undefined | Invalid {
  if (value === undefined || value === null) return undefined;
  return Array.isArray(value) ? value : invalid;
}

/** stringMap keeps the string-valued entries of labels or annotations; anything else reads as empty. */
export function stringMap(value: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (!isJsonObject(value)) return out;
  for (const [key, entry] of Object.entries(value)) if (typeof entry === 'string') out[key] = entry;
  return out;
}

/** describe quotes a bad value for a message, briefly. */
export function describe(value: unknown): string {
  let text: string;
  try {
    text = typeof value === 'string' ? JSON.stringify(value) : (JSON.stringify(value) ?? String(value));
  } catch {
    text = String(value);
  }
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

/**
 * ObjectProblems records problems about one object. Messages read
 * "<subject>: <field>: <cause>; <consequence>", e.g.
 * "service default/web port http: spec.ports[1].nodePort: 70000 is not in 1-65535; nodePort ignored".
 */
export class ObjectProblems {
  readonly sink: Problem[];
  readonly kind: Problem['kind'];
  readonly name: string;
  readonly namespace: string | undefined;

  constructor(sink: Problem[], kind: Problem['kind'], name: string, namespace?: string) {
    this.sink = sink;
    this.kind = kind;
    this.name = name;
    this.namespace = namespace;
  }

  get subject(): string {
    const kindWord = this.kind === 'Config' ? 'proxy config' : this.kind.toLowerCase();
    if (this.kind === 'Config') return kindWord;
    return this.namespace === undefined ? `${kindWord} ${this.name}` : `${kindWord} ${this.namespace}/${this.name}`;
  }

  add(field: string, cause: string, consequence: string, subjectDetail = ''): void {
    const where = field === '' ? '' : `${field}: `;
    const problem: Problem = {
      kind: this.kind,
      name: this.name,
      field,
      message: `${this.subject}${subjectDetail}: ${where}${cause}; ${consequence}`,
    };
    if (this.namespace !== undefined) problem.namespace = this.namespace;
    this.sink.push(problem);
  }
}

/** listOrNone: the list `value` holds, or none when it is absent, or none and a Problem at `field` when it is no list. */
export function listOrNone(value: unknown, field: string, consequence: string, problems: ObjectProblems): unknown[] {
  const list = optionalArray(value);
  if (list !== invalid) return list ?? [];
  problems.add(field, 'not a list', consequence);
  return [];
}

/** readPortEntry: an entry of a ports list, an object with an optional name; undefined (with a Problem) when not. */
export function readPortEntry(
  value: unknown,
  field: string,
  problems: ObjectProblems,
): {entry: JsonObject; name: string | undefined} | undefined {
  if (!isJsonObject(value)) {
    problems.add(field, 'not an object', 'port skipped');
    return undefined;
  }
  const name = optionalString(value.name);
  if (name === invalid) {
    problems.add(`${field}.name`, `${describe(value.name)} is not a port name`, 'port skipped');
    return undefined;
  }
  return {entry: value, name};
}

type HeaderKind = 'Service' | 'EndpointSlice' | 'Node';

/** ObjectHeader: an object read far enough to be named: its metadata, name and namespace. */
export interface ObjectHeader<Kind extends HeaderKind> {
  object: JsonObject;
  metadata: JsonObject;
  name: string;
  /** "default" when a namespaced object leaves it out (kubectl would put it there); none for a Node. */
  namespace: Kind extends 'Node' ? undefined : string;
  /** Where the rest of the object's problems go, under its name. */
  problems: ObjectProblems;
}

/**
 * readObjectHeader: the object's name (and, but for a Node, its namespace), or undefined with a
 * Problem when `raw` is no object (consequence `notObject`) or has no usable name or namespace
 * (consequence `unnamed`).
 */
export function readObjectHeader<Kind extends HeaderKind>(
  raw: unknown,
  kind: Kind,
  sink: Problem[],
  consequences: {notObject: string; unnamed: string},
): ObjectHeader<Kind> | undefined {
  if (!isJsonObject(raw)) {
    new ObjectProblems(sink, kind, '(unnamed)').add(
      '',
      `object is ${describe(raw)}, not ${/^[AEIOU]/.test(kind) ? 'an' : 'a'} ${kind}`,
      consequences.notObject,
    );
    return undefined;
  }
  const metadata = isJsonObject(raw.metadata) ? raw.metadata : {};
  const name = optionalString(metadata.name);
  const namespaceValue = kind === 'Node' ? undefined : optionalString(metadata.namespace);
  if (name === undefined || name === invalid || name === '') {
    const problems = new ObjectProblems(sink, kind, '(unnamed)', namespaceValue === invalid ? undefined : namespaceValue);
    problems.add('metadata.name', name === invalid ? `${describe(metadata.name)} is not a name` : 'missing', consequences.unnamed);
    return undefined;
  }
  if (namespaceValue === invalid) {
    new ObjectProblems(sink, kind, name).add(
      'metadata.namespace',
      `${describe(metadata.namespace)} is not a namespace`,
      consequences.unnamed,
    );
    return undefined;
  }
  const namespace = kind === 'Node' ? undefined : namespaceValue === undefined || namespaceValue === '' ? 'default' : namespaceValue;
  const header = {object: raw, metadata, name, namespace, problems: new ObjectProblems(sink, kind, name, namespace)};
  return header as ObjectHeader<Kind>;
}
