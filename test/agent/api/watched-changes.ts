// A ruleset monitor for tests of the applied rules: it always watches, and reports a foreign
// change when the test makes one, at the time of the test's clock.
import type {RulesetChanges} from '../../../src/agent/applied/ruleset-changes.ts';

export function watchedChanges(clock: {time: number}): RulesetChanges & {foreignChange(): void} {
  let foreignAt = 0;
  return {
    watching: () => true,
    lastForeignChangeAt: () => foreignAt,
    ownWriter: () => () => {},
    settled: async () => true,
    close: () => {},
    foreignChange: () => void (foreignAt = clock.time++),
  };
}
