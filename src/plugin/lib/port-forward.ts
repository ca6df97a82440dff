// A byte stream to one port of a pod through the API server's pods/portforward (client-node's
// PortForward over WebSocket), as a Duplex that a WebSocket client can run over.
import {type KubeConfig, PortForward} from '@kubernetes/client-node';
import {Duplex, PassThrough} from 'node:stream';
import {errorLine, PluginError} from './plugin-error.ts';

export interface PortForwardTarget {
  namespace: string;
  pod: string;
  port: number;
}

function refusalText(error: unknown): string {
  // client-node rejects with the WebSocket error event of a refused upgrade.
  const cause = error as {message?: string; error?: {message?: string}};
  return cause?.message ?? cause?.error?.message ?? String(error);
}

/** openPortForward resolves once the API server accepted the port-forward. */
export async function openPortForward(config: KubeConfig, target: PortForwardTarget): Promise<Duplex> {
  const {namespace, pod, port} = target;
  const fromPod = new PassThrough();
  const errors = new PassThrough();
  const toPod = new PassThrough();
  let ws: {close(): void; on(event: 'close', listener: () => void): void};
  try {
    ws = (await new PortForward(config).portForward(namespace, pod, [port], fromPod, errors, toPod)) as typeof ws;
  } catch (error) {
    const text = refusalText(error);
    if (/\b403\b/.test(text)) {
      throw new PluginError(
        `the API server refused to port-forward to pod ${namespace}/${pod} (403 Forbidden): your user needs create on pods/portforward in ` +
          `namespace ${namespace}`,
      );
    }
    if (/\b401\b/.test(text))
      throw new PluginError(`the API server did not accept your credentials (401 Unauthorized): check the kubeconfig's user`);
    if (/\b404\b/.test(text)) throw new PluginError(`pod ${namespace}/${pod} is gone (404): run the command again`);
    throw new PluginError(`cannot port-forward to pod ${namespace}/${pod} port ${port}: ${errorLine(text)}`);
  }

  const stream = new Duplex({
    read() {},
    write(chunk: Buffer, _encoding, callback) {
      toPod.write(chunk, callback);
    },
    final(callback) {
      toPod.end();
      callback();
    },
    destroy(error, callback) {
      ws.close();
      callback(error);
    },
  });
  fromPod.on('data', (chunk: Buffer) => stream.push(chunk));
  errors.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8').trim();
    if (text) stream.destroy(new Error(`port-forward to pod ${namespace}/${pod} port ${port}: ${text}`));
  });
  ws.on('close', () => stream.push(null));
  return stream;
}
