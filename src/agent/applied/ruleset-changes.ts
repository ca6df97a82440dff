// RulesetChanges: tells the agent API when someone other than the agent changed the kernel's
// ruleset, so that the applied rules (slow to read at scale: iptables-save takes seconds at 10,000
// services) are read again only then. The signal is `nft monitor`, which ends every nf_tables
// transaction with "# new generation N by process PID (NAME)", whoever made it (the agent, kubelet,
// an operator with iptables-nft). The agent's own writes are known to it already (the proxier says
// what it wrote); any other generation makes the cached rules stale.
import {spawn, type ChildProcess} from 'node:child_process';
import {readFileSync, readdirSync, readlinkSync} from 'node:fs';
import {createInterface} from 'node:readline';
import type {IPFamily} from '../../core/model/index.ts';
import type {Logger} from '../log.ts';

/**
 * What foreign changes touched of one nf_tables table: its chains and its named sets and maps, by
 * name; `whole` when a change to it was not told by object (the table deleted or flushed, a
 * flowtable, a stateful object).
 */
export interface TouchedObjects {
  chains: Set<string>;
  sets: Set<string>;
  /** ipvs mode's virtual servers (ipvsStateParts.servers), by the words ipvsadm names them with ("-t 10.96.0.10:80"). */
  servers: Set<string>;
  whole: boolean;
}

/** The objects foreign changes touched, per family and table name (iptables-nft's tables among them). */
export type TouchedTables = Map<IPFamily, Map<string, TouchedObjects>>;

export interface RulesetChanges {
  /** False when changes cannot be seen (no nft, legacy iptables, the monitor died): never trust a cache then. */
  watching(): boolean;
  /**
   * When (ms since the epoch) the last change by a process other than the agent's own writers was
   * reported, or when watching began if that is later: a reading that started after it is current.
   */
  lastForeignChangeAt(): number;
  /**
   * Marks `pid` as one of the agent's own writers: the changes it makes are not foreign. Call the
   * function returned once the process has ended (process ids are reused).
   */
  ownWriter(pid: number): () => void;
  /**
   * Resolves true once every change the kernel committed before the call has been reported (the
   * monitor has nothing left to read), false when that cannot be told within `maxWaitMs`.
   */
  settled(maxWaitMs: number): Promise<boolean>;
  /**
   * The objects of each table (ip and ip6 families) that foreign changes touched from `since` (ms)
   * on; undefined when that cannot be told (a change too old to be kept, or one made before the
   * monitor listened). A reader of some tables looks at those alone.
   */
  foreignObjectsSince(since: number): TouchedTables | undefined;
  close(): void;
}

/** No signal: nothing is ever known to be current, so a cache never serves an old answer. */
export function unwatchedRulesetChanges(): RulesetChanges {
  return {
    watching: () => false,
    lastForeignChangeAt: () => Date.now(),
    ownWriter: () => () => {},
    settled: async () => false,
    foreignObjectsSince: () => undefined,
    close: () => {},
  };
}

/**
 * What one event line of nft monitor changed: a chain (its rules among them) or a named set or
 * map (its elements among them) of a table, or the table as a whole (`object` undefined).
 */
export type MonitorEvent = {family: IPFamily; table: string; object?: {kind: 'chain' | 'set'; name: string}} | 'none';

const monitoredFamilies: Record<string, IPFamily> = {ip: 'IPv4', ip6: 'IPv6'};

/**
 * parseMonitorEvent reads one event line of nft monitor ("add rule ip nat KUBE-SVC-X ...", "delete
 * chain ip6 filter KUBE-FORWARD", "delete element ip kube-proxy service-ips { ... }"): the object of
 * an ip or ip6 table it changed, or that table as a whole (deleted, flushed, a flowtable); 'none'
 * when it changed nothing a reading holds (another family, a table created empty, a rule's
 * anonymous set, whose rule has its own event, a comment line).
 */
export function parseMonitorEvent(line: string): MonitorEvent {
  const words = /^(add|create|insert|replace|delete|destroy|flush) (\w+) (\w+) (\S+)(?: (\S+))?/.exec(line);
  if (!words) return 'none';
  const [, verb, kind, familyWord, table, name] = words;
  const family = monitoredFamilies[familyWord];
  if (!family) return 'none';
  if (kind === 'table') return verb === 'add' || verb === 'create' ? 'none' : {family, table};
  if (name === undefined) return {family, table};
  if (kind === 'rule' || kind === 'chain') return {family, table, object: {kind: 'chain', name}};
  if (kind === 'set' || kind === 'map' || kind === 'element')
    return name.startsWith('__') ? 'none' : {family, table, object: {kind: 'set', name}};
  return {family, table};
}

/** One foreign transaction as the monitor reported it: when, and what it touched. */
interface ForeignChange {
  at: number;
  touched: TouchedTables;
}

/**
 * Foreign transactions kept for foreignObjectsSince, and objects of one table kept per
 * transaction: past that many, the table counts as touched whole (a large restore of it; a
 * reader of it reads it again, a reader of other tables is not bothered).
 */
const foreignChangesKept = 64;
const objectsPerTableKept = 256;

/** A generation line of nft monitor: "# new generation 42 by process 1234 (iptables-restor)". */
export function parseGenerationLine(line: string): {generation: number; pid?: number; process?: string} | undefined {
  const match = /^# new generation (\d+)(?: by process (\d+)(?: \((.*)\))?)?/.exec(line);
  if (!match) return undefined;
  return {generation: Number(match[1]), pid: match[2] === undefined ? undefined : Number(match[2]), process: match[3]};
}

/**
 * monitorIdle: the monitor waits for the kernel with nothing unread, so every change committed
 * before this check is already on its stdout. nft monitor can lag far behind the kernel (on a
 * large ruleset it looks every rule event up in its cache), so its silence alone means nothing.
 * Read from /proc: the process sleeps, not in a pipe write, and its subscribed netlink socket has
 * no bytes queued (/proc/PID/net/netlink is the table of the monitor's own namespace).
 */
export function monitorIdle(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    if (state !== 'S') return false;
    if (readFileSync(`/proc/${pid}/wchan`, 'utf8').includes('pipe')) return false;
    const inodes = new Set<string>();
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      const target = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (target) inodes.add(target[1]);
    }
    let subscribed = false;
    for (const row of readFileSync(`/proc/${pid}/net/netlink`, 'utf8').split('\n').slice(1)) {
      // sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
      const columns = row.trim().split(/\s+/);
      if (columns.length < 10 || !inodes.has(columns[9])) continue;
      if (columns[4] !== '0') return false;
      if (Number.parseInt(columns[3], 16) !== 0) subscribed = true;
    }
    return subscribed;
  } catch {
    return false;
  }
}

/** The objects `touched` holds of one table, made empty when it holds none yet. */
export function touchedIn(touched: TouchedTables, family: IPFamily, table: string): TouchedObjects {
  let tables = touched.get(family);
  if (!tables) touched.set(family, (tables = new Map()));
  let objects = tables.get(table);
  if (!objects) tables.set(table, (objects = {chains: new Set(), sets: new Set(), servers: new Set(), whole: false}));
  return objects;
}

/** Adds what one monitor event touched to `touched`; a table with more than objectsPerTableKept objects touched counts as touched whole. */
function addTouched(touched: TouchedTables, event: Exclude<MonitorEvent, 'none'>): void {
  const objects = touchedIn(touched, event.family, event.table);
  if (objects.whole) return;
  if (event.object) (event.object.kind === 'chain' ? objects.chains : objects.sets).add(event.object.name);
  if (!event.object || objects.chains.size + objects.sets.size > objectsPerTableKept)
    Object.assign(objects, {whole: true, chains: new Set(), sets: new Set(), servers: new Set()});
}

/** Adds the objects of `more` to `touched`. */
export function mergeTouched(touched: TouchedTables, more: TouchedTables): void {
  for (const [family, tables] of more)
    for (const [table, objects] of tables) {
      const into = touchedIn(touched, family, table);
      into.whole ||= objects.whole;
      for (const chain of objects.chains) into.chains.add(chain);
      for (const set of objects.sets) into.sets.add(set);
      for (const server of objects.servers) into.servers.add(server);
    }
}

const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** How often a monitor that does not listen yet is looked at (/proc reads). */
const subscribePollMs = 200;

/** The foreign transactions nft monitor reported, each with what it touched, kept for foreignObjectsSince. */
class ForeignChangeLog {
  readonly #changes: ForeignChange[] = [];
  /** Changes before this time are not all kept. */
  #keptSince = 0;
  /** What the transaction being reported touched: its event lines come before its generation line. */
  #pending: TouchedTables = new Map();

  /** An event line of the transaction being reported. */
  event(line: string): void {
    const event = parseMonitorEvent(line);
    if (event !== 'none') addTouched(this.#pending, event);
  }

  /** The transaction's generation line came: a foreign change reported at `at`, or one of the agent's own (undefined). */
  ended(at: number | undefined): void {
    const touched = this.#pending;
    this.#pending = new Map();
    if (at === undefined) return;
    this.#changes.push({at, touched});
    if (this.#changes.length > foreignChangesKept) this.#keptSince = this.#changes.shift()!.at + 1;
  }

  /** What the changes from `since` on touched; undefined when some of them are no longer kept. */
  since(since: number): TouchedTables | undefined {
    if (since < this.#keptSince) return undefined;
    const touched: TouchedTables = new Map();
    for (const change of this.#changes) if (change.at >= since) mergeTouched(touched, change.touched);
    return touched;
  }
}

/** A process subscribed to nf_tables' events, whose wake-ups tell that something changed, not what. */
interface WakeWatcher {
  /** Since when it is seen subscribed (ms), undefined until then. */
  listeningSince(): number | undefined;
  /** When a change was last seen to wake it (ms), 0 for never: looked at now. */
  lastWokenAt(): number;
  /** Resolves true once it has taken every change committed before the call; false when dead, or not within maxWaitMs. */
  idle(maxWaitMs: number): Promise<boolean>;
  close(): void;
}

/** Its context switches so far (/proc/PID/status): each change that reaches it wakes it. */
function contextSwitches(pid: number): number | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return [...status.matchAll(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)$/gm)].reduce((sum, match) => sum + Number(match[1]), 0);
  } catch {
    return undefined;
  }
}

/** The early watcher an observer runs (watchWakeUps). */
export const earlyWatcher = ['xtables-monitor', '-e'];

/**
 * watchWakeUps runs `command` (`xtables-monitor -e`) as a change signal for the time nft monitor
 * takes to listen: xtables-monitor reads no ruleset first and listens at once, but iptables 1.8.9
 * does not flush what it prints when that goes to a pipe, so its output arrives late or never. Its
 * wake-ups arrive at once: each change the kernel sends it wakes the process, which counts in its
 * context switches. `listens` is called once it is seen listening. Undefined when it cannot start.
 */
async function watchWakeUps(command: string[], listens: () => void): Promise<WakeWatcher | undefined> {
  let child: ChildProcess;
  try {
    child = spawn(command[0], command.slice(1), {stdio: 'ignore'});
  } catch {
    return undefined;
  }
  const started = await new Promise<boolean>((resolve) => {
    child.once('spawn', () => resolve(true));
    child.once('error', () => resolve(false));
  });
  if (!started) return undefined;
  let alive = true;
  child.once('exit', () => (alive = false));
  let since: number | undefined;
  let seen: number | undefined;
  let wokenAt = 0;
  const look = () => {
    if (!alive || since === undefined) return;
    const switches = contextSwitches(child.pid!);
    if (switches !== undefined && switches !== seen) [seen, wokenAt] = [switches, Date.now()];
  };
  // It listens within milliseconds: waited for a little, so that the first reading (taken as the
  // agent starts) is vouched for; looked at until it listens after that.
  const listensSoon = Date.now() + 1000;
  const lookForListening = async () => {
    while (alive && since === undefined) {
      if (monitorIdle(child.pid!)) {
        [since, seen] = [Date.now(), contextSwitches(child.pid!)];
        listens();
      } else await new Promise((resolve) => setTimeout(resolve, Date.now() < listensSoon ? 5 : subscribePollMs).unref());
    }
  };
  await Promise.race([lookForListening(), new Promise((resolve) => setTimeout(resolve, 1000).unref())]);
  return {
    listeningSince: () => (alive ? since : undefined),
    lastWokenAt: () => (look(), wokenAt),
    idle: async (maxWaitMs) => {
      const deadline = Date.now() + maxWaitMs;
      while (alive && !monitorIdle(child.pid!)) {
        if (Date.now() >= deadline) return false;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
      look();
      // A reading that starts once this resolves must start after the last change seen, on a clock in whole ms.
      while (Date.now() <= wokenAt) await new Promise((resolve) => setTimeout(resolve, 1));
      return alive;
    },
    close: () => {
      alive = false;
      child.kill('SIGTERM');
    },
  };
}

/** watchWakeUps of `command`, which logs when it listens. */
function startEarlyWatcher(command: string[], log: Logger, since: number): Promise<WakeWatcher | undefined> {
  return watchWakeUps(command, () =>
    log.detail(2, 'agent api: xtables-monitor listens until nft monitor does; readings are trusted until a change wakes it', {
      seconds: (Date.now() - since) / 1000,
    }),
  );
}

/** Runs `start` once `after` settles, unless closed by then, and tells `started` whether it runs. */
function startOnceSettled(
  after: Promise<unknown>,
  closed: () => boolean,
  start: () => Promise<boolean>,
  started: (running: boolean) => void,
): void {
  const go = () => {
    if (!closed()) void start().then(started);
  };
  after.then(go, go);
}

function closeWatcher(watcher: WakeWatcher | undefined): undefined {
  watcher?.close();
  return undefined;
}

/**
 * spawnMonitor runs the monitor command, its lines to `onLine`; undefined (the reason logged) when
 * it cannot run. `onExit` is told when it ends, with what it said last on stderr.
 */
async function spawnMonitor(
  command: string[],
  log: Logger,
  onLine: (line: string) => void,
  onExit: (ended: {code?: number; signal?: string; stderr?: string}) => void,
): Promise<ChildProcess | undefined> {
  let monitor: ChildProcess;
  try {
    monitor = spawn(command[0], command.slice(1), {stdio: ['ignore', 'pipe', 'pipe']});
  } catch (error) {
    log.warn('agent api: cannot watch the ruleset; applied rules are read for every request', {reason: (error as Error).message});
    return undefined;
  }
  let stderr = '';
  monitor.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr = (stderr + chunk).slice(-500)));
  createInterface({input: monitor.stdout!}).on('line', onLine);
  const started = await new Promise<boolean>((resolve) => {
    monitor.once('spawn', () => resolve(true));
    monitor.once('error', () => resolve(false));
  });
  if (!started) {
    log.warn('agent api: cannot run nft monitor; applied rules are read for every request', {command: command.join(' ')});
    return undefined;
  }
  monitor.once('exit', (code, signal) =>
    onExit({code: code ?? undefined, signal: signal ?? undefined, stderr: stderr.trim() || undefined}),
  );
  return monitor;
}

/**
 * watchNftRuleset runs `nft monitor` (inside `ip netns exec NETNS` when given) until close().
 * Resolves once the monitor runs, or with a signal that watches nothing when it cannot start.
 * `monitor`: another command in its place (tests: one that is slow to listen). Until nft monitor
 * listens (it reads the whole ruleset first: minutes on a large iptables-nft node), `early`
 * (`xtables-monitor -e`, see watchWakeUps) tells that something changed, not what, nor who
 * changed it: for an observer, which changes nothing itself. With `early`, `monitorAfter` holds
 * nft monitor back until it settles (an observer's first reading of the kernel): reading the
 * ruleset, nft takes most of a core, and on a 2-core node iptables-save took twice as long beside it.
 */
export async function watchNftRuleset(options: {
  netns?: string;
  log: Logger;
  monitor?: string[];
  early?: string[];
  monitorAfter?: Promise<unknown>;
}): Promise<RulesetChanges> {
  const {netns, log} = options;
  const monitor = options.monitor ?? ['nft', 'monitor'];
  // ip netns exec execs nft in place: the process id is the monitor's own.
  const inNetns = (words: string[]) => (netns ? ['ip', 'netns', 'exec', netns, ...words] : words);
  const command = inNetns(monitor);
  const spawnedAt = Date.now();
  let early = options.early ? await startEarlyWatcher(inNetns(options.early), log, spawnedAt) : undefined;
  // nft monitor is held back only while the early watcher stands in for it.
  const monitorAfter = early ? options.monitorAfter : undefined;
  // Changes the early watcher saw before nft monitor listened: they are not named.
  let unnamedChangeAt = 0;
  let alive = false;
  /** nft monitor is not started yet (monitorAfter), and the early watcher stands in for it. */
  let heldBack = monitorAfter !== undefined;
  let closed = false;
  // Until the monitor is seen subscribed, changes may pass unreported.
  let watchingSince: number | undefined;
  let lastForeignAt = 0;
  // The agent's writers, with when they ended: once the monitor is idle after that, all their changes were reported.
  const own = new Map<number, number | undefined>();
  let child: ChildProcess | undefined;
  const foreign = new ForeignChangeLog();

  const onMonitorLine = (line: string) => {
    const generation = parseGenerationLine(line);
    if (!generation) return foreign.event(line);
    if (generation.pid !== undefined && own.has(generation.pid)) return foreign.ended(undefined);
    lastForeignAt = Date.now();
    foreign.ended(lastForeignAt);
    log.detail(3, 'agent api: ruleset changed by another process', {...generation});
  };

  /** Starts nft monitor; false when it cannot run (its reason logged). */
  const startMonitor = async (): Promise<boolean> => {
    const monitorProcess = await spawnMonitor(command, log, onMonitorLine, (ended) => {
      alive = false;
      if (!closed) log.warn('agent api: nft monitor ended; applied rules are read for every request from now on', ended);
    });
    if (!monitorProcess) return false;
    child = monitorProcess;
    alive = true;
    // Learn early that the monitor listens, so that readings taken from now on can be trusted. nft
    // reads the whole ruleset before it listens, which on a large node takes minutes: looked at until
    // it does (requests ask only once it watches).
    void (async () => {
      while (alive && !closed && watchingSince === undefined) {
        if (monitorIdle(monitorProcess.pid!)) await settled(1000);
        else await new Promise((resolve) => setTimeout(resolve, subscribePollMs).unref());
      }
    })();
    return true;
  };

  const settled = async (maxWaitMs: number): Promise<boolean> => {
    const deadline = Date.now() + maxWaitMs;
    for (;;) {
      if (!alive) return false;
      const checkedAt = Date.now();
      if (monitorIdle(child!.pid!)) {
        // What the monitor wrote before it went idle is in the pipe: let the event loop read it.
        await turn();
        await turn();
        for (const [pid, endedAt] of own) if (endedAt !== undefined && endedAt < checkedAt) own.delete(pid);
        // A reading that starts once this resolves must start after the last change reported, on a clock in whole ms.
        while (Date.now() <= lastForeignAt) await new Promise((resolve) => setTimeout(resolve, 1));
        if (watchingSince === undefined) {
          // The early watcher hands over: the changes it saw are not named, and the readings it
          // vouched for (taken since it listened) stay trusted.
          const earlySince = early?.listeningSince();
          const handedOver = early !== undefined && earlySince !== undefined && (await early.idle(1000));
          if (handedOver) {
            unnamedChangeAt = early!.lastWokenAt();
            lastForeignAt = Math.max(lastForeignAt, unnamedChangeAt);
          }
          early = closeWatcher(early);
          const listening = Date.now();
          // Another caller may have handed over while this one waited.
          if (watchingSince === undefined) {
            watchingSince = handedOver ? earlySince : listening;
            log.detail(2, 'agent api: the ruleset monitor listens; readings are trusted until it reports a change', {
              monitor: monitor.join(' '),
              seconds: (listening - spawnedAt) / 1000,
            });
          }
        }
        return alive;
      }
      if (Date.now() >= deadline) return false;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  };
  if (monitorAfter) {
    startOnceSettled(
      monitorAfter,
      () => closed,
      startMonitor,
      (running) => {
        // The early watcher stands in until the monitor runs, or for good should it not.
        heldBack = false;
        if (running && closed) child!.kill('SIGTERM');
        if (!running) early = closeWatcher(early);
      },
    );
  } else if (!(await startMonitor())) {
    closeWatcher(early);
    return unwatchedRulesetChanges();
  }

  // Until nft monitor listens, the early watcher's answers, once it listens.
  const earlyListening = (): WakeWatcher | undefined =>
    (alive || heldBack) && watchingSince === undefined && early?.listeningSince() !== undefined ? early : undefined;
  return {
    watching: () => (alive && watchingSince !== undefined) || earlyListening() !== undefined,
    lastForeignChangeAt: () => {
      if (alive && watchingSince !== undefined) return Math.max(lastForeignAt, watchingSince);
      const watcher = earlyListening();
      return watcher ? Math.max(watcher.lastWokenAt(), watcher.listeningSince()!) : Date.now();
    },
    ownWriter: (pid) => {
      own.set(pid, undefined);
      if (own.size > 256) own.delete(own.keys().next().value!);
      return () => {
        if (own.has(pid)) own.set(pid, Date.now());
      };
    },
    settled: (maxWaitMs) => earlyListening()?.idle(maxWaitMs) ?? settled(maxWaitMs),
    foreignObjectsSince: (since) => {
      const watcher = earlyListening();
      // Before nft monitor listens a change is known, not what it touched.
      if (watcher) return since < watcher.listeningSince()! || watcher.lastWokenAt() >= since ? undefined : new Map();
      if (!alive || watchingSince === undefined || since < watchingSince || since <= unnamedChangeAt) return undefined;
      return foreign.since(since);
    },
    close: () => {
      closed = true;
      early?.close();
      if (alive) child!.kill('SIGTERM');
    },
  };
}
