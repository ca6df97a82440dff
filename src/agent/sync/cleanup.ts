// cleanupProxyRules (--cleanup): removes the proxy's iptables chains and jump rules from every
// table and family, the nftables tables of nftables mode, and ipvs mode's chains, virtual
// servers, KUBE- sets and kube-ipvs0, keeping everything foreign.
import type {IPFamily} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {cleanupIpvsMode} from './ipvs-host.ts';
import {cleanupRestoreInput, readOwnedRules} from './owned-rules.ts';
import {errorText} from '../../core/error-text.ts';

const cleanedTables: readonly IptablesTable[] = ['nat', 'filter', 'mangle'];

export interface CleanupResult {
  removedChains: number;
  removedJumpRules: number;
  /** Failures that left something behind; empty when everything went. */
  errors: string[];
}

export async function cleanupProxyRules(host: Host, log: Logger, families: IPFamily[] = ['IPv4', 'IPv6'], options: {excludeCIDRs?: string[]} = {}): Promise<CleanupResult> {
  const result: CleanupResult = {removedChains: 0, removedJumpRules: 0, errors: []};
  for (const family of families) {
    for (const table of cleanedTables) {
      let save: string;
      try {
        save = await host.iptablesSave(family, table);
      } catch (error) {
        // A kernel without IPv6 or without the mangle table has nothing of ours there.
        log.detail(1, 'cannot read table; skipped', {family, table, reason: errorText(error)});
        continue;
      }
      const owned = readOwnedRules(table, save);
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
