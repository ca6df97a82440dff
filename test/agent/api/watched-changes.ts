// A ruleset monitor for tests of the applied rules: it always watches, and reports a foreign
// change when the test makes one, at the time of the test's clock, with the chains it touched when
// the test names them (as nft monitor names iptables' chains).
import type {ChainsByTable, RulesetChanges} from '../../../src/agent/applied/ruleset-changes.ts';

export function watchedChanges(clock: {time: number}): RulesetChanges & {foreignChange(chains?: ChainsByTable): void} {
  let foreignAt = 0;
  const changes: Array<{at: number; chains?: ChainsByTable}> = [];
  return {
    watching: () => true,
    lastForeignChangeAt: () => foreignAt,
    ownWriter: () => () => {},
    settled: async () => true,
    foreignChainsSince: (since) => {
      const touched: ChainsByTable = new Map();
      for (const {at, chains} of changes) {
        if (at < since) continue;
        if (!chains) return undefined;
        for (const [family, tables] of chains)
          for (const [table, names] of tables) {
            if (!touched.has(family)) touched.set(family, new Map());
            const kept = touched.get(family)!;
            kept.set(table, new Set([...(kept.get(table) ?? []), ...names]));
          }
      }
      return touched;
    },
    close: () => {},
    foreignChange: (chains) => {
      foreignAt = clock.time++;
      changes.push({at: foreignAt, chains});
    },
  };
}
