// One TCP stream into a network namespace, run there by `ip netns exec NS node netns-relay.ts PORT`:
// connects to 127.0.0.1:PORT and copies stdin to the connection and the connection to stdout.
// Says "connected" (or "error: ...") on stderr first, so that the caller knows the dial's outcome.
// The lab's port-forward uses it: the embedded API server lives in the host's namespace, pods do not.
import {connect} from 'node:net';

function main(): void {
  const port = Number(process.argv[2]);
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    process.stderr.write(`error: port ${process.argv[2]} is not a port (1-65535)\n`);
    process.exit(2);
  }
  const socket = connect({host: '127.0.0.1', port});
  socket.once('connect', () => {
    process.stderr.write('connected\n');
    process.stdin.pipe(socket);
    socket.pipe(process.stdout);
  });
  socket.on('error', (error: NodeJS.ErrnoException) => {
    process.stderr.write(`error: ${error.code ?? ''} ${error.message}\n`);
    process.exit(1);
  });
  socket.on('close', () => process.exit(0));
}

main();
