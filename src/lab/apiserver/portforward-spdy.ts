// pods/portforward over SPDY/3.1, kubectl's transport: the client opens an error stream and a data stream
// per connection (headers streamtype, port, requestid); the server replies, dials the pod port and copies.
import type {IncomingMessage} from 'node:http';
import type {Duplex} from 'node:stream';
import type {KubeObject} from './object-log.ts';
import {dialPod, portForwardError, type PodAddressResolver} from './portforward-target.ts';
import {
  dataFrame,
  flagFin,
  FrameReader,
  frameType,
  goAwayFrame,
  HeaderReader,
  HeaderWriter,
  pingFrame,
  rstStreamFrame,
  synReplyFrame,
  type Frame,
} from './spdy-framing.ts';

const portForwardProtocol = 'portforward.k8s.io';
const maxDataFrame = 32 * 1024;
const rstCancel = 5;

interface ForwardRequest {
  port: number;
  dataStream?: number;
  errorStream?: number;
  target?: Duplex;
  pendingInput: Buffer[];
  inputEnded: boolean;
  dialing: boolean;
}

class SpdyPortForwardSession {
  private readonly socket: Duplex;
  private readonly pod: KubeObject;
  private readonly resolver: PodAddressResolver;
  private readonly frames = new FrameReader();
  private readonly headersIn = new HeaderReader();
  private readonly headersOut = new HeaderWriter();
  private readonly requests = new Map<string, ForwardRequest>();
  private readonly requestOfStream = new Map<number, string>();
  private readonly closedOut = new Set<number>();
  private queue: Promise<void> = Promise.resolve();
  private lastStream = 0;
  private closed = false;

  constructor(socket: Duplex, pod: KubeObject, resolver: PodAddressResolver, head: Buffer) {
    this.socket = socket;
    this.pod = pod;
    this.resolver = resolver;
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('error', () => this.close());
    socket.on('close', () => this.close());
    if (head.length > 0) this.receive(head);
  }

  private receive(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.frames.push(chunk);
    } catch {
      this.close();
      return;
    }
    // Header blocks share one zlib stream, so frames are handled strictly in order.
    for (const frame of frames) this.queue = this.queue.then(() => this.handle(frame)).catch(() => this.close());
  }

  private async handle(frame: Frame): Promise<void> {
    if (this.closed) return;
    if (!frame.control) {
      this.onData(frame.streamId, frame.data, (frame.flags & flagFin) !== 0);
      return;
    }
    const p = frame.payload;
    switch (frame.type) {
      case frameType.synStream: {
        const streamId = p.readUInt32BE(0) & 0x7fffffff;
        const headers = await this.headersIn.read(p.subarray(10));
        this.lastStream = Math.max(this.lastStream, streamId);
        this.send(synReplyFrame(streamId, this.headersOut.block({})));
        this.onStream(streamId, headers, (frame.flags & flagFin) !== 0);
        break;
      }
      case frameType.headers:
        await this.headersIn.read(p.subarray(4));
        break;
      case frameType.ping:
        this.send(pingFrame(p.readUInt32BE(0)));
        break;
      case frameType.rstStream:
        this.onReset(p.readUInt32BE(0) & 0x7fffffff);
        break;
      case frameType.goAway:
        this.close();
        break;
      // SETTINGS and WINDOW_UPDATE need no answer: kubectl's spdystream does not enforce flow-control windows.
    }
  }

  private onStream(streamId: number, headers: Record<string, string>, finished: boolean): void {
    const requestId = headers.requestid ?? '';
    const port = Number(headers.port);
    let request = this.requests.get(requestId);
    if (!request) {
      request = {port, pendingInput: [], inputEnded: false, dialing: false};
      this.requests.set(requestId, request);
    }
    this.requestOfStream.set(streamId, requestId);
    if (headers.streamtype === 'error') request.errorStream = streamId;
    else if (headers.streamtype === 'data') {
      request.dataStream = streamId;
      if (finished) request.inputEnded = true;
    } else {
      this.send(rstStreamFrame(streamId, 1));
      return;
    }
    if (request.dataStream !== undefined && request.errorStream !== undefined && !request.dialing) {
      request.dialing = true;
      void this.connect(requestId, request);
    }
  }

  private async connect(requestId: string, request: ForwardRequest): Promise<void> {
    if (!Number.isInteger(request.port) || request.port < 1 || request.port > 65535) {
      this.fail(request, new Error(`invalid port ${request.port}`));
      return;
    }
    let target: Duplex;
    try {
      target = await dialPod(this.resolver, this.pod, request.port);
    } catch (err) {
      this.fail(request, err);
      return;
    }
    if (this.closed || !this.requests.has(requestId)) {
      target.destroy();
      return;
    }
    request.target = target;
    for (const chunk of request.pendingInput) target.write(chunk);
    request.pendingInput = [];
    if (request.inputEnded) target.end();
    target.on('data', (chunk: Buffer) => {
      for (let i = 0; i < chunk.length; i += maxDataFrame) this.send(dataFrame(request.dataStream!, chunk.subarray(i, i + maxDataFrame)));
    });
    target.on('error', (err) => this.fail(request, err));
    target.on('close', () => this.finish(requestId, request));
  }

  private onData(streamId: number, data: Buffer, fin: boolean): void {
    const requestId = this.requestOfStream.get(streamId);
    const request = requestId === undefined ? undefined : this.requests.get(requestId);
    if (!request || streamId !== request.dataStream) return; // the client only half-closes its error stream
    if (data.length > 0) {
      if (request.target) request.target.write(data);
      else request.pendingInput.push(data);
    }
    if (fin) {
      request.inputEnded = true;
      request.target?.end();
    }
  }

  private onReset(streamId: number): void {
    const requestId = this.requestOfStream.get(streamId);
    const request = requestId === undefined ? undefined : this.requests.get(requestId);
    if (!request) return;
    this.closedOut.add(streamId);
    request.target?.destroy();
  }

  private fail(request: ForwardRequest, err: unknown): void {
    if (request.errorStream !== undefined && !this.closedOut.has(request.errorStream)) {
      this.send(dataFrame(request.errorStream, Buffer.from(portForwardError(this.pod, request.port, err))));
    }
    request.target?.destroy();
    this.endStream(request.errorStream);
    this.endStream(request.dataStream);
  }

  private finish(requestId: string, request: ForwardRequest): void {
    this.endStream(request.dataStream);
    this.endStream(request.errorStream);
    this.requests.delete(requestId);
  }

  private endStream(streamId: number | undefined): void {
    if (streamId === undefined || this.closedOut.has(streamId)) return;
    this.closedOut.add(streamId);
    this.send(dataFrame(streamId, Buffer.alloc(0), flagFin));
  }

  private send(frame: Buffer): void {
    if (!this.closed && this.socket.writable) this.socket.write(frame);
  }

  close(): void {
    if (this.closed) return;
    this.send(goAwayFrame(this.lastStream));
    this.closed = true;
    for (const request of this.requests.values()) request.target?.destroy();
    this.requests.clear();
    this.headersIn.close();
    this.socket.destroy();
  }

  cancel(): void {
    for (const request of this.requests.values())
      if (request.dataStream !== undefined) this.send(rstStreamFrame(request.dataStream, rstCancel));
    this.close();
  }
}

export class SpdyPortForwarder {
  private readonly resolver: PodAddressResolver;
  private readonly sessions = new Set<SpdyPortForwardSession>();

  constructor(resolver: PodAddressResolver) {
    this.resolver = resolver;
  }

  handle(req: IncomingMessage, socket: Duplex, head: Buffer, pod: KubeObject): void {
    const offered = String(req.headers['x-stream-protocol-version'] ?? '')
      .split(',')
      .map((s) => s.trim());
    if (!offered.includes(portForwardProtocol)) {
      const body = `unable to upgrade: unable to negotiate protocol: client supports ${JSON.stringify(offered)}, server supports ["${portForwardProtocol}"]`;
      socket.end(
        `HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
      return;
    }
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${portForwardProtocol}\r\n\r\n`,
    );
    const session = new SpdyPortForwardSession(socket, pod, this.resolver, head);
    this.sessions.add(session);
    socket.once('close', () => this.sessions.delete(session));
  }

  close(): void {
    for (const session of this.sessions) session.cancel();
    this.sessions.clear();
  }
}
