// The lab's figure for `npm run bench`: wall time of `lab up` (here 3 nodes x 10 pods, goal < 10 s)
// from the call to a ready lab (nodes Ready, pods Ready, every agent synced), with the
// supervisor's own steps, and the time `lab down` takes to remove it all.
import {downLab, upLab} from './lab-control.ts';

export interface LabUpTiming {
  nodes: number;
  podsPerNode: number;
  /** From the call to a ready lab, including the supervisor's start. */
  upMs: number;
  /** Milliseconds from the supervisor's start to the end of each step: namespaces, apiServer, pods, agents, ready. */
  steps: Record<string, number>;
  downMs: number;
}

/** timeLabUp builds a lab under a name of its own, times it, and removes it (also on failure). Needs root. */
export async function timeLabUp(options: {nodes?: number; podsPerNode?: number} = {}): Promise<LabUpTiming> {
  const nodes = options.nodes ?? 3;
  const podsPerNode = options.podsPerNode ?? 10;
  const name = `bench-${process.pid}`;
  const started = performance.now();
  let upMs: number;
  let steps: Record<string, number>;
  try {
    const state = await upLab({name, nodes, podsPerNode});
    upMs = performance.now() - started;
    steps = state.timings;
  } catch (error) {
    await downLab(name).catch(() => undefined);
    throw error;
  }
  const downStarted = performance.now();
  await downLab(name);
  return {nodes, podsPerNode, upMs, steps, downMs: performance.now() - downStarted};
}
