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

/** Stand-ins for the values RuleKindSpeller carries over, numbered from 101 so that none is a prefix of another. */
const standIns = {
  address: (n: number) => `198.51.100.${n}`,
  chain: (n: number) => `KUBE-PXSPELL-${n}`,
  comment: (n: number) => `pxspellc${n}`,
  spacedComment: (n: number) => `px spell c${n}`,
};
const standInPattern = /198\.51\.100\.1\d\d|KUBE-PXSPELL-1\d\d|pxspellc1\d\d|px spell c1\d\d/g;
const hasStandIn = new RegExp(standInPattern.source);
/** Values a rule's spelling carries over as they are: a comment (without escapes), a single IPv4 address, a hashed chain name. */
const carriedValue =
  /(--comment )("(?:[^"\\]*)"|[^\s"\\]+)|(?<![\w.:/-])(\d{1,3}(?:\.\d{1,3}){3})(?![\w./])|\b(KUBE-[A-Z]+-[A-Z2-7]{16})\b/g;

/** A kind of rule spelled: its text in pieces, with the value that goes between each two. */
interface SpelledKind {
  pieces: string[];
  /** For each gap between two pieces, the index of the value that fills it. */
  slots: number[];
}

/**
 * RuleKindSpeller spells rule lines as the renderer writes them ("-A CHAIN ..." in iptables-restore's
 * spelling) as iptables-save prints them, a whole ruleset at a time: each kind of rule is spelled
 * once by the parser. A rule's comment, single IPv4 addresses and hashed chain names are values
 * the spelling carries over as they are (an address gains its /32, wherever it is), so rules that
 * differ only in those are of one kind, and share its spelling with their values put in. Each kind
 * is checked on its first rule, spelled both ways; a kind whose values do not carry over, and
 * every rule that is not of a kind (IPv6, escapes in a comment, many values), is spelled by the
 * parser each time.
 */
export class RuleKindSpeller {
  readonly #family: IPFamily;
  readonly #kinds = new Map<string, SpelledKind | null>();

  constructor(family: IPFamily) {
    this.#family = family;
  }

  /**
   * Pushes onto `rules` the rules `line` ("-A CHAIN ...") of `table` stands for, as iptables-save
   * prints them (a rule of a known kind, most of a render's, makes no array of its own).
   */
  spellInto(table: string, line: string, rules: string[]): void {
    const chainEnd = line.indexOf(' ', 3);
    const chain = chainEnd < 0 ? line.slice(3) : line.slice(3, chainEnd);
    const kind = this.#kindOf(table, chain, line);
    const known = kind && this.#kinds.get(kind.key);
    if (known) {
      rules.push(filled(known, kind.values));
      return;
    }
    const spelled = this.#parsed(table, chain, line);
    for (const rule of spelled) rules.push(rule);
    if (kind === undefined || known === null) return;
    let standIn: string[] = [];
    try {
      standIn = this.#parsed(table, kind.chain, kind.line);
    } catch {
      // Stand-ins the parser does not take: the kind is spelled rule by rule.
    }
    const template = standIn.length === 1 ? templateOf(standIn[0]) : undefined;
    const checked = template && spelled.length === 1 && filled(template, kind.values) === spelled[0] ? template : null;
    this.#kinds.set(kind.key, checked);
  }

  /** The line with its carried values replaced by stand-ins (the kind's key), and the values; undefined when it cannot be. */
  #kindOf(table: string, chain: string, line: string): {key: string; line: string; chain: string; values: string[]} | undefined {
    if (!line.startsWith('-A ') || this.#family !== 'IPv4' || hasStandIn.test(line)) return undefined;
    const values: string[] = [];
    const standIn = (value: string, make: (n: number) => string): string => {
      values.push(value);
      return make(100 + values.length);
    };
    // Built-in chains are few, and keep their names: the parser declares them by name.
    const ownChain = isBuiltinChain(table, chain) ? chain : standIn(chain, standIns.chain);
    const body = line.slice(3 + chain.length).replace(carriedValue, (match, option, comment, address, hashed) => {
      if (option !== undefined) {
        const quoted = comment.startsWith('"');
        const value = quoted ? comment.slice(1, -1) : comment;
        return `${option}${quoted ? `"${standIn(value, /\s/.test(value) ? standIns.spacedComment : standIns.comment)}"` : standIn(value, standIns.comment)}`;
      }
      return address !== undefined ? standIn(address, standIns.address) : standIn(hashed, standIns.chain);
    });
    if (values.length > 99) return undefined;
    const standInLine = `-A ${ownChain}${body}`;
    return {key: `${table} ${standInLine}`, line: standInLine, chain: ownChain, values};
  }

  #parsed(table: string, chain: string, line: string): string[] {
    const policy = isBuiltinChain(table, chain) ? 'ACCEPT' : '-';
    const ruleset = parseIptablesSave(`*${table}\n:${chain} ${policy} [0:0]\n${line}\nCOMMIT\n`, {
      family: this.#family,
      keepSavedText: false,
    });
    return ruleset.tables
      .get(table)!
      .chains.get(chain)!
      .rules.map((rule) => rule.text);
  }
}

/** A stand-in spelling cut at its stand-ins, each gap remembering which value (by number) fills it. */
function templateOf(text: string): SpelledKind | undefined {
  const pieces: string[] = [];
  const slots: number[] = [];
  let from = 0;
  for (const match of text.matchAll(standInPattern)) {
    pieces.push(text.slice(from, match.index));
    slots.push(Number(match[0].slice(-3)) - 101);
    from = match.index + match[0].length;
  }
  pieces.push(text.slice(from));
  return pieces.length > 0 ? {pieces, slots} : undefined;
}

function filled(kind: SpelledKind, values: string[]): string {
  let text = kind.pieces[0];
  for (let index = 0; index < kind.slots.length; index++) text += values[kind.slots[index]] + kind.pieces[index + 1];
  return text;
}
