// CompressedText: a large text kept deflated in blocks, and read back a slice at a time. The agent
// API keeps the kernel's last iptables-save reading between requests to answer traces from, and on
// a large node that text is most of what it holds; deflated it is several times smaller
// (docs/development.md, Memory engineering, has the figures). A trace reads about thirty
// chains, each a slice inside one block or two, and the block read last is kept decoded for the
// slices that follow it. A diff reads every chain, in another order than the text's: past a few
// blocks in one burst of reads (one turn of the event loop) the whole text is inflated once and
// held until the burst ends, rather than a block inflated again for each chain.
// The text is deflated off the main thread, a block at a time, and read as it was given until
// then: the comparison that follows a reading (the first of an observer, at 10,000 services two
// 33 MB texts) reads every chain of it while it is still whole, and does not wait for it to be
// deflated and then inflate it again.
import {promisify} from 'node:util';
import {deflateRaw, inflateRawSync} from 'node:zlib';
import {freedLater} from '../../garbage.ts';

const deflateRawInBackground = promisify(deflateRaw);

/** Characters per block: a slice inflates one block or two, small next to parsing the chain it holds. */
const blockLength = 1 << 16;
/** Blocks inflated in one burst of reads before the whole text is. */
const blocksBeforeWhole = 64;

export class CompressedText {
  readonly length: number;
  /** Resolves once the text is held deflated (and the text given let go). */
  readonly deflated: Promise<void>;
  /** The text as given, until it is deflated (or for good, should deflating fail). */
  #plain: string | undefined;
  /** Where each block starts in the text; blocks end where the next starts. */
  #starts: number[] = [];
  #blocks: Buffer[] = [];
  #decoded: {block: number; text: string} | undefined;
  /**
   * The current burst of reads: blocks inflated in it, and the whole text once that passed
   * blocksBeforeWhole; the blocks a search went through, for the searches that follow it.
   */
  #burst: Burst | undefined;

  constructor(text: string) {
    this.length = text.length;
    this.#plain = text;
    // Should deflating fail (memory), the text stays as given.
    this.deflated = this.#deflate(text).catch(() => undefined);
    freedLater(this.deflated);
  }

  /** Bytes held deflated; undefined while the text is held as given. */
  get compressedBytes(): number | undefined {
    return this.#plain === undefined ? this.#blocks.reduce((sum, block) => sum + block.length, 0) : undefined;
  }

  /** text.slice(start, end) of the text it was made from. */
  slice(start: number, end: number): string {
    end = Math.min(end, this.length);
    if (start >= end) return '';
    const whole = this.#plain ?? this.#burst?.whole;
    if (whole !== undefined) return whole.slice(start, end);
    let text = '';
    for (let block = this.#blockAt(start); block < this.#blocks.length && this.#starts[block] < end; block++) {
      const base = this.#starts[block];
      text += this.#decode(block).slice(Math.max(start - base, 0), end - base);
    }
    return text;
  }

  toString(): string {
    const whole = this.#plain ?? this.#burst?.whole;
    if (whole !== undefined) return whole;
    return this.#blocks.map((block) => inflateRawSync(block).toString('utf8')).join('');
  }

  /** The whole text, for a search through all of it: inflated once and held for the rest of the burst. */
  whole(): string {
    if (this.#plain !== undefined) return this.#plain;
    this.#startBurst().whole ??= this.toString();
    return this.#burst!.whole!;
  }

  /**
   * The lines of the text that hold `needle` (which holds no newline), and where each starts,
   * found a block at a time: a search that stops at the first line it wants inflates only the
   * blocks up to it. They are kept for the other searches of the same burst of reads, and let go
   * with it.
   */
  *linesWith(needle: string): Generator<{line: string; start: number}> {
    const whole = this.#plain ?? this.#burst?.whole;
    if (whole !== undefined) {
      yield* linesHolding(whole, 0, needle, true);
      return;
    }
    // Searches come in bursts (a drift explanation asks for a few names at once): the blocks one
    // went through are kept for the others until the burst ends.
    const searched = (this.#startBurst().searched ??= []);
    // The text's last line that the blocks so far do not end, and where it starts.
    let partial = '';
    let partialStart = 0;
    for (let block = 0; block < this.#blocks.length; block++) {
      const last = block === this.#blocks.length - 1;
      const chunk = partial + (searched[block] ??= inflateRawSync(this.#blocks[block]).toString('utf8'));
      yield* linesHolding(chunk, partialStart, needle, last);
      const cut = last ? chunk.length : chunk.lastIndexOf('\n') + 1;
      partial = chunk.slice(cut);
      partialStart += cut;
    }
  }

  /** Deflates the text a block at a time, each on libuv's thread pool, and then lets it go. */
  async #deflate(text: string): Promise<void> {
    const starts: number[] = [];
    const blocks: Buffer[] = [];
    for (let start = 0; start < text.length; ) {
      let end = Math.min(start + blockLength, text.length);
      // A surrogate pair stays in one block: cut in two, neither half would encode.
      if (end < text.length && isHighSurrogate(text.charCodeAt(end - 1))) end++;
      starts.push(start);
      blocks.push(await deflateRawInBackground(Buffer.from(text.slice(start, end), 'utf8'), {level: 1}));
      start = end;
    }
    this.#starts = starts;
    this.#blocks = blocks;
    this.#plain = undefined;
  }

  #blockAt(position: number): number {
    let low = 0;
    let high = this.#starts.length - 1;
    while (low < high) {
      const middle = (low + high + 1) >> 1;
      if (this.#starts[middle] <= position) low = middle;
      else high = middle - 1;
    }
    return low;
  }

  #decode(block: number): string {
    if (this.#decoded?.block === block) return this.#decoded.text;
    const burst = this.#startBurst();
    if (++burst.inflated > blocksBeforeWhole) {
      this.#decoded = undefined;
      return this.whole().slice(this.#starts[block], this.#starts[block + 1] ?? this.length);
    }
    this.#decoded = {block, text: inflateRawSync(this.#blocks[block]).toString('utf8')};
    return this.#decoded.text;
  }

  /** The burst of reads under way, or a new one, which ends with this turn of the event loop. */
  #startBurst(): Burst {
    if (!this.#burst) {
      const burst = {inflated: 0};
      this.#burst = burst;
      setImmediate(() => {
        if (this.#burst === burst) this.#burst = undefined;
      });
    }
    return this.#burst;
  }
}

/** The lines of `chunk` (at `offset` in its text) that hold `needle`; a last line without its newline only if `ends` (the text ends there). */
export function* linesHolding(chunk: string, offset: number, needle: string, ends: boolean): Generator<{line: string; start: number}> {
  for (let at = chunk.indexOf(needle); at >= 0; at = chunk.indexOf(needle, at + 1)) {
    const start = chunk.lastIndexOf('\n', at) + 1;
    let end = chunk.indexOf('\n', at);
    if (end < 0) {
      if (!ends) return;
      end = chunk.length;
    }
    yield {line: chunk.slice(start, end), start: offset + start};
    // The line's other occurrences would find it again.
    at = end;
  }
}

interface Burst {
  inflated: number;
  whole?: string;
  /** Blocks searched (linesWith), by number. */
  searched?: string[];
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
