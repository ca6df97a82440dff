// The pods/log subresource (`kubectl logs [-f] [--tail N] [--timestamps] [-p]`): plain text from
// the lab's kubelet that runs the pod, with kube-apiserver's 400s for a container it cannot name.
import {badRequest} from '../api-error.ts';
import type {LogLine} from '../pod-log-source.ts';
import type {ResourceHandler} from './context.ts';

function pickContainer(pod: any, asked: string | null): string {
  const names: string[] = (pod.spec?.containers ?? []).map((container: any) => container.name);
  if (asked) {
    const all = [...names, ...(pod.spec?.initContainers ?? []).map((container: any) => container.name)];
    if (!all.includes(asked)) throw badRequest(`container ${asked} is not valid for pod ${pod.metadata.name}`);
    return asked;
  }
  if (names.length === 1) return names[0];
  throw badRequest(`a container name must be specified for pod ${pod.metadata.name}, choose one of: [${names.join(' ')}]`);
}

export const podLog: ResourceHandler = ({store, podLogs}, {res, url, route}) => {
  const pod = store.get('pods', route.namespace, route.name!);
  const container = pickContainer(pod, url.searchParams.get('container'));
  const previous = url.searchParams.get('previous') === 'true';
  const log = podLogs?.open(route.namespace!, route.name!, container, previous);
  if (!log) {
    const status = (pod.status?.containerStatuses ?? []).find((entry: any) => entry.name === container);
    const waiting = status?.state?.waiting?.reason ?? 'ContainerCreating';
    if (previous) throw badRequest(`previous terminated container "${container}" in pod "${route.name}" not found`);
    throw badRequest(`container "${container}" in pod "${route.name}" is waiting to start: ${waiting}`);
  }
  const timestamps = url.searchParams.get('timestamps') === 'true';
  const format = (line: LogLine) => `${timestamps ? `${line.time} ` : ''}${line.text}\n`;
  const tail = url.searchParams.has('tailLines') ? Number(url.searchParams.get('tailLines')) : undefined;
  const since = url.searchParams.has('sinceSeconds') ? Date.now() - Number(url.searchParams.get('sinceSeconds')) * 1000 : undefined;
  let lines = since === undefined ? log.lines : log.lines.filter((line) => Date.parse(line.time) >= since);
  if (tail !== undefined && tail >= 0) lines = lines.slice(Math.max(0, lines.length - tail));
  res.writeHead(200, {'content-type': 'text/plain', 'cache-control': 'no-cache, private'});
  res.write(lines.map(format).join(''));
  if (url.searchParams.get('follow') !== 'true') {
    res.end();
    return;
  }
  const stop = log.follow(
    (line) => res.write(format(line)),
    () => res.end(),
  );
  res.once('close', stop);
};
