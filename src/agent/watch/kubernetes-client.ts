// KubernetesClient: the two calls the watches need (list, watch), over @kubernetes/client-node's
// KubeConfig and Watch. Objects stay raw JSON: the model reads them defensively, and a typed decode
// would drop fields it does not know.
import {readFileSync} from 'node:fs';
import {request as httpRequest} from 'node:http';
import {request as httpsRequest, type RequestOptions} from 'node:https';
// '#client-node': client-node itself, or its tree-shaken copy in the agent process (scripts/bundle-client-node.ts).
import {KubeConfig, Watch} from '#client-node';
import {findKubeconfig} from '../../core/kubeconfig/merge.ts';

export interface ListResult {
  items: unknown[];
  resourceVersion: string;
  /** More of the list is to come: ask again with this as `continue`. */
  continue?: string;
}

export interface WatchHandle {
  abort(): void;
}

export interface KubernetesClient {
  /** GET one object (an observing agent reads kube-proxy's ConfigMap with it); optional for clients made in tests. */
  get?(path: string): Promise<unknown>;
  list(path: string, query: Record<string, string>): Promise<ListResult>;
  /** Streams events until the server ends the watch or an error; onDone is called once either way. */
  watch(
    path: string,
    query: Record<string, string>,
    onEvent: (type: string, object: unknown) => void,
    onDone: (error?: unknown) => void,
  ): Promise<WatchHandle>;
}

/** ApiRequestError: a request to the API server was answered with an error status. */
export class ApiRequestError extends Error {
  override name = 'ApiRequestError';
  readonly statusCode: number;
  constructor(message: string, statusCode: number) {
    super(message);
    this.statusCode = statusCode;
  }
}

/**
 * loadKubeConfig: the given file, else the files $KUBECONFIG lists (merged as kubectl merges them),
 * else ~/.kube/config, else the in-cluster service account.
 */
export function loadKubeConfig(path?: string): KubeConfig {
  const config = new KubeConfig();
  const found = findKubeconfig({file: path, env: process.env, readFile: (file) => readFileSync(file, 'utf8')});
  if (found.kind === 'in-cluster') config.loadFromCluster();
  else config.loadFromString(found.text);
  if (!config.getCurrentCluster())
    throw new Error(`kubeconfig ${found.kind === 'files' ? found.files.join(':') : '(in-cluster)'}: no current cluster`);
  return config;
}

export function createKubernetesClient(config: KubeConfig): KubernetesClient {
  const watcher = new Watch(config);
  return {
    async get(path) {
      const cluster = config.getCurrentCluster()!;
      const url = new URL(cluster.server.replace(/\/$/, '') + path);
      const options: RequestOptions = {method: 'GET', headers: {Accept: 'application/json'}};
      await config.applyToHTTPSOptions(options);
      return getJson(url, options);
    },
    async list(path, query) {
      const cluster = config.getCurrentCluster()!;
      const url = new URL(cluster.server.replace(/\/$/, '') + path);
      for (const [key, value] of Object.entries(query)) url.searchParams.set(key, value);
      const options: RequestOptions = {method: 'GET', headers: {Accept: 'application/json'}};
      await config.applyToHTTPSOptions(options);
      const body = await getJson(url, options);
      const list = body as {items?: unknown; metadata?: {resourceVersion?: unknown; continue?: unknown}};
      if (!Array.isArray(list.items)) throw new Error(`GET ${path}: the answer is not a list`);
      const more = list.metadata?.continue;
      return {
        items: list.items,
        resourceVersion: typeof list.metadata?.resourceVersion === 'string' ? list.metadata.resourceVersion : '',
        ...(typeof more === 'string' && more !== '' ? {continue: more} : {}),
      };
    },
    async watch(path, query, onEvent, onDone) {
      const controller = await watcher.watch(
        path,
        query,
        (type, object) => onEvent(type, object),
        (error) => onDone(error ?? undefined),
      );
      return {abort: () => controller.abort()};
    },
  };
}

function getJson(url: URL, options: RequestOptions): Promise<unknown> {
  const send = url.protocol === 'http:' ? httpRequest : httpsRequest;
  return new Promise((resolve, reject) => {
    const request = send(url, {...options, timeout: 60_000}, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.on('error', reject);
      response.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let body: unknown;
        try {
          body = JSON.parse(text);
        } catch {
          body = undefined;
        }
        const status = response.statusCode ?? 0;
        if (status !== 200) {
          const message = (body as {message?: unknown})?.message;
          reject(
            new ApiRequestError(`GET ${url.pathname}: ${status} ${typeof message === 'string' ? message : text.slice(0, 200)}`, status),
          );
          return;
        }
        if (body === undefined) reject(new Error(`GET ${url.pathname}: the answer is not JSON`));
        else resolve(body);
      });
    });
    request.on('timeout', () => request.destroy(new Error(`GET ${url.pathname}: no answer in 60 s`)));
    request.on('error', reject);
    request.end();
  });
}
