// `nft list ruleset` / `nft list table` text: the nested listing a node's operator saves. It is read
// by turning each table's chains, sets, maps, rules and elements into the flat `nft -f` commands
// parseNftablesScript replays, so that one reader holds the table's shape.
import {type NftRuleset, parseNftablesScript} from './parse.ts';

/** NftListingError names the line of the listing that could not be read. */
export class NftListingError extends Error {
  line: number;
  constructor(line: number, reason: string, text: string) {
    super(`nft listing line ${line}: ${reason}: ${text.trim().slice(0, 120)}`);
    this.name = 'NftListingError';
    this.line = line;
  }
}

interface Block {
  kind: 'table' | 'chain' | 'set' | 'map' | 'flowtable' | 'other';
  name: string;
  /** Declarations of a set or map (type, flags, timeout) or of a base chain (type ... hook ...). */
  spec: string[];
  /** The table's address: "ip kube-proxy". */
  table: string;
}

/** The tables a listing holds, as "FAMILY NAME" in listing order. */
export function listedTables(text: string): string[] {
  return [...text.matchAll(/^table (\S+) (\S+) \{/gm)].map((match) => `${match[1]} ${match[2]}`);
}

/**
 * nftListingToScript turns the listing of one table (`family name`, default the first table named
 * kube-proxy, else the first table) into `nft -f` commands. Other tables are skipped.
 */
export function nftListingToScript(text: string, table?: string): string {
  const tables = listedTables(text);
  const wanted = table ?? tables.find((name) => name.endsWith(' kube-proxy')) ?? tables[0];
  const out: string[] = [];
  const stack: Block[] = [];
  const lines = text.split('\n');
  let elements: {set: string; text: string; line: number} | undefined;
  for (let index = 0; index < lines.length; index++) {
    const raw = lines[index];
    const line = raw.trim();
    if (elements) {
      elements.text += ` ${line}`;
      if (closesBraces(elements.text)) {
        addElements(out, stack, elements.text);
        elements = undefined;
      }
      continue;
    }
    if (line === '' || line.startsWith('#')) continue;
    const top = stack.at(-1);
    const opened =
      /^(table|chain|set|map|flowtable|ct helper|ct timeout|ct expectation|counter|quota|limit|secmark|synproxy)\s+(.*?)\s*\{$/.exec(line);
    if (opened) {
      const kind = opened[1] as Block['kind'];
      if (kind === 'table') {
        if (stack.length > 0) throw new NftListingError(index + 1, 'table inside a table', raw);
        stack.push({kind, name: opened[2], spec: [], table: opened[2]});
        if (opened[2] === wanted) out.push(`add table ${opened[2]}`);
      } else {
        if (!top) throw new NftListingError(index + 1, `${kind} outside a table`, raw);
        stack.push({kind: ['chain', 'set', 'map'].includes(kind) ? kind : 'other', name: opened[2], spec: [], table: top.table});
      }
      continue;
    }
    if (line === '}') {
      const block = stack.pop();
      if (!block) throw new NftListingError(index + 1, 'closing brace without an open block', raw);
      if (
        block.table === wanted &&
        (block.kind === 'set' || block.kind === 'map') &&
        !out.some((o) => o.startsWith(`add ${block.kind} ${wanted} ${block.name} `))
      )
        out.push(declaration(block));
      continue;
    }
    if (!top) throw new NftListingError(index + 1, 'not an nft listing (expected "table FAMILY NAME {")', raw);
    if (top.table !== wanted || top.kind === 'other') continue;
    if (top.kind === 'table') continue; // the table's comment or flags
    if (top.kind === 'set' || top.kind === 'map') {
      if (line.startsWith('elements = ')) {
        // The set is declared before its first elements.
        out.push(declaration(top));
        const text = line.slice('elements = '.length);
        if (closesBraces(text)) addElements(out, stack, text);
        else elements = {set: top.name, text, line: index + 1};
      } else {
        top.spec.push(line);
      }
      continue;
    }
    // A chain: its base-chain declaration, its comment, or a rule.
    if (/^type \w+ hook \w+/.test(line)) {
      top.spec.push(line);
      continue;
    }
    if (/^comment "/.test(line)) continue;
    if (!out.some((o) => o === `add chain ${wanted} ${top.name}` || o.startsWith(`add chain ${wanted} ${top.name} {`)))
      out.push(chainDeclaration(wanted!, top));
    out.push(`add rule ${wanted} ${top.name} ${line}`);
  }
  if (elements) throw new NftListingError(elements.line, 'elements of set not closed with "}"', elements.text);
  if (stack.length > 0) throw new NftListingError(lines.length, `${stack.at(-1)!.kind} ${stack.at(-1)!.name} not closed with "}"`, '');
  // Chains without rules are declared too.
  return `${out.join('\n')}\n${emptyChains(text, wanted, out).join('\n')}\n`;
}

function chainDeclaration(table: string, chain: Block): string {
  const base = chain.spec.find((line) => /^type \w+ hook/.test(line));
  return base ? `add chain ${table} ${chain.name} { ${base.replace(/;?\s*$/, ';')} }` : `add chain ${table} ${chain.name}`;
}

function declaration(block: Block): string {
  const spec = block.spec.map((line) =>
    line.replace(/^timeout (\S+)/, (_all, time: string) => `timeout ${seconds(time)}s`).replace(/;?\s*$/, ';'),
  );
  return `add ${block.kind} ${block.table} ${block.name} { ${spec.join(' ')} }`;
}

/** seconds reads nft's listed duration ("3h", "1d2h3m4s", "10800s") as seconds. */
function seconds(time: string): number {
  const units: Record<string, number> = {d: 86400, h: 3600, m: 60, s: 1};
  let total = 0;
  for (const [, amount, unit] of time.matchAll(/(\d+)(ms|[dhms])/g)) total += unit === 'ms' ? 0 : Number(amount) * units[unit];
  return total;
}

function addElements(out: string[], stack: Block[], text: string): void {
  const top = stack.at(-1)!;
  out.push(`add element ${top.table} ${top.name} ${text.trim()}`);
}

function closesBraces(text: string): boolean {
  let depth = 0;
  let quoted = false;
  for (const char of text) {
    if (char === '"') quoted = !quoted;
    else if (!quoted && char === '{') depth++;
    else if (!quoted && char === '}') depth--;
  }
  return depth === 0 && text.trim().endsWith('}');
}

/** Chains of the table that hold no rule: declared, so that a diff or trace sees them. */
function emptyChains(text: string, table: string | undefined, out: string[]): string[] {
  if (!table) return [];
  const declared = new Set(out.filter((line) => line.startsWith('add chain ')).map((line) => line.split(' ')[4]));
  const chains: string[] = [];
  let inTable = false;
  let chain: Block | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const tableMatch = /^table (\S+ \S+) \{$/.exec(line);
    if (tableMatch) inTable = tableMatch[1] === table;
    const chainMatch = /^chain (\S+) \{$/.exec(line);
    if (inTable && chainMatch) chain = {kind: 'chain', name: chainMatch[1], spec: [], table};
    else if (chain && /^type \w+ hook/.test(line)) chain.spec.push(line);
    else if (chain && line === '}') {
      if (!declared.has(chain.name)) chains.push(chainDeclaration(table, chain));
      chain = undefined;
    }
  }
  return chains;
}

/** parseNftablesListing reads `nft list ruleset` (or `nft list table`) text into the table's shape. */
export function parseNftablesListing(text: string, table?: string): NftRuleset {
  return parseNftablesScript(nftListingToScript(text, table));
}
