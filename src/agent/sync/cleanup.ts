// cleanupProxyRules (--cleanup): removes the proxy's iptables chains and jump rules from every
// table and family, the nftables tables of nftables mode, and ipvs mode's chains, virtual
// servers, KUBE- sets and kube-ipvs0, keeping everything foreign.
import type {IPFamily} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {cleanupIpvsMode} from './ipvs-host.ts';
import {cleanupRestoreInput, type OwnedRules, readOwnedRules} from './owned-rules.ts';
import {errorText} from '../../core/error-text.ts';

const cleanedTables: readonly IptablesTable[] = ['nat', 'filter', 'mangle'];

/**
 * readOwnedTable: the proxy's part of one table, or undefined when the table cannot be read: a
 * kernel without IPv6 or without the mangle table has nothing of ours there (logged as `unreadable`).
 */
export async function readOwnedTable(
  host: Host,
  log: Logger,
  family: IPFamily,
  table: IptablesTable,
  unreadable = 'cannot read table; skipped',
): Promise<OwnedRules | undefined> {
  let save: string;
  try {
    save = await host.iptablesSave(family, table);
  } catch (error) {
    log.detail(1, unreadable, {family, table, reason: errorText(error)});
    return undefined;
  }
  return readOwnedRules(table, save);
}

export interface CleanupResult {
  removedChains: number;
  removedJumpRules: number;
  /** Failures that left something behind; empty when everything went. */
  errors: string[];
}

export async function cleanupProxyRules(
  host: Host,
  log: Logger,
  families: IPFamily[] = ['IPv4', 'IPv6'],
  options: {excludeCIDRs?: string[]} = {},
): Promise<CleanupResult> {
  const result: CleanupResult = {removedChains: 0, removedJumpRules: 0, errors: []};
  for (const family of families) {
    for (const table of cleanedTables) {
      const owned = await readOwnedTable(host, log, family, table);
      if (!owned) continue;
      const input = cleanupRestoreInput(owned);
      if (input === '') continue;
      try {
        await host.iptablesRestore(family, input, {noflush: true});
        result.removedChains += owned.chains.length;
        result.removedJumpRules += owned.jumpRules.length;
        log.info('removed rules', {family, table, chains: owned.chains.length, jumpRules: owned.jumpRules.length});
      } catch (error) {
        result.errors.push(`${family} ${table}: ${errorText(error)}`);
        log.error('cannot remove rules', {family, table, reason: errorText(error)});
      }
    }
  }
  for (const nftFamily of ['ip', 'ip6']) {
    try {
      await host.nft(['list', 'table', nftFamily, 'kube-proxy']);
    } catch {
      continue;
    }
    try {
      await host.nft(['delete', 'table', nftFamily, 'kube-proxy']);
      log.info('removed nftables table', {table: `${nftFamily} kube-proxy`});
    } catch (error) {
      result.errors.push(`nft ${nftFamily} kube-proxy: ${errorText(error)}`);
    }
  }
  // After the iptables rules: a set cannot be destroyed while a rule matches it.
  const ipvs = await cleanupIpvsMode(host, log, families, options.excludeCIDRs);
  result.errors.push(...ipvs.errors);
  return result;
}
