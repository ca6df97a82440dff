// A small validator for the JSON shapes of the agent protocol: each schema checks a value and names
// the first field that does not fit ("params.target.port: must be an integer from 1 to 65535, got 70000").
import {isIP} from 'node:net';

/** Schema checks that a JSON value has the shape of T. */
export interface Schema<T> {
  /** Returns null when `value` fits, else "<path>: <what is wrong>". */
  readonly check: (value: unknown, path: string) => string | null;
  /** Set by optional(): the field may be absent from its object. */
  readonly optional?: boolean;
  /** Carries T for type inference only; never set. */
  readonly __type?: T;
}

export type Infer<S> = S extends Schema<infer T> ? T : never;

/** Short rendering of a value for error messages; large values are cut. */
function shown(value: unknown): string {
  if (value === undefined) return 'nothing';
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `a ${typeof value}`;
}

export interface StringRules {
  minLength?: number;
  maxLength?: number;
  pattern?: RegExp;
  /** Says in words what `pattern` wants, for the error message. */
  patternHint?: string;
}

export function string(rules: StringRules = {}): Schema<string> {
  const {minLength = 0, maxLength = 4096, pattern, patternHint} = rules;
  return {
    check: (value, path) => {
      if (typeof value !== 'string') return `${path}: must be a string, got ${kindOf(value)}`;
      if (value.length < minLength)
        return minLength === 1 ? `${path}: must not be empty` : `${path}: must be at least ${minLength} characters long`;
      if (value.length > maxLength) return `${path}: must be at most ${maxLength} characters long, got ${value.length}`;
      if (pattern && !pattern.test(value)) return `${path}: must be ${patternHint ?? `like ${pattern}`}, got ${shown(value)}`;
      return null;
    },
  };
}

/** An IPv4 or IPv6 address. */
export function ipAddress(): Schema<string> {
  return {
    check: (value, path) => {
      if (typeof value !== 'string') return `${path}: must be an IP address string, got ${kindOf(value)}`;
      if (isIP(value) === 0) return `${path}: must be an IPv4 or IPv6 address, got ${shown(value)}`;
      return null;
    },
  };
}

/** An ISO 8601 timestamp as Date.toISOString() writes it. */
export function timestamp(): Schema<string> {
  return {
    check: (value, path) => {
      if (typeof value !== 'string' || Number.isNaN(Date.parse(value))) return `${path}: must be an ISO 8601 time, got ${shown(value)}`;
      return null;
    },
  };
}

export function oneOf<const V extends readonly string[]>(values: V): Schema<V[number]> {
  return {
    check: (value, path) => {
      if (typeof value === 'string' && values.includes(value)) return null;
      return `${path}: must be one of ${values.map((v) => `"${v}"`).join(', ')}, got ${shown(value)}`;
    },
  };
}

export function integer(range: {min?: number; max?: number} = {}): Schema<number> {
  const {min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER} = range;
  return {
    check: (value, path) => {
      if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
        return `${path}: must be an integer from ${min} to ${max}, got ${shown(value)}`;
      }
      return null;
    },
  };
}

export function number(range: {min?: number; max?: number} = {}): Schema<number> {
  const {min = -Number.MAX_VALUE, max = Number.MAX_VALUE} = range;
  return {
    check: (value, path) => {
      if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
        return `${path}: must be a number from ${min} to ${max}, got ${shown(value)}`;
      }
      return null;
    },
  };
}

export function boolean(): Schema<boolean> {
  return {check: (value, path) => (typeof value === 'boolean' ? null : `${path}: must be true or false, got ${shown(value)}`)};
}

export function array<T>(item: Schema<T>, rules: {maxItems?: number} = {}): Schema<T[]> {
  const {maxItems = 100_000} = rules;
  return {
    check: (value, path) => {
      if (!Array.isArray(value)) return `${path}: must be an array, got ${kindOf(value)}`;
      if (value.length > maxItems) return `${path}: must have at most ${maxItems} items, got ${value.length}`;
      for (let i = 0; i < value.length; i++) {
        const problem = item.check(value[i], `${path}[${i}]`);
        if (problem) return problem;
      }
      return null;
    },
  };
}

export function optional<T>(schema: Schema<T>): Schema<T> & {readonly optional: true} {
  return {check: schema.check, optional: true};
}

export function nullable<T>(schema: Schema<T>): Schema<T | null> {
  return {check: (value, path) => (value === null ? null : schema.check(value, path))};
}

type Shape = Record<string, Schema<unknown>>;
type OptionalKeys<P extends Shape> = {[K in keyof P]: P[K] extends {readonly optional: true} ? K : never}[keyof P];
type Flatten<T> = {[K in keyof T]: T[K]} & {};
export type ObjectOf<P extends Shape> = Flatten<
  {[K in Exclude<keyof P, OptionalKeys<P>>]: Infer<P[K]>} & {[K in OptionalKeys<P>]?: Infer<P[K]>}
>;

export interface ObjectRules {
  /**
   * 'reject' for what a peer asks (a misspelt field is an error, not a silent default); 'allow' for
   * answers, so that an agent may add fields within one protocol version.
   */
  unknownFields: 'reject' | 'allow';
}

export function object<P extends Shape>(shape: P, rules: ObjectRules): Schema<ObjectOf<P>> {
  const keys = Object.keys(shape);
  return {
    check: (value, path) => {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) return `${path}: must be an object, got ${kindOf(value)}`;
      const record = value as Record<string, unknown>;
      for (const key of keys) {
        const field = shape[key];
        const present = Object.hasOwn(record, key) && record[key] !== undefined;
        if (!present) {
          if (field.optional) continue;
          return `${path}.${key}: is required`;
        }
        const problem = field.check(record[key], `${path}.${key}`);
        if (problem) return problem;
      }
      if (rules.unknownFields === 'reject') {
        for (const key of Object.keys(record)) {
          if (!Object.hasOwn(shape, key)) return `${path}.${key}: unknown field (known: ${keys.join(', ') || 'none'})`;
        }
      }
      return null;
    },
  };
}

/** The field a problem names: "params.target.port: ..." -> "target.port" (relative to `root`). */
export function problemField(problem: string, root: string): string {
  const path = problem.slice(0, problem.indexOf(':'));
  if (path === root) return '';
  return path.startsWith(`${root}.`) ? path.slice(root.length + 1) : path;
}
