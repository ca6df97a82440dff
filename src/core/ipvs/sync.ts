// planIpvsSync: the smallest change that turns the applied ipvs state into the desired one, as
// input for `ipvsadm -R` (not ipvsadm-restore, which clears the table first) and `ipset restore` plus addresses to bind and unbind. Real servers
// that go away drain first (weight 0, so IPVS sends them no new connections while existing ones
// finish) and are deleted by a later sync once the caller sees they have no connections left, as
// kube-proxy's graceful termination does.
import {joinHostPort} from '../model/ip.ts';
import {
  formatIpvsadmRestore,
  ipsetCreateLine,
  virtualServerKey,
  type IpvsRealServer,
  type IpvsState,
  type IpvsVirtualServer,
} from './state.ts';

export interface IpvsSyncOptions {
  /** Drain removed real servers (weight 0) instead of deleting them at once (default true). */
  gracefulTermination?: boolean;
  /**
   * Draining real servers (weight 0 in the kernel, not desired) that have no connections left and
   * may go now, as realServerKey strings. The others stay at weight 0.
   */
  drained?: ReadonlySet<string>;
}

export interface IpvsSyncPlan {
  /** `ipvsadm -R` input: -A/-E/-D for virtual servers, -a/-e/-d for real servers. */
  ipvsadm: string;
  /** `ipset restore` input: create -exist, add -exist, del -exist. */
  ipset: string;
  /** Addresses to add to and remove from kube-ipvs0. */
  bind: string[];
  unbind: string[];
  /** Real servers left (or newly put) at weight 0 to drain, as realServerKey strings. */
  draining: string[];
  /** Number of changes in the plan; 0 when the kernel already holds the desired state. */
  changes: number;
}

/** realServerKey names one real server of one virtual server: "TCP 10.96.0.10:80 -> 10.244.1.2:8080". */
export function realServerKey(
  server: Pick<IpvsVirtualServer, 'protocol' | 'address' | 'port'>,
  real: Pick<IpvsRealServer, 'address' | 'port'>,
): string {
  return `${virtualServerKey(server)} -> ${joinHostPort(real.address, real.port)}`;
}

function serviceFlag(server: IpvsVirtualServer): string {
  return formatIpvsadmRestore([{...server, realServers: []}])
    .slice(3)
    .replace(/ -s .*\n$/, '');
}

export function planIpvsSync(desired: IpvsState, applied: IpvsState, options: IpvsSyncOptions = {}): IpvsSyncPlan {
  const graceful = options.gracefulTermination ?? true;
  const drained = options.drained ?? new Set<string>();
  const ipvsadm: string[] = [];
  const draining: string[] = [];
  const appliedServers = new Map(applied.virtualServers.map((server) => [virtualServerKey(server), server]));
  const desiredKeys = new Set(desired.virtualServers.map(virtualServerKey));

  for (const server of desired.virtualServers) {
    const flag = serviceFlag(server);
    const current = appliedServers.get(virtualServerKey(server));
    const [serviceLine] = formatIpvsadmRestore([{...server, realServers: []}])
      .trim()
      .split('\n');
    if (!current) {
      ipvsadm.push(...formatIpvsadmRestore([server]).trim().split('\n'));
      continue;
    }
    if (current.scheduler !== server.scheduler || current.persistenceTimeout !== server.persistenceTimeout) {
      // Dropping persistence needs the server re-created: -E cannot unset -p.
      if (server.persistenceTimeout === undefined && current.persistenceTimeout !== undefined) {
        ipvsadm.push(`-D ${flag}`, ...formatIpvsadmRestore([server]).trim().split('\n'));
        continue;
      }
      ipvsadm.push(serviceLine.replace(/^-A /, '-E '));
    }
    const have = new Map(current.realServers.map((real) => [joinHostPort(real.address, real.port), real]));
    const want = new Set(server.realServers.map((real) => joinHostPort(real.address, real.port)));
    for (const real of server.realServers) {
      const existing = have.get(joinHostPort(real.address, real.port));
      const line = `${flag} -r ${joinHostPort(real.address, real.port)} -m -w ${real.weight}`;
      if (!existing) ipvsadm.push(`-a ${line}`);
      else if (existing.weight !== real.weight) ipvsadm.push(`-e ${line}`);
    }
    for (const real of current.realServers) {
      const text = joinHostPort(real.address, real.port);
      if (want.has(text)) continue;
      const key = realServerKey(server, real);
      if (!graceful || (real.weight === 0 && drained.has(key))) ipvsadm.push(`-d ${flag} -r ${text}`);
      else {
        if (real.weight !== 0) ipvsadm.push(`-e ${flag} -r ${text} -m -w 0`);
        draining.push(key);
      }
    }
  }
  for (const [key, server] of appliedServers) if (!desiredKeys.has(key)) ipvsadm.push(`-D ${serviceFlag(server)}`);

  const ipset: string[] = [];
  const appliedSets = new Map(applied.sets.map((set) => [set.name, set]));
  for (const set of desired.sets) {
    const current = appliedSets.get(set.name);
    if (!current) ipset.push(ipsetCreateLine(set, desired.family));
    const have = new Set(current?.entries ?? []);
    const want = new Set(set.entries);
    for (const entry of set.entries) if (!have.has(entry)) ipset.push(`add ${set.name} ${entry} -exist`);
    for (const entry of current?.entries ?? []) if (!want.has(entry)) ipset.push(`del ${set.name} ${entry} -exist`);
  }

  const bound = new Set(applied.boundAddresses);
  const wanted = new Set(desired.boundAddresses);
  const bind = desired.boundAddresses.filter((address) => !bound.has(address));
  const unbind = applied.boundAddresses.filter((address) => !wanted.has(address));
  return {
    ipvsadm: ipvsadm.length ? `${ipvsadm.join('\n')}\n` : '',
    ipset: ipset.length ? `${ipset.join('\n')}\n` : '',
    bind,
    unbind,
    draining,
    changes: ipvsadm.length + ipset.length + bind.length + unbind.length,
  };
}
