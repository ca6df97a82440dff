// The change signal for ipvs mode's state. Virtual servers, ipsets and kube-ipvs0's addresses change
// unseen by nft monitor, and nothing else announces them: IPVS's and ipset's netlink families have
// no multicast group, and neither keeps a generation number. So they are looked at on a timer,
// each as cheaply as it can be told to have changed:
// - virtual and real servers: the kernel's own table of them, /proc/net/ip_vs, read as a file (no
//   command, no netlink dump of each server's real servers) and compared as text without its
//   connection counts. When it changed, the servers whose lines changed are spelled from it as
//   `ipvsadm -Sn` prints them, into the text the previous look had (core/ipvs/kernel-table.ts);
//   where the table cannot say one as -Sn does (a persistence timeout, in the kernel's ticks),
//   -Sn runs. That text is what is compared and what the follow reads: the servers spelled are
//   named in the change report, and only their lines are read again. The table is compared as
//   it is read: the first server changed in place is reported as soon as the read passes it, so
//   that a change waits for the read to reach it, not for the rest of the table. Where the table
//   cannot be read, every look runs -Sn. What the table does not show (thresholds, scheduler flags) and
//   a change undone within one look are seen when the state is next read whole, which it is every
//   10 minutes (wholeReadingEveryMs);
// - sets: `ipset list -t`, each KUBE- set's header (type, entry count, memory size), not its
//   entries: adding or deleting an entry changes the count and size, and only that set is read
//   again. A delete and an add in the same set between two looks leave its header as it was:
//   that change is seen when the state is next read whole;
// - addresses: `ip -br addr show dev kube-ipvs0`, compared as text.
// The iptables layer is nft monitor's (watchNftRuleset), merged in. A change is reported with
// what it touched, under the names ipvsStateParts gives, for the ipvs backend's follow.
import type {IPFamily} from '../../core/model/index.ts';
import {dummyDevice, savedTextSince, ServerTableComparison, ServerTableShaper, type SpelledSince} from '../../core/ipvs/index.ts';
import {errorText} from '../../core/error-text.ts';
import type {Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {setFamily} from '../sync/ipvs-host.ts';
import {mergeTouched, type RulesetChanges, type TouchedTables, touchedIn} from './ruleset-changes.ts';

/**
 * The parts of ipvs mode's state a change report names, in place of nf_tables tables (a name
 * with a space is no table's): the servers and addresses touched whole, the sets by name.
 */
export const ipvsStateParts = {
  servers: 'ipvs virtual servers',
  sets: 'ipvs sets',
  addresses: `ipvs ${dummyDevice} addresses`,
} as const;

const families: IPFamily[] = ['IPv4', 'IPv6'];

/**
 * The virtual servers as the latest look printed them (`ipvsadm -Sn`), for the follow of the change
 * it saw, in place of printing them again: a change after that look began is seen by a later look,
 * which ends after the follow, so a reading made from this text is never vouched for past it.
 * Undefined until a look succeeds, and after one fails.
 */
export interface LatestIpvsLook {
  servers: string | undefined;
}

/** One look at the state: the texts compared with the previous look's. */
export interface IpvsStateLook {
  /** The servers as `ipvsadm -Sn` prints them: printed, or spelled from serverTable where it changed (lookAtIpvsState). */
  servers: string;
  /** serverTableShape of /proc/net/ip_vs, read before servers were printed; undefined when it could not be read. */
  serverTable?: Buffer;
  /**
   * The servers whose lines differ from the previous look's, by ipvsadm's words for them
   * ("-t 10.96.0.10:80"), where they were spelled from the table, but the one the look reported
   * while it read (lookAtIpvsState's `onServerChanged`); undefined when `ipvsadm -Sn` printed them all.
   */
  changedServers?: ReadonlySet<string>;
  /** Each KUBE- set's header in `ipset list -t`, by name. */
  sets: Map<string, string>;
  addresses: string;
  /** How long telling whether anything changed took, without running `ipvsadm -Sn` when they had: what the next look costs if nothing changes. */
  tellingMs?: number;
}

/** The KUBE- sets' headers in `ipset list -t` output (blocks that begin "Name: ..."), by name. */
export function ipsetHeaders(terse: string): Map<string, string> {
  const headers = new Map<string, string>();
  for (const block of terse.split(/\n(?=Name: )/)) {
    const name = /^Name: (\S+)/.exec(block)?.[1];
    if (name?.startsWith('KUBE-')) headers.set(name, block.trim());
  }
  return headers;
}

/** The family of a virtual server named as ipvsadm names it: "-t [fd00::1]:80" is IPv6's. */
function serverFamily(words: string): IPFamily {
  return words.includes('[') ? 'IPv6' : 'IPv4';
}

/** `touched` with the servers named by ipvsadm's words for them ("-t 10.96.0.10:80"), each in its family. */
function serversTouched(touched: TouchedTables, servers: Iterable<string>): TouchedTables {
  for (const server of servers) touchedIn(touched, serverFamily(server), ipvsStateParts.servers).servers.add(server);
  return touched;
}

/**
 * What changed between two looks, by family and part; empty when nothing did. The servers are
 * named where the look that saw them change could name them.
 */
export function changedParts(before: IpvsStateLook, after: IpvsStateLook): TouchedTables {
  const touched: TouchedTables = new Map();
  const whole = (part: string) => {
    for (const family of families) touchedIn(touched, family, part).whole = true;
  };
  if (before.servers !== after.servers && after.changedServers) serversTouched(touched, after.changedServers);
  else if (before.servers !== after.servers) whole(ipvsStateParts.servers);
  if (before.addresses !== after.addresses) whole(ipvsStateParts.addresses);
  for (const name of new Set([...before.sets.keys(), ...after.sets.keys()]))
    if (before.sets.get(name) !== after.sets.get(name)) touchedIn(touched, setFamily(name), ipvsStateParts.sets).sets.add(name);
  return touched;
}

/**
 * Takes one look at the node's ipvs state. Given the previous look, the servers are printed only
 * when the kernel's table of them changed since, and then only the changed ones are spelled from
 * the table where it can (savedTextSince); else `ipvsadm -Sn` prints them all. The table is
 * compared as it is read (ServerTableComparison): `onServerChanged` is given the first server
 * found changed in place, with `ipvsadm -Sn` as it would print with that change, as soon as the
 * read passes it; the look's result then names only the servers that changed besides.
 */
export async function lookAtIpvsState(
  host: Host,
  previous?: IpvsStateLook,
  onServerChanged?: (change: SpelledSince) => void,
): Promise<IpvsStateLook> {
  const startedAt = Date.now();
  const shaper = new ServerTableShaper();
  const comparison =
    previous?.serverTable && onServerChanged ? new ServerTableComparison(previous.serverTable, previous.servers) : undefined;
  let reported: SpelledSince | undefined;
  const onRead =
    comparison &&
    ((read: Buffer) => {
      const changed = comparison.more(shaper.more(read));
      if (changed) onServerChanged!((reported = changed));
    });
  const [shape, terse, addresses] = await Promise.all([
    host.ipvsTable(onRead).then(
      (table) => shaper.end(table),
      () => undefined,
    ),
    host.ipset(['list', '-t']),
    host.ip(['-br', 'addr', 'show', 'dev', dummyDevice]).catch(() => ''),
  ]);
  // The table's buffer is the host's, read into again by the next look: the shape is kept as a
  // copy, made only when it changed (the previous look's otherwise), so that a look that sees no
  // change leaves the collector nothing of the table's megabytes.
  const serverTable = shape && previous?.serverTable?.equals(shape) ? previous.serverTable : shape && Buffer.from(shape);
  const sets = ipsetHeaders(terse);
  const tellingMs = Date.now() - startedAt;
  if (previous?.serverTable !== undefined && serverTable !== undefined) {
    if (serverTable === previous.serverTable)
      return {servers: previous.servers, serverTable: previous.serverTable, sets, addresses, tellingMs};
    if (reported && comparison!.differsOnlyInSpelled(serverTable))
      return {servers: reported.text, serverTable, changedServers: new Set(), sets, addresses, tellingMs};
    const spelled = savedTextSince(previous.servers, previous.serverTable, serverTable);
    if (spelled !== undefined) {
      // The server reported is spelled again from the same read: its lines are those reported.
      for (const server of reported?.changedServers ?? []) spelled.changedServers.delete(server);
      return {servers: spelled.text, serverTable, changedServers: spelled.changedServers, sets, addresses, tellingMs};
    }
  }
  const servers = await host.ipvsadm(['-Sn']);
  return {servers, serverTable, sets, addresses, tellingMs: serverTable === undefined ? Date.now() - startedAt : tellingMs};
}

/** Changes kept for foreignObjectsSince; older ones make it answer undefined (read everything). */
const changesKept = 64;

/**
 * How long a change may wait to be seen, from when it is made until the end of the look that sees
 * it, where looks are quick enough to allow it: with the drift check that follows (under a
 * second), drift is then counted within 5 s of a foreign change.
 */
const changeSeenWithinMs = 4000;

/**
 * How often the state is read whole again, whatever the looks saw: what they cannot see (an entry
 * deleted and another added to one set between two looks, thresholds, a change made and undone
 * while a look printed the servers) is then seen within this time.
 */
const wholeReadingEveryMs = 10 * 60_000;

/**
 * How long from one look's start to the next's: pollMs while looks are quick. A look that takes
 * longer to tell whether anything changed (IpvsStateLook.tellingMs) spaces them to ten times its
 * length, so that looking at a large state (the table of 100,000 real servers) takes a tenth of
 * the time, but no further apart than lets a change be seen within changeSeenWithinMs; and
 * never less than twice its length, so that looking takes at most half the time, whatever the
 * wait for a change then comes to.
 */
export function lookPeriod(pollMs: number, tellingMs: number): number {
  return Math.max(pollMs, 2 * tellingMs, Math.min(10 * tellingMs, changeSeenWithinMs - tellingMs));
}

/**
 * watchIpvsState looks at the node's ipvs state every pollMs (default 2 s; lookPeriod) and reports each change
 * as foreign, merged with `iptables` (nft monitor for the iptables layer, or no signal). It looks
 * once before it resolves: a reading that starts after that is vouched for. `look` stands in for
 * lookAtIpvsState in tests.
 */
export async function watchIpvsState(options: {
  host: Host;
  log: Logger;
  iptables: RulesetChanges;
  pollMs?: number;
  look?: (previous: IpvsStateLook | undefined, onServerChanged: (change: SpelledSince) => void) => Promise<IpvsStateLook>;
  /** Given each look's servers (ipvsRulesBackend's follow reads them). */
  latest?: LatestIpvsLook;
  /** How often the state is read whole again (default 10 minutes). */
  wholeReadingEveryMs?: number;
}): Promise<RulesetChanges> {
  const {log, iptables, latest} = options;
  const pollMs = options.pollMs ?? 2000;
  const look = options.look ?? ((previous, onServerChanged) => lookAtIpvsState(options.host, previous, onServerChanged));
  let last: IpvsStateLook | undefined;
  /** When the looks were last (re)started from a first look: changes before are not known. */
  let watchingSince: number | undefined;
  let lastChangeAt = 0;
  const changes: {at: number; touched: TouchedTables}[] = [];
  let keptSince = 0;
  let closed = false;
  let timer: NodeJS.Timeout | undefined;
  let lastLookMs = 0;
  let lastLookStartedAt = 0;
  let running: {startedAt: number; done: Promise<boolean>} | undefined;
  /** The last look failed (said once in the log until one succeeds). */
  let failing = false;
  const wholeEveryMs = options.wholeReadingEveryMs ?? wholeReadingEveryMs;
  /** When readings were last made to read the state whole (or the looks began). */
  let wholeSince = 0;

  /** A change reported at `at`: readings from before it follow it. */
  const changed = (at: number, touched: TouchedTables) => {
    lastChangeAt = at;
    changes.push({at, touched});
    if (changes.length > changesKept) keptSince = changes.shift()!.at + 1;
    log.detail(3, 'agent api: ipvs state changed', {parts: describe(touched)});
  };

  /**
   * A server the running look found changed as it read the table, reported then, not once the look
   * ends: with the servers as they print with it, for the follow. The look's result leaves it out.
   */
  const serverChangedWhileLooking = (change: SpelledSince) => {
    if (watchingSince === undefined || !last) return;
    if (latest) latest.servers = change.text;
    changed(Date.now(), serversTouched(new Map(), change.changedServers));
  };

  const lookOnce = (): Promise<boolean> => {
    const startedAt = (lastLookStartedAt = Date.now());
    const done = (async () => {
      try {
        const now = await look(last, serverChangedWhileLooking);
        const at = Date.now();
        lastLookMs = now.tellingMs ?? at - startedAt;
        if (watchingSince === undefined || !last) {
          // The first look, or the first since looking failed: changes before it are not known.
          if (watchingSince === undefined)
            log.detail(2, 'agent api: watching the ipvs state; readings are trusted until it changes', {seconds: lastLookMs / 1000});
          watchingSince = at;
          wholeSince = at;
        } else if (at - wholeSince >= wholeEveryMs) {
          // As after a change of unknown extent: a reading from before now is read whole again.
          wholeSince = lastChangeAt = keptSince = at;
          log.detail(3, 'agent api: the ipvs state is read whole again: looks do not see every change', {
            minutes: wholeEveryMs / 60_000,
          });
        } else {
          const touched = changedParts(last, now);
          if (touched.size > 0) changed(at, touched);
        }
        last = now;
        if (latest) latest.servers = now.servers;
        failing = false;
        return true;
      } catch (error) {
        if (!failing)
          log.warn('agent api: cannot look at the ipvs state; applied rules are read for every request until it can', {
            reason: errorText(error),
          });
        failing = true;
        watchingSince = undefined;
        // The next look prints everything again: what this one could not see is not known.
        last = undefined;
        if (latest) latest.servers = undefined;
        return false;
      } finally {
        running = undefined;
      }
    })();
    running = {startedAt, done};
    return done;
  };

  /** Resolves with a look that started at `since` or later. */
  const lookStartedAfter = async (since: number): Promise<boolean> => {
    for (;;) {
      if (!running) return lookOnce();
      if (running.startedAt >= since) return running.done;
      await running.done;
    }
  };

  /** The next look starts a period after the last one started, counted from its start so that its length does not add to the wait. */
  const schedule = () => {
    if (closed) return;
    const sinceLastStart = Date.now() - lastLookStartedAt;
    timer = setTimeout(
      async () => {
        await (running?.done ?? lookOnce());
        schedule();
      },
      Math.max(0, lookPeriod(pollMs, lastLookMs) - sinceLastStart),
    );
    timer.unref();
  };

  await lookOnce();
  schedule();
  const watching = () => !closed && watchingSince !== undefined && iptables.watching();
  return {
    watching,
    lastForeignChangeAt: () => Math.max(iptables.lastForeignChangeAt(), lastChangeAt, watchingSince ?? Date.now()),
    ownWriter: (pid) => iptables.ownWriter(pid),
    settled: async (maxWaitMs) => {
      const calledAt = Date.now();
      const timeout = new Promise<boolean>((resolve) => setTimeout(() => resolve(false), maxWaitMs).unref());
      const [looked, layer] = await Promise.all([Promise.race([lookStartedAfter(calledAt), timeout]), iptables.settled(maxWaitMs)]);
      // A reading that starts once this resolves must start after the last change reported, on a clock in whole ms.
      while (Date.now() <= lastChangeAt) await new Promise((resolve) => setTimeout(resolve, 1));
      return looked && layer && watching();
    },
    foreignObjectsSince: (since) => {
      if (watchingSince === undefined || since < watchingSince || since < keptSince) return undefined;
      const layer = iptables.foreignObjectsSince(since);
      if (!layer) return undefined;
      const touched: TouchedTables = new Map();
      mergeTouched(touched, layer);
      for (const change of changes) if (change.at >= since) mergeTouched(touched, change.touched);
      return touched;
    },
    close: () => {
      closed = true;
      clearTimeout(timer);
      iptables.close();
    },
  };
}

/** "IPv4 ipvs sets KUBE-LOOP-BACK; IPv4 ipvs virtual servers -t 10.96.0.10:80" for the log. */
function describe(touched: TouchedTables): string {
  const parts: string[] = [];
  for (const [family, tables] of touched)
    for (const [part, objects] of tables)
      parts.push(`${family} ${part}${objects.whole ? '' : ` ${[...objects.sets, ...objects.servers].join(', ')}`}`);
  return parts.join('; ');
}
