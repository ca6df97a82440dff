// Network namespaces: unique names per run, creation, deletion (also of what a crashed run left),
// commands and long-running processes inside them, and their sysctls.
import {randomBytes} from 'node:crypto';
import {execa, type ResultPromise} from 'execa';
import {type CommandOutput, NetnsError, runCommand, runIpBatch} from './ip-command.ts';

/** The first word of every namespace proxyctl's lab and tests create. */
export const namespaceBase = 'pxt';

/**
 * newNamespacePrefix returns "pxt-<pid>-<random>-": unique per run, and it carries the pid so that
 * a later run can tell a crashed run's namespaces (dead pid) from a running one's.
 */
export function newNamespacePrefix(base: string = namespaceBase): string {
  return `${base}-${process.pid}-${randomBytes(3).toString('hex')}-`;
}

/** listNamespaces returns the names of every named network namespace (`ip netns list`). */
export async function listNamespaces(): Promise<string[]> {
  const {stdout} = await runCommand('list network namespaces', ['ip', 'netns', 'list']);
  // Lines look like "name (id: 3)" or just "name".
  return stdout
    .split('\n')
    .map((line) => line.trim().split(/\s+/)[0])
    .filter((name): name is string => Boolean(name));
}

/** createNamespaces adds every named namespace in one `ip -batch`. */
export async function createNamespaces(names: string[]): Promise<void> {
  const what = names.length === 1 ? `create network namespace ${names[0]}` : `create ${names.length} network namespaces`;
  await runIpBatch(
    what,
    names.map((name) => `netns add ${name}`),
  );
}

export async function createNamespace(name: string): Promise<void> {
  await createNamespaces([name]);
}

/** namespacePids lists the processes that live in the namespace (empty when it is gone). */
export async function namespacePids(name: string): Promise<number[]> {
  const result = await execa('ip', ['netns', 'pids', name], {reject: false, env: {LC_ALL: 'C'}});
  if (result.exitCode !== 0) return [];
  return String(result.stdout)
    .split('\n')
    .map((line) => Number(line.trim()))
    .filter((pid) => Number.isInteger(pid) && pid > 0);
}

/**
 * deleteNamespaces kills the processes still inside the namespaces (a namespace outlives its
 * name while a process holds it), then deletes them. Namespaces already gone are not an error.
 */
export async function deleteNamespaces(names: string[]): Promise<void> {
  if (names.length === 0) return;
  const pids = (await Promise.all(names.map((name) => namespacePids(name)))).flat();
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // exited meanwhile
    }
  }
  const existing = new Set(await listNamespaces());
  const present = names.filter((name) => existing.has(name));
  if (present.length === 0) return;
  // -force: one namespace deleted meanwhile must not keep the others alive.
  const result = await execa('ip', ['-force', '-batch', '-'], {
    input: `${present.map((name) => `netns del ${name}`).join('\n')}\n`,
    reject: false,
    env: {LC_ALL: 'C'},
  });
  const left = new Set(await listNamespaces());
  const stuck = present.filter((name) => left.has(name));
  if (stuck.length > 0) {
    throw new NetnsError(`delete network namespaces ${stuck.join(', ')}`, ['ip', '-force', '-batch', '-'], String(result.stderr));
  }
}

export async function deleteNamespace(name: string): Promise<void> {
  await deleteNamespaces([name]);
}

/** deleteNamespacesWithPrefix deletes every namespace whose name starts with prefix; returns them. */
export async function deleteNamespacesWithPrefix(prefix: string): Promise<string[]> {
  if (prefix.length === 0) throw new Error('delete network namespaces: an empty prefix would match every namespace');
  const names = (await listNamespaces()).filter((name) => name.startsWith(prefix));
  await deleteNamespaces(names);
  return names;
}

/**
 * deleteOrphanedNamespaces deletes the namespaces "<base>-<pid>-..." whose creating process is no
 * longer alive: what a killed test run or lab left behind. Namespaces of running processes stay.
 */
export async function deleteOrphanedNamespaces(base: string = namespaceBase): Promise<string[]> {
  const pattern = new RegExp(`^${base.replace(/[^A-Za-z0-9]/g, '\\$&')}-(\\d+)-`);
  const orphaned = (await listNamespaces()).filter((name) => {
    const pid = pattern.exec(name)?.[1];
    return pid !== undefined && !processAlive(Number(pid));
  });
  await deleteNamespaces(orphaned);
  return orphaned;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * execInNamespace runs a command inside the namespace (`ip netns exec`) and resolves with its
 * output; a non-zero exit throws a NetnsError with stderr.
 */
export async function execInNamespace(
  namespace: string,
  command: string[],
  options: {input?: string; timeoutMs?: number} = {},
): Promise<CommandOutput> {
  return runCommand(`run ${command[0]} in network namespace ${namespace}`, ['ip', 'netns', 'exec', namespace, ...command], options);
}

/**
 * spawnInNamespace starts a long-running process inside the namespace. `ip netns exec` execs the
 * program in place, so the child's pid is the program's own and killing it needs nothing more.
 */
export function spawnInNamespace(
  namespace: string,
  command: string[],
  options: {env?: Record<string, string>; stdin?: 'ignore' | 'pipe'} = {},
): ResultPromise<{reject: false; buffer: false; stdin: 'ignore' | 'pipe'}> {
  return execa('ip', ['netns', 'exec', namespace, ...command], {
    reject: false,
    buffer: false,
    stdin: options.stdin ?? 'ignore',
    env: options.env,
  });
}

/** setSysctls writes net.* sysctls inside the namespace, where they are the namespace's own. */
export async function setSysctls(namespace: string, values: Record<string, string | number>): Promise<void> {
  const assignments = Object.entries(values).map(([name, value]) => `${name}=${value}`);
  if (assignments.length === 0) return;
  await runCommand(`set sysctls in network namespace ${namespace}`, [
    'ip',
    'netns',
    'exec',
    namespace,
    'sysctl',
    '-q',
    '-w',
    ...assignments,
  ]);
}

/** readSysctl reads one sysctl as the namespace sees it. */
export async function readSysctl(namespace: string, name: string): Promise<string> {
  const {stdout} = await runCommand(`read sysctl ${name} in network namespace ${namespace}`, [
    'ip',
    'netns',
    'exec',
    namespace,
    'sysctl',
    '-n',
    name,
  ]);
  return stdout.trim();
}
