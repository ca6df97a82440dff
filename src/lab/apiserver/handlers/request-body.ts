// Reading request bodies (JSON, YAML or Kubernetes protobuf) and DeleteOptions.
import type {IncomingMessage} from 'node:http';
import {parse as parseYaml} from 'yaml';
import {ApiError, badRequest} from '../api-error.ts';
import type {DeleteOptions} from '../cluster-store.ts';
import {decodeProtobufObject, protobufMediaType} from '../protobuf-codec.ts';

const maxBodyBytes = 16 * 1024 * 1024;

export async function readBody(req: IncomingMessage): Promise<any> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > maxBodyBytes) throw new ApiError(413, 'RequestEntityTooLarge', 'Request entity too large: limit is 3145728');
    chunks.push(chunk);
  }
  const bytes = Buffer.concat(chunks);
  const contentType = req.headers['content-type'] ?? 'application/json';
  if (bytes.length > 0 && contentType.startsWith(protobufMediaType)) return decodeProtobufObject(bytes);
  const text = bytes.toString('utf8');
  if (text.trim() === '') return undefined;
  try {
    if (contentType.includes('yaml')) return parseYaml(text);
    return JSON.parse(text);
  } catch (err) {
    throw badRequest(`couldn't get version/kind; json parse error: ${(err as Error).message}`);
  }
}

export async function deleteOptionsOf(req: IncomingMessage, url: URL): Promise<DeleteOptions> {
  const body = (await readBody(req)) ?? {};
  const options: DeleteOptions = {
    gracePeriodSeconds: body.gracePeriodSeconds ?? undefined,
    propagationPolicy: body.propagationPolicy,
    preconditions: body.preconditions,
  };
  if (url.searchParams.has('gracePeriodSeconds')) options.gracePeriodSeconds = Number(url.searchParams.get('gracePeriodSeconds'));
  if (url.searchParams.has('propagationPolicy')) options.propagationPolicy = url.searchParams.get('propagationPolicy')!;
  return options;
}
