// A ruleset monitor for tests of the applied rules: it always watches, and reports a foreign
// change when the test makes one, at the time of the test's clock, with the objects it touched when
// the test names them (as nft monitor names iptables' chains and nftables' chains and sets).
import {mergeTouched, type RulesetChanges, type TouchedTables} from '../../../src/agent/applied/ruleset-changes.ts';

export function watchedChanges(clock: {time: number}): RulesetChanges & {foreignChange(touched?: TouchedTables): void} {
  let foreignAt = 0;
  const changes: Array<{at: number; touched?: TouchedTables}> = [];
  return {
    watching: () => true,
    lastForeignChangeAt: () => foreignAt,
    ownWriter: () => () => {},
    settled: async () => true,
    foreignObjectsSince: (since) => {
      const all: TouchedTables = new Map();
      for (const {at, touched} of changes) {
        if (at < since) continue;
        if (!touched) return undefined;
        mergeTouched(all, touched);
      }
      return all;
    },
    close: () => {},
    foreignChange: (touched) => {
      foreignAt = clock.time++;
      changes.push({at: foreignAt, touched});
    },
  };
}
