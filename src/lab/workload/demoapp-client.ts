// The demo client: HTTP-over-TCP and UDP requests to a demo server that tell a reply from an
// immediate refusal (REJECT: RST or ICMP port unreachable) and from silence (DROP: timeout).
// Also a program, run inside any namespace, that makes COUNT requests one after the other:
//   node src/lab/workload/demoapp-client.ts --protocol tcp|udp --host IP --port N [--count N]
//     [--timeout-ms MS] [--source IP]
// and prints a JSON array of ProbeResults.
import {createSocket} from 'node:dgram';
import {request} from 'node:http';
import {createInterface} from 'node:readline';
import {parseArgs} from 'node:util';
import {type DemoReply, isDemoReply, plainIPv4} from './demo-reply.ts';
import {errorText} from '../../core/error-text.ts';

export type ProbeProtocol = 'tcp' | 'udp';

export interface ProbeTarget {
  protocol: ProbeProtocol;
  host: string;
  port: number;
  /** How long to wait for a reply. Default 1000 ms. */
  timeoutMs?: number;
  /** Send from this local address (a client namespace may hold several). */
  sourceIP?: string;
}

export type ProbeResult =
  /** The server answered; localAddress is the client's own address on the connection. */
  | {outcome: 'reply'; reply: DemoReply; localAddress: string; ms: number}
  /** Refused at once: TCP RST, or ICMP port unreachable. */
  | {outcome: 'refused'; ms: number}
  /** ICMP host / network unreachable, or no route. */
  | {outcome: 'unreachable'; code: string; ms: number}
  /** Nothing came back in time: dropped. */
  | {outcome: 'timeout'; ms: number}
  | {outcome: 'error'; message: string; ms: number};

const defaultTimeoutMs = 1000;
const unreachableCodes = new Set(['EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN', 'ENETDOWN']);

function failure(error: NodeJS.ErrnoException, started: number): ProbeResult {
  const ms = Date.now() - started;
  if (error.code === 'ECONNREFUSED' || error.code === 'ECONNRESET') return {outcome: 'refused', ms};
  if (error.code !== undefined && unreachableCodes.has(error.code)) return {outcome: 'unreachable', code: error.code, ms};
  return {outcome: 'error', message: `${error.code ?? ''} ${error.message}`.trim(), ms};
}

/** probeHttp opens a new TCP connection, sends GET / and reads the DemoReply. */
export function probeHttp(target: Omit<ProbeTarget, 'protocol'>): Promise<ProbeResult> {
  const started = Date.now();
  return new Promise((resolve) => {
    let settled = false;
    let localAddress = '';
    const finish = (result: ProbeResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(result);
    };
    const req = request(
      {host: target.host, port: target.port, path: '/', agent: false, localAddress: target.sourceIP, headers: {connection: 'close'}},
      (response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (body += chunk));
        response.on('end', () => {
          try {
            const reply: unknown = JSON.parse(body);
            if (isDemoReply(reply)) finish({outcome: 'reply', reply, localAddress, ms: Date.now() - started});
            else finish({outcome: 'error', message: `not a demo reply: ${body.slice(0, 200)}`, ms: Date.now() - started});
          } catch {
            finish({outcome: 'error', message: `HTTP ${response.statusCode}: ${body.slice(0, 200)}`, ms: Date.now() - started});
          }
        });
      },
    );
    req.on('socket', (socket) => socket.on('connect', () => (localAddress = plainIPv4(socket.localAddress))));
    req.on('error', (error: NodeJS.ErrnoException) => finish(failure(error, started)));
    const timer = setTimeout(() => {
      finish({outcome: 'timeout', ms: Date.now() - started});
      req.destroy();
    }, target.timeoutMs ?? defaultTimeoutMs);
    req.end();
  });
}

/**
 * probeUdp sends one datagram on a connected socket and waits for the DemoReply. Connected,
 * because only a connected UDP socket is told of an ICMP port unreachable (as ECONNREFUSED).
 */
export function probeUdp(target: Omit<ProbeTarget, 'protocol'>): Promise<ProbeResult> {
  const started = Date.now();
  return new Promise((resolve) => {
    const socket = createSocket('udp4');
    let settled = false;
    const finish = (result: ProbeResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.close();
      resolve(result);
    };
    const timer = setTimeout(() => finish({outcome: 'timeout', ms: Date.now() - started}), target.timeoutMs ?? defaultTimeoutMs);
    socket.on('error', (error: NodeJS.ErrnoException) => finish(failure(error, started)));
    socket.on('message', (message) => {
      try {
        const reply: unknown = JSON.parse(message.toString('utf8'));
        if (isDemoReply(reply)) finish({outcome: 'reply', reply, localAddress: socket.address().address, ms: Date.now() - started});
        else finish({outcome: 'error', message: `not a demo reply: ${message.toString('utf8').slice(0, 200)}`, ms: Date.now() - started});
      } catch {
        finish({outcome: 'error', message: `not JSON: ${message.toString('utf8').slice(0, 200)}`, ms: Date.now() - started});
      }
    });
    socket.bind({address: target.sourceIP, port: 0}, () => {
      socket.connect(target.port, target.host, () => {
        socket.send('hello\n', (error) => {
          if (error) finish(failure(error as NodeJS.ErrnoException, started));
        });
      });
    });
  });
}

export function probe(target: ProbeTarget): Promise<ProbeResult> {
  return target.protocol === 'udp' ? probeUdp(target) : probeHttp(target);
}

/** probeMany makes count requests one after the other, each on a new connection / socket. */
export async function probeMany(target: ProbeTarget, count: number): Promise<ProbeResult[]> {
  const results: ProbeResult[] = [];
  for (let i = 0; i < count; i++) results.push(await probe(target));
  return results;
}

/** A request to a client started with --serve: one line of JSON on its stdin. */
export interface ServedProbe {
  id: number;
  target: ProbeTarget;
}

/**
 * serveProbes answers probe requests, a line of JSON each (ServedProbe), with a line of JSON each
 * ({id, result} or {id, error}), as each completes: one process sends many probes from its
 * namespace, where starting a Node process per probe costs seconds (in an emulated machine).
 */
async function serveProbes(): Promise<void> {
  const running: Promise<void>[] = [];
  for await (const line of createInterface({input: process.stdin})) {
    if (line.trim() === '') continue;
    let asked: ServedProbe;
    try {
      asked = JSON.parse(line) as ServedProbe;
    } catch (error) {
      process.stdout.write(`${JSON.stringify({id: -1, error: `not a JSON request: ${errorText(error)}`})}\n`);
      continue;
    }
    running.push(
      probe(asked.target).then(
        (result) => void process.stdout.write(`${JSON.stringify({id: asked.id, result})}\n`),
        (error: unknown) => void process.stdout.write(`${JSON.stringify({id: asked.id, error: errorText(error)})}\n`),
      ),
    );
  }
  await Promise.all(running);
}

async function main(): Promise<void> {
  if (process.argv.slice(2).includes('--serve')) return serveProbes();
  const {values} = parseArgs({
    options: {
      protocol: {type: 'string', default: 'tcp'},
      host: {type: 'string'},
      port: {type: 'string'},
      count: {type: 'string', default: '1'},
      'timeout-ms': {type: 'string', default: String(defaultTimeoutMs)},
      source: {type: 'string'},
    },
  });
  const protocol = values.protocol;
  if (protocol !== 'tcp' && protocol !== 'udp') throw new Error(`demo client: --protocol ${protocol} is not tcp or udp`);
  if (!values.host) throw new Error('demo client: --host is required');
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`demo client: --port ${values.port} is not a port (1-65535)`);
  const count = Number(values.count);
  if (!Number.isInteger(count) || count < 1 || count > 10000) throw new Error(`demo client: --count ${values.count} is not in 1-10000`);
  const timeoutMs = Number(values['timeout-ms']);
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0)
    throw new Error(`demo client: --timeout-ms ${values['timeout-ms']} is not a positive number`);
  const results = await probeMany({protocol, host: values.host, port, timeoutMs, sourceIP: values.source}, count);
  process.stdout.write(`${JSON.stringify(results)}\n`);
}

if (import.meta.main) {
  main().catch((error: unknown) => {
    process.stderr.write(`${errorText(error)}\n`);
    process.exit(2);
  });
}
