// FakeClock: a Clock whose time moves only when a test says so; due timers fire in order.
import type {Clock} from '../../src/agent/clock.ts';

interface Timer {
  id: number;
  at: number;
  callback: () => void;
}

export class FakeClock implements Clock {
  #now: number;
  #timers: Timer[] = [];
  #nextId = 1;

  constructor(start = Date.UTC(2026, 0, 1)) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  setTimer(callback: () => void, milliseconds: number): unknown {
    const timer = {id: this.#nextId++, at: this.#now + Math.max(0, milliseconds), callback};
    this.#timers.push(timer);
    return timer.id;
  }

  clearTimer(handle: unknown): void {
    this.#timers = this.#timers.filter((timer) => timer.id !== handle);
  }

  /** advance moves time forward, firing each due timer at its own time and letting promises settle after each. */
  async advance(milliseconds: number): Promise<void> {
    const target = this.#now + milliseconds;
    await settle();
    for (;;) {
      const due = this.#timers.filter((timer) => timer.at <= target).sort((a, b) => a.at - b.at || a.id - b.id)[0];
      if (due === undefined) break;
      this.#timers = this.#timers.filter((timer) => timer !== due);
      this.#now = due.at;
      due.callback();
      await settle();
    }
    this.#now = target;
    await settle();
  }

  get pendingTimers(): number {
    return this.#timers.length;
  }
}

/** settle lets every queued promise callback run (fakes resolve without real I/O). */
export async function settle(): Promise<void> {
  for (let round = 0; round < 3; round++) await new Promise((resolve) => setImmediate(resolve));
}
