// pods/portforward over WebSocket (the channel protocol client-node speaks): per requested port a data
// channel 2i and an error channel 2i+1; the first frame the server sends on each carries the port (2 bytes LE).
import type {IncomingMessage} from 'node:http';
import type {Duplex} from 'node:stream';
import {WebSocketServer, type WebSocket} from 'ws';
import type {KubeObject} from './object-log.ts';
import {dialPod, portForwardError, type PodAddressResolver} from './portforward-target.ts';

export const webSocketPortForwardProtocols = [
  'v4.channel.k8s.io',
  'portforward.k8s.io',
  'v5.channel.k8s.io',
  'v3.channel.k8s.io',
  'v2.channel.k8s.io',
  'channel.k8s.io',
];

export class WebSocketPortForwarder {
  private readonly wss: WebSocketServer;
  private readonly resolver: PodAddressResolver;
  private readonly open = new Set<WebSocket>();

  constructor(resolver: PodAddressResolver) {
    this.resolver = resolver;
    this.wss = new WebSocketServer({
      noServer: true,
      perMessageDeflate: false,
      handleProtocols: (offered) => webSocketPortForwardProtocols.find((p) => offered.has(p)) ?? false,
    });
  }

  handle(req: IncomingMessage, socket: Duplex, head: Buffer, pod: KubeObject, ports: number[]): void {
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      this.open.add(ws);
      ws.once('close', () => this.open.delete(ws));
      this.serve(ws, pod, ports);
    });
  }

  private serve(ws: WebSocket, pod: KubeObject, ports: number[]): void {
    const streams: Array<Duplex | undefined> = [];
    const pendingInput: Buffer[][] = ports.map(() => []);
    const frame = (channel: number, data: Buffer) => Buffer.concat([Buffer.from([channel]), data]);
    const portPrefix = (port: number) => Buffer.from([port & 0xff, (port >> 8) & 0xff]);
    let closed = false;
    const closeAll = () => {
      if (closed) return;
      closed = true;
      for (const s of streams) s?.destroy();
      if (ws.readyState === ws.OPEN) ws.close(1000);
    };
    ports.forEach((port, i) => {
      ws.send(frame(2 * i, portPrefix(port)));
      ws.send(frame(2 * i + 1, portPrefix(port)));
    });
    ports.forEach((port, i) => {
      dialPod(this.resolver, pod, port).then(
        (stream) => {
          if (closed) {
            stream.destroy();
            return;
          }
          streams[i] = stream;
          for (const chunk of pendingInput[i]) stream.write(chunk);
          pendingInput[i] = [];
          stream.on('data', (chunk: Buffer) => {
            if (ws.readyState === ws.OPEN) ws.send(frame(2 * i, chunk));
          });
          stream.on('error', (err) => {
            if (ws.readyState === ws.OPEN) ws.send(frame(2 * i + 1, Buffer.from(portForwardError(pod, port, err))));
          });
          stream.on('close', closeAll);
        },
        (err) => {
          if (ws.readyState === ws.OPEN) ws.send(frame(2 * i + 1, Buffer.from(portForwardError(pod, port, err))));
          closeAll();
        },
      );
    });
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      const buf = isBinary ? data : Buffer.from(data.toString(), 'utf8');
      if (buf.length === 0) return;
      const channel = buf[0];
      if (channel === 255) return; // v5 close-stream signal
      if (channel % 2 !== 0) return;
      const index = channel / 2;
      if (index >= ports.length) return;
      const payload = buf.subarray(1);
      if (payload.length === 0) return;
      const stream = streams[index];
      if (stream) stream.write(payload);
      else pendingInput[index].push(Buffer.from(payload));
    });
    ws.on('close', closeAll);
    ws.on('error', closeAll);
  }

  close(): void {
    for (const ws of this.open) ws.terminate();
    this.wss.close();
  }
}
