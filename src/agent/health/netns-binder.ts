// The program bindInNetns runs as `ip netns exec NS node netns-binder.ts HOST PORT`: opens a
// listening TCP socket inside that network namespace, hands it to its parent over the IPC
// channel, and exits. A socket keeps the namespace it was made in, so the parent accepts
// connections that arrive in the namespace without being in it.
import {createServer} from 'node:net';

function main(): void {
  const [host, portText] = process.argv.slice(2);
  const port = Number(portText);
  if (!process.send) {
    process.stderr.write('netns-binder: must be started with an IPC channel (by bindInNetns)\n');
    process.exit(2);
  }
  if (!host || !Number.isInteger(port) || port < 0 || port > 65535) {
    process.send({error: {code: 'EINVAL', message: `usage: netns-binder HOST PORT (got ${process.argv.slice(2).join(' ')})`}}, () =>
      process.exit(2),
    );
    return;
  }
  const server = createServer();
  server.once('error', (error: NodeJS.ErrnoException) => {
    process.send!({error: {code: error.code ?? 'UNKNOWN', message: error.message}}, () => process.exit(1));
  });
  server.listen({host, port}, () => {
    // The parent holds its own copy of the socket once the message is sent; ours can go.
    process.send!({listening: true}, server, () => {
      server.close();
      process.disconnect();
    });
  });
}

main();
