// The demo workload, run as its own process inside a pod's namespace: an HTTP server and a UDP
// echo that both answer {pod, podIP, clientIP}, so a test can see which endpoint a service picked
// and whether the client's address was rewritten on the way.
//   node src/lab/workload/demoapp.ts --name POD --http-port 8080 --udp-port 5353 [--access-log] [--drain-ms N] [--wait-for-address IP]
// Each port flag may repeat (a lab pod serves every port its containers declare). Prints one JSON
// line {"ready":true,...} on stdout once all listen; with --access-log, one line per request after
// it (what `kubectl logs` shows). On SIGTERM it keeps serving for --drain-ms, as a server that
// drains before it stops, so that proxies can take it out of their rules first; then it exits.
import {createSocket, type Socket} from 'node:dgram';
import {createServer, type Server} from 'node:http';
import {networkInterfaces} from 'node:os';
import {parseArgs} from 'node:util';
import {type DemoReply, plainIPv4} from './demo-reply.ts';
import {errorText} from '../../core/error-text.ts';

export interface DemoAppOptions {
  name: string;
  httpPorts: number[];
  udpPorts: number[];
  /** Called with one line per request served. */
  log?: (line: string) => void;
  /** An address the namespace is about to get: UDP sockets are bound once it is there. */
  waitForAddress?: string;
}

export interface DemoAppServer {
  close(): Promise<void>;
}

/** startDemoServer listens for HTTP on every address and for UDP on each IPv4 address it holds, on every port given. */
export async function startDemoServer(options: DemoAppOptions): Promise<DemoAppServer> {
  const servers = await Promise.all(options.httpPorts.map((port) => startHttp(options, port)));
  if (options.waitForAddress && options.udpPorts.length > 0) await addressPresent(options.waitForAddress);
  const sockets = (await Promise.all(options.udpPorts.map((port) => startUdp(options, port)))).flat();
  return {
    async close() {
      for (const socket of sockets) socket.close();
      await Promise.all(
        servers.map((http) => {
          http.closeAllConnections();
          return new Promise<void>((resolve) => http.close(() => resolve()));
        }),
      );
    },
  };
}

async function startHttp(options: DemoAppOptions, port: number): Promise<Server> {
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
    options.log?.(`${new Date().toISOString()} ${request.method} ${request.url} port ${port} from ${reply.clientIP} 200`);
  });
  await listen(http, port, options.name);
  return http;
}

async function startUdp(options: DemoAppOptions, port: number): Promise<Socket[]> {
  // One socket per address, because a socket bound to 0.0.0.0 cannot tell which of its addresses
  // a datagram was sent to, and the reply must leave from the address the client (or DNAT) chose.
  const udpSockets: Socket[] = [];
  for (const address of localIPv4Addresses()) {
    const socket = createSocket('udp4');
    socket.on('message', (_message, remote) => {
      const reply: DemoReply = {pod: options.name, podIP: address, clientIP: remote.address, protocol: 'udp'};
      socket.send(`${JSON.stringify(reply)}\n`, remote.port, remote.address);
      options.log?.(`${new Date().toISOString()} UDP port ${port} from ${remote.address}:${remote.port}`);
    });
    await new Promise<void>((resolve, reject) => {
      socket.once('error', (error) =>
        reject(new Error(`demo app ${options.name}: UDP ${address}:${port}: ${error.message}`, {cause: error})),
      );
      socket.bind(port, address, () => resolve());
    });
    udpSockets.push(socket);
  }
  return udpSockets;
}

function listen(server: Server, port: number, name: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', (error) => reject(new Error(`demo app ${name}: HTTP port ${port}: ${error.message}`, {cause: error})));
    server.listen(port, () => resolve());
  });
}

/** addressPresent resolves once the namespace holds address (its kubelet is still setting it), or after 5 s. */
async function addressPresent(address: string): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!localIPv4Addresses().includes(address) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5));
}

function localIPv4Addresses(): string[] {
  return Object.values(networkInterfaces())
    .flatMap((addresses) => addresses ?? [])
    .filter((address) => address.family === 'IPv4')
    .map((address) => address.address);
}

function parsePorts(texts: string[] | undefined, flag: string): number[] {
  return (texts ?? []).map((text) => {
    const port = Number(text);
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`demo app: ${flag} ${text} is not a port (1-65535)`);
    return port;
  });
}

async function main(): Promise<void> {
  const {values} = parseArgs({
    options: {
      name: {type: 'string'},
      'http-port': {type: 'string', multiple: true},
      'udp-port': {type: 'string', multiple: true},
      'access-log': {type: 'boolean'},
      'drain-ms': {type: 'string'},
      'wait-for-address': {type: 'string'},
    },
  });
  const drainMs = Number(values['drain-ms'] ?? 0);
  if (!Number.isInteger(drainMs) || drainMs < 0)
    throw new Error(`demo app: --drain-ms ${values['drain-ms']} is not a number of milliseconds`);
  const httpPorts = parsePorts(values['http-port'], '--http-port');
  const udpPorts = parsePorts(values['udp-port'], '--udp-port');
  const log = values['access-log'] ? (line: string) => process.stdout.write(`${line}\n`) : undefined;
  const options: DemoAppOptions = {
    name: values.name ?? 'demo',
    httpPorts: httpPorts.length + udpPorts.length > 0 ? httpPorts : [8080],
    udpPorts,
    log,
    waitForAddress: values['wait-for-address'],
  };
  const server = await startDemoServer(options);
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log?.(`${new Date().toISOString()} ${signal}: serving ${drainMs} ms more, then exiting`);
    setTimeout(() => void server.close().then(() => process.exit(0)), signal === 'SIGTERM' ? drainMs : 0);
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  process.stdout.write(
    `${JSON.stringify({ready: true, pod: options.name, httpPorts: options.httpPorts, udpPorts: options.udpPorts, pid: process.pid})}\n`,
  );
}

if (import.meta.main) {
  main().catch((error: unknown) => {
    process.stderr.write(`${errorText(error)}\n`);
    process.exit(1);
  });
}
