// Times TCP connection set-up, run inside a namespace:
//   node bench/connect-timer.ts HOST PORT COUNT
// Opens COUNT connections one after the other, each closed once established, and prints a JSON
// array of connect times in milliseconds (the first packet's trip through the proxy rules).
import {connect} from 'node:net';

const [host, portText, countText] = process.argv.slice(2);
const port = Number(portText);
const count = Number(countText);

function once(): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = process.hrtime.bigint();
    const socket = connect({host, port});
    socket.setTimeout(2000, () => socket.destroy(new Error(`connect to ${host}:${port} timed out`)));
    socket.once('connect', () => {
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      socket.destroy();
      resolve(ms);
    });
    socket.once('error', reject);
  });
}

const times: number[] = [];
for (let index = 0; index < count; index++) times.push(await once());
process.stdout.write(JSON.stringify(times));
