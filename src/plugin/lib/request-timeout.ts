// --request-timeout as kubectl reads it: "0" waits forever; a bare number is seconds; otherwise a
// number with a unit (ms, s, m, h), several may follow each other ("1m30s").
import {PluginError} from './plugin-error.ts';

const unitMs: Record<string, number> = {ms: 1, s: 1000, m: 60_000, h: 3_600_000};

/** Milliseconds, or 0 for no limit. */
export function parseRequestTimeout(text: string): number {
  const value = text.trim();
  if (/^\d+$/.test(value)) return Number(value) * 1000;
  const parts = [...value.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)];
  if (value === '' || parts.map((part) => part[0]).join('') !== value) {
    throw new PluginError(`--request-timeout ${JSON.stringify(text)}: must be a duration like 30s, 1m or 500ms, or 0 for no limit`);
  }
  return parts.reduce((total, part) => total + Number(part[1]) * unitMs[part[2]], 0);
}

export function describeTimeout(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}
