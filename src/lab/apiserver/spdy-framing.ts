// SPDY/3 framing as kubectl's port-forward speaks it: frame parsing and building, header blocks.
import {constants, createInflate, type Inflate} from 'node:zlib';

export const frameType = {synStream: 1, synReply: 2, rstStream: 3, settings: 4, ping: 6, goAway: 7, headers: 8, windowUpdate: 9} as const;
export const flagFin = 0x01;
const spdyVersion = 3;

/** The preset zlib dictionary of SPDY/3 header blocks (draft 3, section 2.6.10.1). */
export const headerDictionary: Buffer = (() => {
  const words = [
    'options',
    'head',
    'post',
    'put',
    'delete',
    'trace',
    'accept',
    'accept-charset',
    'accept-encoding',
    'accept-language',
    'accept-ranges',
    'age',
    'allow',
    'authorization',
    'cache-control',
    'connection',
    'content-base',
    'content-encoding',
    'content-language',
    'content-length',
    'content-location',
    'content-md5',
    'content-range',
    'content-type',
    'date',
    'etag',
    'expect',
    'expires',
    'from',
    'host',
    'if-match',
    'if-modified-since',
    'if-none-match',
    'if-range',
    'if-unmodified-since',
    'last-modified',
    'location',
    'max-forwards',
    'pragma',
    'proxy-authenticate',
    'proxy-authorization',
    'range',
    'referer',
    'retry-after',
    'server',
    'te',
    'trailer',
    'transfer-encoding',
    'upgrade',
    'user-agent',
    'vary',
    'via',
    'warning',
    'www-authenticate',
    'method',
    'get',
    'status',
    '200 OK',
    'version',
    'HTTP/1.1',
    'url',
    'public',
    'set-cookie',
    'keep-alive',
    'origin',
  ];
  const tail =
    '100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505203 Non-Authoritative Information204 No Content' +
    '301 Moved Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable' +
    'Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,' +
    'application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.';
  const parts = words.map((w) => {
    const b = Buffer.alloc(4 + w.length);
    b.writeUInt32BE(w.length);
    b.write(w, 4, 'latin1');
    return b;
  });
  return Buffer.concat([...parts, Buffer.from(tail, 'latin1')]);
})();

export type Frame =
  | {control: true; type: number; flags: number; payload: Buffer}
  | {control: false; streamId: number; flags: number; data: Buffer};

/** Splits a byte stream into frames; keeps the incomplete rest for the next call. */
export class FrameReader {
  private pending: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): Frame[] {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    const frames: Frame[] = [];
    while (this.pending.length >= 8) {
      const length = this.pending.readUIntBE(5, 3);
      if (this.pending.length < 8 + length) break;
      const flags = this.pending[4];
      const body = this.pending.subarray(8, 8 + length);
      if (this.pending[0] & 0x80) {
        const version = this.pending.readUInt16BE(0) & 0x7fff;
        if (version !== spdyVersion) throw new Error(`SPDY version ${version} is not supported`);
        frames.push({control: true, type: this.pending.readUInt16BE(2), flags, payload: Buffer.from(body)});
      } else {
        frames.push({control: false, streamId: this.pending.readUInt32BE(0) & 0x7fffffff, flags, data: Buffer.from(body)});
      }
      this.pending = this.pending.subarray(8 + length);
    }
    return frames;
  }
}

function controlFrame(type: number, flags: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt16BE(0x8000 | spdyVersion, 0);
  head.writeUInt16BE(type, 2);
  head[4] = flags;
  head.writeUIntBE(payload.length, 5, 3);
  return Buffer.concat([head, payload]);
}

export function dataFrame(streamId: number, data: Buffer, flags = 0): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(streamId & 0x7fffffff, 0);
  head[4] = flags;
  head.writeUIntBE(data.length, 5, 3);
  return Buffer.concat([head, data]);
}

export function synReplyFrame(streamId: number, headerBlock: Buffer): Buffer {
  const id = Buffer.alloc(4);
  id.writeUInt32BE(streamId & 0x7fffffff);
  return controlFrame(frameType.synReply, 0, Buffer.concat([id, headerBlock]));
}

export function pingFrame(id: number): Buffer {
  const p = Buffer.alloc(4);
  p.writeUInt32BE(id >>> 0);
  return controlFrame(frameType.ping, 0, p);
}

export function rstStreamFrame(streamId: number, status: number): Buffer {
  const p = Buffer.alloc(8);
  p.writeUInt32BE(streamId & 0x7fffffff, 0);
  p.writeUInt32BE(status, 4);
  return controlFrame(frameType.rstStream, 0, p);
}

export function goAwayFrame(lastGoodStreamId: number): Buffer {
  const p = Buffer.alloc(8);
  p.writeUInt32BE(lastGoodStreamId & 0x7fffffff, 0);
  return controlFrame(frameType.goAway, 0, p);
}

export function encodeHeaders(headers: Record<string, string>): Buffer {
  const entries = Object.entries(headers);
  const parts: Buffer[] = [Buffer.alloc(4)];
  parts[0].writeUInt32BE(entries.length);
  for (const [name, value] of entries) {
    for (const text of [name.toLowerCase(), value]) {
      const b = Buffer.from(text, 'utf8');
      const len = Buffer.alloc(4);
      len.writeUInt32BE(b.length);
      parts.push(len, b);
    }
  }
  return Buffer.concat(parts);
}

export function decodeHeaders(block: Buffer): Record<string, string> {
  const headers: Record<string, string> = {};
  let offset = 0;
  const read = () => {
    const len = block.readUInt32BE(offset);
    offset += 4;
    const text = block.subarray(offset, offset + len).toString('utf8');
    offset += len;
    return text;
  };
  const count = block.readUInt32BE(offset);
  offset += 4;
  for (let i = 0; i < count; i++) {
    const name = read();
    headers[name.toLowerCase()] = read();
  }
  return headers;
}

/**
 * Outgoing header blocks: one zlib stream per connection, written as stored (uncompressed) deflate blocks,
 * each ending on a byte boundary the way a sync flush does. Any zlib reader decodes it; no dictionary needed.
 */
export class HeaderWriter {
  private started = false;

  block(headers: Record<string, string>): Buffer {
    const raw = encodeHeaders(headers);
    const stored = Buffer.alloc(5);
    stored[0] = 0x00; // BFINAL=0, BTYPE=00 (stored)
    stored.writeUInt16LE(raw.length, 1);
    stored.writeUInt16LE(~raw.length & 0xffff, 3);
    // An empty stored block after the data, as a sync flush writes it, makes inflaters (Go's flate among them)
    // hand out the block's bytes without first reading ahead into the next frame.
    const syncMarker = Buffer.from([0x00, 0x00, 0x00, 0xff, 0xff]);
    const out = this.started
      ? Buffer.concat([stored, raw, syncMarker])
      : Buffer.concat([Buffer.from([0x78, 0x01]), stored, raw, syncMarker]);
    this.started = true;
    return out;
  }
}

/** Incoming header blocks: one zlib stream per connection with the SPDY dictionary, sync-flushed per block. */
export class HeaderReader {
  private readonly inflate: Inflate = createInflate({dictionary: headerDictionary});

  read(block: Buffer): Promise<Record<string, string>> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      const onData = (c: Buffer) => chunks.push(c);
      const onError = (err: Error) => {
        this.inflate.off('data', onData);
        reject(err);
      };
      this.inflate.on('data', onData);
      this.inflate.once('error', onError);
      this.inflate.write(block);
      this.inflate.flush(constants.Z_SYNC_FLUSH, () => {
        this.inflate.off('data', onData);
        this.inflate.off('error', onError);
        try {
          resolve(decodeHeaders(Buffer.concat(chunks)));
        } catch (err) {
          reject(err);
        }
      });
    });
  }

  close(): void {
    this.inflate.destroy();
  }
}
