// The last step of `npm test`: every test/**/*.test.ts through node's test runner, one file at a
// time, in two lanes side by side. The files that boot the qemu guest (they import
// test/kernel/in-guest.ts, for IP_VS, which this kernel lacks, or call runInGuest) spend their
// time in the emulator, and those of in-guest.ts share one guest (guestLane); the other files
// mostly wait on namespaces, child processes and timers. One after the other they took longer
// than CI's half hour; side by side the run takes about as long as the guest's lane
// (docs/development.md, Tests). On a kernel with IP_VS the guest's files run their cases here, in
// that lane all the same.
//
// The host's lane reports as it goes; the guest's lane is reported whole once it ends, so that the
// two do not interleave. The exit code is the first lane's that failed.
import {spawn} from 'node:child_process';
import {globSync, readFileSync} from 'node:fs';
import {join} from 'node:path';
import {
  guestTestRunFailure,
  guestUnavailableReason,
  hostHasIpvs,
  nodeCompileCacheDir,
  repoRoot,
  runTestFilesInGuest,
} from './qemu/guest.ts';

const source = (file: string) => readFileSync(join(repoRoot, file), 'utf8');
const bootsGuest = (file: string) => /from '\.\/in-guest\.ts'|\brunInGuest\(/.test(source(file));
/** Files whose cases run in the guest through itRunsInGuest; the others that boot it do so themselves. */
const runsInGuest = (file: string) => /from '\.\/in-guest\.ts'/.test(source(file));
/** The bound on the one guest that runs them all; each file's own is runTestFilesInGuest's. */
const guestTimeoutMs = 45 * 60_000;

/** Runs node --test over `files`; resolves with its exit code. `output` gets what it prints. */
function lane(files: string[], output: (chunk: Buffer) => void): Promise<number> {
  // With no files, node --test would look for test files of its own.
  if (files.length === 0) return Promise.resolve(0);
  const child = spawn(process.execPath, ['--test', '--test-concurrency=1', ...process.argv.slice(2), ...files], {
    cwd: repoRoot,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout.on('data', output);
  child.stderr.on('data', output);
  return new Promise((resolve) => child.on('close', (code, signal) => resolve(code ?? (signal ? 1 : 0))));
}

/**
 * guestLane: the files that boot a guest themselves run as any other; those of itRunsInGuest run in
 * one guest, one after the other (runTestFilesInGuest), where a guest boot per file would spend its
 * first minute starting Node processes from cold. Where this kernel has IP_VS, or no guest can boot,
 * all of them run here, and itRunsInGuest's files run their cases or say why they skip.
 */
async function guestLane(output: (chunk: Buffer) => void): Promise<number> {
  if (hostHasIpvs() || guestUnavailableReason()) return lane(guestFiles, output);
  const print = (text: string) => output(Buffer.from(text));
  let code = await lane(
    guestFiles.filter((file) => !runsInGuest(file)),
    output,
  );
  const runs = await runTestFilesInGuest(guestFiles.filter(runsInGuest), {memoryMiB: 2048, timeoutMs: guestTimeoutMs});
  for (const [file, run] of runs) {
    const failure = guestTestRunFailure(run);
    print(`\n# ${file}, every case in the qemu guest: ${failure ? 'failed' : 'passed'} (${Math.round(run.durationMs / 1000)} s)\n`);
    if (run.crashedFirstRun) {
      const first = `${run.crashedFirstRun.stdout}\n${run.crashedFirstRun.stderr}`.replace(/^/gm, "guest's first run | ");
      print(`Node died in the guest's first run of the file (the emulator's fault, not a test's) and it was run again:\n${first}\n`);
    }
    print(failure ?? run.stdout);
    if (failure) code ||= 1;
  }
  return code;
}

// Every Node process of both lanes shares the compile cache the guest reads (nodeCompileCacheDir).
process.env.NODE_COMPILE_CACHE = nodeCompileCacheDir;
const files = globSync('test/**/*.test.ts', {cwd: repoRoot}).sort();
const guestFiles = files.filter(bootsGuest);
const hostFiles = files.filter((file) => !bootsGuest(file));
const guestOutput: Buffer[] = [];
const startedAt = performance.now();
const [hostCode, guestCode] = await Promise.all([
  lane(hostFiles, (chunk) => process.stdout.write(chunk)),
  guestLane((chunk) => guestOutput.push(chunk)).then((code) => {
    const minutes = ((performance.now() - startedAt) / 60_000).toFixed(1);
    guestOutput.unshift(Buffer.from(`\n# the files that boot the qemu guest (${guestFiles.join(', ')}): ${minutes} min\n`));
    return code;
  }),
]);
process.stdout.write(Buffer.concat(guestOutput));
process.stdout.write(`\n# both lanes: ${((performance.now() - startedAt) / 60_000).toFixed(1)} min\n`);
process.exitCode = hostCode || guestCode;
