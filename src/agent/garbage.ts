// When the agent collects its garbage. V8 would hold a large cluster's garbage (whole tables read
// or written) until its next major collection, which an idle agent may not reach for minutes; the
// agent asks for one where it knows it left much behind. Memory that background work frees when
// it ends (a text deflated off the main thread, CompressedText) is waited for, so that one
// collection takes it too.

/** Background work under way that frees memory when it ends. */
const pending = new Set<Promise<unknown>>();
/** The collection asked for once the pending work has ended, the thorough one if any asked for it. */
let afterPending: 'last-resort' | 'regular' | undefined;

/**
 * releaseGarbage collects garbage at once when the agent runs with --expose-gc (bin/proxyctl-agent
 * and the image start it so). The proxiers call it after a sync that wrote or read whole tables:
 * in a large cluster such a sync leaves more garbage than the agent keeps (iptables mode: the
 * restore input, the iptables-save outputs read back and their lines; the initial lists at
 * start), and V8 would hold it, and the memory under it, until its next major collection, which
 * an idle agent may not reach for minutes. A collection is short next to such a sync, and such
 * syncs are rare: at start, hourly, after drift or a failure, and at most once per syncPeriod for
 * the drift check. Without --expose-gc it does nothing. A last-resort collection (two full ones)
 * also compacts the whole old generation, so that the pages the garbage filled go back to the
 * system (the RSS it saves: docs/development.md, Memory engineering); `regular` asks for one full
 * collection, which compacts only the pages V8 finds fragmented: half the time on a large heap.
 * Background work still under way frees its memory after this collection: another follows it.
 */
export function releaseGarbage(flavor: 'last-resort' | 'regular' = 'last-resort'): void {
  const gc = (globalThis as {gc?: (options: object) => void}).gc;
  if (!gc) return;
  forgetLastRegExpMatch();
  gc({type: 'major', execution: 'sync', flavor});
  if (pending.size > 0) collectAfterPending(flavor);
}

let releaseScheduled: 'last-resort' | 'regular' | undefined;

/**
 * releaseGarbageSoon: releaseGarbage once the work on the stack is done (a request answered) and
 * the background work under way has ended, once however many times it is asked for before then:
 * a reading and the diff made of it each leave garbage, and one collection takes both, the
 * thorough one if any asked for it. A whole reading asks for a last-resort collection (its garbage
 * is tables large; compacted, their pages go back to the system). A comparison alone asks for a
 * regular one: an observer compares after each foreign change, and at 10,000 services a
 * last-resort collection was a third of the CPU that took (docs/observe.md).
 */
export function releaseGarbageSoon(flavor: 'last-resort' | 'regular' = 'last-resort'): void {
  if (pending.size > 0) {
    collectAfterPending(flavor);
    return;
  }
  if (releaseScheduled !== undefined) {
    if (flavor === 'last-resort') releaseScheduled = flavor;
    return;
  }
  releaseScheduled = flavor;
  setImmediate(() => {
    const asked = releaseScheduled;
    releaseScheduled = undefined;
    releaseGarbage(asked);
  });
}

/**
 * freedLater: `work` frees memory when it ends (its outcome is the caller's to handle): a
 * collection asked for meanwhile waits for it.
 */
export function freedLater(work: Promise<unknown>): void {
  pending.add(work);
  const ended = () => {
    pending.delete(work);
    if (pending.size > 0 || afterPending === undefined) return;
    const asked = afterPending;
    afterPending = undefined;
    releaseGarbageSoon(asked);
  };
  work.then(ended, ended);
}

function collectAfterPending(flavor: 'last-resort' | 'regular'): void {
  if (afterPending !== 'last-resort') afterPending = flavor;
}

/**
 * V8 keeps the subject of the last regular-expression match alive (for RegExp.lastMatch and
 * RegExp.$1). After a reading, that subject is a rule sliced out of iptables-save's output, and it
 * keeps the whole output until some other match runs, which in an idle agent can be never (what
 * that cost: docs/development.md, Memory engineering). A match on an empty string takes its place.
 */
function forgetLastRegExpMatch(): void {
  /(?:)/.exec('');
}
