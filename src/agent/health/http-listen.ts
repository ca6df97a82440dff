// listenHttp: start an HTTP server on "IP:port" and learn the port it got (for port 0).
import {createServer, type RequestListener, type Server} from 'node:http';
import type {AddressInfo} from 'node:net';
import {bindInNetns} from './netns-bind.ts';

export interface HttpEndpoint {
  server: Server;
  host: string;
  port: number;
  /** "http://host:port", IPv6 hosts in brackets. */
  url: string;
  close(): Promise<void>;
}

export interface ListenOptions {
  /** Listen inside this network namespace (the socket is bound there; the server runs here). */
  netns?: string;
}

export async function listenHttp(host: string, port: number, handler: RequestListener, options: ListenOptions = {}): Promise<HttpEndpoint> {
  const server = createServer(handler);
  // Probes and scrapes are short; do not let idle keep-alive sockets hold shutdown.
  server.keepAliveTimeout = 5000;
  const socket = options.netns ? await bindInNetns(options.netns, host, port) : {host, port};
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socket, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const urlHost = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return {
    server,
    host: address.address,
    port: address.port,
    url: `http://${urlHost}:${address.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
