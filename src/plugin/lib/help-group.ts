// Flags that a command's help shows under one heading (CONNECTION, OFFLINE): the heading is said
// once for the set rather than on each flag.

/** inHelpGroup: the flags, each shown under `helpGroup` in the help of the commands that take them. */
export function inHelpGroup<T extends Record<string, object>>(helpGroup: string, flags: T): T {
  return Object.fromEntries(Object.entries(flags).map(([name, flag]) => [name, {...flag, helpGroup}])) as T;
}
