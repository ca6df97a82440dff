// A small stand-in for core/iptables: one KUBE-SVC chain per service port that DNATs to its first
// endpoint, KUBE-SERVICES rewritten on every sync, stale service chains deleted. Valid
// iptables-restore input, so the kernel test can load it too.
import {createHash} from 'node:crypto';
import {type IPFamily, servicePortIdentity, type ProxyModel, type ServicePort} from '../../../src/core/model/index.ts';
import type {IptablesTable} from '../../../src/core/iptables/chains.ts';
import type {IptablesRuleSource, JumpRule, RenderOptions} from '../../../src/agent/sync/iptables-rules.ts';

export function serviceChain(identity: string): string {
  return `KUBE-SVC-${createHash('sha256').update(identity).digest('hex').slice(0, 16).toUpperCase()}`;
}

export class FakeRules implements IptablesRuleSource {
  readonly renders: RenderOptions[] = [];

  render(model: ProxyModel, options: RenderOptions): string {
    this.renders.push(options);
    const extra = options.extraLines ?? {};
    const nat = ['*nat', ...(extra.nat?.start ?? []), ':KUBE-SERVICES - [0:0]'];
    const rules: string[] = [];
    const live = new Set<string>();
    for (const port of model.servicePorts) {
      const identity = servicePortIdentity(port);
      const chain = serviceChain(identity);
      live.add(chain);
      const protocol = port.protocol.toLowerCase();
      rules.push(`-A KUBE-SERVICES -d ${port.clusterIP}/32 -p ${protocol} -m comment --comment "${port.key} cluster IP" -m ${protocol} --dport ${port.port} -j ${chain}`);
      if (options.changedServicePorts && !options.changedServicePorts.has(identity)) continue;
      nat.push(`:${chain} - [0:0]`);
      const endpoint = port.clusterEndpoints[0];
      if (endpoint) rules.push(`-A ${chain} -p ${protocol} -m comment --comment "${port.key}" -m ${protocol} -j DNAT --to-destination ${endpoint.key}`);
    }
    const stale = [...(options.existingChains?.get('nat') ?? [])].filter((chain) => chain.startsWith('KUBE-SVC-') && !live.has(chain));
    for (const chain of stale) nat.push(`:${chain} - [0:0]`);
    for (const chain of stale) rules.push(`-X ${chain}`);
    const filter = extra.filter ? ['*filter', ...(extra.filter.start ?? []), ...(extra.filter.end ?? []), 'COMMIT'] : [];
    return [...filter, ...nat, ...rules, ...(extra.nat?.end ?? []), 'COMMIT', ''].join('\n');
  }

  serviceChains(_model: ProxyModel, port: ServicePort): string[] {
    return port.clusterEndpoints.length > 0 ? [serviceChain(servicePortIdentity(port))] : [];
  }

  /** The rules above are written as iptables-save prints them already. */
  spellRules(_family: IPFamily, input: string): Map<IptablesTable, Map<string, string[]>> {
    const tables = new Map<IptablesTable, Map<string, string[]>>();
    let chains = new Map<string, string[]>();
    for (const line of input.split('\n')) {
      if (line.startsWith('*')) tables.set(line.slice(1) as IptablesTable, (chains = new Map()));
      else if (line.startsWith(':')) chains.set(line.slice(1).split(' ')[0], []);
      else if (line.startsWith('-A ')) chains.get(line.split(' ')[1])!.push(line);
    }
    return tables;
  }

  jumpRules(): JumpRule[] {
    const rule = ['-m', 'comment', '--comment', 'kubernetes service portals', '-j', 'KUBE-SERVICES'];
    return [
      {table: 'nat', chain: 'PREROUTING', rule, position: 'prepend'},
      {table: 'nat', chain: 'OUTPUT', rule, position: 'prepend'},
    ];
  }
}
