// Reflector: keeps one resource in step with the API server. List, then watch from the list's
// resourceVersion; a watch the server closes resumes from the last resourceVersion seen; on "410
// Gone" list again; when the API server cannot be reached (refused, connection lost) or asks to slow
// down (429), watch again from the last resourceVersion after a doubling backoff, as client-go does,
// so that a restarted API server is not met by every node listing everything at once (a one-item
// list first checks that the server's history has not been reset behind that version); any other
// failure lists again after the backoff; when a watch stays silent longer than the watchdog allows,
// assume it is stuck and list again. Malformed events are dropped, never thrown. Lists come in
// pages of 500, as client-go's pager asks for them, each page reduced to what the store keeps
// before the next is asked for: the API server answers in pieces, and a large cluster's list of
// EndpointSlices never sits in memory whole.
import type {Logger} from '../log.ts';
import {type Clock, systemClock} from '../clock.ts';
import type {KubernetesClient, WatchHandle} from './kubernetes-client.ts';
import {errorText} from '../../core/error-text.ts';

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface ReflectorOptions {
  /** For logs: "services", "endpointslices", "node node-1". */
  name: string;
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
  client: KubernetesClient;
  /**
   * What is kept of each listed or watched object (the store's record of it); the object itself
   * when not given. Applied to each page of a list as it comes.
   */
  keep?: (object: unknown) => unknown;
  /** A list replaced everything that was known (the objects as `keep` made them). */
  onReplace: (items: unknown[]) => void;
  onEvent: (type: WatchEventType, object: unknown) => void;
  /** The first list is in. */
  onSynced?: () => void;
  log: Logger;
  clock?: Clock;
  /** Silence (no event, no bookmark, no reconnect) after which the resource is listed again. */
  watchdogMs: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** How long the server keeps one watch open before ending it (timeoutSeconds). */
  watchTimeoutSeconds?: number;
}

export class Reflector {
  readonly #options: ReflectorOptions;
  readonly #keep: (object: unknown) => unknown;
  readonly #clock: Clock;
  #resourceVersion = '';
  #synced = false;
  #stopped = false;
  #backoff = 0;
  #handle: WatchHandle | undefined;
  #watchdog: unknown;
  #wake: (() => void) | undefined;
  #loop: Promise<void> | undefined;
  #relists = 0;
  /** The API server was unreachable: before resuming the watch, check its history still covers us. */
  #checkHistory = false;

  constructor(options: ReflectorOptions) {
    this.#options = options;
    this.#keep = options.keep ?? ((object) => object);
    this.#clock = options.clock ?? systemClock;
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#handle?.abort();
    this.#clearWatchdog();
    this.#wake?.();
    await this.#loop;
  }

  /** How many times the resource was listed. */
  get lists(): number {
    return this.#relists;
  }

  get synced(): boolean {
    return this.#synced;
  }

  async #run(): Promise<void> {
    const {log, name} = this.#options;
    while (!this.#stopped) {
      let resumable = false;
      try {
        if (this.#resourceVersion !== '' && this.#checkHistory) {
          resumable = true;
          if (!(await this.#historyCovers(this.#resourceVersion))) {
            log.info('API server history restarts before our resourceVersion; listing again', {
              resource: name,
              resourceVersion: this.#resourceVersion,
            });
            this.#resourceVersion = '';
          }
          this.#checkHistory = false;
        }
        resumable = false;
        if (this.#resourceVersion === '') await this.#list();
        resumable = true;
        const startedAt = this.#clock.now();
        const ended = await this.#watchOnce();
        if (ended === 'expired') {
          log.info('watch cannot resume from our resourceVersion (410 Gone, or one the server has not reached); listing again', {
            resource: name,
          });
          this.#resourceVersion = '';
        } else if (ended === 'silent') {
          log.warn('watch silent too long; listing again', {resource: name, seconds: this.#options.watchdogMs / 1000});
          this.#resourceVersion = '';
        } else if (this.#clock.now() - startedAt < 1000 && !this.#stopped) {
          // A server that ends every watch at once would otherwise be asked again in a tight loop.
          this.#backoff = Math.min(
            Math.max(this.#backoff * 2, this.#options.backoffInitialMs ?? 1000),
            this.#options.backoffMaxMs ?? 30_000,
          );
          await this.#sleep(this.#backoff);
          continue;
        }
        this.#backoff = 0;
      } catch (error) {
        if (this.#stopped) break;
        const statusCode = (error as {statusCode?: unknown}).statusCode ?? (error as {code?: unknown}).code;
        if (statusCode === 410) {
          this.#resourceVersion = '';
          continue;
        }
        // A watch that could not reach the API server resumes where it was: the history is most
        // likely still there, and if not the resumed watch gets 410 and lists. Other failures start
        // over with a list, since the server may have lost what the old resourceVersion pointed into.
        const resume = resumable && this.#resourceVersion !== '' && (statusCode === 429 || isConnectionFailure(error));
        if (resume) this.#checkHistory = true;
        else this.#resourceVersion = '';
        const initial = this.#options.backoffInitialMs ?? 1000;
        this.#backoff = this.#backoff === 0 ? initial : Math.min(this.#backoff * 2, this.#options.backoffMaxMs ?? 30_000);
        log.warn('API server request failed; retrying', {
          resource: name,
          reason: errorChainText(error),
          retryInSeconds: this.#backoff / 1000,
          next: resume ? `watch from resourceVersion ${this.#resourceVersion}` : 'list',
        });
        await this.#sleep(this.#backoff);
      }
    }
  }

  async #list(): Promise<void> {
    const items: unknown[] = [];
    let resourceVersion = '';
    let next: string | undefined;
    do {
      const query: Record<string, string> = {limit: String(listPageSize)};
      if (this.#options.labelSelector) query.labelSelector = this.#options.labelSelector;
      if (this.#options.fieldSelector) query.fieldSelector = this.#options.fieldSelector;
      if (next !== undefined) query.continue = next;
      const page = await this.#options.client.list(this.#options.path, query);
      if (this.#stopped) return;
      for (const item of page.items) {
        if (!isObjectWithName(item)) continue;
        try {
          items.push(this.#keep(item));
        } catch (error) {
          this.#options.log.error('listed object dropped', {
            resource: this.#options.name,
            object: objectName(item),
            reason: errorText(error),
          });
        }
      }
      // Every page carries the version of the snapshot the first one was cut from.
      resourceVersion = page.resourceVersion;
      // A server that hands the same token back would be asked forever.
      if (page.continue !== undefined && page.continue === next)
        throw new Error(`GET ${this.#options.path}: the same continue token again`);
      next = page.continue;
    } while (next !== undefined);
    this.#relists++;
    this.#options.onReplace(items);
    this.#resourceVersion = resourceVersion;
    if (!this.#synced) {
      this.#synced = true;
      this.#options.onSynced?.();
    }
  }

  /**
   * Whether the API server's history still reaches back to `resourceVersion`: false when its
   * current version is older (an API server restarted on new or restored storage), where a watch
   * from ours would wait for changes that never come. Versions that are not numbers: false.
   */
  async #historyCovers(resourceVersion: string): Promise<boolean> {
    const query: Record<string, string> = {limit: '1'};
    if (this.#options.labelSelector) query.labelSelector = this.#options.labelSelector;
    if (this.#options.fieldSelector) query.fieldSelector = this.#options.fieldSelector;
    const current = (await this.#options.client.list(this.#options.path, query)).resourceVersion;
    if (!/^\d+$/.test(current) || !/^\d+$/.test(resourceVersion)) return false;
    return BigInt(current) >= BigInt(resourceVersion);
  }

  /** Resolves with how the watch ended: the server closed it, 410, or the watchdog fired. */
  #watchOnce(): Promise<'closed' | 'expired' | 'silent'> {
    return new Promise((resolve, reject) => {
      let outcome: 'closed' | 'expired' | 'silent' = 'closed';
      let settled = false;
      const finish = (error?: unknown) => {
        if (settled) return;
        settled = true;
        this.#clearWatchdog();
        this.#handle = undefined;
        if (error !== undefined && error !== null && outcome === 'closed' && !this.#stopped && !isTimeout(error)) reject(error);
        else resolve(outcome);
      };
      const query: Record<string, string> = {
        resourceVersion: this.#resourceVersion,
        allowWatchBookmarks: 'true',
        timeoutSeconds: String(this.#options.watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300)),
      };
      if (this.#options.labelSelector) query.labelSelector = this.#options.labelSelector;
      if (this.#options.fieldSelector) query.fieldSelector = this.#options.fieldSelector;
      this.#armWatchdog(() => {
        outcome = 'silent';
        this.#handle?.abort();
        finish();
      });
      this.#options.client
        .watch(
          this.#options.path,
          query,
          (type, object) => {
            if (settled) return;
            this.#armWatchdog(() => {
              outcome = 'silent';
              this.#handle?.abort();
              finish();
            });
            this.#handleEvent(type, object, () => {
              outcome = 'expired';
              this.#handle?.abort();
              finish();
            });
          },
          (error) => finish(error),
        )
        .then(
          (handle) => {
            if (settled) handle.abort();
            else this.#handle = handle;
          },
          (error) => finish(error ?? new Error('watch failed')),
        );
    });
  }

  #handleEvent(type: string, object: unknown, expired: () => void): void {
    const resourceVersion = (object as {metadata?: {resourceVersion?: unknown}} | undefined)?.metadata?.resourceVersion;
    if (type === 'ERROR') {
      const status = object as {code?: unknown; details?: {causes?: {reason?: unknown}[]}} | undefined;
      // 410: the history no longer reaches back to our resourceVersion. A resourceVersion the server
      // has not reached (504, ResourceVersionTooLarge): its storage was replaced. Either way, list again.
      const tooLarge = status?.code === 504 && (status.details?.causes ?? []).some((cause) => cause.reason === 'ResourceVersionTooLarge');
      if (status?.code === 410 || tooLarge) expired();
      else this.#options.log.warn('watch error event', {resource: this.#options.name, reason: JSON.stringify(object).slice(0, 200)});
      return;
    }
    if (type === 'BOOKMARK') {
      if (typeof resourceVersion === 'string') this.#resourceVersion = resourceVersion;
      return;
    }
    if (type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED') return;
    if (!isObjectWithName(object)) {
      this.#options.log.warn('watch event without an object name dropped', {resource: this.#options.name, type});
      return;
    }
    if (typeof resourceVersion === 'string') this.#resourceVersion = resourceVersion;
    try {
      this.#options.onEvent(type, this.#keep(object));
    } catch (error) {
      this.#options.log.error('handling a watch event failed', {resource: this.#options.name, reason: errorText(error)});
    }
  }

  #armWatchdog(fire: () => void): void {
    this.#clearWatchdog();
    this.#watchdog = this.#clock.setTimer(fire, this.#options.watchdogMs);
  }

  #clearWatchdog(): void {
    if (this.#watchdog !== undefined) this.#clock.clearTimer(this.#watchdog);
    this.#watchdog = undefined;
  }

  #sleep(milliseconds: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = this.#clock.setTimer(() => {
        this.#wake = undefined;
        resolve();
      }, milliseconds);
      this.#wake = () => {
        this.#clock.clearTimer(timer);
        this.#wake = undefined;
        resolve();
      };
    });
  }
}

/** Objects per list page: client-go's pager's. */
const listPageSize = 500;

function objectName(object: unknown): string {
  const metadata = (object as {metadata: {namespace?: unknown; name: unknown}}).metadata;
  return typeof metadata.namespace === 'string' ? `${metadata.namespace}/${String(metadata.name)}` : String(metadata.name);
}

function isObjectWithName(object: unknown): boolean {
  const name = (object as {metadata?: {name?: unknown}} | undefined)?.metadata?.name;
  return typeof object === 'object' && object !== null && typeof name === 'string' && name !== '';
}

const connectionErrorCodes = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ECONNABORTED',
  'UND_ERR_SOCKET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_CLOSED',
]);

/** The request never reached the API server, or the connection broke: a fetch failure, its cause, or a socket error code. */
function isConnectionFailure(error: unknown): boolean {
  for (
    let cause = error, depth = 0;
    cause !== undefined && cause !== null && depth < 5;
    cause = (cause as {cause?: unknown}).cause, depth++
  ) {
    const code = (cause as {code?: unknown}).code;
    if (typeof code === 'string' && connectionErrorCodes.has(code)) return true;
    const message = (cause as {message?: unknown}).message;
    if (typeof message === 'string' && /^(fetch failed|terminated|other side closed)$/.test(message)) return true;
  }
  return false;
}

/** "fetch failed: connect ECONNREFUSED 127.0.0.1:6443": undici hides the reason in `cause`. */
function errorChainText(error: unknown): string {
  const parts: string[] = [];
  for (
    let cause = error, depth = 0;
    cause !== undefined && cause !== null && depth < 5;
    cause = (cause as {cause?: unknown}).cause, depth++
  ) {
    parts.push(errorText(cause));
  }
  return parts.join(': ');
}

/** client-node's Watch aborts a stream with no data for 30 s; that is a normal reconnect, not a failure. */
function isTimeout(error: unknown): boolean {
  return (error as {name?: unknown})?.name === 'TimeoutError' || (error as {name?: unknown})?.name === 'AbortError';
}
