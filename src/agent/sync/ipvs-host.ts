// ipvs mode's node commands: reading the state ipvs mode keeps (virtual servers, KUBE- sets,
// kube-ipvs0 addresses, iptables layer), preparing the node (kube-ipvs0, sysctls, timeouts), the
// connections a draining real server still has, and removing everything ipvs mode owns (--cleanup).
import {release} from 'node:os';
import {
  dummyDevice,
  ipvsIptablesChains,
  ipvsJumpRules,
  parseBoundAddresses,
  parseIpsetSave,
  parseIpvsadmSave,
  parseIpvsadmSaveSince,
  patchedServers,
  tableSection,
  type IpvsadmBlock,
  type Ipset,
  type IpvsState,
  type IpvsVirtualServer,
} from '../../core/ipvs/index.ts';
import {cidrContains, type IPFamily, joinHostPort, parseCIDR, parseIP} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import {type Host, savedTables} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {insertLine} from '../../core/iptables/index.ts';
import type {JumpRule} from './iptables-rules.ts';
import {errorText} from '../../core/error-text.ts';

/** The ipvs section of KubeProxyConfiguration, durations in ms. */
export interface IpvsSettings {
  scheduler: string;
  excludeCIDRs: string[];
  strictARP: boolean;
  tcpTimeout: number;
  tcpFinTimeout: number;
  udpTimeout: number;
}

const ipvsTables: readonly ('nat' | 'filter')[] = ['nat', 'filter'];

function familyOf(address: string): IPFamily {
  return address.includes(':') ? 'IPv6' : 'IPv4';
}

/**
 * readIpvsKernelState reads one family's ipvs-mode state from the node, as the tools print it. The
 * four tools run at once: the reading takes as long as the slowest (ipset save, on a large node),
 * and the agent's own work meanwhile (an observer makes the desired state as it reads) does not
 * hold back the next tool's start.
 */
export async function readIpvsKernelState(host: Host, family: IPFamily, lookedAt?: string): Promise<IpvsState> {
  const [virtualServers, sets, boundAddresses, iptables] = await Promise.all([
    readVirtualServers(host, family, {lookedAt}),
    readSets(host, family),
    readBoundAddresses(host, family),
    readIptablesLayer(host, family),
  ]);
  return {family, virtualServers, sets, boundAddresses, iptables};
}

/** The family whose state a KUBE- set belongs to: ipvs mode names IPv6's sets KUBE-6-. */
export function setFamily(name: string): IPFamily {
  return name.startsWith('KUBE-6-') ? 'IPv6' : 'IPv4';
}

/** The blocks of `ipvsadm -Sn` each reading of the virtual servers came from, for the reading after it. */
const blocksRead = new WeakMap<IpvsVirtualServer[], Map<string, IpvsadmBlock>>();

/**
 * One family's virtual and real servers, `ipvsadm -Sn` (or its output as given, `printed`). Given
 * the servers of an earlier reading (`since`), only the servers whose lines changed since are
 * parsed; the others are that reading's objects. With `changed`, the servers that may have
 * changed since by ipvsadm's words for them (a look's report), only their lines are looked for in
 * `printed`: the rest of it is not read. `lookedAt`: the servers as a look at the state printed
 * them (LatestIpvsLook), which the look keeps: output that reads the same is parsed from that
 * text, so that the servers' lines (virtualServerText) and the look share one copy.
 */
export async function readVirtualServers(
  host: Host,
  family: IPFamily,
  {
    since,
    printed,
    lookedAt,
    changed,
  }: {since?: IpvsVirtualServer[]; printed?: string; lookedAt?: string; changed?: ReadonlySet<string>} = {},
): Promise<IpvsVirtualServer[]> {
  const ofFamily = (server: Pick<IpvsVirtualServer, 'address'>) => familyOf(server.address) === family;
  // The servers so read keep no blocks for a later reading of all of printed: that one parses every server.
  const patched = since && printed !== undefined && changed ? patchedServers(since, printed, changed, ofFamily) : undefined;
  if (patched) return patched;
  const before = since && blocksRead.get(since);
  let text = printed ?? (await host.ipvsadm(['-Sn']));
  if (lookedAt !== undefined && text === lookedAt) text = lookedAt;
  const {servers, blocks} = parseIpvsadmSaveSince(text, before, ofFamily);
  blocksRead.set(servers, blocks);
  return servers;
}

/** One family's KUBE- sets, `ipset save`. */
export async function readSets(host: Host, family: IPFamily): Promise<Ipset[]> {
  return parseIpsetSave(await host.ipset(['save'])).filter((set) => setFamily(set.name) === family);
}

/** One KUBE- set, `ipset save NAME`; undefined when there is no such set. */
export async function readSet(host: Host, name: string): Promise<Ipset | undefined> {
  try {
    return parseIpsetSave(await host.ipset(['save', name])).find((set) => set.name === name);
  } catch (error) {
    if (/does not exist/.test(errorText(error))) return undefined;
    throw error;
  }
}

/** One family's addresses on kube-ipvs0. */
export async function readBoundAddresses(host: Host, family: IPFamily): Promise<string[]> {
  return parseBoundAddresses(await readDummyAddresses(host)).filter((address) => familyOf(address) === family);
}

/** ipvs mode's iptables layer: the nat and filter tables, as iptables-save prints them. */
export async function readIptablesLayer(host: Host, family: IPFamily): Promise<string> {
  return savedTables(await host.iptablesSave(family), ['nat', 'filter']);
}

/** `ip -j addr show dev kube-ipvs0`; '' when the device does not exist. */
async function readDummyAddresses(host: Host): Promise<string> {
  try {
    return await host.ip(['-j', 'addr', 'show', 'dev', dummyDevice]);
  } catch {
    return '';
  }
}

/** ensureDummyDevice creates kube-ipvs0 (a dummy device, kept down as kube-proxy keeps it) unless it exists. */
export async function ensureDummyDevice(host: Host, log: Logger): Promise<void> {
  try {
    await host.ip(['link', 'show', dummyDevice]);
    return;
  } catch {
    // missing: create it
  }
  await host.ip(['link', 'add', dummyDevice, 'type', 'dummy']);
  log.info('created the service address device', {device: dummyDevice});
}

/** bindAddresses adds and removes service addresses on kube-ipvs0 in one `ip -batch`. */
export async function changeBoundAddresses(host: Host, family: IPFamily, bind: string[], unbind: string[]): Promise<void> {
  if (bind.length + unbind.length === 0) return;
  const bits = family === 'IPv6' ? 128 : 32;
  const lines = [
    ...bind.map((address) => `addr replace ${address}/${bits} dev ${dummyDevice}`),
    ...unbind.map((address) => `addr del ${address}/${bits} dev ${dummyDevice}`),
  ];
  await host.ip(['-batch', '-'], `${lines.join('\n')}\n`);
}

/**
 * The sysctls kube-proxy's ipvs mode sets: conntrack for the iptables layer's masquerade, quick
 * expiry of connections to deleted real servers and of their persistence templates, forwarding,
 * ARP answers only for addresses on the asking interface with strictARP (kube-ipvs0 holds every
 * service address), and on kernels before 5.9 conn_reuse_mode 0, which there avoids a 1 s stall
 * for reused ports.
 */
export function ipvsSysctls(
  settings: Pick<IpvsSettings, 'strictARP'>,
  families: IPFamily[],
  kernelRelease = release(),
): Map<string, string> {
  const sysctls = new Map<string, string>([
    ['net.ipv4.vs.conntrack', '1'],
    ['net.ipv4.vs.expire_nodest_conn', '1'],
    ['net.ipv4.vs.expire_quiescent_template', '1'],
    ['net.ipv4.ip_forward', '1'],
  ]);
  const [major, minor] = kernelRelease.split(/[.-]/).map(Number);
  if (major < 5 || (major === 5 && minor < 9)) sysctls.set('net.ipv4.vs.conn_reuse_mode', '0');
  if (families.includes('IPv6')) sysctls.set('net.ipv6.conf.all.forwarding', '1');
  if (settings.strictARP) {
    sysctls.set('net.ipv4.conf.all.arp_ignore', '1');
    sysctls.set('net.ipv4.conf.all.arp_announce', '2');
  }
  return sysctls;
}

/** setSysctls writes each sysctl that differs; a failure is logged and the agent goes on, as kube-proxy does. */
export async function setSysctls(host: Host, sysctls: Map<string, string>, log: Logger): Promise<void> {
  for (const [name, value] of sysctls) {
    try {
      if ((await host.sysctlRead(name).catch(() => undefined)) === value) continue;
      await host.sysctlWrite(name, value);
      log.info('set sysctl for ipvs mode', {sysctl: name, value});
    } catch (error) {
      log.error('cannot set sysctl', {sysctl: name, value, reason: errorText(error)});
    }
  }
}

/** setIpvsTimeouts: `ipvsadm --set TCP TCPFIN UDP` in seconds; 0 keeps that timeout; nothing when all are 0. */
export async function setIpvsTimeouts(
  host: Host,
  settings: Pick<IpvsSettings, 'tcpTimeout' | 'tcpFinTimeout' | 'udpTimeout'>,
  log: Logger,
): Promise<void> {
  const seconds = [settings.tcpTimeout, settings.tcpFinTimeout, settings.udpTimeout].map((ms) => Math.round(ms / 1000));
  if (seconds.every((value) => value === 0)) return;
  await host.ipvsadm(['--set', ...seconds.map(String)]);
  log.info('set ipvs timeouts', {tcpSeconds: seconds[0], tcpFinSeconds: seconds[1], udpSeconds: seconds[2]});
}

/**
 * IPVS connection states after which a connection carries no more data: a real server whose
 * entries are all in these states (or persistence templates) has drained.
 */
const finishedStates = new Set(['TIME_WAIT', 'CLOSE', 'NONE']);

/**
 * liveConnections counts, per realServerKey ("TCP 10.96.0.10:80 -> 10.244.1.2:8080"), the
 * connections in `ipvsadm -Lnc` output that may still carry data.
 */
export function liveConnections(listing: string): Map<string, number> {
  const counts = new Map<string, number>();
  for (const line of listing.split('\n')) {
    const words = line.trim().split(/\s+/);
    if (words.length < 6 || !/^(TCP|UDP|SCTP)$/.test(words[0]) || finishedStates.has(words[2])) continue;
    const key = `${words[0]} ${words[4]} -> ${words[5]}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

/** iptablesWords splits a rule as iptables-restore reads it (quoted words kept whole). */
function iptablesWords(rule: string): string[] {
  return [...rule.matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((match) => match[1] ?? match[2]);
}

/** missingIpvsJumpRules: the jumps from built-in chains into ipvs mode's chains that iptables-save does not show. */
export function missingIpvsJumpRules(iptablesSave: string): JumpRule[] {
  const missing: JumpRule[] = [];
  for (const table of ipvsTables) {
    // The text holds both tables; a rule counts in its own table only.
    const inTable = new Set(
      tableSection(iptablesSave, table)
        .split('\n')
        .map((line) => line.trim()),
    );
    for (const line of ipvsJumpRules[table]) {
      if (inTable.has(line)) continue;
      const [, chain, ...rule] = iptablesWords(line);
      missing.push({table, chain, rule, position: 'prepend'});
    }
  }
  return missing;
}

/**
 * ipvsLayerCleanupInput is iptables-restore --noflush input removing ipvs mode's chains from one
 * table: each is flushed, the rules of other chains that jump to them are deleted, then they are
 * deleted. '' when none exists.
 */
export function ipvsLayerCleanupInput(table: IptablesTable, save: string): string {
  const section = tableSection(save, table);
  const names = new Set<string>(table === 'nat' || table === 'filter' ? ipvsIptablesChains[table] : []);
  const chains: string[] = [];
  const jumps: string[] = [];
  for (const raw of section.split('\n')) {
    const line = raw.trim();
    const declared = /^:(\S+)/.exec(line);
    if (declared && names.has(declared[1])) chains.push(declared[1]);
    const rule = /^-A\s+(\S+)\s.*\s-[jg]\s+(\S+)/.exec(line);
    if (rule && !names.has(rule[1]) && names.has(rule[2])) jumps.push(line.replace(/^-A\s/, '-D '));
  }
  if (chains.length === 0) return '';
  return [`*${table}`, ...chains.map((chain) => `:${chain} - [0:0]`), ...jumps, ...chains.map((chain) => `-X ${chain}`), 'COMMIT', ''].join(
    '\n',
  );
}

export interface IpvsCleanupResult {
  removed: string[];
  errors: string[];
}

/**
 * cleanupIpvsMode (--cleanup) removes what ipvs mode owns: its iptables chains and jumps, the
 * virtual servers of service addresses (on kube-ipvs0) and of NodePorts (ports in the
 * KUBE-NODE-PORT sets), the KUBE- sets and kube-ipvs0. Virtual servers and sets of others stay.
 */
export async function cleanupIpvsMode(
  host: Host,
  log: Logger,
  families: IPFamily[],
  excludeCIDRs: string[] = [],
): Promise<IpvsCleanupResult> {
  const result: IpvsCleanupResult = {removed: [], errors: []};
  const attempt = async (what: string, action: () => Promise<unknown>) => {
    try {
      await action();
      result.removed.push(what);
      log.info('removed', {what});
    } catch (error) {
      result.errors.push(`${what}: ${errorText(error)}`);
      log.error('cannot remove', {what, reason: errorText(error)});
    }
  };
  for (const family of families) {
    for (const table of ipvsTables) {
      let save: string;
      try {
        save = await host.iptablesSave(family, table);
      } catch {
        continue;
      }
      const input = ipvsLayerCleanupInput(table, save);
      if (input !== '') await attempt(`${family} ${table} ipvs mode chains`, () => host.iptablesRestore(family, input, {noflush: true}));
    }
  }

  let sets: ReturnType<typeof parseIpsetSave> = [];
  try {
    sets = parseIpsetSave(await host.ipset(['save']));
  } catch (error) {
    log.detail(1, 'cannot list ipsets; none removed', {reason: errorText(error)});
  }
  const bound = new Set(parseBoundAddresses(await readDummyAddresses(host)));
  const nodePorts = new Set<string>();
  for (const set of sets) {
    const protocol = /NODE-PORT(-LOCAL)?-(TCP|UDP)$/.exec(set.name)?.[2];
    if (protocol) for (const entry of set.entries) nodePorts.add(`${protocol} ${entry}`);
  }
  let servers: IpvsVirtualServer[] = [];
  try {
    servers = parseIpvsadmSave(await host.ipvsadm(['-Sn']));
  } catch (error) {
    log.detail(1, 'cannot list virtual servers; none removed', {reason: errorText(error)});
  }
  const excluded = excludeCIDRs.map(parseCIDR).filter((cidr) => cidr !== undefined);
  const ours = servers.filter((server) => {
    const ip = parseIP(server.address);
    if (ip && excluded.some((cidr) => cidrContains(cidr, ip))) return false;
    return bound.has(server.address) || nodePorts.has(`${server.protocol} ${server.port}`);
  });
  if (ours.length > 0) {
    const flag = {TCP: '-t', UDP: '-u', SCTP: '--sctp-service'} as const;
    const input = ours.map((server) => `-D ${flag[server.protocol]} ${joinHostPort(server.address, server.port)}`).join('\n');
    await attempt(`${ours.length} virtual servers`, () => host.ipvsadm(['-R'], `${input}\n`));
  }
  for (const set of sets) await attempt(`ipset ${set.name}`, () => host.ipset(['destroy', set.name]));
  let deviceExists = true;
  await host.ip(['link', 'show', dummyDevice]).catch(() => (deviceExists = false));
  if (deviceExists) await attempt(dummyDevice, () => host.ip(['link', 'del', dummyDevice]));
  return result;
}

/**
 * withJumpRules adds the missing jump rules to the ipvs layer's restore input, at the end of their
 * table's part: in the same atomic write as the chains they lead to, once those are filled, and
 * without a separate iptables command per rule (each one reads the whole table on iptables-nft).
 */
export function withJumpRules(input: string, jumps: JumpRule[]): string {
  let text = input;
  for (const table of new Set(jumps.map((jump) => jump.table)))
    text = beforeCommit(text, table, jumps.filter((jump) => jump.table === table).map(insertLine));
  return text;
}

function beforeCommit(input: string, table: IptablesTable, lines: string[]): string {
  const start = input.indexOf(`*${table}\n`);
  if (start < 0) return `${input}*${table}\n${lines.join('\n')}\nCOMMIT\n`;
  const commit = input.indexOf('\nCOMMIT\n', start);
  return `${input.slice(0, commit + 1)}${lines.join('\n')}\n${input.slice(commit + 1)}`;
}
