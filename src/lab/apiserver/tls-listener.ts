// One port for plain HTTP and TLS. kubectl (client-go) sends a kubeconfig's bearer token only over
// TLS, so the kubeconfig the server writes names https://; programmatic clients on loopback may
// keep using http://. The first byte of a connection tells them apart (0x16 opens a TLS
// handshake). The certificate is self-signed, made once per process with openssl; the kubeconfig
// marks the cluster insecure-skip-tls-verify, as there is nothing to verify on loopback.
import {execFile} from 'node:child_process';
import {mkdtemp, readFile, rm} from 'node:fs/promises';
import type {Server as HttpServer} from 'node:http';
import {createServer, type Server, type Socket} from 'node:net';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {Duplex} from 'node:stream';
import {createSecureContext, type SecureContext, TLSSocket} from 'node:tls';
import {promisify} from 'node:util';

const tlsHandshake = 0x16;
let certificate: Promise<SecureContext> | undefined;

/** The lab's self-signed certificate for 127.0.0.1, ::1 and localhost. */
function labCertificate(): Promise<SecureContext> {
  certificate ??= (async () => {
    const dir = await mkdtemp(join(tmpdir(), 'proxyctl-lab-tls-'));
    try {
      const [key, cert] = [join(dir, 'key.pem'), join(dir, 'cert.pem')];
      await promisify(execFile)('openssl', [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '3650',
        '-subj',
        '/CN=proxyctl-lab',
        '-addext',
        'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost',
        '-keyout',
        key,
        '-out',
        cert,
      ]);
      return createSecureContext({key: await readFile(key), cert: await readFile(cert)});
    } catch (error) {
      certificate = undefined;
      throw new Error(`lab API server: cannot make its TLS certificate with openssl: ${(error as Error).message}`, {cause: error});
    } finally {
      await rm(dir, {recursive: true, force: true});
    }
  })();
  return certificate;
}

/**
 * listenPlainAndTls listens on host:port and hands every connection to `server`, TLS ones
 * decrypted. `onSocket` sees each raw connection (to destroy them on stop).
 */
export async function listenPlainAndTls(
  server: HttpServer,
  host: string,
  port: number,
  onSocket: (socket: Socket) => void,
): Promise<Server> {
  const secureContext = await labCertificate();
  // Without noDelay a response written in pieces (headers, then the body; a TLS record each) waits
  // for the client's delayed acknowledgement of the first piece before the second is sent.
  const listener = createServer({noDelay: true}, (socket) => {
    onSocket(socket);
    socket.once('error', () => socket.destroy());
    socket.once('data', (first: Buffer) => {
      socket.pause();
      socket.unshift(first);
      if (first[0] === tlsHandshake) {
        // Wrapped as a stream, not the socket's handle, so that the TLS layer reads the byte given back.
        const stream = Duplex.from({readable: socket, writable: socket});
        const secure = new TLSSocket(stream as unknown as Socket, {isServer: true, secureContext});
        secure.once('error', () => socket.destroy());
        server.emit('connection', secure);
      } else {
        server.emit('connection', socket);
        socket.resume();
      }
    });
  });
  await new Promise<void>((resolve, reject) => {
    listener.once('error', reject);
    listener.listen(port, host, () => {
      listener.off('error', reject);
      resolve();
    });
  });
  return listener;
}
