// parseNftablesListing reads nft's text listing (`nft list table ip kube-proxy`, `nft list
// ruleset`) into the same NftRuleset as parseNftablesJson: sets and maps with their elements
// (which nft wraps over several lines), chains with hook and priority, rules as listed.
import {
  type NftChain,
  type NftRule,
  type NftRuleset,
  type NftSet,
  type NftSetElement,
  nftRule,
  parseElement,
  priorityValue,
  ruleComment,
  ruleText,
  splitComment,
  splitTopLevel,
} from './parse.ts';

/** timeoutSeconds: nft's "3h", "1d2h30m", "10800s" or "500ms" in seconds. */
function timeoutSeconds(text: string): number | undefined {
  const units: Record<string, number> = {d: 86400, h: 3600, m: 60, s: 1, ms: 0.001};
  let total = 0;
  let matched = '';
  for (const part of text.matchAll(/(\d+)(ms|d|h|m|s)/g)) {
    total += Number(part[1]) * units[part[2]];
    matched += part[0];
  }
  return matched === text && matched !== '' ? total : undefined;
}

interface Block {
  /** 'other': a flowtable, counter, quota, ct helper … the ruleset shape has no place for. */
  kind: 'table' | 'chain' | 'set' | 'map' | 'other';
  name: string;
  family?: string;
}

/** A listing line without its "# handle N" (nft -a), trimmed. */
function listingLine(raw: string): string {
  return raw.replace(/\s+# handle \d+$/, '').trim();
}

/**
 * parseNftablesListing reads the text listing; with several tables (`list ruleset`), the first
 * named `tableName` ("kube-proxy", or with its family: "ip6 kube-proxy"), else the first. Throws
 * on a line it cannot place, naming it.
 */
export function parseNftablesListing(text: string, tableName = 'kube-proxy'): NftRuleset {
  const lines = text.split('\n');
  const tables: Array<{family: string; name: string; ruleset: NftRuleset}> = [];
  const stack: Block[] = [];
  let ruleset: NftRuleset | undefined;
  let chain: NftChain | undefined;
  let set: NftSet | undefined;
  for (let index = 0; index < lines.length; index++) {
    const line = listingLine(lines[index]);
    const where = () => `nft listing line ${index + 1}`;
    if (line === '' || line.startsWith('#')) continue;
    const opening = /^(table|chain|set|map) (?:(ip6?|inet|arp|bridge|netdev) )?(\S+) \{$/.exec(line);
    if (opening) {
      const [, kind, family, name] = opening;
      if (kind === 'table') {
        ruleset = {family: family ?? 'ip', table: name, chains: new Map(), sets: new Map()};
        tables.push({family: ruleset.family, name, ruleset});
      } else if (!ruleset) {
        throw new Error(`${where()}: ${kind} ${name} outside a table`);
      } else if (kind === 'chain') {
        chain = {name, rules: []};
        ruleset.chains.set(name, chain);
      } else {
        set = {name, kind: kind as 'set' | 'map', flags: [], elements: []};
        ruleset.sets.set(name, set);
      }
      stack.push({kind: kind as Block['kind'], name});
      continue;
    }
    const otherBlock = /^(\S+(?: \S+)?) (\S+) \{$/.exec(line);
    if (otherBlock && stack.length > 0 && !set && !chain) {
      stack.push({kind: 'other', name: `${otherBlock[1]} ${otherBlock[2]}`});
      continue;
    }
    if (line === '}') {
      const closed = stack.pop();
      if (!closed) throw new Error(`${where()}: "}" closes nothing`);
      if (closed.kind === 'chain') chain = undefined;
      if (closed.kind === 'set' || closed.kind === 'map') set = undefined;
      continue;
    }
    const inside = stack.at(-1);
    if (!inside) throw new Error(`${where()}: cannot read "${line.slice(0, 80)}" outside a table`);
    if (inside.kind === 'other') continue;
    if (set) {
      index = readSetLine(set, lines, index, line);
      continue;
    }
    if (chain) {
      const base = /^type (\w+) hook (\w+)(?: device \S+)? priority ([^;]+);(?: policy (\w+);)?$/.exec(line);
      if (base) {
        Object.assign(chain, {type: base[1], hook: base[2], priority: priorityValue(base[3]), policy: base[4] ?? 'accept'});
      } else if (!/^comment "(?:[^"\\]|\\.)*"$/.test(line)) {
        const {text: rule, comment} = splitComment(line);
        chain.rules.push(nftRule(rule, comment));
      }
      continue;
    }
    // Table-level lines: comment, flags.
    if (!/^(comment|flags) /.test(line)) throw new Error(`${where()}: cannot read "${line.slice(0, 80)}" in table ${inside.name}`);
  }
  if (stack.length > 0) throw new Error(`nft listing: ${stack.at(-1)!.kind} ${stack.at(-1)!.name} is not closed`);
  const [family, name] = tableName.includes(' ') ? tableName.split(' ') : [undefined, tableName];
  const chosen = tables.find((table) => table.name === name && (family === undefined || table.family === family)) ?? tables[0];
  if (!chosen) throw new Error('nft listing: no table; expected the output of `nft list table ip kube-proxy` or `nft list ruleset`');
  return chosen.ruleset;
}

/** readSetLine reads one property of a set or map, or its elements (to the closing brace); returns the last line used. */
function readSetLine(set: NftSet, lines: string[], index: number, line: string): number {
  const flags = /^flags (.+)$/.exec(line);
  if (flags) {
    set.flags = flags[1].split(',').map((flag) => flag.trim());
    return index;
  }
  const timeout = /^timeout (\S+)$/.exec(line);
  if (timeout) {
    const seconds = timeoutSeconds(timeout[1]);
    if (seconds !== undefined) set.timeoutSeconds = seconds;
    return index;
  }
  if (!line.startsWith('elements = {')) return index; // type, typeof, size, comment, policy, counter
  // The elements run over as many lines as the set has elements (110,000 in a large node's maps):
  // the brace depth is counted line by line as they come, and the lines joined once.
  const parts = [line.slice('elements = '.length)];
  let depth = braceDepth(parts[0], 0);
  let last = index;
  while (depth !== 0 && last + 1 < lines.length) {
    const next = listingLine(lines[++last]);
    parts.push(next);
    depth = braceDepth(next, depth);
  }
  const text = parts.join(' ');
  const inner = /^\{(.*)\}$/.exec(text.trim())?.[1] ?? '';
  // Elements of dynamic sets carry their own timeout and time left, which no key holds.
  for (const item of splitTopLevel(inner, ','))
    set.elements.push(parseElement(item.replace(/ timeout \S+| expires \S+/g, ''), set.kind === 'map'));
  return last;
}

/** braceDepth: the depth of "{" outside quotes after `text`, from `depth` before it (a quote does not span lines). */
function braceDepth(text: string, depth: number): number {
  let quoted = false;
  for (const char of text) {
    if (char === '"') quoted = !quoted;
    else if (!quoted && char === '{') depth++;
    else if (!quoted && char === '}') depth--;
  }
  return depth;
}

/**
 * formatNftablesListing prints a ruleset as `nft list table` does (what parseNftablesListing
 * reads): the text of rules that were patched after they were read, which no tool printed whole.
 * Sets print no type: the ruleset shape does not keep it.
 */
export function formatNftablesListing(ruleset: NftRuleset): string {
  const lines = [`table ${ruleset.family} ${ruleset.table} {`];
  for (const set of ruleset.sets.values()) {
    lines.push(`\t${set.kind} ${set.name} {`);
    if (set.flags.length > 0) lines.push(`\t\tflags ${set.flags.join(',')}`);
    if (set.timeoutSeconds !== undefined) lines.push(`\t\ttimeout ${set.timeoutSeconds}s`);
    if (set.elements.length > 0) lines.push(`\t\telements = { ${set.elements.map(elementText).join(',\n\t\t\t     ')} }`);
    lines.push('\t}');
  }
  for (const chain of ruleset.chains.values()) {
    lines.push(chainLine(chain));
    if (chain.hook !== undefined)
      lines.push(`\t\ttype ${chain.type} hook ${chain.hook} priority ${chain.priority}; policy ${chain.policy ?? 'accept'};`);
    for (const rule of chain.rules) lines.push(ruleLine(rule));
    lines.push('\t}');
  }
  lines.push('}');
  return `${lines.join('\n')}\n`;
}

/**
 * The lines of formatNftablesListing's text that hold `needle`, found without printing the rest:
 * a chain's opening line, a rule, an element (each on a line of its own there).
 */
export function nftablesListingLinesWith(ruleset: NftRuleset, needle: string): string[] {
  const found: string[] = [];
  // Plain loops: at 10,000 services this visits 120,000 chains and 350,000 rules per name looked for.
  for (const set of ruleset.sets.values()) setLinesWith(set, needle, found);
  for (const chain of ruleset.chains.values()) chainLinesWith(chain, needle, found);
  return found;
}

/**
 * nftablesListingLinesWith in the chains and sets alone that the lines `near` name: as a diff or a
 * listing names them ("chain NAME", "rule NAME #1: ...", "element NAME { ... }") and as rules and
 * elements go to them ("goto NAME", "jump NAME", "@NAME").
 */
export function nftablesListingLinesNear(ruleset: NftRuleset, needle: string, near: readonly string[]): string[] {
  const names = new Set<string>();
  for (const line of near)
    for (const match of line.matchAll(/(?:^\s*(?:chain|rule|set|map|element) |\b(?:goto|jump) |@)([^\s,{}]+)/g)) names.add(match[1]);
  const found: string[] = [];
  for (const name of names) {
    const set = ruleset.sets.get(name);
    if (set) setLinesWith(set, needle, found);
    const chain = ruleset.chains.get(name);
    if (chain) chainLinesWith(chain, needle, found);
  }
  return found;
}

/** Adds to `found` the listing lines of `set`'s elements that hold `needle`. */
function setLinesWith(set: NftSet, needle: string, found: string[]): void {
  for (const element of set.elements)
    if (element.key.includes(needle) || element.value?.includes(needle) || element.comment?.includes(needle)) {
      const line = elementText(element);
      // The printed line quotes the comment: what the comment holds may read otherwise there.
      if (line.includes(needle)) found.push(line);
    }
}

/** Adds to `found` the listing lines of `chain` (its opening line, its rules) that hold `needle`. */
function chainLinesWith(chain: NftChain, needle: string, found: string[]): void {
  if (chain.name.includes(needle)) found.push(chainLine(chain));
  for (const rule of chain.rules)
    if (ruleText(rule).includes(needle) || ruleComment(rule)?.includes(needle)) {
      const line = ruleLine(rule);
      // As for elements, the comment is quoted.
      if (line.includes(needle)) found.push(line);
    }
}

function commentText(text: string | undefined): string {
  return text !== undefined ? ` comment ${JSON.stringify(text)}` : '';
}

function elementText(element: NftSetElement): string {
  return `${element.key}${commentText(element.comment)}${element.value !== undefined ? ` : ${element.value}` : ''}`;
}

function chainLine(chain: NftChain): string {
  return `\tchain ${chain.name} {`;
}

function ruleLine(rule: NftRule): string {
  return `\t\t${ruleText(rule)}${commentText(ruleComment(rule))}`;
}
