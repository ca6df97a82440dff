// Runs a command inside a qemu guest that boots Debian's stock kernel (which has IP_VS, ipsets and
// dummy devices as modules) over this machine's own root, shared read-only over 9p under a tmpfs
// overlay, so the guest sees the same tools, node and checkout but can never write to the host.
//
// Use from code: `await runInGuest(['ipvsadm', '-Ln'])`; from a shell:
//   node scripts/qemu/guest.ts [--timeout SECONDS] [--memory MIB] -- COMMAND [ARGS...]
import {spawn, spawnSync} from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmSync,
  writeFileSync,
  chmodSync,
  copyFileSync,
  openSync,
  closeSync,
  readSync,
} from 'node:fs';
import {tmpdir} from 'node:os';
import {dirname, join, resolve} from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';

/** The checkout this file lives in. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Downloaded kernel packages and the guest images built from them (gitignored). */
export const guestCacheDir = join(repoRoot, '.cache', 'qemu-guest');
/**
 * Node's compile cache (type-stripped sources and V8 code) for the tests' processes, on the host
 * (scripts/run-tests.ts) and in the guest, which sees this checkout: there, under emulation, a Node
 * process spends seconds stripping types and compiling before it runs, and finds most of that done
 * by the host's processes. What the guest adds stays in its own memory.
 */
export const nodeCompileCacheDir = join(repoRoot, '.cache', 'node-compile-cache');

/** Commands the harness needs on the host -> the Debian package that provides each. */
const hostTools: Record<string, string> = {
  'qemu-system-x86_64': 'qemu-system-x86',
  busybox: 'busybox-static',
  cpio: 'cpio',
  'dpkg-deb': 'dpkg',
  depmod: 'kmod',
  xz: 'xz-utils',
};

/** Modules the initramfs loads (with their dependencies) before it can mount the shared root. */
const bootModules = ['virtio_pci', '9pnet_virtio', '9p', 'overlay', 'virtio_console'];

/** A kernel and the files a guest boots it with. */
export interface GuestImage {
  /** Kernel release, e.g. 6.1.0-56-amd64. */
  release: string;
  /** Uncompressed ELF kernel (qemu boots it through its PVH entry, skipping decompression). */
  kernel: string;
  /** Directory holding lib/modules/RELEASE with modules.dep, shared with the guest. */
  modulesRoot: string;
  /** gzip-free newc cpio archive: busybox, the boot modules and /init. */
  initramfs: string;
}

export interface GuestRunOptions {
  /** Working directory inside the guest (a host path; default: the checkout). */
  cwd?: string;
  /** Environment for the command (default: PATH, HOME, LANG from this process, PROXYCTL_IN_GUEST=1, NODE_OPTIONS loading guest-node-flags.mjs, and NODE_COMPILE_CACHE at nodeCompileCacheDir). */
  env?: Record<string, string>;
  /** Give up and kill the guest after this long (default 600 s). */
  timeoutMs?: number;
  /** Guest memory in MiB (default 1536). */
  memoryMiB?: number;
  /** Virtual CPUs (default 2). */
  cpus?: number;
  /** Called with each chunk of the command's stdout as it arrives. */
  onStdout?: (chunk: string) => void;
  /** Called with each chunk of the command's stderr as it arrives. */
  onStderr?: (chunk: string) => void;
}

export interface GuestRunResult {
  stdout: string;
  stderr: string;
  /** The command's exit status, or undefined when the guest never reported one (boot failure, timeout). */
  exitCode: number | undefined;
  /** Kernel and init messages from the guest's serial console, for diagnosing boot failures. */
  consoleLog: string;
  durationMs: number;
  timedOut: boolean;
}

function onPath(command: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${command}`], {stdio: 'ignore'}).status === 0;
}

function run(command: string, args: string[], options: {cwd?: string; input?: Buffer} = {}): string {
  const result = spawnSync(command, args, {cwd: options.cwd, input: options.input, maxBuffer: 256 * 1024 * 1024});
  if (result.error) throw new Error(`${command} ${args.join(' ')}: ${result.error.message}`);
  if (result.status !== 0) {
    throw new Error(`${command} ${args.join(' ')} exited with ${result.status}: ${result.stderr.toString().trim()}`);
  }
  return result.stdout.toString();
}

/**
 * guestUnavailableReason installs the harness's host packages when they are missing and we are root,
 * and returns why a guest cannot be booted here, or undefined when it can.
 */
export function guestUnavailableReason(): string | undefined {
  if (process.platform !== 'linux' || process.arch !== 'x64')
    return `qemu guest needs linux/x64, this is ${process.platform}/${process.arch}`;
  const missing = () => [
    ...new Set(
      Object.entries(hostTools)
        .filter(([cmd]) => !onPath(cmd))
        .map(([, pkg]) => pkg),
    ),
  ];
  let packages = missing();
  if (packages.length > 0 && process.getuid?.() === 0 && onPath('apt-get')) {
    const env = {...process.env, DEBIAN_FRONTEND: 'noninteractive'};
    const install = () => spawnSync('apt-get', ['install', '-y', '--no-install-recommends', ...packages], {stdio: 'ignore', env});
    if (install().status !== 0) {
      spawnSync('apt-get', ['update'], {stdio: 'ignore', env});
      install();
    }
    packages = missing();
  }
  if (packages.length > 0) return `qemu guest needs the Debian packages ${packages.join(' ')} (apt-get install -y ${packages.join(' ')})`;
  if (!onPath('apt-get') || !onPath('apt-cache')) return 'qemu guest needs apt-get to download linux-image-amd64';
  return undefined;
}

/** kernelPackageName is the versioned package linux-image-amd64 depends on, e.g. linux-image-6.1.0-56-amd64. */
function kernelPackageName(): string {
  const depends = run('apt-cache', ['depends', 'linux-image-amd64']);
  const match = /Depends:\s*(linux-image-\S+)/.exec(depends);
  if (!match) throw new Error(`apt-cache depends linux-image-amd64 names no linux-image package:\n${depends}`);
  return match[1];
}

/**
 * extractElfKernel pulls the xz-compressed ELF kernel out of a bzImage: the payload starts at the
 * xz magic, and xz stops at its end (the trailing bytes make it exit non-zero, which is expected).
 */
function extractElfKernel(bzImage: string, target: string): void {
  const image = readFileSync(bzImage);
  const magic = Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]);
  for (let at = image.indexOf(magic); at >= 0; at = image.indexOf(magic, at + 1)) {
    const result = spawnSync('xz', ['-dcq'], {input: image.subarray(at), maxBuffer: 512 * 1024 * 1024});
    const elf = result.stdout;
    if (elf && elf.length > 4 && elf.subarray(0, 4).equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46]))) {
      writeFileSync(target, elf);
      return;
    }
  }
  throw new Error(`${bzImage}: found no xz-compressed ELF kernel inside`);
}

/** moduleLoadOrder lists module files (relative to the release dir) so that each comes after its dependencies. */
function moduleLoadOrder(releaseDir: string, names: string[]): string[] {
  const deps = new Map<string, string[]>();
  const byName = new Map<string, string>();
  for (const line of readFileSync(join(releaseDir, 'modules.dep'), 'utf8').split('\n')) {
    const [file, rest] = line.split(':');
    if (!file) continue;
    deps.set(file, rest.trim().split(/\s+/).filter(Boolean));
    byName.set(
      file
        .replace(/^.*\//, '')
        .replace(/\.ko(\.\w+)?$/, '')
        .replace(/-/g, '_'),
      file,
    );
  }
  const builtin = new Set(
    readFileSync(join(releaseDir, 'modules.builtin'), 'utf8')
      .split('\n')
      .map((line) => line.replace(/^.*\//, '').replace(/\.ko$/, '').replace(/-/g, '_')),
  );
  const order: string[] = [];
  const visit = (file: string) => {
    if (order.includes(file)) return;
    for (const dep of deps.get(file) ?? []) visit(dep);
    order.push(file);
  };
  for (const name of names) {
    const file = byName.get(name.replace(/-/g, '_'));
    if (file) visit(file);
    else if (!builtin.has(name.replace(/-/g, '_'))) throw new Error(`kernel has no module ${name}`);
  }
  return order;
}

/** The initramfs's /init: load the boot modules, build the overlay root, run the command, power off. */
function initScript(release: string, modules: string[]): string {
  return `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in ${modules.map((m) => `/modules/${m.replace(/^.*\//, '')}`).join(' ')}; do insmod "$m" || echo "init: insmod $m failed"; done
fail() { echo "init: $*"; echo "PROXYCTL_GUEST_EXIT=255"; poweroff -f; }
mkdir -p /host /rw /root /mods
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host || fail "mount host root"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose modules /mods || fail "mount modules"
mount -t tmpfs -o size=75% rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work,xino=off,index=off overlay /root || fail "mount overlay"
script=$(sed -n 's/.*proxyctl.script=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
cp "/host$script" /command.sh || fail "read $script"
# The fresh /tmp, /run and /dev below would hide a checkout or working directory inside them: each
# path the host lists in KEEP is held aside (the overlay's writable view of it) and put back on top.
mkdir -p /keep
kept=0
if [ -f "/host$script.keep" ]; then
  while IFS= read -r path; do
    [ -n "$path" ] || continue
    kept=$((kept + 1)); mkdir -p /keep/$kept
    mount --bind "/root$path" /keep/$kept || fail "hold $path"
  done < "/host$script.keep"
fi
mkdir -p /root/lib/modules/${release}
mount --bind /mods/lib/modules/${release} /root/lib/modules/${release}
for d in proc sys dev run tmp; do mkdir -p /root/$d; done
mount -t proc proc /root/proc
mount -t sysfs sys /root/sys
mount -t devtmpfs dev /root/dev
mkdir -p /root/dev/pts /root/dev/shm
mount -t devpts devpts /root/dev/pts
mount -t tmpfs tmpfs /root/dev/shm
mount -t tmpfs tmpfs /root/run
mount -t tmpfs tmpfs /root/tmp
mkdir -p /root/run/netns
if [ "$kept" -gt 0 ]; then
  n=0
  while IFS= read -r path; do
    [ -n "$path" ] || continue
    n=$((n + 1)); mkdir -p "/root$path"
    mount --move /keep/$n "/root$path" || fail "put back $path"
  done < "/host$script.keep"
fi
cp /command.sh /root/run/proxyctl-command.sh
port() { for p in /sys/class/virtio-ports/*; do if [ "$(cat $p/name)" = "$1" ]; then echo /dev/\${p##*/}; fi; done; }
out=$(port stdout); err=$(port stderr)
[ -n "$out" ] && [ -n "$err" ] || fail "no virtio ports"
hostname proxyctl-guest
# The kernel loads modules on demand (veth, ip_vs schedulers, ipset types) through the modprobe of the shared root.
printf '#!/bin/sh\nexec /bin/chroot /root /sbin/modprobe "$@"\n' > /bin/root-modprobe
chmod 755 /bin/root-modprobe
echo /bin/root-modprobe > /proc/sys/kernel/modprobe
chroot /root /bin/sh -c 'ip link set lo up; exec /bin/sh /run/proxyctl-command.sh' > "$out" 2> "$err" < /dev/null
code=$?
sync
echo "PROXYCTL_GUEST_EXIT=$code"
poweroff -f
`;
}

/**
 * buildInitramfs writes a newc cpio of busybox, the boot modules and /init, and the init script
 * beside it (`TARGET.init`) so that a later change to the script is seen and the archive rebuilt.
 */
function buildInitramfs(releaseDir: string, release: string, target: string): void {
  const staging = mkdtempSync(join(tmpdir(), 'proxyctl-initramfs-'));
  try {
    for (const dir of ['bin', 'modules', 'proc', 'sys', 'dev']) mkdirSync(join(staging, dir));
    copyFileSync(run('sh', ['-c', 'command -v busybox']).trim(), join(staging, 'bin', 'busybox'));
    chmodSync(join(staging, 'bin', 'busybox'), 0o755);
    const modules = moduleLoadOrder(releaseDir, bootModules);
    for (const module of modules) copyFileSync(join(releaseDir, module), join(staging, 'modules', module.replace(/^.*\//, '')));
    const init = initScript(release, modules);
    writeFileSync(join(staging, 'init'), init, {mode: 0o755});
    const files = run('find', ['.', '-mindepth', '1'], {cwd: staging});
    const archive = spawnSync('cpio', ['-o', '-H', 'newc', '--quiet'], {cwd: staging, input: files, maxBuffer: 256 * 1024 * 1024});
    if (archive.status !== 0) throw new Error(`cpio: ${archive.stderr.toString()}`);
    // Written aside and renamed, so that a guest booting meanwhile reads the old archive or the new one whole.
    writeFileSync(`${target}.${process.pid}`, archive.stdout);
    renameSync(`${target}.${process.pid}`, target);
    writeFileSync(`${target}.init`, init);
  } finally {
    rmSync(staging, {recursive: true, force: true});
  }
}

/** initramfsCurrent tells whether the cached initramfs was built from this file's init script. */
function initramfsCurrent(image: GuestImage): boolean {
  const releaseDir = join(image.modulesRoot, 'lib', 'modules', image.release);
  const wanted = initScript(image.release, moduleLoadOrder(releaseDir, bootModules));
  return existsSync(`${image.initramfs}.init`) && readFileSync(`${image.initramfs}.init`, 'utf8') === wanted;
}

/**
 * prepareGuestImage downloads the kernel linux-image-amd64 resolves to (once), unpacks it, indexes
 * its modules and builds the initramfs. Later calls find the finished image in the cache.
 */
export function prepareGuestImage(): GuestImage {
  const packageName = kernelPackageName();
  const release = packageName.replace(/^linux-image-/, '');
  const imageDir = join(guestCacheDir, release);
  const image: GuestImage = {
    release,
    kernel: join(imageDir, 'vmlinux'),
    modulesRoot: join(imageDir, 'root'),
    initramfs: join(imageDir, 'initramfs.cpio'),
  };
  if (existsSync(join(imageDir, 'complete'))) {
    if (!initramfsCurrent(image)) buildInitramfs(join(image.modulesRoot, 'lib', 'modules', release), release, image.initramfs);
    return image;
  }

  mkdirSync(guestCacheDir, {recursive: true});
  const staging = mkdtempSync(join(guestCacheDir, `${release}.building-`));
  try {
    run('apt-get', ['download', '-q', packageName], {cwd: staging});
    const deb = readdirSync(staging).find((name) => name.endsWith('.deb'));
    if (!deb) throw new Error(`apt-get download ${packageName} left no .deb in ${staging}`);
    run('dpkg-deb', ['-x', join(staging, deb), join(staging, 'root')]);
    rmSync(join(staging, deb));
    run('depmod', ['-b', join(staging, 'root'), release]);
    extractElfKernel(join(staging, 'root', 'boot', `vmlinuz-${release}`), join(staging, 'vmlinux'));
    buildInitramfs(join(staging, 'root', 'lib', 'modules', release), release, join(staging, 'initramfs.cpio'));
    writeFileSync(join(staging, 'complete'), `${packageName}\n`);
    rmSync(imageDir, {recursive: true, force: true});
    renameSync(staging, imageDir);
  } catch (error) {
    rmSync(staging, {recursive: true, force: true});
    throw error;
  }
  return image;
}

/** Where the guest mounts fresh file systems over the shared root (see initScript). */
const freshGuestMounts = ['/tmp', '/run', '/dev'];

/**
 * pathsUnderGuestMounts: of these host directories (a checkout, a working directory), the ones the
 * guest's fresh /tmp, /run or /dev would hide, by real path, each once and none inside another.
 * A clone in the temporary directory is the usual case.
 */
export function pathsUnderGuestMounts(paths: string[]): string[] {
  const real = paths.map((path) => (existsSync(path) ? realpathSync(path) : resolve(path)));
  const hidden = [...new Set(real)].filter((path) => freshGuestMounts.some((mount) => path === mount || path.startsWith(`${mount}/`)));
  return hidden.filter((path) => !hidden.some((other) => other !== path && path.startsWith(`${other}/`)));
}

function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/**
 * runInGuest boots a guest, runs `command` (argv, or one shell command line) as root in `cwd` and
 * returns its output and exit status once the guest has powered off. Each call boots a fresh guest:
 * nothing the command does survives it.
 */
export async function runInGuest(command: string[] | string, options: GuestRunOptions = {}): Promise<GuestRunResult> {
  const started = Date.now();
  const image = prepareGuestImage();
  const runDir = mkdtempSync(join(tmpdir(), 'proxyctl-guest-'));
  const cwd = options.cwd ?? repoRoot;
  const env = options.env ?? {
    PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
    HOME: '/root',
    LANG: process.env.LANG ?? 'C.UTF-8',
    PROXYCTL_IN_GUEST: '1',
    NODE_OPTIONS: `--import=${pathToFileURL(join(repoRoot, 'scripts', 'qemu', 'guest-node-flags.mjs')).href}`,
    NODE_COMPILE_CACHE: nodeCompileCacheDir,
  };
  const commandLine = typeof command === 'string' ? command : command.map(shellQuote).join(' ');
  const script = [
    ...Object.entries(env).map(([name, value]) => `export ${name}=${shellQuote(value)}`),
    `cd ${shellQuote(cwd)} || exit 254`,
    `sysctl -qw net.ipv4.ip_forward=1 2>/dev/null`,
    commandLine,
  ].join('\n');
  const scriptPath = join(runDir, 'run.sh');
  writeFileSync(scriptPath, `${script}\n`);
  writeFileSync(
    `${scriptPath}.keep`,
    pathsUnderGuestMounts([cwd, repoRoot])
      .map((path) => `${path}\n`)
      .join(''),
  );
  const stdoutPath = join(runDir, 'stdout');
  const stderrPath = join(runDir, 'stderr');
  const consolePath = join(runDir, 'console');
  const share = (tag: string, path: string) => [
    '-fsdev',
    `local,id=${tag},path=${path},security_model=none,readonly=on,multidevs=remap`,
    '-device',
    `virtio-9p-pci,fsdev=${tag},mount_tag=${tag}`,
  ];
  const args = [
    '-accel',
    'tcg,thread=multi',
    '-machine',
    'q35',
    // Without PKU: V8 protects its JIT pages with memory protection keys when the CPU has them,
    // and under TCG's emulation of them Node dies now and then with "Check failed:
    // it->second.Size() > offset" (V8's JIT page tracking), in the test runner or the agent.
    '-cpu',
    'max,pku=off',
    '-smp',
    String(options.cpus ?? 2),
    '-m',
    String(options.memoryMiB ?? 1536),
    '-display',
    'none',
    '-vga',
    'none',
    '-monitor',
    'none',
    '-nic',
    'none',
    '-no-reboot',
    '-serial',
    `file:${consolePath}`,
    '-kernel',
    image.kernel,
    '-initrd',
    image.initramfs,
    '-append',
    `console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init proxyctl.script=${scriptPath}`,
    ...share('hostroot', '/'),
    ...share('modules', image.modulesRoot),
    '-device',
    'virtio-serial-pci',
    '-chardev',
    `file,id=stdout,path=${stdoutPath}`,
    '-device',
    'virtserialport,chardev=stdout,name=stdout',
    '-chardev',
    `file,id=stderr,path=${stderrPath}`,
    '-device',
    'virtserialport,chardev=stderr,name=stderr',
  ];

  const qemu = spawn('qemu-system-x86_64', args, {stdio: ['ignore', 'ignore', 'pipe']});
  let qemuErrors = '';
  qemu.stderr.setEncoding('utf8').on('data', (chunk: string) => (qemuErrors += chunk));
  // The ports write to files; pass on what is new now and then so long runs show progress.
  const followers = [follow(stdoutPath, options.onStdout), follow(stderrPath, options.onStderr)];
  const poll = setInterval(() => followers.forEach((forward) => forward()), 300);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    qemu.kill('SIGKILL');
  }, options.timeoutMs ?? 600_000);
  const onExit = () => qemu.kill('SIGKILL');
  process.once('exit', onExit);
  try {
    const status = await new Promise<number | null>((resolvePromise, reject) => {
      qemu.once('error', reject);
      qemu.once('close', (code) => resolvePromise(code));
    });
    followers.forEach((forward) => forward());
    const consoleLog = existsSync(consolePath) ? readFileSync(consolePath, 'utf8') : '';
    const exitMatch = /PROXYCTL_GUEST_EXIT=(\d+)/.exec(consoleLog);
    const stdout = existsSync(stdoutPath) ? readFileSync(stdoutPath, 'utf8') : '';
    const stderr = existsSync(stderrPath) ? readFileSync(stderrPath, 'utf8') : '';
    if (status !== 0 && !timedOut && !exitMatch) {
      throw new Error(`qemu-system-x86_64 exited with ${status}: ${qemuErrors.trim()}\n${consoleLog}`);
    }
    return {
      stdout,
      stderr,
      exitCode: exitMatch ? Number(exitMatch[1]) : undefined,
      consoleLog: qemuErrors ? `${consoleLog}\n${qemuErrors}` : consoleLog,
      durationMs: Date.now() - started,
      timedOut,
    };
  } finally {
    clearInterval(poll);
    clearTimeout(timer);
    process.off('exit', onExit);
    rmSync(runDir, {recursive: true, force: true});
  }
}

/** follow returns a function that hands `consumer` the bytes appended to `path` since its last call. */
function follow(path: string, consumer: ((chunk: string) => void) | undefined): () => void {
  let shown = 0;
  const decoder = new TextDecoder();
  return () => {
    if (!consumer || !existsSync(path)) return;
    const fd = openSync(path, 'r');
    try {
      const buffer = Buffer.alloc(64 * 1024);
      for (let n = readSync(fd, buffer, 0, buffer.length, shown); n > 0; n = readSync(fd, buffer, 0, buffer.length, shown)) {
        const text = decoder.decode(buffer.subarray(0, n), {stream: true});
        if (text) consumer(text);
        shown += n;
      }
    } finally {
      closeSync(fd);
    }
  };
}

/** The result of a test file's run in the guest, and the run before it when Node itself died in that one. */
export interface GuestTestRun extends GuestRunResult {
  /** Output of a first run in which the guest's Node died (see `nodeDiedInGuest`); it was run again. */
  crashedFirstRun?: GuestRunResult;
}

/**
 * nodeDiedInGuest tells whether a failed run is the emulator's fault rather than a test's outcome:
 * the runner ended before it reported any test or file (a file that failed to load is reported as a
 * failed test named after the file, and is the file's fault), or a Node process in the guest
 * stopped on a V8 fatal check or was killed by a fault signal (JavaScript cannot make Node
 * segfault; qemu's emulation of the CPU has, now and then, in a long run). guest-node-flags.mjs
 * keeps V8 off the path where the fatal check was seen; should another show up, the run still says
 * it was the emulator and not a test.
 */
export function nodeDiedInGuest(result: GuestRunResult): boolean {
  if (result.exitCode === 0 || result.exitCode === undefined) return false;
  const testStarted = /^\s*(▶|✔|✖) /m.test(result.stdout);
  return !testStarted || nodeCrashedInGuest(result);
}

/** True when a Node process in the guest stopped on a V8 fatal check or a fault signal (the emulator's doing: nodeDiedInGuest). */
export function nodeCrashedInGuest(result: GuestRunResult): boolean {
  if (result.exitCode === 0 || result.exitCode === undefined) return false;
  const v8Fatal = /# Fatal error in [^\n]*\n(\s*#[^\n]*\n){0,3}\s*# Check failed:/;
  const faultSignal = /\b(SIGSEGV|SIGBUS|SIGILL)\b|Segmentation fault/;
  return [v8Fatal, faultSignal].some((crash) => crash.test(result.stdout) || crash.test(result.stderr));
}

/**
 * runTestFileInGuest runs one test file with node's test runner in the guest. When Node died in
 * the guest (`nodeDiedInGuest`), the run is repeated once in a fresh guest and the first is kept in
 * `crashedFirstRun` so that callers report it. A test that fails on its own is never repeated.
 */
export async function runTestFileInGuest(file: string, options: GuestRunOptions = {}): Promise<GuestTestRun> {
  return (await runTestFilesInGuest([file], options)).get(file)!;
}

/** Printed on the guest's stdout and stderr after each file of runTestFilesInGuest (with the exit code and milliseconds on stdout). */
const fileEndMarker = 'PROXYCTL_FILE_END';
/** How long one file may run in runTestFilesInGuest before `timeout` ends it. */
const fileTimeoutSeconds = 1500;

/**
 * runTestFilesInGuest runs test files with node's test runner one after the other in one guest, each
 * result its own as runTestFileInGuest's: one boot for all, and the compile cache (in the guest's
 * memory) that the first files fill spares the later ones' Node processes much of their start. The
 * files in which Node died (`nodeDiedInGuest`) run once more, together, in a fresh guest.
 */
export async function runTestFilesInGuest(files: string[], options: GuestRunOptions = {}): Promise<Map<string, GuestTestRun>> {
  const runs: Map<string, GuestTestRun> = await runFilesInOneGuest(files, options);
  const died = files.filter((file) => nodeDiedInGuest(runs.get(file)!));
  if (died.length === 0) return runs;
  const again = await runFilesInOneGuest(died, options);
  for (const file of died) runs.set(file, {...again.get(file)!, crashedFirstRun: runs.get(file)});
  return runs;
}

async function runFilesInOneGuest(files: string[], options: GuestRunOptions): Promise<Map<string, GuestRunResult>> {
  const script = files.map(
    (file) =>
      `started=$(date +%s%N); timeout --kill-after=10 ${fileTimeoutSeconds} ${shellQuote(process.execPath)} --test --test-reporter=spec ${shellQuote(file)}; ` +
      `code=$?; printf '\\n${fileEndMarker} %s %s\\n' $code $(( ($(date +%s%N) - started) / 1000000 )); printf '\\n${fileEndMarker}\\n' >&2`,
  );
  const whole = await runInGuest(script.join('\n'), options);
  const stdoutParts = whole.stdout.split(new RegExp(`\\n${fileEndMarker} (\\d+) (\\d+)\\n`));
  const stderrParts = whole.stderr.split(`\n${fileEndMarker}\n`);
  return new Map(
    files.map((file, index) => {
      // split() with two groups: text, code, ms, text, code, ms, ..., text after the last marker.
      const [stdout = '', code, ms] = stdoutParts.slice(index * 3, index * 3 + 3);
      const ended = code !== undefined;
      return [
        file,
        {
          stdout,
          stderr: stderrParts[index] ?? '',
          exitCode: ended ? Number(code) : undefined,
          consoleLog: whole.consoleLog,
          durationMs: ended ? Number(ms) : whole.durationMs,
          timedOut: !ended && whole.timedOut,
        },
      ];
    }),
  );
}

/**
 * guestTestRunFailure: why a test file's run in the guest did not pass (it failed, timed out, never
 * reported, or skipped cases: every case of such a file is meant to run there), or undefined.
 */
export function guestTestRunFailure(run: GuestRunResult): string | undefined {
  if (run.exitCode !== 0)
    return `the guest's test run failed (${run.exitCode === undefined ? 'no exit status' : `exit ${run.exitCode}`}${run.timedOut ? ', timed out' : ''}):\n${run.stdout}\n${run.stderr}\n${run.exitCode === undefined ? run.consoleLog : ''}`;
  if (!/ℹ fail 0/.test(run.stdout)) return `the guest's test run reports failures:\n${run.stdout}`;
  if (!/ℹ skipped 0/.test(run.stdout)) return `cases skipped in the guest:\n${run.stdout}`;
  return undefined;
}

/** hostHasIpvs tells whether this machine's own kernel offers IP_VS (built in, loaded or loadable). */
export function hostHasIpvs(): boolean {
  if (existsSync('/proc/net/ip_vs')) return true;
  spawnSync('modprobe', ['-q', 'ip_vs'], {stdio: 'ignore'});
  return existsSync('/proc/net/ip_vs');
}

async function main(argv: string[]): Promise<number> {
  const options: GuestRunOptions = {onStdout: (chunk) => process.stdout.write(chunk), onStderr: (chunk) => process.stderr.write(chunk)};
  let index = 0;
  for (; index < argv.length && argv[index] !== '--'; index += 2) {
    const [flag, value] = [argv[index], argv[index + 1]];
    if (flag === '--timeout') options.timeoutMs = Number(value) * 1000;
    else if (flag === '--memory') options.memoryMiB = Number(value);
    else if (flag === '--cwd') options.cwd = value;
    else {
      console.error(
        `usage: node scripts/qemu/guest.ts [--timeout SECONDS] [--memory MIB] [--cwd DIR] -- COMMAND [ARGS...]\nunknown flag ${flag}`,
      );
      return 2;
    }
  }
  const command = argv.slice(index + 1);
  if (command.length === 0) {
    console.error('usage: node scripts/qemu/guest.ts [--timeout SECONDS] [--memory MIB] [--cwd DIR] -- COMMAND [ARGS...]');
    return 2;
  }
  const unavailable = guestUnavailableReason();
  if (unavailable) {
    console.error(unavailable);
    return 3;
  }
  const result = await runInGuest(command, options);
  if (result.exitCode === undefined) {
    console.error(result.timedOut ? 'guest timed out' : 'guest reported no exit status');
    console.error(result.consoleLog);
    return 125;
  }
  console.error(`guest: exit ${result.exitCode} after ${(result.durationMs / 1000).toFixed(1)} s`);
  return result.exitCode;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main(process.argv.slice(2));
}
