// A long-lived UDP flow, run inside a pod namespace: one socket, one source port, a datagram every
// --interval-ms to HOST:PORT for as long as it runs; each demo reply is printed as one JSON line
// {"ms": <since start>, "pod": <who answered>}. Without a reply nothing is printed.
//   node test/agent/live/udp-flow.ts --host 10.96.0.53 --port 53 [--interval-ms 50]
import {createSocket} from 'node:dgram';
import {parseArgs} from 'node:util';

const {values} = parseArgs({options: {host: {type: 'string'}, port: {type: 'string'}, 'interval-ms': {type: 'string', default: '50'}}});
const port = Number(values.port);
if (!values.host || !Number.isInteger(port)) {
  process.stderr.write('udp-flow: --host and --port are required\n');
  process.exit(2);
}
const started = Date.now();
const socket = createSocket('udp4');
socket.on('message', (message) => {
  try {
    const reply = JSON.parse(message.toString('utf8')) as {pod?: unknown};
    process.stdout.write(`${JSON.stringify({ms: Date.now() - started, pod: reply.pod})}\n`);
  } catch {
    // not a demo reply: ignore
  }
});
// A refusal (ICMP port unreachable while no endpoint exists) must not end the flow.
socket.on('error', () => {});
socket.bind(0, () => {
  const send = () => socket.send('hello\n', port, values.host);
  send();
  setInterval(send, Number(values['interval-ms']));
});
