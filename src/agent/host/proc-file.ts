// readProcFile: a /proc file the kernel spells as it is read (a seq_file, such as /proc/net/ip_vs),
// read whole into one buffer. Such a file says its size is 0, and each read() of it gives at most
// a page, whatever the buffer: /proc/net/ip_vs at 10,000 services x 10 endpoints takes about 1,500
// reads, and ipvs mode's looks read it every few seconds. readFile does each read on libuv's
// thread pool, a round trip between threads per page, into a new 64 KiB buffer per page, all of
// it garbage outside V8's heap. Here the reads are made on this thread, in bursts of a few
// milliseconds with the event loop free between them, into one buffer that doubles when it is
// nearly full: the reading costs the agent little more than the kernel's spelling of the file
// (docs/observe.md has the figures, timed in the qemu guest and on a development machine). A file
// read again and again can be read into a ReadBuffer kept between reads: once it is large enough,
// a read allocates nothing, where each look would leave megabytes for the collector.
import {readSync} from 'node:fs';
import {open} from 'node:fs/promises';
import {setImmediate as eventLoopTurn} from 'node:timers/promises';

/** The first buffer's size; most /proc files fit, and a large one takes few doublings from it. */
const firstBufferBytes = 64 * 1024;

/** Room left below which the buffer doubles before the next read(): a page or two, as the kernel gives. */
const roomBeforeDoubling = 8 * 1024;

/** How long one burst of reads may hold the event loop: what an API request may wait behind it. */
const defaultBurstMs = 10;

/** A buffer that reads of one file share, one read at a time: what a read returns is valid until the next. */
export class ReadBuffer {
  bytes = Buffer.allocUnsafeSlow(firstBufferBytes);
  /** A read is filling it: another read meanwhile takes a buffer of its own. */
  inUse = false;
}

/**
 * The file's bytes, read from its start to its end. The result may share its memory with a larger
 * buffer (at most twice its length): a caller that keeps it long copies it. `burstMs` is how long
 * one burst of reads may hold the event loop (default 10 ms). `into`: a buffer kept from read to
 * read, which the result then is (a view of), until the next read into it. `onRead`: given the
 * bytes read so far after each burst, a view of what the result holds, so that a caller can begin
 * on them while the kernel spells the rest; it may write over the bytes it was given.
 */
export async function readProcFile(
  path: string,
  {burstMs = defaultBurstMs, into, onRead}: {burstMs?: number; into?: ReadBuffer; onRead?: (read: Buffer) => void} = {},
): Promise<Buffer> {
  const shared = into !== undefined && !into.inUse ? into : undefined;
  if (shared) shared.inUse = true;
  try {
    return await readWhole(path, burstMs, shared, onRead);
  } finally {
    // Only once the file is closed and the bytes are the caller's: a read that began meanwhile took a buffer of its own.
    if (shared) shared.inUse = false;
  }
}

async function readWhole(
  path: string,
  burstMs: number,
  shared: ReadBuffer | undefined,
  onRead: ((read: Buffer) => void) | undefined,
): Promise<Buffer> {
  const handle = await open(path);
  try {
    let buffer = shared?.bytes ?? Buffer.allocUnsafeSlow(firstBufferBytes);
    let length = 0;
    for (;;) {
      const burstEnds = performance.now() + burstMs;
      do {
        if (buffer.length - length < roomBeforeDoubling) {
          const larger = Buffer.allocUnsafeSlow(buffer.length * 2);
          buffer.copy(larger, 0, 0, length);
          buffer = larger;
          if (shared) shared.bytes = larger;
        }
        const bytesRead = readSync(handle.fd, buffer, length, buffer.length - length, null);
        if (bytesRead === 0) return buffer.subarray(0, length);
        length += bytesRead;
      } while (performance.now() < burstEnds);
      onRead?.(buffer.subarray(0, length));
      await eventLoopTurn();
    }
  } finally {
    await handle.close();
  }
}
