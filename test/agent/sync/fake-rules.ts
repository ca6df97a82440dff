// A small stand-in for core/iptables: one KUBE-SVC chain per service port that DNATs to its first
// endpoint, KUBE-SERVICES rewritten on every sync, stale service chains deleted. Valid
// iptables-restore input, so the kernel test can load it too. Its rules are written as
// iptables-save prints them, so what a write leaves is its own lines.
import {createHash} from 'node:crypto';
import {insertLine} from '../../../src/core/iptables/index.ts';
import {endpointKey, portsWithIdentities, servicePortIdentity, type ProxyModel} from '../../../src/core/model/index.ts';
import type {IptablesRuleSource, JumpRule, RenderedWrite, RenderOptions, WrittenTable} from '../../../src/agent/sync/iptables-rules.ts';

export function serviceChain(identity: string): string {
  return `KUBE-SVC-${createHash('sha256').update(identity).digest('hex').slice(0, 16).toUpperCase()}`;
}

export class FakeRules implements IptablesRuleSource {
  readonly renders: RenderOptions[] = [];

  render(model: ProxyModel, options: RenderOptions): RenderedWrite {
    this.renders.push(options);
    const extra = options.extraLines ?? {};
    const jumps = options.insertJumps ?? [];
    const jumpLines = (table: 'filter' | 'nat') => jumps.filter((jump) => jump.table === table).map(insertLine);
    const nat = ['*nat', ...(extra.nat?.start ?? []), ':KUBE-SERVICES - [0:0]'];
    const rules: string[] = [];
    const live = new Set<string>();
    for (const port of model.servicePorts) {
      const identity = servicePortIdentity(port);
      const chain = serviceChain(identity);
      if (port.clusterEndpoints.length > 0) live.add(chain);
      const protocol = port.protocol.toLowerCase();
      rules.push(
        `-A KUBE-SERVICES -d ${port.clusterIP}/32 -p ${protocol} -m comment --comment "${port.key} cluster IP" -m ${protocol} --dport ${port.port} -j ${chain}`,
      );
      if (options.changedServicePorts && !options.changedServicePorts.has(identity)) continue;
      nat.push(`:${chain} - [0:0]`);
      const endpoint = port.clusterEndpoints[0];
      if (endpoint)
        rules.push(
          `-A ${chain} -p ${protocol} -m comment --comment "${port.key}" -m ${protocol} -j DNAT --to-destination ${endpointKey(endpoint)}`,
        );
    }
    const existing = options.existingChains?.get('nat') ?? new Set<string>();
    const previous =
      options.previous && options.changedServicePorts
        ? portsWithIdentities(options.previous, options.changedServicePorts).map((port) => serviceChain(servicePortIdentity(port)))
        : [];
    const stale = [...new Set([...existing, ...previous])].filter(
      (chain) => chain.startsWith('KUBE-SVC-') && !live.has(chain) && !nat.includes(`:${chain} - [0:0]`),
    );
    for (const chain of stale) nat.push(`:${chain} - [0:0]`);
    for (const chain of stale) rules.push(`-X ${chain}`);
    const filter =
      extra.filter || jumpLines('filter').length > 0
        ? ['*filter', ...(extra.filter?.start ?? []), ...jumpLines('filter'), ...(extra.filter?.end ?? []), 'COMMIT']
        : [];
    const text = [...filter, ...nat, ...rules, ...jumpLines('nat'), ...(extra.nat?.end ?? []), 'COMMIT', ''].join('\n');
    const written = writtenTables(text, options.changedServicePorts === undefined);
    return {input: text, declaredChains: () => ({filter: written.filter.declared, nat: written.nat.declared}), written: () => written};
  }

  jumpRules(): JumpRule[] {
    const rule = ['-m', 'comment', '--comment', 'kubernetes service portals', '-j', 'KUBE-SERVICES'];
    return [
      {table: 'nat', chain: 'PREROUTING', rule, position: 'prepend'},
      {table: 'nat', chain: 'OUTPUT', rule, position: 'prepend'},
    ];
  }
}

/** What the fake's input does, read from its lines; a full write's service chains by count, as core's renderer records them. */
function writtenTables(text: string, countServiceChains: boolean): Record<'filter' | 'nat', WrittenTable> {
  const tables = {filter: emptyTable(), nat: emptyTable()};
  let table = tables.nat;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) table = tables[line.slice(1) as 'filter' | 'nat'];
    else if (line.startsWith(':')) table.declared.push(line.slice(1).split(' ')[0]);
    else if (line.startsWith('-X ')) table.deleted.push(line.slice(3));
    else if (line.startsWith('-I ') || (line.startsWith('-A ') && !table.declared.includes(line.split(' ')[1]))) {
      table.jumps.push({chain: line.split(' ')[1], rule: `-A ${line.slice(3)}`, prepend: line.startsWith('-I ')});
    } else if (line.startsWith('-A ')) {
      const chain = line.split(' ')[1];
      const sofar = table.rules.get(chain);
      if (countServiceChains && chain.startsWith('KUBE-SVC-')) table.rules.set(chain, ((sofar as number | undefined) ?? 0) + 1);
      else table.rules.set(chain, [...((sofar as string[] | undefined) ?? []), line]);
    }
  }
  return tables;
}

function emptyTable(): WrittenTable {
  return {declared: [], deleted: [], rules: new Map(), jumps: []};
}
