// A CPU profile of an agent over a stretch of a bench, taken through its inspector (the agent
// started with --inspect=127.0.0.1:0), not with --cpu-prof: that one samples from start to exit,
// and its sampling keeps the process's CPU time moving, so a bench that waits for the agent to be
// idle would wait for ever.
import {writeFile} from 'node:fs/promises';
import WebSocket from 'ws';
import type {AgentRun} from './agent.ts';

/** Where PXBENCH_CPU_PROFILE_DIR asks for profiles, or undefined. */
export const cpuProfileDir = process.env.PXBENCH_CPU_PROFILE_DIR;

/** The flag that opens the agent's inspector on a free loopback port. */
export const inspectorFlag = '--inspect=127.0.0.1:0';

export interface AgentProfiler {
  start(): Promise<void>;
  /** Stops the profile begun by start and writes it to `file` (open it in Chrome's DevTools). */
  stopInto(file: string): Promise<void>;
  close(): void;
}

/** Connects to the inspector of a run started with inspectorFlag in its NODE_OPTIONS. */
export async function connectProfiler(run: AgentRun, samplingIntervalUs = 1000): Promise<AgentProfiler> {
  const {line} = await run.waitForLine(/Debugger listening on ws:\/\//, 30_000);
  const url = /(ws:\/\/\S+)/.exec(line)![1];
  const socket = new WebSocket(url);
  await new Promise<void>((resolve, reject) => socket.once('open', () => resolve()).once('error', reject));
  let nextId = 1;
  const waiting = new Map<number, {resolve(result: unknown): void; reject(error: Error): void}>();
  socket.on('message', (data) => {
    const message = JSON.parse(String(data)) as {id?: number; result?: unknown; error?: {message: string}};
    const waiter = message.id === undefined ? undefined : waiting.get(message.id);
    if (!waiter) return;
    waiting.delete(message.id!);
    if (message.error) waiter.reject(new Error(`inspector: ${message.error.message}`));
    else waiter.resolve(message.result);
  });
  // An observer that exits mid-profile fails the bench instead of leaving it waiting.
  socket.on('close', () => {
    for (const waiter of waiting.values()) waiter.reject(new Error('inspector: the connection closed'));
    waiting.clear();
  });
  const call = (method: string, params: object = {}) =>
    new Promise<unknown>((resolve, reject) => {
      const id = nextId++;
      waiting.set(id, {resolve, reject});
      socket.send(JSON.stringify({id, method, params}));
    });
  await call('Profiler.enable');
  await call('Profiler.setSamplingInterval', {interval: samplingIntervalUs});
  return {
    start: async () => {
      await call('Profiler.start');
    },
    stopInto: async (file) => {
      const {profile} = (await call('Profiler.stop')) as {profile: unknown};
      await writeFile(file, JSON.stringify(profile));
    },
    close: () => socket.close(),
  };
}
