// pods/portforward over SPDY/3.1 (kubectl's transport).
import type {IncomingMessage} from 'node:http';
import type {Duplex} from 'node:stream';
import type {KubeObject} from './object-log.ts';
import type {PodAddressResolver} from './portforward-target.ts';

export class SpdyPortForwarder {
  private readonly resolver: PodAddressResolver;
  constructor(resolver: PodAddressResolver) {
    this.resolver = resolver;
  }
  handle(_req: IncomingMessage, socket: Duplex, _head: Buffer, _pod: KubeObject): void {
    void this.resolver;
    socket.end('HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
  }
  close(): void {}
}
