// The demo workload, run as its own process inside a pod's namespace: an HTTP server and a UDP
// echo that both answer {pod, podIP, clientIP}, so a test can see which endpoint a service picked
// and whether the client's address was rewritten on the way.
//   node src/lab/workload/demoapp.ts --name POD --http-port 8080 --udp-port 5353
// Prints one JSON line {"ready":true,...} on stdout once both listen.
import {createSocket, type Socket} from 'node:dgram';
import {createServer, type Server} from 'node:http';
import {networkInterfaces} from 'node:os';
import {parseArgs} from 'node:util';
import {type DemoReply, plainIPv4} from './demo-reply.ts';
import {errorText} from '../../core/error-text.ts';

export interface DemoAppOptions {
  name: string;
  httpPort: number;
  udpPort: number;
}

export interface DemoAppServer {
  httpPort: number;
  udpPort: number;
  close(): Promise<void>;
}

/** startDemoServer listens for HTTP on every address and for UDP on each IPv4 address it holds. */
export async function startDemoServer(options: DemoAppOptions): Promise<DemoAppServer> {
  const http = createServer((request, response) => {
    const reply: DemoReply = {
      pod: options.name,
      podIP: plainIPv4(request.socket.localAddress),
      clientIP: plainIPv4(request.socket.remoteAddress),
      protocol: 'tcp',
    };
    const body = `${JSON.stringify(reply)}\n`;
    response.writeHead(200, {'content-type': 'application/json', 'content-length': Buffer.byteLength(body), connection: 'close'});
    response.end(body);
  });
  await listen(http, options.httpPort, options.name);

  // One socket per address, because a socket bound to 0.0.0.0 cannot tell which of its addresses
  // a datagram was sent to, and the reply must leave from the address the client (or DNAT) chose.
  const udpSockets: Socket[] = [];
  for (const address of localIPv4Addresses()) {
    const socket = createSocket('udp4');
    socket.on('message', (_message, remote) => {
      const reply: DemoReply = {pod: options.name, podIP: address, clientIP: remote.address, protocol: 'udp'};
      socket.send(`${JSON.stringify(reply)}\n`, remote.port, remote.address);
    });
    await new Promise<void>((resolve, reject) => {
      socket.once('error', (error) =>
        reject(new Error(`demo app ${options.name}: UDP ${address}:${options.udpPort}: ${error.message}`, {cause: error})),
      );
      socket.bind(options.udpPort, address, () => resolve());
    });
    udpSockets.push(socket);
  }

  return {
    httpPort: options.httpPort,
    udpPort: options.udpPort,
    async close() {
      for (const socket of udpSockets) socket.close();
      http.closeAllConnections();
      await new Promise<void>((resolve) => http.close(() => resolve()));
    },
  };
}

function listen(server: Server, port: number, name: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', (error) => reject(new Error(`demo app ${name}: HTTP port ${port}: ${error.message}`, {cause: error})));
    server.listen(port, () => resolve());
  });
}

function localIPv4Addresses(): string[] {
  return Object.values(networkInterfaces())
    .flatMap((addresses) => addresses ?? [])
    .filter((address) => address.family === 'IPv4')
    .map((address) => address.address);
}

function parsePort(text: string | undefined, flag: string, fallback: number): number {
  if (text === undefined) return fallback;
  const port = Number(text);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`demo app: ${flag} ${text} is not a port (1-65535)`);
  return port;
}

async function main(): Promise<void> {
  const {values} = parseArgs({options: {name: {type: 'string'}, 'http-port': {type: 'string'}, 'udp-port': {type: 'string'}}});
  const options: DemoAppOptions = {
    name: values.name ?? 'demo',
    httpPort: parsePort(values['http-port'], '--http-port', 8080),
    udpPort: parsePort(values['udp-port'], '--udp-port', 5353),
  };
  const server = await startDemoServer(options);
  const stop = () => void server.close().then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.stdout.write(
    `${JSON.stringify({ready: true, pod: options.name, httpPort: options.httpPort, udpPort: options.udpPort, pid: process.pid})}\n`,
  );
}

if (import.meta.main) {
  main().catch((error: unknown) => {
    process.stderr.write(`${errorText(error)}\n`);
    process.exit(1);
  });
}
