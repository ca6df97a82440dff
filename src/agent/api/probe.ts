// probe: real connections to a service address, as a client on the node (or in a network namespace
// on it) would make them, grouped by the endpoint that answered. Endpoints are told apart by what
// they answer: the lab's demo app replies {pod, podIP, clientIP}; any other server counts as one
// unnamed answer. Also a program, run inside a network namespace by `ip netns exec`:
//   node src/agent/api/probe.ts --protocol TCP|UDP --ip IP --port N --count N [--timeout-ms MS]
// which prints the ProbeResult as JSON.
import {execFile} from 'node:child_process';
import {createSocket} from 'node:dgram';
import {request} from 'node:http';
import {fileURLToPath} from 'node:url';
import {parseArgs} from 'node:util';
import type {ProbeResult, ProbeTarget} from '../../protocol/methods.ts';
import {errorText} from '../../core/error-text.ts';

/** What one connection got. */
export type ProbeOutcome = {answered: string; pod?: string} | {failed: string};

export interface ProbeOptions {
  /** Wait for one answer (default 1000 ms). */
  timeoutMs?: number;
  /** Connections open at once (default 8). */
  parallel?: number;
}

const defaultTimeoutMs = 1000;
/** Endpoint name for an answer that does not say who sent it. */
export const unnamedAnswer = 'unnamed (not a demo app reply)';

function plainIPv4(address: string): string {
  return address.startsWith('::ffff:') ? address.slice(7) : address;
}

function whoAnswered(body: string): ProbeOutcome {
  try {
    const reply = JSON.parse(body) as {pod?: unknown; podIP?: unknown};
    if (typeof reply.podIP === 'string' && reply.podIP !== '')
      return {answered: plainIPv4(reply.podIP), pod: typeof reply.pod === 'string' ? reply.pod : undefined};
  } catch {
    // not JSON: some other server answered
  }
  return {answered: unnamedAnswer};
}

function failureReason(error: NodeJS.ErrnoException): string {
  switch (error.code) {
    case 'ECONNREFUSED':
    case 'ECONNRESET':
      return 'connection refused';
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return `unreachable (${error.code})`;
    default:
      return error.code ?? error.message;
  }
}

/**
 * firstOutcome runs one connection: `start` opens it and returns how to close it; the first
 * outcome it reports, or "timed out" after timeoutMs, is the answer, and the connection is closed.
 */
function firstOutcome(timeoutMs: number, start: (finish: (outcome: ProbeOutcome) => void) => () => void): Promise<ProbeOutcome> {
  return new Promise((resolve) => {
    let settled = false;
    let close: (() => void) | undefined;
    const finish = (outcome: ProbeOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      close?.();
      resolve(outcome);
    };
    const timer = setTimeout(() => finish({failed: 'timed out'}), timeoutMs);
    try {
      close = start(finish);
    } catch (error) {
      clearTimeout(timer);
      throw error;
    }
    if (settled) close();
  });
}

function probeTcp(target: ProbeTarget, timeoutMs: number): Promise<ProbeOutcome> {
  return firstOutcome(timeoutMs, (finish) => {
    const req = request({host: target.ip, port: target.port, path: '/', agent: false, headers: {connection: 'close'}}, (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (body = (body + chunk).slice(0, 4096)));
      response.on('end', () => finish(whoAnswered(body)));
      response.on('error', (error) => finish({failed: failureReason(error)}));
    });
    req.on('error', (error: NodeJS.ErrnoException) => finish({failed: failureReason(error)}));
    req.end();
    return () => req.destroy();
  });
}

function probeUdp(target: ProbeTarget, timeoutMs: number): Promise<ProbeOutcome> {
  return firstOutcome(timeoutMs, (finish) => {
    // Connected, so that an ICMP port unreachable comes back as ECONNREFUSED.
    const socket = createSocket(target.ip.includes(':') ? 'udp6' : 'udp4');
    socket.on('error', (error: NodeJS.ErrnoException) => finish({failed: failureReason(error)}));
    socket.on('message', (message) => finish(whoAnswered(message.toString('utf8'))));
    socket.connect(target.port, target.ip, () => socket.send('probe\n'));
    return () => socket.close();
  });
}

/** probeHere makes `count` connections from this process's network namespace. */
export async function probeHere(target: ProbeTarget, count: number, options: ProbeOptions = {}): Promise<ProbeResult> {
  const timeoutMs = options.timeoutMs ?? defaultTimeoutMs;
  const parallel = Math.max(1, Math.min(options.parallel ?? 8, count));
  const once = () =>
    target.protocol === 'UDP'
      ? probeUdp(target, timeoutMs)
      : target.protocol === 'TCP'
        ? probeTcp(target, timeoutMs)
        : Promise.resolve<ProbeOutcome>({failed: `${target.protocol} probes are not supported`});
  const outcomes: ProbeOutcome[] = [];
  let started = 0;
  const worker = async () => {
    while (started < count) {
      started++;
      outcomes.push(await once());
    }
  };
  await Promise.all(Array.from({length: parallel}, worker));
  return summarize(outcomes);
}

export function summarize(outcomes: ProbeOutcome[]): ProbeResult {
  const answers = new Map<string, {endpoint: string; count: number; pod?: string}>();
  const failures = new Map<string, number>();
  for (const outcome of outcomes) {
    if ('failed' in outcome) {
      failures.set(outcome.failed, (failures.get(outcome.failed) ?? 0) + 1);
      continue;
    }
    const entry = answers.get(outcome.answered) ?? {endpoint: outcome.answered, count: 0, ...(outcome.pod ? {pod: outcome.pod} : {})};
    entry.count++;
    answers.set(outcome.answered, entry);
  }
  return {
    answers: [...answers.values()].sort((a, b) => a.endpoint.localeCompare(b.endpoint)),
    failures: [...failures].map(([reason, n]) => ({reason, count: n})).sort((a, b) => a.reason.localeCompare(b.reason)),
  };
}

// This file, run as a program: .ts from source, .js when built.
const programPath = fileURLToPath(import.meta.url);

/** probeInNetns runs this file as a program inside network namespace `netns` (a process lives in one namespace). */
export function probeInNetns(netns: string, target: ProbeTarget, count: number, options: ProbeOptions = {}): Promise<ProbeResult> {
  const timeoutMs = options.timeoutMs ?? defaultTimeoutMs;
  const args = [
    'netns',
    'exec',
    netns,
    process.execPath,
    programPath,
    '--protocol',
    target.protocol,
    '--ip',
    target.ip,
    '--port',
    String(target.port),
    '--count',
    String(count),
    '--timeout-ms',
    String(timeoutMs),
  ];
  const deadline = Math.ceil(count / (options.parallel ?? 8)) * timeoutMs + 10_000;
  return new Promise((resolve, reject) => {
    execFile('ip', args, {timeout: deadline, maxBuffer: 1024 * 1024}, (error, stdout, stderr) => {
      if (error) {
        const detail = (stderr.trim().split('\n').at(-1) ?? '') || error.message;
        reject(new Error(`probe from network namespace ${netns}: ${detail}`));
        return;
      }
      try {
        resolve(JSON.parse(stdout) as ProbeResult);
      } catch {
        reject(new Error(`probe from network namespace ${netns}: unreadable output: ${stdout.slice(0, 200)}`));
      }
    });
  });
}

async function main(): Promise<void> {
  const {values} = parseArgs({
    options: {
      protocol: {type: 'string'},
      ip: {type: 'string'},
      port: {type: 'string'},
      count: {type: 'string'},
      'timeout-ms': {type: 'string'},
    },
  });
  const protocol = values.protocol;
  if (protocol !== 'TCP' && protocol !== 'UDP' && protocol !== 'SCTP')
    throw new Error(`probe: --protocol ${protocol} is not TCP, UDP or SCTP`);
  const port = Number(values.port);
  const count = Number(values.count ?? '1');
  const timeoutMs = Number(values['timeout-ms'] ?? defaultTimeoutMs);
  if (!values.ip) throw new Error('probe: --ip is required');
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`probe: --port ${values.port} is not a port (1-65535)`);
  if (!Number.isInteger(count) || count < 1 || count > 1000) throw new Error(`probe: --count ${values.count} is not in 1-1000`);
  const result = await probeHere({protocol, ip: values.ip, port}, count, {timeoutMs});
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

if (import.meta.main) {
  main().catch((error: unknown) => {
    process.stderr.write(`${errorText(error)}\n`);
    process.exit(2);
  });
}
