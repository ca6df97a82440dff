// itRunsInGuest: on a kernel without IP_VS, one test that runs the whole calling test file in the
// qemu guest (Debian's kernel, which has IP_VS) and passes only if every case passed there, none
// skipped. The guest's per-case lines come back as diagnostics, so a failure names its case.
import assert from 'node:assert/strict';
import {relative} from 'node:path';
import {it} from 'node:test';
import {fileURLToPath} from 'node:url';
import {guestTestRunFailure, guestUnavailableReason, repoRoot, runTestFileInGuest} from '../../scripts/qemu/guest.ts';

export function itRunsInGuest(fileUrl: string, options: {timeoutMs: number; memoryMiB?: number}): void {
  it("runs every case of this file in a qemu guest booting Debian's kernel", {timeout: options.timeoutMs + 20_000}, async (t) => {
    const unavailable = guestUnavailableReason();
    if (unavailable) {
      t.skip(`this kernel has no IP_VS and no qemu guest can boot: ${unavailable}`);
      return;
    }
    const file = relative(repoRoot, fileURLToPath(fileUrl));
    const result = await runTestFileInGuest(file, {memoryMiB: options.memoryMiB ?? 2048, timeoutMs: options.timeoutMs});
    if (result.crashedFirstRun) {
      // Each of its lines marked as the guest's, so that its own test report is not taken for this run's.
      const output = `${result.crashedFirstRun.stdout}\n${result.crashedFirstRun.stderr}`
        .split('\n')
        .map((line) => `guest's first run | ${line}`);
      t.diagnostic(
        `Node died in the guest's first run (the emulator's fault, not a test's) and the file was run again:\n${output.join('\n')}`,
      );
    }
    for (const line of result.stdout.split('\n').filter((text) => /^ℹ (tests|pass|fail|skipped|duration_ms)|^\s+[✔✖] /.test(text)))
      t.diagnostic(`guest: ${line.trim()}`);
    t.diagnostic(`guest run: ${Math.round(result.durationMs / 1000)} s for the file`);
    const failure = guestTestRunFailure(result);
    if (failure) assert.fail(failure);
  });
}
