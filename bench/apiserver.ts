// Embedded API server watch fan-out: 50 client-node watchers of EndpointSlices while 10,000
// slices are created and then updated through the server's store, as the lab's controllers do.
import {KubeConfig, Watch} from '@kubernetes/client-node';
import {startApiServer} from '../src/lab/apiserver/server.ts';
import {figure, heading, mib, percentile, timed} from './report.ts';
import {endpointSliceFor} from './workload.ts';

export async function benchApiServerWatch(watchers = 50, objects = 10000): Promise<void> {
  heading(
    'lab API server: watch fan-out',
    `${watchers} client-node watchers of endpointslices; ${objects.toLocaleString('en-US')} EndpointSlices created, then each updated once (${(2 * objects).toLocaleString('en-US')} events per watcher)`,
  );
  const server = await startApiServer({port: 0, watchWindow: 4 * objects});
  const rssBefore = process.memoryUsage().rss;
  try {
    server.store.create('namespaces', {apiVersion: 'v1', kind: 'Namespace', metadata: {name: 'bench'}});
    const kubeconfig = new KubeConfig();
    kubeconfig.loadFromString(server.kubeconfig());

    const expected = 2 * objects;
    // Written at: slice name + generation -> time of the write.
    const writtenAt = new Map<string, number>();
    const lastSeenAt = new Map<string, number>();
    let delivered = 0;
    let finished = 0;
    let allDone!: () => void;
    const done = new Promise<void>((resolve) => (allDone = resolve));
    const requests = [];
    for (let w = 0; w < watchers; w++) {
      let seen = 0;
      const request = await new Watch(kubeconfig).watch(
        '/apis/discovery.k8s.io/v1/namespaces/bench/endpointslices',
        {},
        (_type: string, object: {metadata: {name: string; labels?: Record<string, string>}}) => {
          const key = `${object.metadata.name}/${object.metadata.labels?.['bench/generation'] ?? '0'}`;
          lastSeenAt.set(key, performance.now());
          delivered++;
          if (++seen === expected && ++finished === watchers) allDone();
        },
        () => {},
      );
      requests.push(request);
    }

    const writes = await timed(async () => {
      for (const generation of [0, 1]) {
        for (let s = 0; s < objects; s++) {
          const slice = endpointSliceFor(s, 10, generation);
          slice.metadata!.labels = {...slice.metadata!.labels, 'bench/generation': String(generation)};
          writtenAt.set(`${slice.metadata!.name}/${generation}`, performance.now());
          if (generation === 0) server.store.create('endpointslices', slice as never, 'bench');
          else {
            const current = server.store.get('endpointslices', 'bench', slice.metadata!.name!) as {metadata: {resourceVersion: string}};
            server.store.update(
              'endpointslices',
              {...slice, metadata: {...slice.metadata, resourceVersion: current.metadata.resourceVersion}} as never,
              'bench',
            );
          }
          // Let the server stream while writes go on, as a real stream of API writes would.
          if (s % 500 === 0) await new Promise((resolve) => setImmediate(resolve));
        }
      }
    });
    const all = await timed(() => done);
    const totalMs = writes.ms + all.ms;
    const delays = [...writtenAt].map(([key, at]) => (lastSeenAt.get(key) ?? NaN) - at).sort((a, b) => a - b);
    figure({name: 'events delivered', value: delivered, unit: 'count'});
    figure({name: 'events per second, all watchers', value: delivered / (totalMs / 1000), unit: 'per second'});
    figure({name: 'write -> last watcher has it, p50', value: percentile(delays, 50), unit: 'ms'});
    figure({name: 'write -> last watcher has it, p99', value: percentile(delays, 99), unit: 'ms'});
    figure({name: 'RSS growth (server + watchers, one process)', value: mib(process.memoryUsage().rss - rssBefore), unit: 'MiB'});
    for (const request of requests) (request as {abort?: () => void}).abort?.();
  } finally {
    await server.stop();
  }
}
