// What the node offers iptables mode, found the way kube-proxy's iptables proxier finds it at
// start: the nfacct objects its counting rules need (created when missing), whether iptables knows
// MASQUERADE --random-fully, and whether conntrack is liberal about TCP windows. Core renders from
// the answer (ProxyConfig.iptablesFeatures); nothing in core asks the node.
import {nfacctCounters} from '../../core/iptables/chains.ts';
import type {IPFamily, IptablesFeatures} from '../../core/model/index.ts';
import type {Host} from '../host/host.ts';
import type {Logger} from '../log.ts';
import {errorText} from '../../core/error-text.ts';

/** The kube-proxy nfacct objects, in the order kube-proxy ensures them. */
export const kubeProxyNfacctCounters: readonly string[] = [nfacctCounters.ctStateInvalidDropped, nfacctCounters.localhostNodePortsAccepted];

/** iptables learned MASQUERADE --random-fully in 1.6.2 (kube-proxy's RandomFullyMinVersion). */
const randomFullyMinVersion = [1, 6, 2];

export interface DetectOptions {
  families: IPFamily[];
  /** Create the nfacct objects that are missing (a proxying agent); otherwise only those that exist count. */
  createCounters: boolean;
}

/** detectIptablesFeatures asks the node; a question it cannot answer leaves kube-proxy's default for that feature, logged. */
export async function detectIptablesFeatures(host: Host, log: Logger, options: DetectOptions): Promise<IptablesFeatures> {
  const features: IptablesFeatures = {nfacctCounters: [], randomFully: true, conntrackTCPLiberal: false};
  for (const name of kubeProxyNfacctCounters) {
    try {
      if (options.createCounters && (await readNfacctPackets(host, name)) === undefined) await host.nfacct(['add', name]);
      if ((await readNfacctPackets(host, name)) !== undefined) features.nfacctCounters.push(name);
    } catch (error) {
      log.error('cannot create nfacct counter; its rules are left out and its metric will not be updated', {
        counter: name,
        reason: errorText(error),
      });
    }
  }
  try {
    // Every family's iptables must know it: the rules of each are rendered alike.
    for (const family of options.families) {
      const version = /v(\d+)\.(\d+)\.(\d+)/.exec(await host.iptablesVersion(family));
      if (version && compareVersions(version.slice(1).map(Number), randomFullyMinVersion) < 0) features.randomFully = false;
    }
  } catch (error) {
    log.warn('cannot read the iptables version; assuming it supports --random-fully', {reason: errorText(error)});
  }
  try {
    // Without conntrack the sysctl does not exist; kube-proxy then writes the drop rule.
    features.conntrackTCPLiberal = (await host.sysctlRead('net.netfilter.nf_conntrack_tcp_be_liberal')) !== '0';
    if (features.conntrackTCPLiberal) log.info('nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets');
  } catch {
    features.conntrackTCPLiberal = false;
  }
  log.info('iptables features', {
    nfacctCounters: features.nfacctCounters.join(',') || 'none',
    randomFully: features.randomFully,
    conntrackTCPLiberal: features.conntrackTCPLiberal,
  });
  return features;
}

/**
 * readNfacctPackets: the packets counted in the nfacct object `name`; undefined when the object
 * does not exist. Other failures (no nfacct tool, no nfnetlink_acct in the kernel) throw.
 */
export async function readNfacctPackets(host: Host, name: string): Promise<number | undefined> {
  let output: string;
  try {
    output = await host.nfacct(['get', name]);
  } catch (error) {
    if (/No such file or directory|ENOENT/.test(errorText(error)) && !/could not run/.test(errorText(error))) return undefined;
    throw error;
  }
  const found = /pkts = (\d+),/.exec(output);
  if (!found) throw new Error(`nfacct get ${name}: cannot read "${output.trim().slice(0, 200)}"`);
  return Number(found[1]);
}

/**
 * readNfacctCounters: the packets counted in every nfacct object, by name (`nfacct list`: one
 * command for all the counters a metrics scrape reads). Failures (no nfacct tool, no
 * nfnetlink_acct in the kernel) throw.
 */
export async function readNfacctCounters(host: Host): Promise<Map<string, number>> {
  const counters = new Map<string, number>();
  for (const line of (await host.nfacct(['list'])).split('\n')) {
    const found = /^\{ pkts = (\d+), bytes = \d+ \} = (\S+);$/.exec(line.trim());
    if (found) counters.set(found[2], Number(found[1]));
    else if (line.trim() !== '') throw new Error(`nfacct list: cannot read "${line.trim().slice(0, 200)}"`);
  }
  return counters;
}

function compareVersions(a: number[], b: number[]): number {
  for (let index = 0; index < Math.max(a.length, b.length); index++)
    if ((a[index] ?? 0) !== (b[index] ?? 0)) return (a[index] ?? 0) - (b[index] ?? 0);
  return 0;
}
