// Parse nftables tables into one shape, whether they come from the kernel (`nft -j list table ip
// kube-proxy`) or from a script render wrote (`nft -f` input): chains with their rules as nft
// lists them, and sets and maps with their elements. Trace and diff read only this shape.
import {detached} from '../detached.ts';
import {parseCIDR} from '../model/ip.ts';

/**
 * A rule as nft lists it, without its comment (e.g. "ip daddr @cluster-ips reject"): the string
 * itself, or with its comment. Most rules have none, and a table of kube-proxy's layout holds
 * 200,000 rules at 10,000 services, where an object around each string would cost 6 MB.
 * ruleText and ruleComment read either.
 */
export type NftRule = string | CommentedNftRule;

export interface CommentedNftRule {
  text: string;
  comment: string;
}

/** The rule as nft lists it, without its comment. */
export function ruleText(rule: NftRule): string {
  return typeof rule === 'string' ? rule : rule.text;
}

/** The rule's comment, if it has one. */
export function ruleComment(rule: NftRule): string | undefined {
  return typeof rule === 'string' ? undefined : rule.comment;
}

export interface NftChain {
  name: string;
  /** Base chains only. */
  type?: string;
  hook?: string;
  priority?: number;
  policy?: string;
  rules: NftRule[];
}

export interface NftSetElement {
  /** Key as nft writes it: "10.96.0.10 . tcp . 80". */
  key: string;
  /** Maps only: "goto service-...", "drop", "10.244.0.5 . 8080". */
  value?: string;
  comment?: string;
}

export interface NftSet {
  name: string;
  kind: 'set' | 'map';
  flags: string[];
  /** Default element timeout in seconds (affinity sets). */
  timeoutSeconds?: number;
  elements: NftSetElement[];
}

export interface NftRuleset {
  family: string;
  table: string;
  chains: Map<string, NftChain>;
  sets: Map<string, NftSet>;
}

type Json = unknown;

function isObject(value: Json): value is Record<string, Json> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** hex32 prints a mark the way nft lists it: 0x00004000. */
function hex32(value: number): string {
  return `0x${(value >>> 0).toString(16).padStart(8, '0')}`;
}

const metaKeysWithoutPrefix = new Set(['iifname', 'oifname', 'iif', 'oif']);

/** exprText writes one JSON expression in nft's list syntax. `markContext` prints numbers as marks. */
export function exprText(expr: Json, markContext = false): string {
  if (typeof expr === 'string') return expr.startsWith('@') || /^[\w.:/-]+$/.test(expr) ? expr : JSON.stringify(expr);
  if (typeof expr === 'number') return markContext ? hex32(expr) : String(expr);
  if (typeof expr === 'boolean') return String(expr);
  if (Array.isArray(expr)) return expr.map((item) => exprText(item, markContext)).join(', ');
  if (!isObject(expr)) return String(expr);
  const [kind] = Object.keys(expr);
  const body = expr[kind];
  switch (kind) {
    case 'payload': {
      const payload = body as {protocol: string; field: string};
      return `${payload.protocol} ${payload.field}`;
    }
    case 'meta': {
      const key = (body as {key: string}).key;
      return metaKeysWithoutPrefix.has(key) ? key : `meta ${key}`;
    }
    case 'ct':
      return `ct ${(body as {key: string}).key}`;
    case 'fib': {
      const fib = body as {result: string; flags?: string | string[]};
      const flags = Array.isArray(fib.flags) ? fib.flags : fib.flags ? [fib.flags] : [];
      return `fib ${flags.join(' . ')} ${fib.result}`;
    }
    case 'concat':
      return (body as Json[]).map((item) => exprText(item, markContext)).join(' . ');
    case 'prefix': {
      const prefix = body as {addr: string; len: number};
      return `${prefix.addr}/${prefix.len}`;
    }
    case 'range': {
      const [from, to] = body as [Json, Json];
      return `${exprText(from)}-${exprText(to)}`;
    }
    case 'set': {
      const items = Array.isArray(body) ? body : [body];
      const itemText = (item: Json): string =>
        Array.isArray(item) ? `${exprText(item[0])} : ${verdictOrExprText(item[1])}` : exprText(item, markContext);
      return `{ ${items.map(itemText).join(', ')} }`;
    }
    case 'elem': {
      const elem = body as {val: Json};
      return exprText(elem.val, markContext);
    }
    case '&':
    case '|':
    case '^': {
      const [left, right] = body as [Json, Json];
      const mark = markContext || (isObject(left) && 'meta' in left && (left.meta as {key: string}).key === 'mark');
      return `${exprText(left, mark)} ${kind} ${exprText(right, mark)}`;
    }
    case 'numgen': {
      const numgen = body as {mode: string; mod: number; offset?: number};
      return `numgen ${numgen.mode} mod ${numgen.mod}${numgen.offset ? ` offset ${numgen.offset}` : ''}`;
    }
    case 'map': {
      const map = body as {key: Json; data: Json};
      return `${exprText(map.key)} map ${verdictOrExprText(map.data)}`;
    }
    default:
      return JSON.stringify(expr);
  }
}

const verdictKeys = new Set(['accept', 'drop', 'continue', 'return', 'jump', 'goto', 'queue']);

function verdictOrExprText(expr: Json): string {
  if (isObject(expr)) {
    const [kind] = Object.keys(expr);
    if (verdictKeys.has(kind)) {
      const target = (expr[kind] as {target?: string} | null)?.target;
      return target !== undefined ? `${kind} ${target}` : kind;
    }
  }
  return exprText(expr);
}

/** statementText writes one statement of a rule's "expr" list in nft's list syntax. */
export function statementText(statement: Json): string {
  if (!isObject(statement)) return JSON.stringify(statement);
  const [kind] = Object.keys(statement);
  const body = statement[kind] as Record<string, Json> | null;
  if (verdictKeys.has(kind)) return verdictOrExprText(statement);
  switch (kind) {
    case 'match': {
      const {op, left, right} = body as {op: string; left: Json; right: Json};
      const mark =
        isObject(left) && ('&' in left || '|' in left || '^' in left || ('meta' in left && (left.meta as {key: string}).key === 'mark'));
      const rightText = Array.isArray(right) ? right.join(',') : exprText(right, mark);
      // nft shows "==" only after a bitwise expression ("meta mark & 0x4000 == 0x0").
      const bitwise = isObject(left) && ('&' in left || '|' in left || '^' in left);
      const shownOp = (op === '==' && !bitwise) || op === 'in' ? '' : `${op} `;
      return `${exprText(left)} ${shownOp}${rightText}`;
    }
    case 'vmap': {
      const {key, data} = body as {key: Json; data: Json};
      return `${exprText(key)} vmap ${verdictOrExprText(data)}`;
    }
    case 'mangle': {
      const {key, value} = body as {key: Json; value: Json};
      const mark = isObject(key) && 'meta' in key && (key.meta as {key: string}).key === 'mark';
      return `${exprText(key)} set ${exprText(value, mark)}`;
    }
    case 'reject': {
      // The family's default (ICMP / ICMPv6 port unreachable) is listed but was never written.
      const type = body?.type;
      const code = body?.expr;
      if (!body || code === undefined || (code === 'port-unreachable' && (type === 'icmp' || type === 'icmpv6' || type === 'icmpx')))
        return 'reject';
      return `reject with ${exprText(type ?? '')} ${exprText(code)}`.trim();
    }
    case 'masquerade':
    case 'snat':
    case 'dnat': {
      const nat = (body ?? {}) as {family?: string; addr?: Json; port?: Json; flags?: string | string[]};
      const flags = nat.flags === undefined ? [] : Array.isArray(nat.flags) ? nat.flags : [nat.flags];
      let text = kind;
      if (nat.addr !== undefined) {
        const addr = exprText(nat.addr);
        const bracketed = nat.port !== undefined && addr.includes(':') && !addr.includes(' ') ? `[${addr}]` : addr;
        text += `${nat.family ? ` ${nat.family}` : ''} to ${bracketed}${nat.port !== undefined ? `:${exprText(nat.port)}` : ''}`;
      }
      return flags.length > 0 ? `${text} ${flags.join(',')}` : text;
    }
    case 'set': {
      const {op, elem, set} = body as {op: string; elem: Json; set: string};
      return `${op} ${set} { ${exprText(elem)} }`;
    }
    case 'counter':
      return body && typeof body === 'object' && 'packets' in body ? `counter packets ${body.packets} bytes ${body.bytes}` : 'counter';
    case 'log':
      return 'log';
    case 'notrack':
      return 'notrack';
    default:
      return JSON.stringify(statement);
  }
}

function elementOf(entry: Json, isMap: boolean): NftSetElement {
  let keyExpr: Json = isMap && Array.isArray(entry) ? entry[0] : entry;
  const valueExpr: Json = isMap && Array.isArray(entry) ? entry[1] : undefined;
  let comment: string | undefined;
  if (isObject(keyExpr) && 'elem' in keyExpr) {
    const elem = keyExpr.elem as {val: Json; comment?: string};
    comment = elem.comment;
    keyExpr = elem.val;
  }
  return {key: exprText(keyExpr), ...(isMap ? {value: verdictOrExprText(valueExpr)} : {}), ...(comment !== undefined ? {comment} : {})};
}

/**
 * parseNftablesJson reads `nft -j list table ...` (or `list ruleset`: the first table named
 * kube-proxy, else the first table). Throws a clear error on text that is not nft's JSON.
 */
export function parseNftablesJson(json: string, tableName = 'kube-proxy'): NftRuleset {
  let document: Json;
  try {
    document = JSON.parse(json);
  } catch (error) {
    throw new Error(`nft JSON: not JSON (${(error as Error).message})`);
  }
  const items = isObject(document) && Array.isArray(document.nftables) ? document.nftables : undefined;
  if (!items) throw new Error('nft JSON: no "nftables" list; expected the output of `nft -j list table ip kube-proxy`');
  const tables = items
    .filter((item) => isObject(item) && isObject(item.table))
    .map((item) => (item as {table: {family: string; name: string}}).table);
  // A listing of one chain or set (`nft -j list chain ...`) has no table object: its objects name the table.
  const chosen = tables.find((table) => table.name === tableName) ?? tables[0] ?? objectsTable(items);
  const ruleset: NftRuleset = {family: chosen?.family ?? 'ip', table: chosen?.name ?? tableName, chains: new Map(), sets: new Map()};
  const ours = (object: {family?: string; table?: string}) => object.family === ruleset.family && object.table === ruleset.table;
  for (const item of items) {
    if (!isObject(item)) continue;
    if (isObject(item.chain)) {
      const chain = item.chain as {
        name: string;
        table: string;
        family: string;
        type?: string;
        hook?: string;
        prio?: number;
        policy?: string;
      };
      if (!ours(chain)) continue;
      ruleset.chains.set(chain.name, {
        name: chain.name,
        ...(chain.hook !== undefined ? {type: chain.type, hook: chain.hook, priority: chain.prio, policy: chain.policy ?? 'accept'} : {}),
        rules: [],
      });
    } else if (isObject(item.set) || isObject(item.map)) {
      const isMap = isObject(item.map);
      const set = (isMap ? item.map : item.set) as {
        name: string;
        table: string;
        family: string;
        flags?: string[];
        timeout?: number;
        elem?: Json[];
      };
      if (!ours(set)) continue;
      ruleset.sets.set(set.name, {
        name: set.name,
        kind: isMap ? 'map' : 'set',
        flags: set.flags ?? [],
        ...(set.timeout !== undefined ? {timeoutSeconds: set.timeout} : {}),
        elements: (set.elem ?? []).map((entry) => elementOf(entry, isMap)),
      });
    } else if (isObject(item.rule)) {
      const rule = item.rule as {chain: string; table: string; family: string; expr: Json[]; comment?: string};
      if (!ours(rule)) continue;
      let chain = ruleset.chains.get(rule.chain);
      if (!chain) ruleset.chains.set(rule.chain, (chain = {name: rule.chain, rules: []}));
      chain.rules.push(nftRule(rule.expr.map(statementText).join(' '), rule.comment));
    }
  }
  return compacted(ruleset);
}

/** The family and table the first chain, set, map or rule of a listing names. */
function objectsTable(items: Json[]): {family: string; name: string} | undefined {
  for (const item of items) {
    if (!isObject(item)) continue;
    const object = [item.chain, item.set, item.map, item.rule].find(isObject) as {family?: string; table?: string} | undefined;
    if (object?.family !== undefined && object.table !== undefined) return {family: object.family, name: object.table};
  }
  return undefined;
}

/** A rule of a chain: its text alone, or with its comment. */
export function nftRule(text: string, comment: string | undefined): NftRule {
  return comment === undefined ? text : {text, comment};
}

/**
 * The ruleset with each chain's rules in an array of their own length: arrays grown by push keep
 * room for 16 or more, and a table holds 110,000 chains of one to three rules at 10,000 services.
 */
function compacted(ruleset: NftRuleset): NftRuleset {
  for (const chain of ruleset.chains.values()) chain.rules = chain.rules.slice();
  return ruleset;
}

/** splitTopLevel splits on a separator outside braces and quotes. */
export function splitTopLevel(text: string, separator: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let quoted = false;
  let start = 0;
  for (let index = 0; index < text.length; index++) {
    const char = text[index];
    if (char === '"') quoted = !quoted;
    else if (!quoted && char === '{') depth++;
    else if (!quoted && char === '}') depth--;
    else if (!quoted && depth === 0 && text.startsWith(separator, index)) {
      parts.push(text.slice(start, index));
      start = index + separator.length;
      index += separator.length - 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((part) => part.trim()).filter((part) => part.length > 0);
}

/** splitComment separates a trailing `comment "..."` from a rule or element. */
/** changeObject applies a script's delete, flush or add/create of one named chain or set; add and create keep one already there. */
function changeObject<T>(objects: Map<string, T>, verb: string, name: string, flush: (object: T) => void, create: () => T): void {
  if (verb === 'delete') objects.delete(name);
  else if (verb === 'flush') {
    const object = objects.get(name);
    if (object) flush(object);
  } else if (!objects.has(name)) objects.set(name, create());
}

export function splitComment(text: string): {text: string; comment?: string} {
  const match = /^(.*?)\s*comment "((?:[^"\\]|\\.)*)"(.*)$/.exec(text);
  if (!match) return {text: text.trim()};
  return {text: `${match[1]}${match[3]}`.trim(), comment: match[2]};
}

export function parseElement(text: string, isMap: boolean): NftSetElement {
  if (!isMap) {
    const {text: key, comment} = splitComment(text);
    return {key, ...(comment !== undefined ? {comment} : {})};
  }
  const [left, ...rest] = splitTopLevel(text, ' : ');
  const {text: key, comment} = splitComment(left);
  return {key, value: rest.join(' : '), ...(comment !== undefined ? {comment} : {})};
}

/** hexMark: a mark written in any base ("0x4000", "16384", "0") as nft lists it. */
function hexMark(text: string): string {
  return hex32(Number(text));
}

/** Sort key of an address or CIDR: its bytes, then its prefix length. */
function addressOrder(text: string): number[] | undefined {
  const cidr = parseCIDR(text.includes('/') ? text : `${text}/${text.includes(':') ? 128 : 32}`);
  return cidr && [...cidr.network.bytes, cidr.prefixLength];
}

/**
 * sortAddressSets writes anonymous sets of addresses and CIDRs as nft lists them: elements in
 * address order, joined by ", " (kube-proxy writes them in its own order, "a , b" or "a,b").
 */
function sortAddressSets(rule: string): string {
  return rule.replace(/\{ ([^{}]*?) \}/g, (group, inner: string) => {
    const items = inner.split(',').map((item) => item.trim());
    const keyed = items.map((item) => ({item, order: addressOrder(item)}));
    if (items.length < 2 || keyed.some((entry) => entry.order === undefined)) return group;
    keyed.sort((a, b) => {
      const index = a.order!.findIndex((byte, at) => byte !== b.order![at]);
      return index < 0 ? 0 : a.order![index] - b.order![index];
    });
    return `{ ${keyed.map((entry) => entry.item).join(', ')} }`;
  });
}

/**
 * listSpelling rewrites a rule as kube-proxy's script spells it into nft's list syntax, so that a
 * script and the kernel's listing of it compare equal: "mark set mark or 0x4000" is listed
 * "meta mark set meta mark | 0x00004000", a one-element anonymous set "{ 10.0.0.0/8 }" as its
 * element, a host prefix "10.0.0.1/32" as the address, and sets of addresses in nft's order ("a , b"
 * inside braces as "a, b"). Text already in list syntax is kept.
 */
export function listSpelling(rule: string): string {
  return (
    sortAddressSets(rule)
      .replace(
        /(^|\s)mark set mark (or|xor) (\w+)/g,
        (_, lead: string, op: string, value: string) => `${lead}meta mark set meta mark ${op === 'or' ? '|' : '^'} ${hexMark(value)}`,
      )
      .replace(
        /(^|\s)mark and (\w+) == (\w+)/g,
        (_, lead: string, mask: string, value: string) => `${lead}meta mark & ${hexMark(mask)} == ${hexMark(value)}`,
      )
      .replace(/(^|\s)\{ ([^{},\s]+) \}(?=\s|$)/g, '$1$2')
      // Not in chain names: "endpoint-...__10.0.0.1/32" is an endpoint on port 32.
      .replace(/(?<![_\w.])(\d+\.\d+\.\d+\.\d+)\/32\b/g, '$1')
      .replace(/([0-9a-f:]*:[0-9a-f:]*)\/128\b/gi, '$1')
      .replace(/ , /g, ', ')
  );
}

const priorityNames: Record<string, number> = {raw: -300, mangle: -150, dstnat: -100, filter: 0, security: 50, srcnat: 100};

/** priorityValue: a chain priority as a number, from "-110", "dstnat", "dstnat - 10" or "filter+5". */
export function priorityValue(text: string): number {
  const compact = text.replace(/\s+/g, '');
  const named = /^([a-z]+)([+-]\d+)?$/.exec(compact);
  return named && named[1] in priorityNames ? priorityNames[named[1]] + Number(named[2] ?? 0) : Number(compact);
}

/**
 * parseNftablesScript replays an `nft -f` script as render writes it (add/flush/delete of tables,
 * chains, sets, maps, elements and rules) into the table it leaves, starting from `base` if given.
 * Throws on a command it does not know, naming the line.
 */
export function parseNftablesScript(script: string, base?: NftRuleset): NftRuleset {
  const ruleset: NftRuleset = base
    ? {
        family: base.family,
        table: base.table,
        chains: new Map([...base.chains].map(([name, chain]) => [name, {...chain, rules: [...chain.rules]}])),
        sets: new Map([...base.sets].map(([name, set]) => [name, {...set, elements: [...set.elements]}])),
      }
    : {family: 'ip', table: 'kube-proxy', chains: new Map(), sets: new Map()};
  const setKeys = new Map<NftSet, {elements: NftSetElement[]; keys: Set<string>}>();
  const lines = script.split('\n');
  for (const [index, raw] of lines.entries()) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const match = /^(add|flush|delete|create) (table|chain|rule|set|map|element) (ip6?|inet) (\S+)(?: (\S+))?(?: (.*))?$/.exec(line);
    if (!match) throw new Error(`nft script line ${index + 1}: cannot read "${line.slice(0, 80)}"`);
    const [, verb, object, family, table, sliced, rest = ''] = match;
    ruleset.family = family;
    ruleset.table = table;
    // What the ruleset keeps (names, rules, elements) gets strings of its own: a slice of the line
    // is a view into the whole script, which it would keep alive (55 MB at 10,000 services).
    const name = sliced && verb !== 'delete' && object !== 'rule' && object !== 'element' ? detached(sliced) : sliced;
    switch (object) {
      case 'table':
        if (verb === 'delete') {
          ruleset.chains.clear();
          ruleset.sets.clear();
        }
        break;
      case 'chain':
        changeObject(
          ruleset.chains,
          verb,
          name!,
          (chain) => (chain.rules = []),
          () => {
            const base = /type (\w+) hook (\w+) priority ([^;]+?)\s*;/.exec(rest);
            return base
              ? {name: name!, type: base[1], hook: base[2], priority: priorityValue(base[3]), policy: 'accept', rules: []}
              : {name: name!, rules: []};
          },
        );
        break;
      case 'rule': {
        let chain = ruleset.chains.get(name!);
        if (!chain) {
          const own = detached(name!);
          ruleset.chains.set(own, (chain = {name: own, rules: []}));
        }
        const {text, comment} = splitComment(rest);
        chain.rules.push(nftRule(detached(listSpelling(text)), comment === undefined ? undefined : detached(comment)));
        break;
      }
      case 'set':
      case 'map':
        changeObject(
          ruleset.sets,
          verb,
          name!,
          (set) => (set.elements = []),
          () => {
            const flags = /flags ([\w,]+)/.exec(rest)?.[1].split(',') ?? [];
            const timeout = /timeout (\d+)s/.exec(rest);
            return {name: name!, kind: object, flags, ...(timeout ? {timeoutSeconds: Number(timeout[1])} : {}), elements: []};
          },
        );
        break;
      case 'element': {
        const set = ruleset.sets.get(name!);
        if (!set) throw new Error(`nft script line ${index + 1}: element of unknown set ${name}`);
        const inner = /^\{(.*)\}$/.exec(rest.trim())?.[1] ?? '';
        const elements = splitTopLevel(inner, ',').map((text) => parseElement(detached(text.trim()), set.kind === 'map'));
        // The keys a set holds, kept while the script is read: kube-proxy adds a map's elements one line each.
        let known = setKeys.get(set);
        if (!known || known.elements !== set.elements)
          setKeys.set(set, (known = {elements: set.elements, keys: new Set(set.elements.map((element) => element.key))}));
        if (verb === 'delete') {
          const gone = new Set(elements.map((element) => element.key));
          set.elements = set.elements.filter((element) => !gone.has(element.key));
          for (const key of gone) known.keys.delete(key);
          known.elements = set.elements;
        } else {
          for (const element of elements) {
            if (known.keys.has(element.key)) continue;
            set.elements.push(element);
            known.keys.add(element.key);
          }
        }
        break;
      }
    }
  }
  return compacted(ruleset);
}
