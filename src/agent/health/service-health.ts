// Service health servers: one listener per healthCheckNodePort of a Service with
// externalTrafficPolicy Local, answering cloud load balancers whether this node has a ready
// endpoint of that service (kube-proxy's pkg/proxy/healthcheck/service_health.go).
import {type HttpEndpoint, type ListenOptions, listenHttp} from './http-listen.ts';

export interface ServiceHealthTarget {
  namespace: string;
  name: string;
  healthCheckNodePort: number;
  /** Ready endpoints of the service on this node. */
  localEndpoints: number;
}

export interface ServiceHealthOptions {
  /** Addresses to listen on; default one dual-stack listener on every address. */
  hosts?: string[];
  /** The node's network namespace when the agent runs outside it (--netns): the listeners are opened there. */
  netns?: string;
  /** serviceProxyHealthy in answers: the proxy's own health (a 503 when false). */
  proxyHealthy: () => boolean;
  /** Told when a port cannot be opened; the other services go on. */
  onError?: (target: ServiceHealthTarget, error: unknown) => void;
}

interface Listener {
  target: ServiceHealthTarget;
  endpoints: HttpEndpoint[];
}

export class ServiceHealthServers {
  readonly #options: ServiceHealthOptions;
  readonly #listeners = new Map<string, Listener>();

  constructor(options: ServiceHealthOptions) {
    this.#options = options;
  }

  /** sync opens listeners for new ports, closes the ones no service uses, and updates endpoint counts. */
  async sync(targets: ServiceHealthTarget[]): Promise<void> {
    const wanted = new Map(targets.map((target) => [listenerKey(target), target]));
    for (const [key, listener] of this.#listeners) {
      if (!wanted.has(key)) {
        this.#listeners.delete(key);
        await Promise.all(listener.endpoints.map((endpoint) => endpoint.close()));
      }
    }
    for (const [key, target] of wanted) {
      const existing = this.#listeners.get(key);
      if (existing) {
        existing.target = target;
        continue;
      }
      const listener: Listener = {target, endpoints: []};
      try {
        const answer = (_request: unknown, response: import('node:http').ServerResponse) => this.#answer(listener, response);
        const where = {netns: this.#options.netns};
        if (this.#options.hosts) {
          for (const host of this.#options.hosts)
            listener.endpoints.push(await listenHttp(host, target.healthCheckNodePort, answer, where));
        } else {
          listener.endpoints.push(await listenAnywhere(target.healthCheckNodePort, answer, where));
        }
        this.#listeners.set(key, listener);
      } catch (error) {
        await Promise.all(listener.endpoints.map((endpoint) => endpoint.close()));
        this.#options.onError?.(target, error);
      }
    }
  }

  /** The ports listened on now, by "namespace/name". */
  ports(): Map<string, number> {
    return new Map([...this.#listeners.values()].map(({target}) => [`${target.namespace}/${target.name}`, target.healthCheckNodePort]));
  }

  async close(): Promise<void> {
    await this.sync([]);
  }

  #answer(listener: Listener, response: import('node:http').ServerResponse): void {
    const {target} = listener;
    const proxyHealthy = this.#options.proxyHealthy();
    const body = {
      service: {namespace: target.namespace, name: target.name},
      localEndpoints: target.localEndpoints,
      serviceProxyHealthy: proxyHealthy,
    };
    const code = target.localEndpoints > 0 && proxyHealthy ? 200 : 503;
    response
      .writeHead(code, {
        'Content-Type': 'application/json',
        'X-Content-Type-Options': 'nosniff',
        'X-Load-Balancing-Endpoint-Weight': String(target.localEndpoints),
      })
      .end(JSON.stringify(body));
  }
}

function listenerKey(target: ServiceHealthTarget): string {
  return `${target.namespace}/${target.name}:${target.healthCheckNodePort}`;
}

/** listenAnywhere: one dual-stack listener on "::", or IPv4 only on a node without IPv6. */
async function listenAnywhere(
  port: number,
  handler: (request: unknown, response: import('node:http').ServerResponse) => void,
  options: ListenOptions,
): Promise<HttpEndpoint> {
  try {
    return await listenHttp('::', port, handler, options);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code !== 'EAFNOSUPPORT' && code !== 'EADDRNOTAVAIL') throw error;
    return listenHttp('0.0.0.0', port, handler, options);
  }
}
