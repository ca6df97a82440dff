// Containers' logs as the lab's kubelets keep them: the lines a pod's demo server wrote (bounded),
// with followers for `kubectl logs -f`, and the previous run's log for `kubectl logs -p`.
import type {ContainerLog, LogLine, PodLogSource} from '../apiserver/pod-log-source.ts';

const keptLines = 5000;

export class RunLog implements ContainerLog {
  readonly lines: LogLine[] = [];
  readonly #followers = new Set<{onLine: (line: LogLine) => void; onEnd: () => void}>();
  #ended = false;

  append(text: string): void {
    const line = {time: new Date().toISOString(), text};
    this.lines.push(line);
    if (this.lines.length > keptLines) this.lines.splice(0, this.lines.length - keptLines);
    for (const follower of this.#followers) follower.onLine(line);
  }

  /** end: the run is over; followers are told and let go. */
  end(): void {
    this.#ended = true;
    for (const follower of this.#followers) follower.onEnd();
    this.#followers.clear();
  }

  follow(onLine: (line: LogLine) => void, onEnd: () => void): () => void {
    if (this.#ended) {
      onEnd();
      return () => undefined;
    }
    const follower = {onLine, onEnd};
    this.#followers.add(follower);
    return () => this.#followers.delete(follower);
  }
}

/** PodLogs: every lab pod's current and previous run log, by namespace/pod (all containers of a pod share its demo server). */
export class PodLogs implements PodLogSource {
  readonly #runs = new Map<string, {current?: RunLog; previous?: RunLog}>();

  /** newRun starts a pod's next run log; the one before becomes the previous. */
  newRun(namespace: string, pod: string): RunLog {
    const key = `${namespace}/${pod}`;
    const entry = this.#runs.get(key) ?? {};
    entry.current?.end();
    const run = new RunLog();
    this.#runs.set(key, {current: run, previous: entry.current});
    return run;
  }

  forget(namespace: string, pod: string): void {
    const key = `${namespace}/${pod}`;
    this.#runs.get(key)?.current?.end();
    this.#runs.delete(key);
  }

  open(namespace: string, pod: string, _container: string, previous: boolean): ContainerLog | undefined {
    const entry = this.#runs.get(`${namespace}/${pod}`);
    return previous ? entry?.previous : entry?.current;
  }
}
