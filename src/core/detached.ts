// detached: the same characters in a string of their own. V8 keeps a slice of a long string (a
// line of a dump or of a rendered script) as a view into it, so a name or rule sliced from it and
// kept would keep the whole text alive: tens of MB at 10,000 services.
export function detached(text: string): string {
  return Buffer.from(text, 'utf8').toString('utf8');
}
