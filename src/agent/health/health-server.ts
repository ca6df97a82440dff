// The healthz server (kube-proxy's :10256): /healthz answers whether the proxy is keeping its rules
// up to date and the node should get load-balancer traffic; /livez only the first, so that a node
// being drained is taken out of load balancers without the agent being restarted.
import type {IncomingMessage, ServerResponse} from 'node:http';
import type {AgentMetrics} from './metrics.ts';
import type {ProxierHealth} from './proxier-health.ts';
import {type HttpEndpoint, listenHttp} from './http-listen.ts';

export async function startHealthServer(options: {
  host: string;
  port: number;
  health: ProxierHealth;
  metrics?: AgentMetrics;
}): Promise<HttpEndpoint> {
  const {health, metrics} = options;
  return listenHttp(options.host, options.port, (request: IncomingMessage, response: ServerResponse) => {
    const path = new URL(request.url ?? '/', 'http://agent').pathname;
    if (path !== '/healthz' && path !== '/livez') {
      response.writeHead(404, {'Content-Type': 'text/plain'}).end('404 page not found\n');
      return;
    }
    const state = health.state();
    const body: Record<string, unknown> = {
      lastUpdated: state.lastUpdated === undefined ? '' : new Date(state.lastUpdated).toISOString(),
      currentTime: new Date(state.currentTime).toISOString(),
    };
    let ok = state.healthy;
    if (path === '/healthz') {
      body.nodeEligible = state.nodeEligible;
      ok = ok && state.nodeEligible;
    }
    const code = ok ? 200 : 503;
    (path === '/healthz' ? metrics?.healthzTotal : metrics?.livezTotal)?.inc({code: String(code)});
    response.writeHead(code, {'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff'}).end(JSON.stringify(body));
  });
}
