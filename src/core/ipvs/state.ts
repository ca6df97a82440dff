// The state ipvs mode keeps in the kernel: virtual and real servers, ipsets, addresses bound to
// kube-ipvs0 and the small iptables layer; how it is written for ipvsadm-restore / ipset restore and
// read back from `ipvsadm -Sn`, `ipset save` and `ip -j addr show kube-ipvs0`.
import type {IPFamily, Protocol} from '../model/types.ts';
import {joinHostPort, parseIP} from '../model/ip.ts';

/** The dummy device every service address is bound to, so the node accepts packets for it. */
export const dummyDevice = 'kube-ipvs0';

export interface IpvsRealServer {
  address: string;
  port: number;
  /** 0 while a removed endpoint's connections drain. */
  weight: number;
}

export interface IpvsVirtualServer {
  address: string;
  port: number;
  protocol: Protocol;
  scheduler: string;
  /** Persistence timeout in seconds (sessionAffinity ClientIP); undefined without affinity. */
  persistenceTimeout?: number;
  realServers: IpvsRealServer[];
  /** "ns/name:port" of the service port the server belongs to; '' when read from the kernel. */
  servicePort: string;
}

export interface Ipset {
  name: string;
  /** hash:ip,port, hash:ip,port,ip, hash:ip,port,net, bitmap:port, hash:ip. */
  type: string;
  /** Sorted entries in `ipset save` spelling, e.g. "10.96.0.10,tcp:53". */
  entries: string[];
}

export interface IpvsState {
  family: IPFamily;
  /** Sorted by key (virtualServerKey). */
  virtualServers: IpvsVirtualServer[];
  /** Sorted by name. */
  sets: Ipset[];
  /** Sorted addresses bound to kube-ipvs0. */
  boundAddresses: string[];
  /** The iptables layer, iptables-restore text (nat and filter tables). */
  iptables: string;
}

/**
 * A virtual server object, spelled as one literal of either shape: a property added after the
 * literal (a spread of the optional persistence) is kept outside the object, which costs a
 * node's hundred thousand servers megabytes.
 */
export function virtualServer(
  address: string,
  port: number,
  protocol: Protocol,
  scheduler: string,
  persistenceTimeout: number | string | undefined,
  servicePort: string,
  realServers: IpvsRealServer[] = [],
): IpvsVirtualServer {
  return persistenceTimeout === undefined
    ? {address, port, protocol, scheduler, realServers, servicePort}
    : {address, port, protocol, scheduler, persistenceTimeout: Number(persistenceTimeout), realServers, servicePort};
}

/** How ipvsadm names a virtual server's protocol: -t 10.96.0.10:80. */
export const protocolFlags: Record<Protocol, string> = {TCP: '-t', UDP: '-u', SCTP: '--sctp-service'};

/** The protocol an ipvsadm service flag names ("-t": TCP); undefined for any other word. */
export const flagProtocol = (flag: string): Protocol | undefined =>
  (Object.keys(protocolFlags) as Protocol[]).find((protocol) => protocolFlags[protocol] === flag);

/** virtualServerKey names a virtual server the way ipvsadm lists it: "TCP 10.96.0.10:80". */
export function virtualServerKey(server: Pick<IpvsVirtualServer, 'protocol' | 'address' | 'port'>): string {
  return `${server.protocol} ${joinHostPort(server.address, server.port)}`;
}

/** One server's lines as `ipvsadm -R` reads them: its "-A" line, then a "-a" line per real server. */
function serverRestoreLines(server: IpvsVirtualServer): string[] {
  const service = `${protocolFlags[server.protocol]} ${joinHostPort(server.address, server.port)}`;
  const lines = [
    `-A ${service} -s ${server.scheduler}${server.persistenceTimeout !== undefined ? ` -p ${server.persistenceTimeout}` : ''}`,
  ];
  for (const real of server.realServers) lines.push(`-a ${service} -r ${joinHostPort(real.address, real.port)} -m -w ${real.weight}`);
  return lines;
}

/**
 * formatIpvsadmRestore writes the virtual and real servers as `ipvsadm -R` reads them (and
 * `ipvsadm -Sn` prints them). Debian's ipvsadm-restore runs `ipvsadm -C` first: a full load.
 */
export function formatIpvsadmRestore(servers: IpvsVirtualServer[]): string {
  const lines = servers.flatMap(serverRestoreLines);
  return lines.length ? `${lines.join('\n')}\n` : '';
}

/**
 * Each server's lines as one text (without the last newline), once per server object: the state's
 * text and the drift explanations' searches read them again and again, and a reading's untouched
 * servers are the same objects. A server read from `ipvsadm -Sn` that ipvsadm spelled the same
 * way keeps the slice of the output it was read from (spelledAsRead), which its reading keeps anyway.
 */
const serverTexts = new WeakMap<IpvsVirtualServer, string>();

/** A server's lines as formatIpvsadmRestore spells them, as one text without the last newline. */
export function virtualServerText(server: IpvsVirtualServer): string {
  let text = serverTexts.get(server);
  if (text === undefined) serverTexts.set(server, (text = serverRestoreLines(server).join('\n')));
  return text;
}

/**
 * A server's lines, split from its text when asked for: a diff compares servers without them
 * (sameVirtualServer), and a search splits only the servers whose text holds what it looks for.
 */
export function virtualServerLines(server: IpvsVirtualServer): string[] {
  return virtualServerText(server).split('\n');
}

/**
 * Records `printed`, the lines `server` was read from, as its text when they spell it as
 * formatIpvsadmRestore would; otherwise its text is spelled on its own.
 */
function spelledAsRead(server: IpvsVirtualServer, printed: string): void {
  const body = printed.endsWith('\n') ? printed.slice(0, -1) : printed;
  const spelled = serverTexts.get(server) ?? serverRestoreLines(server).join('\n');
  serverTexts.set(server, spelled === body ? body : spelled);
}

/** Whether two servers hold the same settings and real servers, in the same order: what their lines say. */
export function sameVirtualServer(a: IpvsVirtualServer, b: IpvsVirtualServer): boolean {
  if (a === b) return true;
  if (
    a.address !== b.address ||
    a.port !== b.port ||
    a.protocol !== b.protocol ||
    a.scheduler !== b.scheduler ||
    a.persistenceTimeout !== b.persistenceTimeout ||
    a.realServers.length !== b.realServers.length
  )
    return false;
  return a.realServers.every((real, index) => {
    const other = b.realServers[index];
    return real.address === other.address && real.port === other.port && real.weight === other.weight;
  });
}

/**
 * A hash set's element limit. kube-proxy's 65,536 overflows KUBE-LOOP-BACK (one entry per
 * endpoint) at 10,000 services x 10 endpoints ("Hash is full"). The kernel grows a hash set's
 * buckets with its entries, so a high limit costs nothing until it is used; and a set's limit
 * cannot change once created, so it must fit the largest cluster from the start.
 */
export const ipsetMaxElements = 1 << 22;

/** ipsetCreateLine is the `create` command for one set, `-exist` so that it can run on every sync. */
export function ipsetCreateLine(set: Pick<Ipset, 'name' | 'type'>, family: IPFamily): string {
  const options =
    set.type === 'bitmap:port'
      ? 'range 0-65535'
      : `family ${family === 'IPv6' ? 'inet6' : 'inet'} hashsize 1024 maxelem ${ipsetMaxElements}`;
  return `create ${set.name} ${set.type} ${options} -exist`;
}

/** formatIpsetRestore writes the sets as `ipset restore` reads them: create (if missing), flush, add. */
export function formatIpsetRestore(sets: Ipset[], family: IPFamily): string {
  const lines: string[] = [];
  for (const set of sets) {
    lines.push(ipsetCreateLine(set, family));
    lines.push(`flush ${set.name}`);
    for (const entry of set.entries) lines.push(`add ${set.name} ${entry} -exist`);
  }
  return lines.length ? `${lines.join('\n')}\n` : '';
}

export class IpvsParseError extends Error {}

/** "10.96.0.10:80" or "[fd00::10]:80" as ipvsadm prints it; undefined when it is not an address and port. */
function hostPort(text: string): {address: string; port: number} | undefined {
  const match = /^\[?([^\]]*?)\]?:(\d+)$/.exec(text);
  return match && parseIP(match[1]) ? {address: match[1], port: Number(match[2])} : undefined;
}

function splitHostPort(text: string, line: string): {address: string; port: number} {
  const found = hostPort(text);
  if (!found) throw new IpvsParseError(`ipvsadm: cannot read address "${text}" in line: ${line}`);
  return found;
}

/** parseIpvsadmSave reads `ipvsadm -Sn` output (or ipvsadm-restore input) into virtual servers, sorted by key. */
export function parseIpvsadmSave(text: string): IpvsVirtualServer[] {
  const servers = new Map<string, IpvsVirtualServer>();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const words = line.split(/\s+/);
    const op = words[0];
    const protocol = flagProtocol(words[1]);
    if ((op !== '-A' && op !== '-a') || !protocol || words.length < 3) throw new IpvsParseError(`ipvsadm: cannot read line: ${line}`);
    const {address, port} = splitHostPort(words[2], line);
    const option = (flag: string) => {
      const at = words.indexOf(flag, 3);
      return at >= 0 ? words[at + 1] : undefined;
    };
    const key = virtualServerKey({protocol, address, port});
    if (op === '-A') {
      const persistence = option('-p');
      servers.set(key, virtualServer(address, port, protocol, option('-s') ?? 'wlc', persistence, ''));
    } else {
      const server = servers.get(key);
      if (!server) throw new IpvsParseError(`ipvsadm: real server before its virtual server ${key}: ${line}`);
      const real = option('-r');
      if (!real) throw new IpvsParseError(`ipvsadm: real server without -r: ${line}`);
      const weight = Number(option('-w') ?? '1');
      if (!Number.isInteger(weight) || weight < 0)
        throw new IpvsParseError(`ipvsadm: weight "${option('-w')}" is no whole number: ${line}`);
      const target = splitHostPort(real, line);
      server.realServers.push({address: target.address, port: target.port, weight});
    }
  }
  return sortServers([...servers.values()]);
}

/**
 * Each server's lines in `ipvsadm -Sn` output by its words after the verb ("-t 10.96.0.10:80"),
 * in the order printed: ipvsadm prints a server's real servers right after it, so a server's
 * lines are a run. A line without a server's words (a comment, an empty line, one
 * parseIpvsadmSave refuses) is a run of its own.
 */
export function ipvsadmRuns(text: string): Map<string, string> {
  const runs = new Map<string, string>();
  let start = 0;
  let owner: string | undefined;
  const close = (end: number) => {
    if (owner !== undefined) runs.set(owner, (runs.get(owner) ?? '') + text.slice(start, end));
  };
  for (let at = 0; at < text.length; ) {
    const next = text.indexOf('\n', at);
    const lineEnd = next < 0 ? text.length : next;
    const end = next < 0 ? text.length : next + 1;
    const server = lineOwner(text, at, lineEnd) ?? `line ${at}`;
    if (server !== owner) {
      close(at);
      owner = server;
      start = at;
    }
    at = end;
  }
  close(text.length);
  return runs;
}

/**
 * Beyond this many servers, their lines are found in one walk over every line of the output, not
 * by a search of the whole output for each server's words.
 */
const serversSearchedFor = 16;

/**
 * Where the lines of each server named by `words` ("-t 10.96.0.10:80") are in `ipvsadm -Sn`
 * output: each line whose first word is followed by those words (ipvsadmRuns' owner), as
 * [start, end) with its newline, in order; a server without lines has none. A few servers are
 * searched for rather than splitting all of a large node's 110,000 lines into runs.
 */
export function serverLineRanges(printed: string, words: ReadonlySet<string>): Map<string, [number, number][]> {
  const ranges = new Map<string, [number, number][]>([...words].map((server) => [server, []]));
  if (words.size > serversSearchedFor) {
    for (let at = 0; at < printed.length; ) {
      const next = printed.indexOf('\n', at);
      const end = next < 0 ? printed.length : next + 1;
      const owner = lineOwner(printed, at, next < 0 ? printed.length : next);
      if (owner !== undefined) ranges.get(owner)?.push([at, end]);
      at = end;
    }
    return ranges;
  }
  for (const server of words) {
    const needle = ` ${server}`;
    for (let at = printed.indexOf(needle); at >= 0; at = printed.indexOf(needle, at + 1)) {
      const lineStart = printed.lastIndexOf('\n', at) + 1;
      const after = printed.charCodeAt(at + needle.length);
      const firstWordOnly = printed.indexOf(' ', lineStart) === at;
      // Followed by a space, the line's end or the text's: "-t 10.96.0.1:80" is not "-t 10.96.0.1:8080".
      if (!firstWordOnly || !(Number.isNaN(after) || after === 32 || after === 10)) continue;
      const next = printed.indexOf('\n', at);
      ranges.get(server)!.push([lineStart, next < 0 ? printed.length : next + 1]);
    }
  }
  return ranges;
}

/** The words after a line's first word, up to its third ("-t 10.96.0.10:80"); undefined for a line of fewer than three words. */
function lineOwner(text: string, lineStart: number, lineEnd: number): string | undefined {
  const firstSpace = text.indexOf(' ', lineStart);
  const secondSpace = firstSpace < 0 || firstSpace >= lineEnd ? -1 : text.indexOf(' ', firstSpace + 1);
  if (secondSpace < 0 || secondSpace >= lineEnd) return undefined;
  const thirdSpace = text.indexOf(' ', secondSpace + 1);
  return text.slice(firstSpace + 1, thirdSpace < 0 || thirdSpace >= lineEnd ? lineEnd : thirdSpace);
}

/** A virtual server's lines in `ipvsadm -Sn` output, and the server read from them. */
export interface IpvsadmBlock {
  lines: string;
  server: IpvsVirtualServer;
}

/**
 * parseIpvsadmSaveSince reads `ipvsadm -Sn` output as parseIpvsadmSave does, but a server whose
 * lines (its "-A" line and its real servers' "-a" lines) are those of a block in `before` is that
 * block's object, not parsed again: a node's servers change one at a time, and what a diff worked
 * out about an object stays with it. Returns the servers `kept` keeps, sorted by key, and every
 * block, for the next reading.
 */
export function parseIpvsadmSaveSince(
  text: string,
  before: ReadonlyMap<string, IpvsadmBlock> | undefined,
  kept: (server: IpvsVirtualServer) => boolean,
): {servers: IpvsVirtualServer[]; blocks: Map<string, IpvsadmBlock>} {
  const runs = ipvsadmRuns(text);
  const blocks = new Map<string, IpvsadmBlock>();
  const servers: {key: string; server: IpvsVirtualServer}[] = [];
  for (const [owner, lines] of runs) {
    const known = before?.get(owner);
    const server = known?.lines === lines ? known.server : parseIpvsadmSave(lines)[0];
    if (!server) continue;
    // A server kept from the reading before takes its text from this reading, so that the one
    // before, whose lines it would hold, can go.
    spelledAsRead(server, lines);
    blocks.set(owner, {lines, server});
    if (kept(server)) servers.push({key: virtualServerKey(server), server});
  }
  return {servers: servers.sort((a, b) => compare(a.key, b.key)).map(({server}) => server), blocks};
}

/** The virtual server ipvsadm's words name ("-t 10.96.0.10:80"); undefined for words that name none. */
export function serverNamed(words: string): Pick<IpvsVirtualServer, 'protocol' | 'address' | 'port'> | undefined {
  const [flag, target = ''] = words.split(' ');
  const protocol = flagProtocol(flag);
  const named = hostPort(target);
  return protocol && named ? {protocol, ...named} : undefined;
}

/**
 * A reading's servers (`servers`, sorted by key) brought up to `printed`, newer `ipvsadm -Sn`
 * output in which only the servers named by `words` ("-t 10.96.0.10:80") may differ from the
 * reading: each of those is read again from its lines in `printed`, or is gone when it has none;
 * every other one stays the reading's object, so a diff knows it unchanged. `kept` chooses the
 * servers to keep (one family's). Undefined when a word names no server ipvsadm could print.
 * The kept servers' texts stay slices of the output they were read from (spelledAsRead), which
 * therefore lives beside `printed` until the state is next read whole: one more copy of the
 * servers' text, where reading all of `printed` again would cost a parse of every line per change.
 */
export function patchedServers(
  servers: readonly IpvsVirtualServer[],
  printed: string,
  words: ReadonlySet<string>,
  kept: (server: Pick<IpvsVirtualServer, 'address'>) => boolean,
): IpvsVirtualServer[] | undefined {
  const patched = servers.slice();
  for (const [server, ranges] of serverLineRanges(printed, words)) {
    const named = serverNamed(server);
    if (!named) return undefined;
    if (!kept(named)) continue;
    const key = virtualServerKey(named);
    // A copy of the lines, not slices of `printed`: a slice would keep all of it alive with the server.
    const lines = Buffer.from(ranges.map(([start, end]) => printed.slice(start, end)).join('')).toString();
    const [read] = lines === '' ? [] : parseIpvsadmSave(lines);
    if (read) spelledAsRead(read, lines);
    const at = sortedIndex(patched, key, virtualServerKey);
    const present = at < patched.length && virtualServerKey(patched[at]) === key;
    if (read) patched.splice(at, present ? 1 : 0, read);
    else if (present) patched.splice(at, 1);
  }
  return patched;
}

export function sortServers(servers: IpvsVirtualServer[]): IpvsVirtualServer[] {
  for (const server of servers)
    server.realServers.sort((a, b) => compare(joinHostPort(a.address, a.port), joinHostPort(b.address, b.port)));
  return servers.sort((a, b) => compare(virtualServerKey(a), virtualServerKey(b)));
}

/** The order the state keeps its lists in (by code unit, as sort() without a comparator). */
export function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Whether `sorted`, in compare's order, holds `value`: found by halving, without a copy. */
export function sortedIncludes(sorted: readonly string[], value: string): boolean {
  const at = sortedIndex(sorted, value);
  return at < sorted.length && sorted[at] === value;
}

/**
 * Where `value` is or would go in `sorted` (compare's order, by `keyOf` of each item): the first
 * item not before it, found by halving. The items that begin with a prefix follow one another
 * from the prefix's index.
 */
export function sortedIndex<T>(sorted: readonly T[], value: string, keyOf: (item: T) => string = String): number {
  let low = 0;
  let high = sorted.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (keyOf(sorted[middle]) < value) low = middle + 1;
    else high = middle;
  }
  return low;
}

/**
 * parseIpsetSave reads `ipset save` output into sets, sorted by name with sorted entries. Only
 * sets whose name starts with `prefix` are kept (the node may hold other programs' sets).
 */
export function parseIpsetSave(text: string, prefix = 'KUBE-'): Ipset[] {
  const sets = new Map<string, Ipset>();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    const words = line.split(/\s+/);
    if (words[0] === 'create' && words.length >= 3) {
      if (words[1].startsWith(prefix)) sets.set(words[1], {name: words[1], type: words[2], entries: []});
    } else if (words[0] === 'add' && words.length >= 3) {
      if (!words[1].startsWith(prefix)) continue;
      const set = sets.get(words[1]);
      if (!set) throw new IpvsParseError(`ipset: entry for set ${words[1]} before its create line: ${line}`);
      set.entries.push(words[2]);
    } else {
      throw new IpvsParseError(`ipset: cannot read line: ${line}`);
    }
  }
  for (const set of sets.values()) set.entries.sort(compare);
  return [...sets.values()].sort((a, b) => compare(a.name, b.name));
}

/** parseBoundAddresses reads `ip -j addr show dev kube-ipvs0` into sorted addresses ([] when the device is missing). */
export function parseBoundAddresses(json: string): string[] {
  if (!json.trim()) return [];
  let links: unknown;
  try {
    links = JSON.parse(json);
  } catch (error) {
    throw new IpvsParseError(`ip -j addr: not JSON: ${(error as Error).message}`);
  }
  if (!Array.isArray(links)) throw new IpvsParseError('ip -j addr: expected a JSON array of links');
  const addresses: string[] = [];
  for (const link of links as Array<{addr_info?: Array<{local?: string}>}>) {
    for (const info of link.addr_info ?? []) if (info.local) addresses.push(info.local);
  }
  return addresses.sort(compare);
}
