// The kernel's own table of virtual and real servers, /proc/net/ip_vs: addresses and ports in hex,
// each real server's connection counts, a persistence timeout in the kernel's ticks. Reading it
// makes no netlink dump of each server's real servers, as `ipvsadm -Sn` does, so ipvs mode's
// looks read it to tell whether the servers changed, and which, and spell the changed ones as -Sn
// would where the table says all that -Sn prints.
import {joinHostPort, parseIP} from '../model/index.ts';
import {protocolFlags, serverLineRanges} from './state.ts';

/**
 * The table without each real server's connection counts (ActiveConn, InActConn), which traffic
 * changes: what is left changes only when a server does. A real server's line, "  -> ADDRESS
 * FORWARD WEIGHT ACTIVE INACTIVE", keeps its first three words; every other line is kept whole.
 */
export function serverTableShape(table: string): string {
  return serverTableShapeBytes(Buffer.from(table, 'latin1')).toString('latin1');
}

/**
 * serverTableShape of the table's bytes, as the looks read it (Host.ipvsTable), without making it
 * a string. The shape is written over `table` itself, from its start (it is never longer), and
 * is a view of it: a look allocates no second table, and copies the shape only to keep it.
 */
export function serverTableShapeBytes(table: Uint8Array): Buffer {
  return new ServerTableShaper().end(table);
}

/**
 * serverTableShapeBytes made as the table is read: each call shapes the lines read whole since the
 * last one, over the table from its start, so that a look can compare the shape with the one
 * before while the kernel is still spelling the rest (ServerTableComparison).
 */
export class ServerTableShaper {
  /** How many bytes of the table are shaped. */
  #shaped = 0;
  /** How long the shape is: it is written over the table from its start. */
  #length = 0;

  /** The shape of the whole lines of `read`, the table so far, whose bytes before the last call's end are as that call left them: a view of it. */
  more(read: Uint8Array): Buffer {
    return this.#shape(read, false);
  }

  /** The shape of the whole table, whose last line may have no newline: a view of it. */
  end(table: Uint8Array): Buffer {
    return this.#shape(table, true);
  }

  #shape(table: Uint8Array, whole: boolean): Buffer {
    let start = this.#shaped;
    let length = this.#length;
    while (start < table.length) {
      let end = start;
      while (end < table.length && table[end] !== newline) end++;
      // A line still being read is shaped once it is read whole.
      if (end === table.length && !whole) break;
      const kept = realServerWordsEnd(table, start, end);
      // Byte by byte, not indexOf and copyWithin: in the qemu guest, two calls into the runtime per
      // line (110,000 lines at 10,000 services) cost more than the loop over the line's bytes.
      for (let at = start; at < kept; at++) table[length++] = table[at];
      if (end < table.length) table[length++] = newline;
      start = end + 1;
    }
    this.#shaped = Math.min(start, table.length);
    this.#length = length;
    return Buffer.from(table.buffer, table.byteOffset, length);
  }
}

const space = 32;
const newline = 10;
const isDigit = (byte: number) => byte >= 48 && byte <= 57;
/** How a real server's line begins, its first word right after. */
const realServerPrefix = Buffer.from('  -> ', 'latin1');

/**
 * Where a real server's line ends without its counts: after its third word, when the line is
 * "  -> " and five words, the last two digits, then spaces; else the line's end.
 */
function realServerWordsEnd(table: Uint8Array, start: number, end: number): number {
  const first = start + realServerPrefix.length;
  if (first >= end || table[first] === space) return end;
  for (let at = start; at < first; at++) if (table[at] !== realServerPrefix[at - start]) return end;
  let words = 0;
  let thirdEnd = end;
  for (let at = first; at < end; ) {
    while (at < end && table[at] === space) at++;
    if (at === end) break;
    words++;
    // The fourth and fifth words are the counts: digits only.
    while (at < end && table[at] !== space) {
      if (words > 3 && !isDigit(table[at])) return end;
      at++;
    }
    if (words === 3) thirdEnd = at;
  }
  return words === 5 ? thirdEnd : end;
}

const serverLine = /^(?:TCP|UDP|SCTP|FWM) /;

/**
 * Each virtual server's lines in the table (its own and its real servers'), by its protocol and
 * hex address, "TCP 0A60000A:0050". The header's lines are no server's.
 */
export function serverTableBlocks(table: string): Map<string, string> {
  const blocks = new Map<string, string>();
  let key: string | undefined;
  let start = 0;
  const close = (end: number) => {
    if (key !== undefined) blocks.set(key, table.slice(start, end));
  };
  for (let at = 0; at < table.length; ) {
    const next = table.indexOf('\n', at);
    const end = next < 0 ? table.length : next + 1;
    if (serverLine.test(table.slice(at, at + 5))) {
      close(at);
      const words = table.slice(at, end).trim().split(/\s+/);
      key = `${words[0]} ${words[1]}`;
      start = at;
    }
    at = end;
  }
  close(table.length);
  return blocks;
}

/** "0A60000A" (IPv4) or "[fd00:0010:...:0001]" (IPv6) and a hex port, as ipvsadm -n prints them; undefined when not an address. */
function tableHostPort(hexAddress: string, hexPort: string): string | undefined {
  const text = hexAddress.startsWith('[')
    ? hexAddress.slice(1, -1)
    : /^[0-9A-F]{8}$/.test(hexAddress)
      ? [0, 2, 4, 6].map((at) => parseInt(hexAddress.slice(at, at + 2), 16)).join('.')
      : undefined;
  const ip = text === undefined ? undefined : parseIP(text);
  return ip && /^[0-9A-F]{4}$/.test(hexPort) ? joinHostPort(ip.text, parseInt(hexPort, 16)) : undefined;
}

/** The words ipvsadm names a block's virtual server by ("-t 10.96.0.10:80"); undefined for a fwmark service. */
function serverWords(block: string): string | undefined {
  const match = /^(TCP|UDP|SCTP) {2}(\S+):(\S+) /.exec(block);
  const hostPort = match && tableHostPort(match[2], match[3]);
  return hostPort ? `${protocolFlags[match[1] as keyof typeof protocolFlags]} ${hostPort}` : undefined;
}

/**
 * A block's lines as `ipvsadm -Sn` prints them; undefined where the table does not say all that
 * -Sn prints as -Sn does: persistence (its timeout in the kernel's ticks), one-packet scheduling,
 * a real server that is not masqueraded, a fwmark service.
 */
function savedLines(block: string): string | undefined {
  const [head, ...reals] = block.trimEnd().split('\n');
  const server = /^(?:TCP|UDP|SCTP) {2}\S+ (\S+) *$/.exec(head);
  const words = serverWords(block);
  if (!server || !words) return undefined;
  let lines = `-A ${words} -s ${server[1]}\n`;
  for (const line of reals) {
    const real = /^ {2}-> (\S+):(\S+) +Masq +(\d+)$/.exec(line);
    const hostPort = real && tableHostPort(real[1], real[2]);
    if (!hostPort) return undefined;
    lines += `-a ${words} -r ${hostPort} -m -w ${real[3]}\n`;
  }
  return lines;
}

/** Whether a server's block begins at `at`: a line that names a virtual server. */
function blockStartsAt(table: Buffer, at: number): boolean {
  return (at === 0 || table[at - 1] === newline) && serverLine.test(table.toString('latin1', at, at + 5));
}

/** How many bytes of two tables are compared at once, by the runtime, before byte by byte. */
const comparedAtOnce = 4096;

/** How many bytes two tables begin with alike. */
function commonHead(a: Buffer, b: Buffer): number {
  return sameLength(a, 0, b, 0, Math.min(a.length, b.length));
}

/** How many bytes from `aFrom` in `a` and `bFrom` in `b` are alike, up to `limit`. */
function sameLength(a: Buffer, aFrom: number, b: Buffer, bFrom: number, limit: number): number {
  let same = 0;
  while (
    same + comparedAtOnce <= limit &&
    a.compare(b, bFrom + same, bFrom + same + comparedAtOnce, aFrom + same, aFrom + same + comparedAtOnce) === 0
  )
    same += comparedAtOnce;
  while (same < limit && a[aFrom + same] === b[bFrom + same]) same++;
  return same;
}

/** How many bytes two tables end with alike, within the `limit` bytes after their common head. */
function commonTail(a: Buffer, b: Buffer, limit: number): number {
  let tail = 0;
  while (
    tail + comparedAtOnce <= limit &&
    a.compare(b, b.length - tail - comparedAtOnce, b.length - tail, a.length - tail - comparedAtOnce, a.length - tail) === 0
  )
    tail += comparedAtOnce;
  while (tail < limit && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  return tail;
}

/**
 * The blocks of two tables around where they differ: each table cut to whole blocks from where
 * the two stop being the same bytes, from either end. A change touches a server or two of
 * thousands, so this compares bytes (most of them in the runtime, a page at a time) instead of
 * making strings of both tables and splitting them into every block. Outside the cut the tables
 * are the same, so no server there changed.
 */
function differingBlocks(before: Buffer, now: Buffer): {blocksBefore: Map<string, string>; blocksNow: Map<string, string>} {
  const head = commonHead(before, now);
  const tail = commonTail(before, now, Math.min(before.length, now.length) - head);
  // The cut begins at a block that begins, with its first word, before the first difference: the
  // same place in both. Before the first server line is the header, which is no block.
  let start = lineStart(before, Math.max(0, head - 5));
  while (start > 0 && !blockStartsAt(before, start)) start = lineStart(before, start - 1);
  // It ends where a block begins after the last difference, in the bytes both end with.
  const end = (table: Buffer) => {
    let at = table.indexOf(newline, table.length - tail);
    while (at >= 0 && !blockStartsAt(table, at + 1)) at = table.indexOf(newline, at + 1);
    return at < 0 ? table.length : at + 1;
  };
  return {
    blocksBefore: serverTableBlocks(before.toString('latin1', start, end(before))),
    blocksNow: serverTableBlocks(now.toString('latin1', start, end(now))),
  };
}

/** `ipvsadm -Sn` as it would print now, and which servers' lines differ from what it printed before. */
export interface SpelledSince {
  text: string;
  /** The words ipvsadm names each changed server by ("-t 10.96.0.10:80"): added, removed or changed. */
  changedServers: Set<string>;
}

/**
 * `ipvsadm -Sn` as it would print now, made from what it printed before (`printed`, read after
 * the table's shape `before`) and the table's shape `now` (serverTableShapeBytes): each server whose block changed is
 * spelled from the table, every other one kept as printed. A server that changed after `before`
 * was read and before `printed` was has changed in `now` too, so it is spelled again. Undefined
 * when a changed server cannot be spelled from the table: run -Sn.
 */
export function savedTextSince(printed: string, before: Buffer, now: Buffer): SpelledSince | undefined {
  const {blocksBefore, blocksNow} = differingBlocks(before, now);
  const changedServers = new Set<string>();
  for (const [key, block] of blocksBefore) {
    if (blocksNow.get(key) === block) continue;
    const words = serverWords(block);
    if (!words) return undefined;
    changedServers.add(words);
  }
  let spelled = '';
  for (const [key, block] of blocksNow) {
    if (blocksBefore.get(key) === block) continue;
    const words = serverWords(block);
    const lines = savedLines(block);
    if (!words || lines === undefined) return undefined;
    changedServers.add(words);
    spelled += lines;
  }
  return {text: withoutServers(printed, changedServers, spelled), changedServers};
}

/**
 * `ipvsadm -Sn` output without the lines of the servers named by `words` ("-t 10.96.0.10:80"),
 * with `appended` after it, as one flat string: the follow searches this text, and a string
 * made by `+` would be copied whole (flattened) by its first search, megabytes at 10,000 services.
 */
function withoutServers(printed: string, words: ReadonlySet<string>, appended: string): string {
  const dropped = [...serverLineRanges(printed, words).values()].flat().sort((a, b) => a[0] - b[0]);
  if (dropped.length === 0 && appended === '') return printed;
  const pieces: string[] = [];
  let from = 0;
  for (const [start, end] of dropped) {
    if (start >= from) pieces.push(printed.slice(from, start));
    from = Math.max(from, end);
  }
  pieces.push(printed.slice(from));
  // Dropped lines end with their newline: only a last line without one needs one before `appended`.
  const lastPiece = pieces.at(-1)!;
  if (appended !== '' && lastPiece !== '' && !lastPiece.endsWith('\n')) pieces.push('\n');
  pieces.push(appended);
  return pieces.join('');
}

/** Where the line that holds `at` begins. */
function lineStart(table: Buffer, at: number): number {
  // (A Buffer's lastIndexOf counts a negative offset from the end: at 0 there is nothing before.)
  return at === 0 ? 0 : table.lastIndexOf(newline, at - 1) + 1;
}

/** Where the block after the one that begins at `start` begins; undefined when no line after it begins one. */
function nextBlockStart(table: Buffer, start: number): number | undefined {
  for (let at = table.indexOf(newline, start); at >= 0 && at + 1 < table.length; at = table.indexOf(newline, at + 1))
    if (blockStartsAt(table, at + 1)) return at + 1;
  return undefined;
}

/** Where a block's first line stops naming its server: after its second word ("TCP  0A60000A:0050"). */
function serverNameEnd(table: Buffer, start: number): number {
  let at = start;
  while (at < table.length && table[at] !== space) at++;
  while (at < table.length && table[at] === space) at++;
  while (at < table.length && table[at] !== space && table[at] !== newline) at++;
  return at;
}

/**
 * Compares a table's shape as it is read (ServerTableShaper) with the shape of the table read
 * before it, so that a look names a changed server as soon as its read passes it, not once the
 * kernel has spelled the whole table: at 10,000 services in the qemu guest the whole read takes
 * seconds, and a change would wait for all of it. Where the two shapes first differ, a server is
 * sure to have changed when both hold its block there and the blocks differ (a real server added,
 * removed or weighted): each table holds a server's block once. A server added or removed there
 * is not sure until the whole table is read (a server deleted and added again moves to its hash
 * bucket's head, so a block missing here may be further on), and is left to savedTextSince once
 * the table is read. One server is spelled per look: each costs a copy of the printed text, and
 * a look that sees more changes reports them when it ends.
 */
export class ServerTableComparison {
  readonly #before: Buffer;
  readonly #printed: string;
  /** Where the shapes are compared from: in the shape being read, and the same place in `before`. */
  #at = 0;
  #atBefore = 0;
  /** Until the first difference; then whether it was a server changed in place, spelled, or anything else. */
  #state: 'comparing' | 'spelled' | 'differs' = 'comparing';

  /** `before`: the shape of the table read before (serverTableShapeBytes); `printed`: `ipvsadm -Sn` as it printed after it. */
  constructor(before: Buffer, printed: string) {
    this.#before = before;
    this.#printed = printed;
  }

  /** Given the shape read so far (whole lines), the changed server spelled as savedTextSince spells it, the first time one is sure. */
  more(shape: Buffer): SpelledSince | undefined {
    return this.#compare(shape, false);
  }

  /** Whether the whole table's shape differs from the one before only in the server `more` spelled. */
  differsOnlyInSpelled(shape: Buffer): boolean {
    if (this.#state !== 'spelled') return false;
    this.#compare(shape, true);
    return this.#state === 'spelled';
  }

  #compare(shape: Buffer, whole: boolean): SpelledSince | undefined {
    const before = this.#before;
    let spelled: SpelledSince | undefined;
    while (this.#state !== 'differs') {
      const comparable = Math.min(shape.length - this.#at, before.length - this.#atBefore);
      const same = sameLength(shape, this.#at, before, this.#atBefore, comparable);
      this.#at += same;
      this.#atBefore += same;
      if (same === comparable) {
        // All read so far is alike; a table that ends, or goes on, where the other does not differs from it there.
        if (this.#at === shape.length && (!whole || this.#atBefore === before.length)) return spelled;
        this.#state = 'differs';
      } else if (this.#state === 'spelled') this.#state = 'differs';
      else {
        const changed = this.#changedInPlace(shape, whole);
        if (changed === 'unread') return spelled;
        if (changed === undefined) this.#state = 'differs';
        else {
          spelled = changed;
          this.#state = 'spelled';
        }
      }
    }
    return spelled;
  }

  /**
   * The server whose block holds the first difference, spelled, where both shapes hold its block
   * there; 'unread' while its block is not read whole. Past it, the shapes are compared from the
   * block after it in each.
   */
  #changedInPlace(shape: Buffer, whole: boolean): SpelledSince | 'unread' | undefined {
    const before = this.#before;
    const at = this.#at;
    const offset = this.#atBefore - at;
    // The shapes are alike up to the difference: the block that holds it begins at the same place
    // in both. A difference at a line's start where either begins a block is at the end of the
    // block before (a real server's line added or removed there), unless both begin one: a server
    // added or removed.
    const atLineStart = at === 0 || shape[at - 1] === newline;
    const blockInShape = atLineStart && blockStartsAt(shape, at);
    const blockBefore = atLineStart && blockStartsAt(before, at + offset);
    if (blockInShape && blockBefore) return undefined;
    if (at === 0 && (blockInShape || blockBefore)) return undefined;
    let start = lineStart(shape, blockInShape || blockBefore ? at - 1 : at);
    while (start > 0 && !blockStartsAt(shape, start)) start = lineStart(shape, start - 1);
    if (!blockStartsAt(shape, start)) return undefined;
    const startBefore = start + offset;
    const end = nextBlockStart(shape, start) ?? (whole ? shape.length : undefined);
    if (end === undefined) return 'unread';
    const endBefore = nextBlockStart(before, startBefore) ?? before.length;
    const nameEnd = serverNameEnd(shape, start);
    if (
      nameEnd - start !== serverNameEnd(before, startBefore) - startBefore ||
      shape.compare(before, startBefore, startBefore + nameEnd - start, start, nameEnd) !== 0
    )
      return undefined;
    const block = shape.toString('latin1', start, end);
    const words = serverWords(block);
    const lines = savedLines(block);
    if (!words || lines === undefined) return undefined;
    this.#at = end;
    this.#atBefore = endBefore;
    const changedServers = new Set([words]);
    return {text: withoutServers(this.#printed, changedServers, lines), changedServers};
  }
}
