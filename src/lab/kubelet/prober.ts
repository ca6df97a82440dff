// The kubelet's side of readiness probes: one probe-runner process per node, in the node's network
// namespace, started at the first probe and stopped with the kubelet.
import {createInterface} from 'node:readline';
import {spawnInNamespace} from '../netns/index.ts';
import {siblingProgram} from '../workload/launch.ts';
import {type ProbeAnswer, type ProbeRequest, runProbe} from './probe-runner.ts';

export class NodeProber {
  readonly #namespace: string;
  #child: ReturnType<typeof spawnInNamespace> | undefined;
  #nextId = 1;
  readonly #waiting = new Map<number, (answer: ProbeAnswer) => void>();

  constructor(nodeNamespace: string) {
    this.#namespace = nodeNamespace;
  }

  probe(request: Omit<ProbeRequest, 'id'>): Promise<ProbeAnswer> {
    const child = this.#start();
    const id = this.#nextId++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#waiting.delete(id);
        resolve({id, ok: false, message: 'probe runner did not answer'});
      }, request.timeoutMs + 2000);
      this.#waiting.set(id, (answer) => {
        clearTimeout(timer);
        resolve(answer);
      });
      child.stdin?.write(`${JSON.stringify({...request, id})}\n`);
    });
  }

  /** probeOnHost: a probe of a server that listens on the host's loopback (an agent's, see agent-container.ts). */
  probeOnHost(request: Omit<ProbeRequest, 'id'>): Promise<ProbeAnswer> {
    return runProbe({...request, id: 0});
  }

  stop(): void {
    this.#child?.kill('SIGTERM');
    this.#child = undefined;
  }

  #start(): ReturnType<typeof spawnInNamespace> {
    if (this.#child) return this.#child;
    const child = spawnInNamespace(this.#namespace, [process.execPath, siblingProgram('probe-runner', import.meta.url)], {stdin: 'pipe'});
    this.#child = child;
    child.catch(() => undefined);
    void child.then(() => {
      if (this.#child === child) this.#child = undefined;
    });
    createInterface({input: child.stdout!}).on('line', (line) => {
      try {
        const answer = JSON.parse(line) as ProbeAnswer;
        this.#waiting.get(answer.id)?.(answer);
        this.#waiting.delete(answer.id);
      } catch {
        // not an answer
      }
    });
    return child;
  }
}
