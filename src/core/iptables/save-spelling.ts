// IptablesSaveSpelling: the rules a render writes, spelled as iptables-save prints them once they
// are loaded, so that what a write left can be compared with a reading of the kernel without
// reading it back. The renderer writes kube-proxy's restore spelling ("-m comment --comment X -m
// tcp -p tcp -d 10.96.0.10 --dport 80"); iptables-save prints its own ("-d 10.96.0.10/32 -p tcp
// -m comment --comment X -m tcp --dport 80"). The parser knows the second from the first, checked
// equal to the kernel's for every rule the renderer writes (test/kernel/iptables.test.ts).
import type {IPFamily} from '../model/types.ts';
import type {ProxyTable} from './chains.ts';
import {parseIptablesSave} from './parse.ts';
import {type IptablesRenderRecord, insertLine} from './render.ts';
import {isBuiltinChain} from './ruleset.ts';

/** SpelledTable: a RenderedTable with its rules and jumps as iptables-save prints them. */
export interface SpelledTable {
  declared: string[];
  deleted: string[];
  /** Per chain, its rules as iptables-save prints them; a per-service chain of a full render, how many. */
  rules: Map<string, string[] | number>;
  /** The jump rules inserted into built-in chains, as iptables-save prints them; `prepend`: first in their chain. */
  jumps: Array<{chain: string; rule: string; prepend: boolean}>;
}

/**
 * IptablesSaveSpelling spells renders of one family. Spellings are kept per line from one render
 * to the next: a partial sync that rewrites KUBE-SERVICES changes few of its lines.
 */
export class IptablesSaveSpelling {
  readonly #family: IPFamily;
  #known = new Map<string, string>();

  constructor(family: IPFamily) {
    this.#family = family;
  }

  /** The record's tables in iptables-save's spelling (sharing nothing with the record); undefined when a line does not spell as one rule. */
  spell(record: IptablesRenderRecord): Record<ProxyTable, SpelledTable> | undefined {
    const lines: Array<{table: ProxyTable; chain: string; line: string}> = [];
    for (const table of ['filter', 'nat'] as const) {
      const rendered = record.tables[table];
      for (const [chain, rules] of rendered.rules)
        if (typeof rules !== 'number') for (const line of rules) lines.push({table, chain, line});
      for (const jump of rendered.jumps) lines.push({table, chain: jump.chain, line: `-A ${insertLine(jump).slice(3)}`});
    }
    const fresh = this.#spellNew(lines.filter((entry) => !this.#known.has(entry.line)));
    if (!fresh) return undefined;
    const known = new Map<string, string>();
    for (const {line} of lines) known.set(line, this.#known.get(line) ?? fresh.get(line)!);
    // Kept for the renders to come; in fresh strings, since slices would keep the whole input alive.
    this.#known = known;
    const spelled = (table: ProxyTable): SpelledTable => {
      const rendered = record.tables[table];
      const rules = new Map<string, string[] | number>();
      for (const [chain, list] of rendered.rules) rules.set(chain, typeof list === 'number' ? list : list.map((line) => known.get(line)!));
      const jumps = rendered.jumps.map((jump) => ({
        chain: jump.chain,
        rule: known.get(`-A ${insertLine(jump).slice(3)}`)!,
        prepend: jump.position === 'prepend',
      }));
      return {declared: [...rendered.declared], deleted: [...rendered.deleted], rules, jumps};
    };
    return {filter: spelled('filter'), nat: spelled('nat')};
  }

  #spellNew(lines: Array<{table: ProxyTable; chain: string; line: string}>): Map<string, string> | undefined {
    const spelled = new Map<string, string>();
    if (lines.length === 0) return spelled;
    const byTable = new Map<ProxyTable, Map<string, string[]>>();
    for (const {table, chain, line} of lines) {
      const chains = byTable.get(table) ?? new Map<string, string[]>();
      byTable.set(table, chains);
      const list = chains.get(chain);
      if (list) list.push(line);
      else chains.set(chain, [line]);
    }
    const dump: string[] = [];
    for (const [table, chains] of byTable) {
      // Built-in chains (the jump rules' PREROUTING, INPUT ...) are declared with a policy, as iptables-save does.
      dump.push(`*${table}`, ...[...chains.keys()].map((chain) => `:${chain} ${isBuiltinChain(table, chain) ? 'ACCEPT' : '-'} [0:0]`));
      for (const list of chains.values()) dump.push(...list);
      dump.push('COMMIT');
    }
    let ruleset: ReturnType<typeof parseIptablesSave>;
    try {
      ruleset = parseIptablesSave(`${dump.join('\n')}\n`, {family: this.#family, keepSavedText: false});
    } catch {
      return undefined;
    }
    for (const [table, chains] of byTable) {
      for (const [chain, list] of chains) {
        const rules = ruleset.tables.get(table)?.chains.get(chain)?.rules;
        // One input line, one rule: anything else (a list of addresses expanded) is not followed.
        if (!rules || rules.length !== list.length) return undefined;
        list.forEach((line, index) => spelled.set(line, rules[index].text));
      }
    }
    return spelled;
  }
}
