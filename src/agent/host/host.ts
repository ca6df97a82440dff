// Host: every command the agent runs on the node (iptables, nft, ipset, ipvsadm, conntrack, sysctl, ss),
// behind one interface so that tests can record calls instead of touching a kernel.
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {IPFamily, Protocol} from '../../core/model/index.ts';

export type IptablesFrontEnd = 'nf_tables' | 'legacy';

export interface RestoreOptions {
  /** Keep chains the input does not declare (iptables-restore --noflush). */
  noflush: boolean;
  /** Take packet counters from the input (--counters). */
  counters?: boolean;
  /**
   * Called once iptables-restore has been given all of the input, while it still parses the last
   * of it and commits (at 10,000 services that takes seconds): work that needs the whole input can
   * run meanwhile. Not called when the input could not be written.
   */
  inputTaken?: () => void;
}

/**
 * iptables-restore input: the whole text, or its pieces in order (renderIptablesChunks), each
 * written as soon as it is made so that iptables-restore reads the first while the rest is made.
 */
export type RestoreInput = string | Iterable<Uint8Array>;

/** restoreInputText: the whole of an input (the pieces joined). */
export function restoreInputText(input: RestoreInput): string {
  return typeof input === 'string' ? input : Buffer.concat([...input]).toString('utf8');
}

/**
 * ConntrackFilter selects entries for `conntrack -D`. origDst/dport match the original direction
 * (the service address the client used), dstNat the endpoint the entry was DNATed to.
 */
export interface ConntrackFilter {
  family: IPFamily;
  protocol: Protocol;
  origDst?: string;
  dport?: number;
  dstNat?: string;
}

export interface Host {
  /** The network namespace commands run in; undefined for the agent's own. */
  readonly netns: string | undefined;
  /** Feeds rules to iptables-restore (ip6tables-restore for IPv6), waiting for the xtables lock. */
  iptablesRestore(family: IPFamily, rules: RestoreInput, options: RestoreOptions): Promise<void>;
  /**
   * iptables-save -t TABLE; without a table, every table in one reading. iptables-nft reads the
   * whole ruleset for any one table, so one reading of all costs what one of a single table
   * does, where two readings of two tables cost twice that.
   */
  iptablesSave(family: IPFamily, table?: IptablesTable): Promise<string>;
  /**
   * iptables -t TABLE -S CHAIN: that chain's rules as iptables-save spells them, after its "-N
   * CHAIN" (or "-P CHAIN POLICY") line; undefined when the chain does not exist (or iptables
   * cannot read it). It reads the one chain, where iptables-nft-save reads the whole ruleset
   * whatever table it is asked for.
   */
  iptablesListChain(family: IPFamily, table: IptablesTable, chain: string): Promise<string | undefined>;
  /** Which kernel interface the iptables command drives, from `iptables --version`. */
  iptablesFrontEnd(family: IPFamily): Promise<IptablesFrontEnd>;
  /** `iptables --version` (ip6tables for IPv6) as it prints it, e.g. "iptables v1.8.9 (nf_tables)". */
  iptablesVersion(family: IPFamily): Promise<string>;
  /** nfacct ARGS: the named packet counters `-m nfacct` counts into (add NAME, get NAME). */
  nfacct(args: string[]): Promise<string>;
  /** nft ARGS, with an optional script on stdin (`nft -f -`). */
  nft(args: string[], input?: string): Promise<string>;
  ipset(args: string[], input?: string): Promise<string>;
  /** ipvsadm ARGS, with an optional input on stdin (`ipvsadm -R`). */
  ipvsadm(args: string[], input?: string): Promise<string>;
  /**
   * The namespace's /proc/net/ip_vs: the kernel's own table of virtual and real servers (addresses
   * in hex, with connection counts), read as a file in the agent's own namespace and, with a
   * netns, through a process kept in that one (CommandHost's NamespaceAnchor). It costs no
   * netlink dump of each server's real servers, so it is the cheap way to tell whether they changed;
   * `ipvsadm -Sn` stays the reading. Fails where IP_VS is not loaded. Its bytes, not a string:
   * a look every few seconds compares megabytes of it, and a string that size would wait in V8's
   * heap for the next full collection, where a buffer is let go as soon as its holder is. The
   * bytes may be a buffer the host reads the next table into: valid until the next call, so a
   * caller that keeps them copies them. `onRead`: given the bytes read so far as the reading goes
   * (the table is spelled by the kernel a page per read()), each a view of what the result holds,
   * so that a look can compare them while the rest is read; it may write over the bytes given.
   * The result holds those bytes as onRead left them: a host that cannot end the read it began
   * rejects rather than read the table again.
   */
  ipvsTable(onRead?: (read: Buffer) => void): Promise<Buffer>;
  /** ip ARGS (iproute2), e.g. link add kube-ipvs0 type dummy, addr add, -j addr show. */
  ip(args: string[], input?: string): Promise<string>;
  /** conntrack -D with the filter; returns how many entries were deleted (0 when none matched). */
  conntrackDelete(filter: ConntrackFilter): Promise<number>;
  /** sysctl NAME, e.g. "net.ipv4.conf.all.route_localnet". */
  sysctlRead(name: string): Promise<string>;
  sysctlWrite(name: string, value: string): Promise<void>;
  /**
   * The listening TCP and UDP sockets of the namespace, as `ss -H -l -n -t -u -p` prints them
   * (with the process behind each where ss can name it). Only reads.
   */
  listeningSockets(): Promise<string>;
  /** Ends what the host keeps running for its reads (CommandHost's namespace anchor); they end with the agent anyway. */
  close?(): void;
  /**
   * Calls `listener` with the process id of every command as it starts (nft monitor names the
   * process behind each ruleset change: the agent API tells its own writes from others' by it).
   */
  onSpawn?(listener: (pid: number, command: string[]) => void): () => void;
}

/** HostCommandError: a node command failed; the message holds the command line and its stderr. */
export class HostCommandError extends Error {
  override name = 'HostCommandError';
  readonly command: string[];
  readonly exitCode: number | undefined;
  readonly stderr: string;
  constructor(command: string[], exitCode: number | undefined, stderr: string) {
    const detail = stderr.trim().split('\n').slice(0, 5).join(' / ') || 'no error output';
    super(`${command.join(' ')}: ${exitCode === undefined ? 'could not run' : `exit ${exitCode}`}: ${detail}`);
    this.command = command;
    this.exitCode = exitCode;
    this.stderr = stderr;
  }
}

/**
 * savedTables: the parts of an iptables-save output of every table that hold `tables`, in that
 * order, each as `iptables-save -t TABLE` prints it (from its *TABLE line to its COMMIT line).
 */
export function savedTables(save: string, tables: readonly IptablesTable[]): string {
  let text = '';
  for (const table of tables) {
    const start = save.startsWith(`*${table}\n`) ? 0 : save.indexOf(`\n*${table}\n`) + 1;
    if (start === 0 && !save.startsWith(`*${table}\n`)) continue;
    const commit = save.indexOf('\nCOMMIT\n', start);
    text += commit < 0 ? save.slice(start) : save.slice(start, commit + 8);
  }
  return text;
}
