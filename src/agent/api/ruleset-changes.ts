// RulesetChanges: tells the agent API when the kernel's ruleset may have changed, so that the
// applied rules (slow to read at scale: iptables-save takes seconds at 10,000 services) are read
// again only then. The signal is `nft monitor`, which prints a line for every nf_tables change,
// whoever makes it (the agent, kubelet, an operator with iptables-nft).
import {spawn, type ChildProcess} from 'node:child_process';
import {createInterface} from 'node:readline';
import type {Logger} from '../log.ts';

export interface RulesetChanges {
  /** Grows with every change seen; compare two readings to know whether anything changed between them. */
  generation(): number;
  /** False when changes cannot be seen (no nft, legacy iptables, the monitor died or lags): never trust a cache then. */
  watching(): boolean;
  /** Counts a change the agent made itself: a write that started at `startedAt` (ms since the epoch). */
  bump(startedAt: number): void;
  close(): void;
}

/** No signal: every reading is a new generation, so a cache never serves an old answer. */
export function unwatchedRulesetChanges(): RulesetChanges {
  let generation = 0;
  return {generation: () => ++generation, watching: () => false, bump: () => void generation++, close: () => {}};
}

/**
 * watchNftRuleset runs `nft monitor` (inside `ip netns exec NETNS` when given) until close().
 * Resolves once the monitor runs, or with a signal that watches nothing when it cannot start.
 */
export async function watchNftRuleset(options: {netns?: string; log: Logger}): Promise<RulesetChanges> {
  const {netns, log} = options;
  const command = netns ? ['ip', 'netns', 'exec', netns, 'nft', 'monitor'] : ['nft', 'monitor'];
  let generation = 0;
  let alive = false;
  let closed = false;
  // nft monitor can lag far behind the kernel (on a large ruleset it rebuilds its cache for each
  // event): trust its silence only once it has reported a change since the agent's last write.
  let heardSinceOwnWrite = false;
  let lastLineAt = 0;
  let child: ChildProcess;
  try {
    child = spawn(command[0], command.slice(1), {stdio: ['ignore', 'pipe', 'pipe']});
  } catch (error) {
    log.warn('agent api: cannot watch the ruleset; applied rules are read for every request', {reason: (error as Error).message});
    return unwatchedRulesetChanges();
  }
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr = (stderr + chunk).slice(-500)));
  createInterface({input: child.stdout!}).on('line', () => {
    generation++;
    heardSinceOwnWrite = true;
    lastLineAt = Date.now();
  });
  const started = await new Promise<boolean>((resolve) => {
    child.once('spawn', () => resolve(true));
    child.once('error', () => resolve(false));
  });
  if (!started) {
    log.warn('agent api: cannot run nft monitor; applied rules are read for every request', {command: command.join(' ')});
    return unwatchedRulesetChanges();
  }
  alive = true;
  child.once('exit', (code, signal) => {
    alive = false;
    if (!closed) log.warn('agent api: nft monitor ended; applied rules are read for every request from now on', {code: code ?? undefined, signal: signal ?? undefined, stderr: stderr.trim() || undefined});
  });
  return {
    // While the monitor is gone or behind, every reading is new, as with no signal at all.
    generation: () => (alive && heardSinceOwnWrite ? generation : ++generation),
    watching: () => alive && heardSinceOwnWrite,
    bump: (startedAt) => {
      generation++;
      // The monitor may have reported the write before the agent finished it.
      heardSinceOwnWrite = lastLineAt >= startedAt;
    },
    close: () => {
      closed = true;
      if (alive) child.kill('SIGTERM');
    },
  };
}
