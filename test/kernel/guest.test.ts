// The qemu guest (scripts/qemu/guest.ts) mounts a fresh /tmp, /run and /dev over the shared root;
// a checkout or working directory inside them must still be there, writable, for the ipvs tests to
// run from a clone in the temporary directory.
import assert from 'node:assert/strict';
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {describe, it} from 'node:test';
import {
  guestUnavailableReason,
  hostHasIpvs,
  nodeCrashedInGuest,
  nodeDiedInGuest,
  pathsUnderGuestMounts,
  repoRoot,
  runInGuest,
} from '../../scripts/qemu/guest.ts';

describe('the qemu guest and directories under its fresh mounts', () => {
  it('lists the directories the guest would hide, by real path, none inside another', () => {
    const scratch = mkdtempSync(join(tmpdir(), 'proxyctl-guest-paths-'));
    try {
      const inside = join(scratch, 'sub');
      assert.deepEqual(pathsUnderGuestMounts([inside, scratch, '/run/x', '/usr/src']), [scratch, '/run/x']);
      assert.deepEqual(pathsUnderGuestMounts(['/usr/src', '/var/tmp/x', '/tmpfoo']), []);
    } finally {
      rmSync(scratch, {recursive: true, force: true});
    }
  });

  // The first guest run of a checkout also fetches Debian's kernel and builds the guest's image.
  it('runs a command in a working directory inside the temporary directory, and can write there', {timeout: 600_000}, async (t) => {
    if (hostHasIpvs()) {
      t.skip('this kernel has IP_VS: the ipvs tests run on it, no guest boots');
      return;
    }
    const unavailable = guestUnavailableReason();
    if (unavailable) {
      t.skip(`no qemu guest can boot here: ${unavailable}`);
      return;
    }
    const checkout = mkdtempSync(join(tmpdir(), 'proxyctl-guest-checkout-'));
    try {
      writeFileSync(join(checkout, 'marker'), 'host file\n');
      const result = await runInGuest('cat marker; echo guest file > written; cat written; pwd', {cwd: checkout, timeoutMs: 150_000});
      assert.equal(
        result.exitCode,
        0,
        `the guest could not run in ${checkout} (exit ${result.exitCode}):\n${result.stdout}\n${result.stderr}\n${result.consoleLog}`,
      );
      assert.equal(result.stdout, `host file\nguest file\n${checkout}\n`);
      assert.equal(readFileSync(join(checkout, 'marker'), 'utf8'), 'host file\n', 'the host checkout is unchanged');
      assert.throws(() => readFileSync(join(checkout, 'written')), /ENOENT/, "the guest's writes stay in the guest");
      t.diagnostic(`guest run: ${Math.round(result.durationMs / 1000)} s from boot to poweroff (checkout of this run: ${repoRoot})`);
    } finally {
      rmSync(checkout, {recursive: true, force: true});
    }
  });
});

describe("a guest run in which Node died is the emulator's fault, not a test's", () => {
  const run = (exitCode: number | undefined, stdout: string, stderr = '') => ({
    stdout,
    stderr,
    exitCode,
    consoleLog: '',
    durationMs: 1,
    timedOut: false,
  });
  const v8Fatal =
    '\n\n#\n# Fatal error in , line 0\n# Check failed: it->second.Size() > offset.\n#\n#\n#\n#FailureMessage Object: 0x7fff0c268680\n';
  it('a V8 fatal check in a test file that had started, on stdout or stderr', () => {
    assert.equal(nodeDiedInGuest(run(1, `▶ ipvs agent\n  ✔ first case (10ms)\n${v8Fatal}✖ test/kernel/ipvs-agent.test.ts\n`)), true);
    assert.equal(nodeDiedInGuest(run(1, '▶ ipvs agent\n', v8Fatal)), true);
  });
  it('a Node process killed by a fault signal, as the test that ran it reports it', () => {
    const segfault =
      '  ✖ every class behaves as predicted (8721ms)\n    Error: demo client in pxt-151-pod-0-0 ended (exit SIGSEGV): no message\n';
    assert.equal(nodeDiedInGuest(run(1, `▶ switching iptables -> ipvs\n${segfault}`)), true);
  });
  it('a runner that ended before any test started', () => {
    assert.equal(nodeDiedInGuest(run(134, '')), true);
  });
  it('a bench run (no tests) crashed only when Node says it was killed by a fault or a fatal check', () => {
    const bench = '== observe (kube-proxy ipvs): first full read, memory, drift\n';
    assert.equal(nodeCrashedInGuest(run(139, bench, 'Segmentation fault\n')), true);
    assert.equal(nodeCrashedInGuest(run(1, bench, v8Fatal)), true);
    assert.equal(nodeCrashedInGuest(run(1, bench, 'Error: ipvsadm-restore: exit 1\n')), false);
    assert.equal(nodeCrashedInGuest(run(0, bench, 'Segmentation fault\n')), false);
  });
  it('not a test that failed on its own, a passing run or a guest that never reported', () => {
    assert.equal(nodeDiedInGuest(run(1, "▶ ipvs agent\n  ✖ a case (10ms)\n  AssertionError: 'Check failed: x' !== 'y'\n")), false);
    assert.equal(nodeDiedInGuest(run(0, `▶ ipvs agent\n${v8Fatal}`)), false);
    assert.equal(nodeDiedInGuest(run(undefined, v8Fatal)), false);
    const notLoaded =
      "SyntaxError: The requested module './live-cluster.ts' does not provide an export named 'probe'\n✖ test/kernel/ipvs-observe.test.ts (40636ms)\nℹ fail 1\n";
    assert.equal(nodeDiedInGuest(run(1, notLoaded)), false, 'a file that failed to load');
  });
});
