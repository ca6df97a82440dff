// ChainIndexedRuleset: an iptables-save dump (or iptables-restore input of -A rules) read as an
// IptablesRuleset whose chains are parsed one at a time, when a trace or a diff asks for them. A
// node with 10,000 services holds 430,000 rules in 110,000 chains; a trace of one service needs
// about thirty of those chains, and a parsed copy of all of them kept between requests is most of
// what the agent API would hold. What is kept instead: the text, deflated (CompressedText), and
// where each chain's rules are in it. A diff parses the chains whose lines differ (chainsToCompare),
// and keeps nothing afterwards.
import {guessFamily, parseIptablesSave} from '../../../core/iptables/parse.ts';
import {
  builtinChains,
  isBuiltinChain,
  type IptablesChain,
  type IptablesRuleset,
  type RulesetTable,
  type UnknownMatch,
} from '../../../core/iptables/ruleset.ts';
import type {ChainsWritten} from '../../sync/types.ts';
import {RuleKindSpeller} from '../../../core/iptables/save-spelling.ts';
import {CompressedText, linesHolding} from './compressed-text.ts';
import {detached} from '../../../core/detached.ts';

/** Rules a partial write left in a chain, in iptables-save's spelling, and the line each had in that write's record. */
interface WrittenChain {
  rules: readonly string[];
  lines: readonly number[];
}

/**
 * Where one table's chains are. At 10,000 services a table has 110,000 chains: an object and an
 * array per chain would be most of the index, so the runs of rule lines are kept in typed arrays
 * by chain number.
 */
interface TableIndex {
  name: string;
  /**
   * Chain name -> its number, in the order the text declares them. It describes the text, and every
   * patched copy shares it unchanged: at 10,000 services a copy per foreign change cost more than
   * comparing the chains it changed.
   */
  textIds: Map<string, number>;
  /** Policies other than "-" (the built-in chains'), by chain number. */
  policies: Map<number, string>;
  /** Per chain number: the first run of its rule lines in the text, [start, end, line number of the first]; start -1 for none. */
  runs: Int32Array;
  /** Later runs of a chain whose rules are not all together, three numbers per run as in `runs`. */
  moreRuns: Map<number, number[]>;
  /**
   * Chains partial writes declared since the text was read, in the order of their last
   * declaration (a chain declared again moves to the end of its table): what each holds now, or
   * null once deleted. The text's run of such a chain is no longer its rules.
   */
  written: Map<string, WrittenChain | null>;
  /** How many chains the table has now. */
  size: number;
}

/** Whether the table has the chain now. */
function hasChain(table: TableIndex, name: string): boolean {
  const written = table.written.get(name);
  return written === undefined ? table.textIds.has(name) : written !== null;
}

/** The table's chains now: the text's that no write declared, in its order, then the written ones. */
function* chainNames(table: TableIndex): MapIterator<string> {
  if (table.written.size === 0) {
    yield* table.textIds.keys();
    return;
  }
  for (const name of table.textIds.keys()) if (!table.written.has(name)) yield name;
  for (const [name, written] of table.written) if (written !== null) yield name;
}

/** The chain's number in the text, while no write has declared it since. */
function textId(table: TableIndex, name: string): number | undefined {
  return table.written.has(name) ? undefined : table.textIds.get(name);
}

interface DumpIndex {
  text: CompressedText;
  family: IptablesRuleset['family'];
  /** The dump's comment lines, which say who wrote it (and so whether its rules are in iptables-save's spelling). */
  comments: string;
  tables: Map<string, TableIndex>;
}

/** Parsed chains a ruleset keeps for the requests to come (a trace meets about thirty). */
const parsedChainsKept = 64;

/** A table's index while the dump is read: growable arrays, made typed once it is read. */
interface TableBuilder {
  name: string;
  ids: Map<string, number>;
  policies: Map<number, string>;
  runs: number[];
  moreRuns: Map<number, number[]>;
}

function declare(table: TableBuilder, name: string, policy: string): number {
  let id = table.ids.get(name);
  if (id === undefined) {
    id = table.ids.size;
    // Kept after the dump's text is deflated: not a view into that text.
    table.ids.set(detached(name), id);
    table.runs.push(-1, -1, 0);
  }
  if (policy === '-') table.policies.delete(id);
  else table.policies.set(id, policy);
  return id;
}

/**
 * indexDump finds every chain's rules in `text`, line by line without splitting it; undefined for
 * input with other commands than chain declarations and -A (the caller then parses it whole).
 */
function indexDump(text: string, family?: IptablesRuleset['family']): DumpIndex | undefined {
  const tables = new Map<string, TableBuilder>();
  const comments: string[] = [];
  let table: TableBuilder | undefined;
  let lineNumber = 0;
  for (let start = 0; start < text.length; ) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    const lineStart = start;
    start = end + 1;
    lineNumber++;
    if (end === lineStart) continue;
    const first = text.charCodeAt(lineStart);
    if (first === 0x2d && text.startsWith('-A ', lineStart)) {
      if (!table) return undefined;
      const space = text.indexOf(' ', lineStart + 3);
      const name = text.slice(lineStart + 3, space < 0 || space > end ? end : space);
      let id = table.ids.get(name);
      if (id === undefined) {
        // iptables-restore knows the built-in chains without a declaration.
        if (!isBuiltinChain(table.name, name)) return undefined;
        id = declare(table, name, 'ACCEPT');
      }
      const runs = table.runs;
      const more = table.moreRuns.get(id);
      if (runs[id * 3] < 0) {
        runs[id * 3] = lineStart;
        runs[id * 3 + 1] = end;
        runs[id * 3 + 2] = lineNumber;
      } else if (!more && runs[id * 3 + 1] + 1 === lineStart) runs[id * 3 + 1] = end;
      else if (more && more[more.length - 2] + 1 === lineStart) more[more.length - 2] = end;
      else if (more) more.push(lineStart, end, lineNumber);
      else table.moreRuns.set(id, [lineStart, end, lineNumber]);
      continue;
    }
    const line = text.slice(lineStart, end);
    if (line.trim() !== line) return undefined;
    if (first === 0x23) {
      comments.push(line);
    } else if (first === 0x2a) {
      const name = line.slice(1);
      table = tables.get(name) ?? {name, ids: new Map(), policies: new Map(), runs: [], moreRuns: new Map()};
      tables.set(name, table);
    } else if (first === 0x3a) {
      const match = /^:(\S+)\s+(\S+)(?:\s+\[\d+:\d+\])?$/.exec(line);
      if (!table || !match) return undefined;
      declare(table, match[1], match[2]);
    } else if (line === 'COMMIT') {
      table = undefined;
    } else {
      return undefined;
    }
  }
  const indexes = new Map<string, TableIndex>();
  for (const [name, {ids, ...built}] of tables)
    indexes.set(name, {...built, textIds: ids, runs: Int32Array.from(built.runs), written: new Map(), size: ids.size});
  return {text: new CompressedText(text), family: family ?? guessFamily(text), comments: detached(comments.join('\n')), tables: indexes};
}

/**
 * ChainIndexedRuleset reads a dump's chains when asked. Parsed chains are kept for the requests to
 * come, the most recently used few; iterating a table's chains (a diff, a formatted text) parses
 * each chain and keeps none.
 */
export class ChainIndexedRuleset implements IptablesRuleset {
  readonly family: IptablesRuleset['family'];
  readonly frontEnd: IptablesRuleset['frontEnd'];
  readonly notes: string[];
  readonly tables: Map<string, RulesetTable>;
  readonly #index: DumpIndex;
  readonly #parsed = new Map<string, IptablesChain>();
  /** The dump says iptables-save wrote it: its rules are parsed as printed (parseIptablesSave's keepSavedText). */
  readonly #savedSpelling: boolean;
  /**
   * Per other ruleset's text: the chains, per table, whose rules in that text are not the same
   * lines as in this one's (or that only one of the texts has), found once (chainsToCompare).
   */
  readonly #textDifferences = new WeakMap<CompressedText, Map<string, Set<string>>>();

  private constructor(index: DumpIndex) {
    this.#index = index;
    this.#savedSpelling = /^# Generated by /m.test(index.comments);
    this.family = index.family;
    const header = parseIptablesSave(index.comments, {family: index.family});
    this.frontEnd = header.frontEnd;
    this.notes = header.notes;
    this.tables = new Map(
      [...index.tables.values()].map((table) => [table.name, {name: table.name, chains: new IndexedChains(this, table)}]),
    );
  }

  /** The dump read chain by chain; undefined for input it does not index (parse that whole). */
  static of(text: string, options: {family?: IptablesRuleset['family']} = {}): ChainIndexedRuleset | undefined {
    const index = indexDump(text, options.family);
    return index && new ChainIndexedRuleset(index);
  }

  /** Spelled rules, read chain by chain where their spelling found them (not searched for in the text again). */
  static spelled(dump: SpelledDump): ChainIndexedRuleset {
    const tables = new Map<string, TableIndex>();
    for (const table of dump.tables) {
      const textIds = new Map(table.chains.map((name, id) => [name, id]));
      tables.set(table.name, {
        name: table.name,
        textIds,
        policies: new Map(table.policies),
        runs: table.runs,
        moreRuns: new Map(),
        written: new Map(),
        size: textIds.size,
      });
    }
    return new ChainIndexedRuleset({text: new CompressedText(dump.text), family: dump.family, comments: dump.comments, tables});
  }

  /** Reads back the text these rules were read from; undefined once a partial write replaced chains of it. */
  get sourceText(): (() => string) | undefined {
    if ([...this.#index.tables.values()].some((table) => table.written.size > 0)) return undefined;
    const text = this.#index.text;
    return () => text.toString();
  }

  /**
   * The chains of `table` that may hold other rules here than in `other`: every other chain holds
   * the same lines on both sides, told from the texts without parsing either. Undefined unless
   * both are in iptables-save's spelling (a dump, or rules spelled as it prints them:
   * spelledAsSaved): compare every chain. The texts are compared once per pair (the first
   * comparison walks all 110,000 chains of a node with 10,000 services); a patched copy of either
   * side adds only the chains writes declared since its text was read, so that a foreign change
   * followed chain by chain is compared by those chains alone.
   */
  chainsToCompare(other: ChainIndexedRuleset, table: string): string[] | undefined {
    if (!this.#savedSpelling || !other.#savedSpelling) return undefined;
    const names = new Set(this.#textDifferencesFrom(other, table));
    for (const name of this.#index.tables.get(table)?.written.keys() ?? []) names.add(name);
    for (const name of other.#index.tables.get(table)?.written.keys() ?? []) names.add(name);
    return [...names];
  }

  /** The chains of `table` whose lines differ between this text and `other`'s, writes since either was read left aside. */
  #textDifferencesFrom(other: ChainIndexedRuleset, tableName: string): Set<string> {
    let tables = this.#textDifferences.get(other.#index.text);
    if (!tables) this.#textDifferences.set(other.#index.text, (tables = new Map()));
    let differing = tables.get(tableName);
    if (differing) return differing;
    differing = new Set();
    const mine = this.#index.tables.get(tableName);
    const theirs = other.#index.tables.get(tableName);
    for (const [name, myId] of mine?.textIds ?? []) {
      const id = theirs?.textIds.get(name);
      if (id === undefined || this.#textRules(mine!, myId) !== other.#textRules(theirs!, id)) differing.add(name);
    }
    for (const name of theirs?.textIds.keys() ?? []) if (!mine?.textIds.has(name)) differing.add(name);
    tables.set(tableName, differing);
    return differing;
  }

  /**
   * A chain of `table` with a rule that jumps or goes to `chain`, found by searching the text
   * rather than reading every chain; undefined when there is none (or a partial write replaced it).
   */
  callerOf(tableName: string, chain: string): string | undefined {
    const table = this.#index.tables.get(tableName);
    if (table === undefined) return undefined;
    for (const verb of [' -j ', ' -g ']) {
      const needle = `${verb}${chain}`;
      for (const {line, start} of this.#index.text.linesWith(needle)) {
        if (!line.startsWith('-A ')) continue;
        for (let at = line.indexOf(needle); at >= 0; at = line.indexOf(needle, at + 1)) {
          const after = line.charAt(at + needle.length);
          if (after !== '' && after !== ' ') continue;
          const name = line.slice(3, line.indexOf(' ', 3));
          if (this.#holdsRule(table, name, start)) return name;
        }
      }
    }
    return undefined;
  }

  /**
   * The rules as formatIptablesRuleset prints them, put together from the text's lines and the
   * chains a write replaced, without parsing a chain: the text of patched rules (a foreign change
   * followed chain by chain leaves a drift check one to search, at 10,000 services 33 MB).
   */
  savedText(): string {
    const lines: string[] = [];
    for (const table of this.#index.tables.values()) {
      lines.push(`*${table.name}`);
      const order = builtinChains[table.name] ?? [];
      const names = [...chainNames(table)];
      const builtin = names.filter((name) => isBuiltinChain(table.name, name));
      for (const name of builtin) {
        const id = textId(table, name);
        lines.push(`:${name} ${(id !== undefined && table.policies.get(id)) || 'ACCEPT'} [0:0]`);
      }
      for (const name of names) if (!isBuiltinChain(table.name, name)) lines.push(`:${name} - [0:0]`);
      const sorted = [
        ...builtin.sort((a, b) => order.indexOf(a) - order.indexOf(b)),
        ...names.filter((name) => !isBuiltinChain(table.name, name)),
      ];
      for (const name of sorted) {
        const written = table.written.get(name);
        if (written) lines.push(...written.rules);
        else {
          const raw = this.#textRules(table, table.textIds.get(name)!);
          if (raw) lines.push(raw);
        }
      }
      lines.push('COMMIT');
    }
    return lines.length === 0 ? '' : `${lines.join('\n')}\n`;
  }

  /**
   * The rule lines of savedText() that hold `needle`, found without putting that text together:
   * the rules of the chains writes replaced first (held apart, and what changed last), then the
   * dump's text a block at a time, where a rule counts while its chain is still the dump's. A
   * drift check after a foreign change asks this for a few names and mostly stops at the first
   * line found, where savedText() would join 33 MB at 10,000 services.
   */
  *rulesWith(needle: string): Generator<string> {
    for (const table of this.#index.tables.values())
      for (const written of table.written.values()) for (const rule of written?.rules ?? []) if (rule.includes(needle)) yield rule;
    for (const {line, start} of this.#index.text.linesWith(needle)) {
      if (!line.startsWith('-A ')) continue;
      const space = line.indexOf(' ', 3);
      if (this.#isCurrentRule(line.slice(3, space < 0 ? undefined : space), start)) yield line;
    }
  }

  /**
   * The rule lines of savedText() that hold `needle` in the chains `near` names ("-A CHAIN", "-j
   * CHAIN", "-g CHAIN" of a drifted service's rule lines), each read alone: a drifted service's
   * other rules are mostly in the chains its drifted ones name.
   */
  *rulesNear(needle: string, near: readonly string[]): Generator<string> {
    const named = new Set<string>();
    for (const line of near) for (const match of line.matchAll(/(?:^| )-[Ajg] (\S+)/g)) named.add(match[1]);
    for (const name of named)
      for (const table of this.#index.tables.values()) {
        if (table.written.has(name)) {
          for (const rule of table.written.get(name)?.rules ?? []) if (rule.includes(needle)) yield rule;
          continue;
        }
        const id = table.textIds.get(name);
        if (id !== undefined) for (const {line} of linesHolding(this.#textRules(table, id), 0, needle, true)) yield line;
      }
  }

  /** Whether the dump's rule of chain `name` that starts at `start` in the text is in savedText(): no write replaced that chain. */
  #isCurrentRule(name: string, start: number): boolean {
    for (const table of this.#index.tables.values()) if (this.#holdsRule(table, name, start)) return true;
    return false;
  }

  /** Whether the dump's rule line at `position` is one of `table`'s chain `name`'s rules now (no write replaced that chain). */
  #holdsRule(table: TableIndex, name: string, position: number): boolean {
    const id = textId(table, name);
    return id !== undefined && this.#inRuns(table, id, position);
  }

  /** Whether the line at `position` of the text is one of chain `id`'s rules in `table`. */
  #inRuns(table: TableIndex, id: number, position: number): boolean {
    const runs = [...table.runs.subarray(id * 3, id * 3 + 3), ...(table.moreRuns.get(id) ?? [])];
    for (let at = 0; at < runs.length; at += 3) if (runs[at] >= 0 && runs[at] <= position && position <= runs[at + 1]) return true;
    return false;
  }

  /** The rule lines of the text's chain `id`, as the text has them (whether or not a write replaced the chain since). */
  #textRules(table: TableIndex, id: number): string {
    const {text} = this.#index;
    if (table.runs[id * 3] < 0) return '';
    let rules = text.slice(table.runs[id * 3], table.runs[id * 3 + 1]);
    const more = table.moreRuns.get(id) ?? [];
    for (let at = 0; at < more.length; at += 3) rules += `\n${text.slice(more[at], more[at + 1])}`;
    return rules;
  }

  /** Rules with matches the tracer does not evaluate: every chain parsed to tell, so only when asked. */
  get unknownMatches(): UnknownMatch[] {
    const found: UnknownMatch[] = [];
    for (const table of this.#index.tables.values())
      for (const name of chainNames(table)) found.push(...this.#parse(table, name).unknownMatches);
    return found;
  }

  /**
   * patched: these rules with the chains a partial write declared replaced by what they hold now,
   * or gone; a new ruleset sharing the text with this one, which stays as it was. Replaced chains
   * move to the end of their table, as a chain declared again does.
   */
  patched(written: readonly ChainsWritten[]): ChainIndexedRuleset {
    const tables = new Map([...this.#index.tables].map(([name, table]) => [name, {...table, written: new Map(table.written)}]));
    // Lines as a dump of the written chains alone would number them, header first.
    let line = 1;
    for (const {table: name, declared, chains, rules} of written) {
      let table = tables.get(name);
      if (!table)
        tables.set(
          name,
          (table = {
            name,
            textIds: new Map(),
            policies: new Map(),
            runs: new Int32Array(0),
            moreRuns: new Map(),
            written: new Map(),
            size: 0,
          }),
        );
      line += 1 + chains.length;
      const byChain = new Map<string, WrittenChain & {rules: string[]; lines: number[]}>(
        chains.map((chain) => [chain, {rules: [], lines: []}]),
      );
      for (const rule of rules) {
        line++;
        const space = rule.indexOf(' ', 3);
        const entry = byChain.get(rule.slice(3, space < 0 ? undefined : space));
        entry?.rules.push(rule);
        entry?.lines.push(line);
      }
      line++;
      // What an earlier write left in a declared chain goes with it; the chains it holds now go
      // to the end of the table, in the order written, as chains declared again do.
      for (const chain of declared) {
        if (hasChain(table, chain)) table.size--;
        table.written.delete(chain);
      }
      for (const [chain, entry] of byChain) table.written.set(chain, entry);
      for (const chain of declared) if (!byChain.has(chain)) table.written.set(chain, null);
      table.size += byChain.size;
    }
    return new ChainIndexedRuleset({...this.#index, tables});
  }

  /** The chain, parsed once and kept among the most recently used. */
  chain(table: TableIndex, name: string): IptablesChain | undefined {
    if (!hasChain(table, name)) return undefined;
    const key = `${table.name} ${name}`;
    let chain = this.#parsed.get(key);
    if (chain) {
      this.#parsed.delete(key);
    } else {
      chain = this.#parse(table, name).chain;
      if (this.#parsed.size >= parsedChainsKept) this.#parsed.delete(this.#parsed.keys().next().value!);
    }
    this.#parsed.set(key, chain);
    return chain;
  }

  /** The chain parsed now, or the kept one; not kept. */
  chainOnce(table: TableIndex, name: string): IptablesChain {
    return this.#parsed.get(`${table.name} ${name}`) ?? this.#parse(table, name).chain;
  }

  /** One chain's rules as a dump of its own, with the dump's header so that they are read in the same spelling, and their lines put back. */
  #parse(table: TableIndex, name: string): {chain: IptablesChain; unknownMatches: UnknownMatch[]} {
    const {text, comments, family} = this.#index;
    const rules: string[] = [];
    const lines: number[] = [];
    const written = table.written.get(name);
    const id = table.textIds.get(name)!;
    if (written) {
      rules.push(...written.rules);
      lines.push(...written.lines);
    } else {
      const runs = table.runs[id * 3] < 0 ? [] : [...table.runs.subarray(id * 3, id * 3 + 3), ...(table.moreRuns.get(id) ?? [])];
      for (let at = 0; at < runs.length; at += 3) {
        const run = text.slice(runs[at], runs[at + 1]);
        rules.push(run);
        let line = runs[at + 2];
        lines.push(line);
        for (let next = run.indexOf('\n'); next >= 0; next = run.indexOf('\n', next + 1)) lines.push(++line);
      }
    }
    const header = comments === '' ? '' : `${comments}\n`;
    const headerLines = comments === '' ? 0 : comments.split('\n').length;
    const policy = written ? '-' : (table.policies.get(id) ?? '-');
    const dump = `${header}*${table.name}\n:${name} ${policy} [0:0]\n${rules.length > 0 ? `${rules.join('\n')}\n` : ''}COMMIT\n`;
    const parsed = parseIptablesSave(dump, {family});
    const chain = parsed.tables.get(table.name)!.chains.get(name)!;
    // Rule k of the chain came from dump line headerLines + 3 + k (one line gives several rules only
    // for address lists, which are not in iptables-save's output).
    const lineOf = (line: number) => lines[line - headerLines - 3] ?? line;
    for (const rule of chain.rules) rule.line = lineOf(rule.line);
    return {chain, unknownMatches: parsed.unknownMatches.map((match) => ({...match, line: lineOf(match.line)}))};
  }
}

/** A table's chains, parsed when looked up or iterated (see ChainIndexedRuleset). */
class IndexedChains extends Map<string, IptablesChain> {
  readonly #ruleset: ChainIndexedRuleset;
  readonly #table: TableIndex;

  constructor(ruleset: ChainIndexedRuleset, table: TableIndex) {
    super();
    this.#ruleset = ruleset;
    this.#table = table;
  }

  override get size(): number {
    return this.#table.size;
  }

  override has(name: string): boolean {
    return hasChain(this.#table, name);
  }

  override get(name: string): IptablesChain | undefined {
    return this.#ruleset.chain(this.#table, name);
  }

  override keys(): MapIterator<string> {
    return chainNames(this.#table);
  }

  override *values(): MapIterator<IptablesChain> {
    for (const name of chainNames(this.#table)) yield this.#ruleset.chainOnce(this.#table, name);
  }

  override *entries(): MapIterator<[string, IptablesChain]> {
    for (const name of chainNames(this.#table)) yield [name, this.#ruleset.chainOnce(this.#table, name)];
  }

  override [Symbol.iterator](): MapIterator<[string, IptablesChain]> {
    return this.entries();
  }

  override forEach(callback: (value: IptablesChain, key: string, map: Map<string, IptablesChain>) => void, thisArg?: unknown): void {
    for (const [name, chain] of this.entries()) callback.call(thisArg, chain, name, this);
  }

  override set(): this {
    throw new Error('the chains of an indexed dump are read only');
  }

  override delete(): boolean {
    throw new Error('the chains of an indexed dump are read only');
  }

  override clear(): void {
    throw new Error('the chains of an indexed dump are read only');
  }
}

/**
 * SpelledDump: rendered rules as iptables-save prints them once loaded, and where each chain's
 * rules are in that text: what ChainIndexedRuleset reads, made as the rules are spelled rather than
 * found again in the text.
 */
export interface SpelledDump {
  family: IptablesRuleset['family'];
  text: string;
  /** The header line that says the rules are in iptables-save's spelling. */
  comments: string;
  tables: SpelledTable[];
}

interface SpelledTable {
  name: string;
  /** The chains in the order they are declared. */
  chains: string[];
  /** Policies other than "-", by chain number. */
  policies: Array<[number, string]>;
  /** Per chain number: its rules' run in the text, [start, end, line number of the first]; start -1 for none. */
  runs: Int32Array;
}

const spelledHeader = '# Generated by proxyctl: the desired rules as iptables-save prints them';

/**
 * SavedSpelling spells rendered rules (iptables-restore input of declarations and -A lines) a line
 * at a time as iptables-save prints them once loaded: every rule in its spelling (RuleKindSpeller,
 * each kind of rule spelled once), chain by chain, under a header that says they are, so that they
 * read back (ChainIndexedRuleset) without being spelled again and compare with a reading of the
 * kernel line by line (chainsToCompare).
 */
export class SavedSpelling {
  readonly #family: IptablesRuleset['family'];
  readonly #speller: RuleKindSpeller;
  readonly #tables: Array<{name: string; chains: Map<string, string[]>; policies: Map<string, string>}> = [];
  #table: {name: string; chains: Map<string, string[]>; policies: Map<string, string>} | undefined;
  /** The chain the last rule went to, and its rules. */
  #lastChain: string | undefined;
  #lastRules: string[] = [];

  constructor(family: IptablesRuleset['family']) {
    this.#family = family;
    this.#speller = new RuleKindSpeller(family);
  }

  /** Takes one line of the render; false for a line of another command (the whole parser spells such input: spelledAsSaved). */
  add(text: string): boolean {
    const line = isSpace(text.charCodeAt(0)) || isSpace(text.charCodeAt(text.length - 1)) ? text.trim() : text;
    const table = this.#table;
    const first = line.charCodeAt(0);
    if (line === '' || first === 0x23) return true;
    if (first === 0x2d && line.startsWith('-A ') && table) {
      const space = line.indexOf(' ', 3);
      const chain = line.slice(3, space < 0 ? undefined : space);
      // A chain's rules mostly come one after another: the last chain's list, without a lookup.
      let rules = this.#lastChain === chain ? this.#lastRules : table.chains.get(chain);
      // Names are kept with the index: copied out of the render's text, which a slice would keep.
      if (!rules) table.chains.set(detached(chain), (rules = []));
      this.#lastChain = chain;
      this.#lastRules = rules;
      this.#speller.spellInto(table.name, line, rules);
    } else if (first === 0x3a && table) {
      const match = /^:(\S+)\s+(\S+)/.exec(line);
      if (!match) return false;
      if (!table.chains.has(match[1])) table.chains.set(detached(match[1]), []);
      table.policies.set(match[1], match[2]);
    } else if (first === 0x2a) {
      this.#table = {name: line.slice(1), chains: new Map(), policies: new Map()};
      this.#lastChain = undefined;
    } else if (line === 'COMMIT' && table) {
      this.#tables.push(table);
      this.#table = undefined;
      this.#lastChain = undefined;
    } else return false;
    return true;
  }

  /** The tables committed so far, as one text and its index. */
  finish(): SpelledDump {
    const lines = [spelledHeader];
    const tables: SpelledTable[] = [];
    for (const {name: tableName, chains, policies} of this.#tables) {
      lines.push(`*${tableName}`);
      const names = [...chains.keys()];
      const table: SpelledTable = {name: tableName, chains: names, policies: [], runs: new Int32Array(names.length * 3)};
      for (const [id, name] of names.entries()) {
        const policy = policies.get(name) ?? (isBuiltinChain(tableName, name) ? 'ACCEPT' : '-');
        if (policy !== '-') table.policies.push([id, policy]);
        lines.push(`:${name} ${policy} [0:0]`);
      }
      // Where each chain's rules will be: the lines so far, joined by newlines, and then its own.
      let offset = lines.reduce((sum, line) => sum + line.length + 1, 0);
      for (const [id, rules] of [...chains.values()].entries()) {
        table.runs.set(rules.length === 0 ? [-1, -1, 0] : [offset, offset - 1, lines.length + 1], id * 3);
        for (const rule of rules) {
          lines.push(rule);
          offset += rule.length + 1;
        }
        if (rules.length > 0) table.runs[id * 3 + 1] = offset - 1;
      }
      lines.push('COMMIT');
      tables.push(table);
    }
    lines.push('');
    return {family: this.#family, text: lines.join('\n'), comments: spelledHeader, tables};
  }
}

/** How much of a render spellRender spells before it lets the event loop run (bytes, about 25 ms of work). */
const spelledPerTurn = 1 << 20;

/**
 * spellRender: SavedSpelling over a render's pieces (UTF-8) as the render makes them, letting the
 * event loop run after each megabyte or so; undefined when the render has lines SavedSpelling does
 * not take. An observer spells a whole render for each new model, 430,000 rules at 10,000
 * services and seconds of work: meanwhile requests are answered, and a reading of the kernel that
 * comes in is parsed, rather than waiting for the spelling to end.
 */
export async function spellRender(pieces: Iterable<Uint8Array>, family: IptablesRuleset['family']): Promise<SpelledDump | undefined> {
  const spelling = new SavedSpelling(family);
  const decoder = new TextDecoder();
  let partial = '';
  let sinceTurn = 0;
  const add = (text: string): boolean => {
    const lines = (partial + text).split('\n');
    partial = lines.pop()!;
    return lines.every((line) => spelling.add(line));
  };
  for (const piece of pieces) {
    if (!add(decoder.decode(piece, {stream: true}))) return undefined;
    sinceTurn += piece.byteLength;
    if (sinceTurn >= spelledPerTurn) {
      sinceTurn = 0;
      await new Promise((resolve) => setImmediate(resolve));
    }
  }
  return add(`${decoder.decode()}\n`) ? spelling.finish() : undefined;
}

/** SavedSpelling over a whole render's text; undefined when it has lines SavedSpelling does not take. */
function spelledDump(rendered: string, family: IptablesRuleset['family']): SpelledDump | undefined {
  const spelling = new SavedSpelling(family);
  for (let start = 0; start < rendered.length; ) {
    let end = rendered.indexOf('\n', start);
    if (end < 0) end = rendered.length;
    if (!spelling.add(rendered.slice(start, end))) return undefined;
    start = end + 1;
  }
  return spelling.finish();
}

/**
 * spelledAsSaved: rendered rules as iptables-save prints them once loaded (SavedSpelling's text).
 * Input with other commands is spelled by the whole parser.
 */
export function spelledAsSaved(rendered: string, family: IptablesRuleset['family']): string {
  return spelledDump(rendered, family)?.text ?? spelledWhole(rendered, family);
}

/** spelledAsSaved's rules, read chain by chain: indexed as they were spelled where SavedSpelling took them. */
export function spelledRuleset(rendered: string, family: IptablesRuleset['family']): IptablesRuleset {
  const dump = spelledDump(rendered, family);
  if (dump) return ChainIndexedRuleset.spelled(dump);
  const spelled = spelledWhole(rendered, family);
  return ChainIndexedRuleset.of(spelled, {family}) ?? parseIptablesSave(spelled, {family});
}

function isSpace(code: number): boolean {
  return code === 0x20 || code === 0x09 || code === 0x0d;
}

/** spelledAsSaved for any input the parser reads: parsed whole, chain by chain where it can be. */
function spelledWhole(rendered: string, family: IptablesRuleset['family']): string {
  const ruleset = ChainIndexedRuleset.of(rendered, {family}) ?? parseIptablesSave(rendered, {family, keepSavedText: false});
  const lines = [spelledHeader];
  for (const table of ruleset.tables.values()) {
    const rules: string[] = [];
    lines.push(`*${table.name}`);
    for (const [name, chain] of table.chains) {
      lines.push(`:${name} ${chain.policy ?? '-'} [0:0]`);
      for (const rule of chain.rules) rules.push(rule.text);
    }
    for (const rule of rules) lines.push(rule);
    lines.push('COMMIT');
  }
  lines.push('');
  return lines.join('\n');
}
