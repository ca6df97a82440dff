// CompressedText: a large text kept deflated in blocks, and read back a slice at a time. The agent
// API keeps the kernel's last iptables-save reading between requests to answer traces from, and on
// a large node that text is most of what it holds; deflated it is several times smaller
// (docs/development.md, Memory engineering, has the figures). A trace reads about thirty
// chains, each a slice inside one block or two, and the block read last is kept decoded for the
// slices that follow it. A diff reads every chain, in another order than the text's: past a few
// blocks in one burst of reads (one turn of the event loop) the whole text is inflated once and
// held until the burst ends, rather than a block inflated again for each chain.
import {deflateRawSync, inflateRawSync} from 'node:zlib';

/** Characters per block: a slice inflates one block or two, small next to parsing the chain it holds. */
const blockLength = 1 << 16;
/** Blocks inflated in one burst of reads before the whole text is. */
const blocksBeforeWhole = 64;

export class CompressedText {
  readonly length: number;
  /** Where each block starts in the text; blocks end where the next starts. */
  readonly #starts: number[] = [];
  readonly #blocks: Buffer[] = [];
  #decoded: {block: number; text: string} | undefined;
  /** The current burst of reads: blocks inflated in it, and the whole text once that passed blocksBeforeWhole. */
  #burst: {inflated: number; whole?: string} | undefined;

  constructor(text: string) {
    this.length = text.length;
    for (let start = 0; start < text.length; ) {
      let end = Math.min(start + blockLength, text.length);
      // A surrogate pair stays in one block: cut in two, neither half would encode.
      if (end < text.length && isHighSurrogate(text.charCodeAt(end - 1))) end++;
      this.#starts.push(start);
      this.#blocks.push(deflateRawSync(Buffer.from(text.slice(start, end), 'utf8'), {level: 1}));
      start = end;
    }
  }

  /** Bytes held, deflated. */
  get compressedBytes(): number {
    return this.#blocks.reduce((sum, block) => sum + block.length, 0);
  }

  /** text.slice(start, end) of the text it was made from. */
  slice(start: number, end: number): string {
    end = Math.min(end, this.length);
    if (start >= end) return '';
    if (this.#burst?.whole !== undefined) return this.#burst.whole.slice(start, end);
    let text = '';
    for (let block = this.#blockAt(start); block < this.#blocks.length && this.#starts[block] < end; block++) {
      const base = this.#starts[block];
      text += this.#decode(block).slice(Math.max(start - base, 0), end - base);
    }
    return text;
  }

  toString(): string {
    if (this.#burst?.whole !== undefined) return this.#burst.whole;
    return this.#blocks.map((block) => inflateRawSync(block).toString('utf8')).join('');
  }

  /** The whole text, for a search through all of it: inflated once and held for the rest of the burst. */
  whole(): string {
    this.#startBurst().whole ??= this.toString();
    return this.#burst!.whole!;
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
  #startBurst(): {inflated: number; whole?: string} {
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

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
