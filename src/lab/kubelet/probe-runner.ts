// Readiness probes as a node's kubelet sends them: this process runs in a lab node's network
// namespace (a process lives in one) and answers probe requests from the kubelet, one JSON line
// each way:
//   in:  {"id":1,"kind":"http","host":"10.244.1.5","port":8080,"path":"/healthz","timeoutMs":1000}
//   out: {"id":1,"ok":false,"message":"Get \"http://10.244.1.5:8080/healthz\": connect ECONNREFUSED"}
import {request} from 'node:http';
import {connect} from 'node:net';
import {createInterface} from 'node:readline';

export interface ProbeRequest {
  id: number;
  kind: 'http' | 'tcp';
  host: string;
  port: number;
  path?: string;
  timeoutMs: number;
}

export interface ProbeAnswer {
  id: number;
  ok: boolean;
  message: string;
}

function httpProbe(probe: ProbeRequest): Promise<ProbeAnswer> {
  const url = `http://${probe.host}:${probe.port}${probe.path ?? '/'}`;
  return new Promise((resolve) => {
    const req = request(url, {timeout: probe.timeoutMs, headers: {'user-agent': 'kube-probe/1.34'}}, (res) => {
      res.resume();
      const code = res.statusCode ?? 0;
      const ok = code >= 200 && code < 400;
      resolve({
        id: probe.id,
        ok,
        message: ok ? `HTTP probe succeeded with statuscode: ${code}` : `HTTP probe failed with statuscode: ${code}`,
      });
    });
    req.on('timeout', () => req.destroy(new Error('context deadline exceeded (Client.Timeout exceeded while awaiting headers)')));
    req.on('error', (error) => resolve({id: probe.id, ok: false, message: `Get "${url}": ${error.message}`}));
    req.end();
  });
}

function tcpProbe(probe: ProbeRequest): Promise<ProbeAnswer> {
  return new Promise((resolve) => {
    const socket = connect({host: probe.host, port: probe.port, timeout: probe.timeoutMs});
    const done = (ok: boolean, message: string) => {
      socket.destroy();
      resolve({id: probe.id, ok, message});
    };
    socket.once('connect', () => done(true, ''));
    socket.once('timeout', () => done(false, `dial tcp ${probe.host}:${probe.port}: i/o timeout`));
    socket.once('error', (error) => done(false, `dial tcp ${probe.host}:${probe.port}: ${error.message}`));
  });
}

/** runProbe: one probe from this process's namespace (the host's, for servers the lab moved to loopback). */
export function runProbe(probe: ProbeRequest): Promise<ProbeAnswer> {
  return probe.kind === 'http' ? httpProbe(probe) : tcpProbe(probe);
}

if (import.meta.main) {
  const lines = createInterface({input: process.stdin});
  lines.on('line', (line) => {
    let probe: ProbeRequest;
    try {
      probe = JSON.parse(line) as ProbeRequest;
    } catch {
      return;
    }
    void runProbe(probe).then((answer) => process.stdout.write(`${JSON.stringify(answer)}\n`));
  });
  lines.on('close', () => process.exit(0));
}
