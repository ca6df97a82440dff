// ReadOnlyHost: the Host of an observing agent (--observe). It passes on the commands that only
// read the node (iptables-save, iptables -S, nft list, ipset list/save, ipvsadm -L/-S, /proc/net/ip_vs, ip ... show,
// nfacct get/list, sysctl -n, ss -l) and refuses every other one before it runs, naming it. The rule
// is an allow-list: a command the list does not know is a write, so a bug elsewhere (a proxier's
// path reached by mistake, a new command added later) fails loudly instead of changing a node
// that kube-proxy owns.
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {IPFamily} from '../../core/model/index.ts';
import type {ConntrackFilter, Host, IptablesFrontEnd, RestoreInput, RestoreOptions} from './host.ts';

/** WriteRefusedError: an observing agent was asked to run a command that changes the node. */
export class WriteRefusedError extends Error {
  override name = 'WriteRefusedError';
  readonly command: string[];
  constructor(command: string[]) {
    super(`observe mode: refused to run "${command.join(' ')}": an observing agent never changes the node`);
    this.command = command;
  }
}

/** nft's global options (nft [OPTIONS] COMMAND): those that take no value, and those that take one. */
const nftFlags = new Set([
  '-j',
  '--json',
  '-a',
  '--handle',
  '-n',
  '--numeric',
  '-s',
  '--stateless',
  '-t',
  '--terse',
  '-y',
  '--numeric-priority',
]);
const nftFlagsWithValue = new Set(['-I', '--includepath']);

/** True when `nft ARGS` (no input) only lists or monitors: `nft -f`, add, delete, flush, reset and the rest change the ruleset. */
export function isNftRead(args: readonly string[]): boolean {
  let index = 0;
  while (index < args.length && args[index].startsWith('-')) {
    if (nftFlagsWithValue.has(args[index])) index += 2;
    else if (nftFlags.has(args[index])) index += 1;
    else return false;
  }
  return args[index] === 'list' || args[index] === 'monitor' || args[index] === '--version' || args[index] === '-v';
}

/** True for `ipset list|save|test|version` (and their short forms); add, del, create, destroy, flush, restore, swap, rename write. */
export function isIpsetRead(args: readonly string[]): boolean {
  return ['list', '-L', 'save', '-S', 'test', '-T', 'version', '-v', '--version'].includes(args[0] ?? '');
}

const ipvsadmListFlags = new Set(['-L', '-l', '--list', '-S', '--save', '-Ln', '-Sn', '-Lnc', '--version', '-v']);
const ipvsadmReadOptions = new Set([
  '-n',
  '--numeric',
  '-c',
  '--connection',
  '--stats',
  '--rate',
  '--timeout',
  '--exact',
  '--thresholds',
  '--persistent-conn',
  '--nosort',
  '--sort',
  '-t',
  '--tcp-service',
  '-u',
  '--udp-service',
  '--sctp-service',
  '-f',
  '--fwmark-service',
]);

/** True for ipvsadm listing (-L, -S and their options); -A/-E/-D/-C/-R/-a/-e/-d/--set/-Z write. */
export function isIpvsadmRead(args: readonly string[]): boolean {
  if (!args.some((arg) => ipvsadmListFlags.has(arg))) return false;
  // An address after -t/-u/-f (one service listed) is a value, not a command.
  return args.every(
    (arg, index) =>
      ipvsadmListFlags.has(arg) ||
      ipvsadmReadOptions.has(arg) ||
      (!arg.startsWith('-') && index > 0 && ipvsadmReadOptions.has(args[index - 1])),
  );
}

const ipObjects = new Set(['link', 'l', 'address', 'addr', 'a', 'route', 'r', 'rule', 'neighbour', 'neigh', 'n', 'netns', 'monitor']);
const ipReadVerbs = new Set(['show', 'list', 'lst', 'ls', 'sh', 'get']);

/** True for `ip [-j|-d|-s|-4|-6|-o|-br] OBJECT [show|list|get] ...`; add, del, set, change, replace, flush and -batch write. */
export function isIpRead(args: readonly string[]): boolean {
  let index = 0;
  while (index < args.length && /^-(j|json|d|details|s|stats|4|6|o|oneline|br|brief|p|pretty)$/.test(args[index])) index++;
  const object = args[index];
  if (object === undefined || !ipObjects.has(object) || object === 'monitor') return false;
  const verb = args[index + 1];
  // `ip link` alone, or `ip link dev X`, means show.
  return verb === undefined || ipReadVerbs.has(verb) || (verb === 'dev' && object !== 'netns');
}

/** True for `nfacct get NAME` and `nfacct list`; add, delete and flush write. */
export function isNfacctRead(args: readonly string[]): boolean {
  return args[0] === 'get' || args[0] === 'list';
}

/** Whether a call of each tool only reads, by tool. */
const isReadOnly = {nfacct: isNfacctRead, nft: isNftRead, ipset: isIpsetRead, ipvsadm: isIpvsadmRead, ip: isIpRead};

export interface ReadOnlyHostOptions {
  /** Told of each refused command (the agent logs it and counts it). */
  onRefused?: (error: WriteRefusedError) => void;
}

export class ReadOnlyHost implements Host {
  readonly #inner: Host;
  readonly #onRefused: ((error: WriteRefusedError) => void) | undefined;
  /** Every command refused so far (a test asserts there were none). */
  readonly refused: string[][] = [];

  constructor(inner: Host, options: ReadOnlyHostOptions = {}) {
    this.#inner = inner;
    this.#onRefused = options.onRefused;
  }

  get netns(): string | undefined {
    return this.#inner.netns;
  }

  /** Passes a call of `tool` on when it only reads (a reading verb, no input to load), else refuses it. */
  #read(tool: keyof typeof isReadOnly, args: string[], input?: string): Promise<string> {
    if (input !== undefined || !isReadOnly[tool](args)) this.#refuse([tool, ...args]);
    return this.#inner[tool](args);
  }

  #refuse(command: string[]): never {
    const error = new WriteRefusedError(command);
    this.refused.push(command);
    this.#onRefused?.(error);
    throw error;
  }

  async iptablesRestore(family: IPFamily, _rules: RestoreInput, options: RestoreOptions): Promise<void> {
    this.#refuse([`${iptables(family)}-restore`, ...(options.noflush ? ['--noflush'] : [])]);
  }

  iptablesSave(family: IPFamily, table?: IptablesTable): Promise<string> {
    return this.#inner.iptablesSave(family, table);
  }

  iptablesListChain(family: IPFamily, table: IptablesTable, chain: string): Promise<string | undefined> {
    return this.#inner.iptablesListChain(family, table, chain);
  }

  iptablesFrontEnd(family: IPFamily): Promise<IptablesFrontEnd> {
    return this.#inner.iptablesFrontEnd(family);
  }

  iptablesVersion(family: IPFamily): Promise<string> {
    return this.#inner.iptablesVersion(family);
  }

  async nfacct(args: string[]): Promise<string> {
    return this.#read('nfacct', args);
  }

  async nft(args: string[], input?: string): Promise<string> {
    return this.#read('nft', args, input);
  }

  async ipset(args: string[], input?: string): Promise<string> {
    return this.#read('ipset', args, input);
  }

  async ipvsadm(args: string[], input?: string): Promise<string> {
    return this.#read('ipvsadm', args, input);
  }

  ipvsTable(onRead?: (read: Buffer) => void): Promise<Buffer> {
    return this.#inner.ipvsTable(onRead);
  }

  async ip(args: string[], input?: string): Promise<string> {
    return this.#read('ip', args, input);
  }

  async conntrackDelete(filter: ConntrackFilter): Promise<number> {
    this.#refuse(['conntrack', '-D', '-f', filter.family === 'IPv6' ? 'ipv6' : 'ipv4', '-p', filter.protocol.toLowerCase()]);
  }

  sysctlRead(name: string): Promise<string> {
    return this.#inner.sysctlRead(name);
  }

  async sysctlWrite(name: string, value: string): Promise<void> {
    this.#refuse(['sysctl', '-w', `${name}=${value}`]);
  }

  listeningSockets(): Promise<string> {
    return this.#inner.listeningSockets();
  }

  onSpawn(listener: (pid: number, command: string[]) => void): () => void {
    return this.#inner.onSpawn?.(listener) ?? (() => {});
  }

  close(): void {
    this.#inner.close?.();
  }
}

function iptables(family: IPFamily): string {
  return family === 'IPv6' ? 'ip6tables' : 'iptables';
}
