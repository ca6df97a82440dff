// The metrics server (kube-proxy's :10249): /metrics for Prometheus, plus /healthz, /proxyMode and
// /configz as kube-proxy serves them on the same port.
import type {Registry} from 'prom-client';
import {type HttpEndpoint, listenHttp} from './http-listen.ts';

export async function startMetricsServer(options: {
  host: string;
  port: number;
  registry: Registry;
  mode: string;
  configz?: () => unknown;
}): Promise<HttpEndpoint> {
  return listenHttp(options.host, options.port, (request, response) => {
    const path = new URL(request.url ?? '/', 'http://agent').pathname;
    switch (path) {
      case '/metrics':
        options.registry.metrics().then(
          (text) => response.writeHead(200, {'Content-Type': options.registry.contentType}).end(text),
          (error: unknown) => response.writeHead(500, {'Content-Type': 'text/plain'}).end(`metrics: ${String(error)}\n`),
        );
        return;
      case '/healthz':
        response.writeHead(200, {'Content-Type': 'text/plain'}).end('ok');
        return;
      case '/proxyMode':
        response.writeHead(200, {'Content-Type': 'text/plain'}).end(options.mode);
        return;
      case '/configz':
        response.writeHead(200, {'Content-Type': 'application/json'}).end(JSON.stringify({kubeproxy: options.configz?.() ?? {}}));
        return;
      default:
        response.writeHead(404, {'Content-Type': 'text/plain'}).end('404 page not found\n');
    }
  });
}
