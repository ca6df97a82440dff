// The last step of `npm test`: every test/**/*.test.ts through node's test runner, one file at a
// time, in two lanes side by side. The files that boot the qemu guest (they import
// test/kernel/in-guest.ts, for IP_VS, which this kernel lacks, or call runInGuest) spend their
// time in the emulator;
// the other files mostly wait on namespaces, child processes and timers. One after the other
// they took longer than CI's half hour; side by side the run takes about as long as the guest's
// lane (docs/development.md, Tests). On a kernel with IP_VS the guest's files run their cases
// here, in that lane all the same.
//
// The host's lane reports as it goes; the guest's lane is reported whole once it ends, so that the
// two do not interleave. The exit code is the first lane's that failed.
import {spawn} from 'node:child_process';
import {globSync, readFileSync} from 'node:fs';
import {join} from 'node:path';
import {nodeCompileCacheDir, repoRoot} from './qemu/guest.ts';

const bootsGuest = (file: string) => /from '\.\/in-guest\.ts'|\brunInGuest\(/.test(readFileSync(join(repoRoot, file), 'utf8'));

/** Runs node --test over `files`; resolves with its exit code. `output` gets what it prints. */
function lane(files: string[], output: (chunk: Buffer) => void): Promise<number> {
  const child = spawn(process.execPath, ['--test', '--test-concurrency=1', ...process.argv.slice(2), ...files], {
    cwd: repoRoot,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout.on('data', output);
  child.stderr.on('data', output);
  return new Promise((resolve) => child.on('close', (code, signal) => resolve(code ?? (signal ? 1 : 0))));
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
  lane(guestFiles, (chunk) => guestOutput.push(chunk)).then((code) => {
    const minutes = ((performance.now() - startedAt) / 60_000).toFixed(1);
    guestOutput.unshift(Buffer.from(`\n# the files that boot the qemu guest (${guestFiles.join(', ')}): ${minutes} min\n`));
    return code;
  }),
]);
process.stdout.write(Buffer.concat(guestOutput));
process.stdout.write(`\n# both lanes: ${((performance.now() - startedAt) / 60_000).toFixed(1)} min\n`);
process.exitCode = hostCode || guestCode;
