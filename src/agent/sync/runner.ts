// BoundedFrequencyRunner: runs the sync function when asked, but never sooner than minInterval after
// the previous run ended (requests in between coalesce into one run), at least once per maxInterval,
// and again after a failure with a backoff that doubles up to retryInterval. kube-proxy's
// pkg/proxy/runner promises the same three bounds.
import {type Clock, systemClock} from '../clock.ts';

/** Why a run happens; more than one can be true. */
export interface RunReason {
  /** run() was called since the last run. */
  requested: boolean;
  /** maxInterval passed without a run. */
  periodic: boolean;
  /** The previous run failed and its backoff is over. */
  retry: boolean;
}

export interface RunnerOptions {
  /** Shortest time from the end of one run to the start of the next. */
  minInterval: number;
  /** Longest time between runs. */
  maxInterval: number;
  /** Longest wait before retrying after a failure; the first retry waits retryBase. */
  retryInterval: number;
  /** First retry delay (default: minInterval, at least 1 s, at most retryInterval). */
  retryBase?: number;
  clock?: Clock;
  /** Told of each failure and when the retry is due. */
  onError?: (error: unknown, retryInMilliseconds: number) => void;
}

export class BoundedFrequencyRunner {
  readonly #fn: (reason: RunReason) => Promise<void>;
  readonly #minInterval: number;
  readonly #maxInterval: number;
  readonly #retryInterval: number;
  readonly #retryBase: number;
  readonly #clock: Clock;
  readonly #onError: RunnerOptions['onError'];

  #started = false;
  #stopped = false;
  #requested = false;
  #lastEnd: number | undefined;
  #periodicAt = 0;
  #retryAt: number | undefined;
  #failures = 0;
  #running: Promise<void> | undefined;
  #timer: unknown;
  #timerAt: number | undefined;

  constructor(fn: (reason: RunReason) => Promise<void>, options: RunnerOptions) {
    if (options.maxInterval < options.minInterval) {
      throw new Error(`runner: maxInterval ${options.maxInterval} ms is shorter than minInterval ${options.minInterval} ms`);
    }
    this.#fn = fn;
    this.#minInterval = options.minInterval;
    this.#maxInterval = options.maxInterval;
    this.#retryInterval = options.retryInterval;
    this.#retryBase = Math.min(options.retryBase ?? Math.max(options.minInterval, 1000), options.retryInterval);
    this.#clock = options.clock ?? systemClock;
    this.#onError = options.onError;
  }

  /** start arms the periodic timer; runs happen only after start. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    this.#periodicAt = this.#clock.now() + this.#maxInterval;
    this.#schedule();
  }

  /** run asks for a run as soon as minInterval allows; calls before it starts coalesce. */
  run(): void {
    this.#requested = true;
    this.#schedule();
  }

  /** stop cancels timers and waits for a run in progress to end. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#cancelTimer();
    await this.#running;
  }

  /** A run was asked for and has not started yet. */
  get pending(): boolean {
    return this.#requested;
  }

  /** When the next run is due, or undefined when none is scheduled (stopped, or running now). */
  get nextRunAt(): number | undefined {
    return this.#timerAt;
  }

  #schedule(): void {
    if (!this.#started || this.#stopped || this.#running) return;
    const earliest = this.#lastEnd === undefined ? this.#clock.now() : this.#lastEnd + this.#minInterval;
    let due = this.#periodicAt;
    if (this.#requested) due = Math.min(due, earliest);
    if (this.#retryAt !== undefined) due = Math.min(due, Math.max(this.#retryAt, earliest));
    due = Math.max(due, earliest);
    if (this.#timerAt === due) return;
    this.#cancelTimer();
    this.#timerAt = due;
    this.#timer = this.#clock.setTimer(
      () => {
        this.#timer = undefined;
        this.#timerAt = undefined;
        this.#execute();
      },
      Math.max(0, due - this.#clock.now()),
    );
  }

  #cancelTimer(): void {
    if (this.#timer !== undefined) this.#clock.clearTimer(this.#timer);
    this.#timer = undefined;
    this.#timerAt = undefined;
  }

  #execute(): void {
    if (this.#stopped || this.#running) return;
    const now = this.#clock.now();
    const reason: RunReason = {
      requested: this.#requested,
      periodic: now >= this.#periodicAt,
      retry: this.#retryAt !== undefined && now >= this.#retryAt,
    };
    if (!reason.requested && !reason.periodic && !reason.retry) {
      this.#schedule();
      return;
    }
    this.#requested = false;
    this.#running = this.#runOnce(reason);
  }

  async #runOnce(reason: RunReason): Promise<void> {
    try {
      await this.#fn(reason);
      this.#failures = 0;
      this.#retryAt = undefined;
    } catch (error) {
      this.#failures++;
      const delay = Math.min(this.#retryBase * 2 ** (this.#failures - 1), this.#retryInterval);
      this.#retryAt = this.#clock.now() + delay;
      this.#onError?.(error, delay);
    } finally {
      this.#lastEnd = this.#clock.now();
      this.#periodicAt = this.#lastEnd + this.#maxInterval;
      this.#running = undefined;
      this.#schedule();
    }
  }
}
