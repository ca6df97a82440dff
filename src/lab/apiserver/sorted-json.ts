// JSON as Go's encoding/json writes a map: keys in sorted order. Objects compare equal by their
// text only in this form, and kubectl's last-applied-configuration and a ControllerRevision's data
// are written in it.

/** withSortedKeys: a copy of value with every object's keys in sorted order. */
export function withSortedKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withSortedKeys);
  if (!value || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((key) => [key, withSortedKeys((value as Record<string, unknown>)[key])]),
  );
}

/** canonicalJson: the JSON text of value with sorted keys. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(withSortedKeys(value));
}
