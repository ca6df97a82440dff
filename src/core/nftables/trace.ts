// traceNftables: the first packet of a connection walked through an nftables table as nft lists
// it (parseNftablesJson) or as a script leaves it (parseNftablesScript): base chains by hook and
// priority, jumps and gotos, verdict maps, numgen endpoint choice (vmap to endpoint chains as
// kube-proxy writes it, or a DNAT map as render writes it), masquerade marks, reject and drop.
import {cidrContains, parseCIDR, parseIP} from '../model/ip.ts';
import type {Packet, TraceBranch, TraceContext, TraceHop, TraceResult} from '../trace/types.ts';
import {type NftChain, type NftRule, type NftRuleset, type NftSet, type NftSetElement, ruleComment, ruleText} from './parse.ts';

type Hook = TraceHop['hook'];

interface PathState {
  probability: number;
  hops: TraceHop[];
  daddr: string;
  dport: number;
  /** "ip:port" once DNATed. */
  endpoint?: string;
  mark: number;
  markedBy?: string;
  masquerade: boolean;
  masqueradeReason: string;
  /** Set by drop / reject: the packet goes no further. */
  end?: 'DROP' | 'REJECT';
}

type Outcome = PathState;

const maxDepth = 64;

/** tokenize splits a rule into words, keeping `{ ... }` groups and quoted strings whole. */
function tokenize(text: string): string[] {
  const words: string[] = [];
  let index = 0;
  while (index < text.length) {
    const char = text[index];
    if (char === ' ') {
      index++;
      continue;
    }
    if (char === '{') {
      let depth = 0;
      let end = index;
      for (; end < text.length; end++) {
        if (text[end] === '{') depth++;
        else if (text[end] === '}' && --depth === 0) break;
      }
      words.push(text.slice(index, end + 1));
      index = end + 1;
      continue;
    }
    if (char === '"') {
      const end = text.indexOf('"', index + 1);
      words.push(text.slice(index, end < 0 ? text.length : end + 1));
      index = end < 0 ? text.length : end + 1;
      continue;
    }
    let end = text.indexOf(' ', index);
    if (end < 0) end = text.length;
    words.push(text.slice(index, end));
    index = end;
  }
  return words;
}

// Many packets pass the same rules: split each rule into words once, kept by its chain's list of
// rules and its position there (a rule is a string, no key of its own).
const ruleWords = new WeakMap<readonly NftRule[], ({text: string; words: string[]} | undefined)[]>();

function wordsOf(rules: readonly NftRule[], position: number): string[] {
  let known = ruleWords.get(rules);
  if (!known) ruleWords.set(rules, (known = []));
  const text = ruleText(rules[position]);
  const memo = known[position];
  if (memo && memo.text === text) return memo.words;
  const words = tokenize(text);
  known[position] = {text, words};
  return words;
}

function setItems(group: string): string[] {
  const inner = group.slice(1, -1);
  const items: string[] = [];
  let depth = 0;
  let start = 0;
  for (let index = 0; index < inner.length; index++) {
    if (inner[index] === '{') depth++;
    else if (inner[index] === '}') depth--;
    else if (inner[index] === ',' && depth === 0) {
      items.push(inner.slice(start, index).trim());
      start = index + 1;
    }
  }
  items.push(inner.slice(start).trim());
  return items.filter((item) => item.length > 0);
}

function unquote(text: string): string {
  return text.startsWith('"') && text.endsWith('"') ? text.slice(1, -1) : text;
}

const protocolNumbers: Record<string, string> = {tcp: 'TCP', udp: 'UDP', sctp: 'SCTP', '6': 'TCP', '17': 'UDP', '132': 'SCTP'};

interface Walker {
  packet: Packet;
  context: TraceContext;
  ruleset: NftRuleset;
  local: Set<string>;
  tableLabel: string;
  warnings: Set<string>;
}

/** literalMatches: one value of a rule (address, CIDR, range, name with *, number) against a packet value. */
function literalMatches(literal: string, value: string): boolean {
  const text = unquote(literal);
  if (text === value) return true;
  if (text.endsWith('*')) return value.startsWith(text.slice(0, -1));
  if (text.includes('/')) {
    const cidr = parseCIDR(text);
    const ip = parseIP(value);
    return cidr !== undefined && ip !== undefined && cidrContains(cidr, ip);
  }
  if (/^\d+-\d+$/.test(text)) {
    const [from, to] = text.split('-').map(Number);
    return Number(value) >= from && Number(value) <= to;
  }
  const ip = parseIP(text);
  if (ip && parseIP(value)?.text === ip.text) return true;
  if (/^0x[0-9a-f]+$/i.test(text) && /^0x[0-9a-f]+$/i.test(value)) return Number.parseInt(text, 16) === Number.parseInt(value, 16);
  if (protocolNumbers[text] !== undefined && protocolNumbers[text] === protocolNumbers[value]) return true;
  return false;
}

/**
 * canonicalPart: one part of a set key as the index holds it; undefined for a part that matches more
 * than itself (CIDR, range, wildcard, hex mask), which only literalMatches can judge.
 */
function canonicalPart(part: string): string | undefined {
  const text = unquote(part);
  if (text.endsWith('*') || text.includes('/') || /^\d+-\d+$/.test(text) || /^0x/i.test(text)) return undefined;
  const protocol = protocolNumbers[text];
  if (protocol !== undefined) return protocol;
  // IPv4 text is canonical unless an octet has a leading zero; IPv6 text has many spellings.
  if (text.includes(':') || (text.includes('.') && /(^|\.)0\d/.test(text))) return parseIP(text)?.text ?? text;
  return text;
}

interface SetIndex {
  /** Elements whose every part is plain, by their canonical key. */
  exact: Map<string, NftSetElement>;
  /** The others, in set order. */
  patterns: NftSetElement[];
  size: number;
}

// A service table's sets hold one element per service port: look keys up instead of scanning.
const setIndexes = new WeakMap<NftSet, SetIndex>();

function setIndex(set: NftSet): SetIndex {
  let index = setIndexes.get(set);
  if (index && index.size === set.elements.length) return index;
  index = {exact: new Map(), patterns: [], size: set.elements.length};
  for (const element of set.elements) {
    const parts = element.key.split(' . ').map(canonicalPart);
    if (parts.some((part) => part === undefined)) index.patterns.push(element);
    else if (!index.exact.has(parts.join(' . '))) index.exact.set(parts.join(' . '), element);
  }
  setIndexes.set(set, index);
  return index;
}

function findElement(set: NftSet | undefined, key: string[]): NftSetElement | undefined {
  if (!set) return undefined;
  const index = setIndex(set);
  const exact = index.exact.get(key.map((part) => canonicalPart(part) ?? part).join(' . '));
  if (exact) return exact;
  return index.patterns.find((element) => {
    const parts = element.key.split(' . ');
    return parts.length === key.length && parts.every((part, position) => literalMatches(part, key[position]));
  });
}

function setContains(set: NftSet | undefined, key: string[]): boolean {
  return findElement(set, key) !== undefined;
}

function mapLookup(set: NftSet | undefined, key: string[]): string | undefined {
  return findElement(set, key)?.value;
}

/** readSelector reads one packet field at words[index]; returns its value (undefined: does not apply) and the next index. */
function readSelector(
  walker: Walker,
  state: PathState,
  words: string[],
  index: number,
): {value: string | undefined; next: number} | undefined {
  const word = words[index];
  const next = words[index + 1];
  const packet = walker.packet;
  const protocol = packet.protocol.toLowerCase();
  if ((word === 'ip' || word === 'ip6') && (next === 'saddr' || next === 'daddr')) {
    return {value: next === 'saddr' ? packet.srcIP : state.daddr, next: index + 2};
  }
  if (['tcp', 'udp', 'sctp', 'th'].includes(word) && (next === 'dport' || next === 'sport')) {
    if (word !== 'th' && word !== protocol) return {value: undefined, next: index + 2};
    return {value: next === 'dport' ? String(state.dport) : '', next: index + 2};
  }
  if (word === 'meta' && next === 'l4proto') return {value: protocol, next: index + 2};
  if (word === 'meta' && next === 'mark') {
    if (words[index + 2] === '&') return {value: `0x${(state.mark & Number.parseInt(words[index + 3], 16)).toString(16)}`, next: index + 4};
    return {value: `0x${state.mark.toString(16)}`, next: index + 2};
  }
  if (word === 'iifname' || word === 'iif')
    return {value: walker.packet.origin === 'arriving' ? (packet.inInterface ?? '') : '', next: index + 1};
  if (word === 'oifname' || word === 'oif') return {value: '', next: index + 1};
  if (word === 'fib' && (next === 'saddr' || next === 'daddr') && words[index + 2] === 'type') {
    const address = next === 'saddr' ? packet.srcIP : state.daddr;
    const local = walker.local.has(parseIP(address)?.text ?? address) || isLoopback(address);
    return {value: local ? 'local' : 'unicast', next: index + 3};
  }
  if (word === 'ct' && next === 'state') return {value: packet.conntrack ?? 'new', next: index + 2};
  if (word === 'ct' && next === 'status') return {value: state.endpoint !== undefined ? 'dnat' : '', next: index + 2};
  return undefined;
}

function isLoopback(address: string): boolean {
  const ip = parseIP(address);
  return ip !== undefined && (ip.family === 'IPv4' ? ip.bytes[0] === 127 : ip.text === '::1');
}

type Action =
  | {kind: 'jump' | 'goto'; target: string}
  | {kind: 'return' | 'accept' | 'drop' | 'reject' | 'continue'}
  | {kind: 'split'; choices: Array<{probability: number; action: Action | undefined; dnat?: string; explanation: string}>};

function verdictAction(text: string | undefined): Action | undefined {
  if (text === undefined) return undefined;
  const [word, target] = text.split(' ');
  if ((word === 'jump' || word === 'goto') && target) return {kind: word, target};
  if (word === 'return' || word === 'accept' || word === 'drop' || word === 'continue') return {kind: word};
  if (word === 'reject') return {kind: 'reject'};
  return undefined;
}

/** numgenKeys: the keys `numgen random mod N [offset K]` can produce. */
function numgenKeys(words: string[], index: number): {keys: number[]; next: number} | undefined {
  if (words[index] !== 'numgen' || words[index + 2] !== 'mod') return undefined;
  const modulus = Number(words[index + 3]);
  let next = index + 4;
  let offset = 0;
  if (words[next] === 'offset') {
    offset = Number(words[next + 1]);
    next += 2;
  }
  return {keys: Array.from({length: modulus}, (_, key) => key + offset), next};
}

interface RuleEffect {
  matched: boolean;
  action?: Action;
  /** Statements that change the packet, applied in order when the rule matches. */
  mark?: {op: '|' | '^'; value: number};
  masquerade?: boolean;
  dnat?: string;
  explanation: string;
}

/** evaluateRule reads a rule left to right: every match must hold; the statements then apply. */
function evaluateRule(walker: Walker, state: PathState, rules: readonly NftRule[], position: number): RuleEffect {
  const text = ruleText(rules[position]);
  const words = wordsOf(rules, position);
  const effect: RuleEffect = {matched: true, explanation: ''};
  const conditions: string[] = [];
  let index = 0;
  while (index < words.length) {
    const word = words[index];
    if (word === 'jump' || word === 'goto') {
      effect.action = {kind: word, target: words[index + 1]};
      index += 2;
      continue;
    }
    if (word === 'return' || word === 'accept' || word === 'drop' || word === 'continue') {
      effect.action = {kind: word};
      index++;
      continue;
    }
    if (word === 'reject') {
      effect.action = {kind: 'reject'};
      break;
    }
    if (word === 'masquerade') {
      effect.masquerade = true;
      break;
    }
    if (word === 'counter' || word === 'log' || word === 'notrack') {
      index++;
      while (index < words.length && /^(packets|bytes|\d+)$/.test(words[index])) index++;
      continue;
    }
    if (word === 'update' || word === 'add') {
      index += 3;
      continue;
    }
    if (word === 'meta' && words[index + 1] === 'mark' && words[index + 2] === 'set') {
      effect.mark = {op: words[index + 5] === '^' ? '^' : '|', value: Number.parseInt(words[index + 6], 16)};
      index += 7;
      continue;
    }
    if (word === 'dnat') {
      let at = index + 1;
      if (words[at] === 'ip' || words[at] === 'ip6') at++;
      if (words[at] === 'to') at++;
      const numgen = numgenKeys(words, at);
      if (numgen && words[numgen.next] === 'map') {
        const set = walker.ruleset.sets.get(words[numgen.next + 1].replace(/^@/, ''));
        const choices = numgen.keys.map((key) => {
          const target = mapLookup(set, [String(key)]);
          const [ip, port] = target?.split(' . ') ?? [];
          const endpoint = ip !== undefined && port !== undefined ? (ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`) : undefined;
          return {
            probability: 1 / numgen.keys.length,
            action: undefined,
            dnat: endpoint,
            explanation: endpoint ? `numgen picks key ${key}: DNAT to ${endpoint}` : `numgen picks key ${key}, which the map does not hold`,
          };
        });
        effect.action = {kind: 'split', choices};
        break;
      }
      const target = words[at] ?? '';
      effect.dnat = target;
      index = at + 1;
      continue;
    }
    const numgen = numgenKeys(words, index);
    if (numgen && words[numgen.next] === 'vmap') {
      const data = words[numgen.next + 1];
      const entries = data.startsWith('@')
        ? (walker.ruleset.sets.get(data.slice(1))?.elements ?? []).map((element) => [element.key, element.value ?? ''] as const)
        : setItems(data).map((item) => {
            const [key, ...value] = item.split(' : ');
            return [key.trim(), value.join(' : ').trim()] as const;
          });
      const byKey = new Map(entries);
      const choices = numgen.keys.map((key) => {
        const action = verdictAction(byKey.get(String(key)));
        return {
          probability: 1 / numgen.keys.length,
          action,
          explanation: `numgen picks key ${key}: ${byKey.get(String(key)) ?? 'no element, falls through'}`,
        };
      });
      effect.action = {kind: 'split', choices};
      break;
    }

    // A match: one or more selectors joined by ".", then an optional operator and a value, or vmap.
    const key: Array<string | undefined> = [];
    const start = index;
    let selector = readSelector(walker, state, words, index);
    if (!selector) {
      walker.warnings.add(`cannot evaluate "${words.slice(index).join(' ')}" in rule "${text}"; treated as not matching`);
      return {matched: false, explanation: ''};
    }
    key.push(selector.value);
    index = selector.next;
    while (words[index] === '.') {
      selector = readSelector(walker, state, words, index + 1);
      if (!selector) {
        walker.warnings.add(`cannot evaluate "${words.slice(index).join(' ')}" in rule "${text}"; treated as not matching`);
        return {matched: false, explanation: ''};
      }
      key.push(selector.value);
      index = selector.next;
    }
    const described = words.slice(start, index).join(' ');
    if (words[index] === 'vmap') {
      const data = words[index + 1];
      index += 2;
      if (key.some((part) => part === undefined)) return {matched: false, explanation: ''};
      const value = data.startsWith('@')
        ? mapLookup(walker.ruleset.sets.get(data.slice(1)), key as string[])
        : setItems(data)
            .map((item) => item.split(' : '))
            .find(([candidate]) =>
              candidate
                .trim()
                .split(' . ')
                .every((part, position) => literalMatches(part, (key as string[])[position])),
            )?.[1];
      const action = verdictAction(value?.trim());
      if (!action) return {matched: false, explanation: ''};
      effect.action = action;
      conditions.push(`${described} (${(key as string[]).join(' . ')}) is in ${data}`);
      continue;
    }
    let negate = false;
    if (words[index] === '!=') {
      negate = true;
      index++;
    } else if (words[index] === '==') index++;
    const valueWord = words[index++];
    if (key.some((part) => part === undefined) || valueWord === undefined) return {matched: false, explanation: ''};
    let holds: boolean;
    if (valueWord.startsWith('@')) holds = setContains(walker.ruleset.sets.get(valueWord.slice(1)), key as string[]);
    else if (valueWord.startsWith('{'))
      holds = setItems(valueWord).some((item) =>
        item.split(' . ').every((part, position) => literalMatches(part.trim(), (key as string[])[position])),
      );
    else holds = valueWord.split(',').some((item) => literalMatches(item, (key as string[])[0]));
    if (holds === negate) return {matched: false, explanation: ''};
    conditions.push(`${described} ${negate ? 'is not' : 'is'} ${valueWord}`);
  }
  const why = conditions.length > 0 ? `${conditions.join(', ')}` : 'every packet';
  effect.explanation = why;
  return effect;
}

function hopOf(walker: Walker, hook: Hook, chain: string, rule: NftRule, target: string, explanation: string): TraceHop {
  const comment = ruleComment(rule);
  const text = comment !== undefined ? `${ruleText(rule)} comment "${comment}"` : ruleText(rule);
  return {hook, table: walker.tableLabel, chain, rule: text, target, explanation};
}

function clone(state: PathState): PathState {
  return {...state, hops: [...state.hops]};
}

interface ReturnPoint {
  chain: NftChain;
  index: number;
}

/** execChain runs a chain from rule `index`; each outcome is one path with its probability. */
function execChain(
  walker: Walker,
  hook: Hook,
  chain: NftChain,
  index: number,
  state: PathState,
  stack: ReturnPoint[],
  depth: number,
): Outcome[] {
  if (depth > maxDepth) {
    walker.warnings.add(`chain ${chain.name}: more than ${maxDepth} jumps; stopped`);
    return [state];
  }
  for (let position = index; position < chain.rules.length; position++) {
    const rule = chain.rules[position];
    const effect = evaluateRule(walker, state, chain.rules, position);
    if (!effect.matched) continue;
    if (effect.mark) {
      state.mark = effect.mark.op === '|' ? state.mark | effect.mark.value : state.mark ^ effect.mark.value;
      if (effect.mark.op === '|') state.markedBy = stack.length > 0 ? stack[stack.length - 1].chain.name : chain.name;
    }
    if (effect.dnat) {
      state.endpoint = effect.dnat;
      const [ip, port] = splitEndpoint(effect.dnat);
      state.daddr = ip;
      state.dport = port;
    }
    if (effect.masquerade) {
      state.masquerade = true;
      state.masqueradeReason = state.markedBy ? `marked for masquerade in ${state.markedBy}` : `masqueraded in ${chain.name}`;
    }
    const action = effect.action;
    const target = !action
      ? effect.dnat
        ? 'DNAT'
        : effect.masquerade
          ? 'MASQUERADE'
          : effect.mark
            ? 'MARK'
            : 'CONTINUE'
      : action.kind === 'jump' || action.kind === 'goto'
        ? action.target
        : action.kind.toUpperCase();
    const explanation = effect.dnat
      ? `${effect.explanation}: DNAT to ${effect.dnat}`
      : effect.masquerade
        ? `${effect.explanation}: source NAT to the outgoing address`
        : effect.mark
          ? `${effect.explanation}: marks the packet for masquerade`
          : `${effect.explanation}: ${target.toLowerCase() === target ? `${action?.kind ?? ''} ${target}` : target}`;
    state.hops.push(hopOf(walker, hook, chain.name, rule, action?.kind === 'split' ? 'numgen' : target, explanation.trim()));
    if (!action) continue;
    switch (action.kind) {
      case 'continue':
        continue;
      case 'accept':
        return [state];
      case 'drop':
        state.end = 'DROP';
        return [state];
      case 'reject':
        state.end = 'REJECT';
        return [state];
      case 'return':
        return returnFrom(walker, hook, state, stack, depth);
      case 'jump':
      case 'goto': {
        const next = walker.ruleset.chains.get(action.target);
        if (!next) {
          walker.warnings.add(`rule in ${chain.name} jumps to missing chain ${action.target}`);
          continue;
        }
        const returnStack = action.kind === 'jump' ? [...stack, {chain, index: position + 1}] : stack;
        return execChain(walker, hook, next, 0, state, returnStack, depth + 1);
      }
      case 'split': {
        const outcomes: Outcome[] = [];
        for (const choice of action.choices) {
          const branch = clone(state);
          branch.probability *= choice.probability;
          if (choice.dnat) {
            branch.endpoint = choice.dnat;
            const [ip, port] = splitEndpoint(choice.dnat);
            branch.daddr = ip;
            branch.dport = port;
          }
          const hop = branch.hops[branch.hops.length - 1];
          branch.hops[branch.hops.length - 1] = {
            ...hop,
            target: choice.dnat
              ? 'DNAT'
              : choice.action && 'target' in choice.action
                ? choice.action.target
                : (choice.action?.kind ?? 'CONTINUE').toUpperCase(),
            explanation: choice.explanation,
          };
          if (!choice.action) {
            outcomes.push(...execChain(walker, hook, chain, position + 1, branch, stack, depth + 1));
            continue;
          }
          const nextChain = 'target' in choice.action ? walker.ruleset.chains.get(choice.action.target) : undefined;
          if (nextChain) {
            const returnStack = choice.action.kind === 'jump' ? [...stack, {chain, index: position + 1}] : stack;
            outcomes.push(...execChain(walker, hook, nextChain, 0, branch, returnStack, depth + 1));
          } else if (choice.action.kind === 'drop' || choice.action.kind === 'reject') {
            branch.end = choice.action.kind === 'drop' ? 'DROP' : 'REJECT';
            outcomes.push(branch);
          } else outcomes.push(branch);
        }
        return outcomes;
      }
    }
  }
  return returnFrom(walker, hook, state, stack, depth);
}

function returnFrom(walker: Walker, hook: Hook, state: PathState, stack: ReturnPoint[], depth: number): Outcome[] {
  if (stack.length === 0) return [state];
  const top = stack[stack.length - 1];
  return execChain(walker, hook, top.chain, top.index, state, stack.slice(0, -1), depth + 1);
}

function splitEndpoint(endpoint: string): [string, number] {
  const bracketed = /^\[(.+)\]:(\d+)$/.exec(endpoint);
  if (bracketed) return [bracketed[1], Number(bracketed[2])];
  const plain = /^(.+):(\d+)$/.exec(endpoint);
  if (plain && !plain[1].includes(':')) return [plain[1], Number(plain[2])];
  return [endpoint, 0];
}

// A table with tens of thousands of chains has a handful of base chains: find them once per table,
// not once per hook of every traced packet.
const baseChainsByTable = new WeakMap<Map<string, NftChain>, Map<string, NftChain[]>>();

function baseChains(ruleset: NftRuleset, hook: string): NftChain[] {
  let byHook = baseChainsByTable.get(ruleset.chains);
  if (!byHook) {
    byHook = new Map();
    for (const chain of ruleset.chains.values())
      if (chain.hook !== undefined) byHook.set(chain.hook, [...(byHook.get(chain.hook) ?? []), chain]);
    for (const chains of byHook.values()) chains.sort((a, b) => (a.priority ?? 0) - (b.priority ?? 0));
    baseChainsByTable.set(ruleset.chains, byHook);
  }
  return byHook.get(hook) ?? [];
}

/** runHook passes every path through the hook's base chains in priority order. */
function runHook(walker: Walker, hook: Hook, paths: PathState[]): PathState[] {
  let current = paths;
  for (const chain of baseChains(walker.ruleset, hook.toLowerCase())) {
    // nat chains see only the packet that starts a connection.
    if (chain.type === 'nat' && walker.packet.conntrack === 'invalid') continue;
    const next: PathState[] = [];
    for (const path of current) {
      if (path.end) {
        next.push(path);
        continue;
      }
      const outcomes = execChain(walker, hook, chain, 0, path, [], 0);
      for (const outcome of outcomes) {
        if (!outcome.end && chain.policy === 'drop') outcome.end = 'DROP';
        next.push(outcome);
      }
    }
    current = next;
  }
  return current;
}

const servicePortChain = /^(?:service|local|external|firewall|endpoint)-[A-Z0-9]{8}-([^/]+)\/([^/]+)\/[a-z]+\/([^_]*?)(?:__.*)?$/;

/**
 * traceNftables walks the packet through the table. Dynamic sets (session affinity) are taken as
 * listed: a client already in one follows it.
 */
export function traceNftables(ruleset: NftRuleset, packet: Packet, context: TraceContext): TraceResult {
  const walker: Walker = {
    packet,
    context,
    ruleset,
    local: new Set(context.localAddresses.map((address) => parseIP(address)?.text ?? address)),
    tableLabel: `${ruleset.family} ${ruleset.table}`,
    warnings: new Set(),
  };
  const start: PathState = {
    probability: 1,
    hops: [],
    daddr: packet.dstIP,
    dport: packet.dstPort,
    mark: 0,
    masquerade: false,
    masqueradeReason: '',
  };
  let paths = runHook(walker, packet.origin === 'arriving' ? 'PREROUTING' : 'OUTPUT', [start]);
  const after: PathState[] = [];
  for (const path of paths) {
    if (path.end) {
      after.push(path);
      continue;
    }
    if (packet.origin === 'local') {
      after.push(...runHook(walker, 'POSTROUTING', [path]));
      continue;
    }
    const toNode = walker.local.has(parseIP(path.daddr)?.text ?? path.daddr) || isLoopback(path.daddr);
    const routed = runHook(walker, toNode ? 'INPUT' : 'FORWARD', [path]);
    after.push(
      ...(toNode ? routed : routed.flatMap((routedPath) => (routedPath.end ? [routedPath] : runHook(walker, 'POSTROUTING', [routedPath])))),
    );
  }
  paths = after;

  const verdictOf = (path: PathState) => path.end ?? (path.endpoint !== undefined ? 'DNAT' : 'ACCEPT');
  const dnatPaths = paths.filter((path) => verdictOf(path) === 'DNAT');
  const verdict = dnatPaths.length > 0 ? 'DNAT' : verdictOf(paths[0]);
  const chosen = verdict === 'DNAT' ? dnatPaths : paths;
  if (new Set(paths.map(verdictOf)).size > 1)
    walker.warnings.add(`paths end differently: ${[...new Set(paths.map(verdictOf))].join(', ')}`);

  let shared = 0;
  const first = chosen[0].hops;
  while (
    shared < first.length &&
    chosen.every(
      (path) =>
        path.hops[shared] !== undefined &&
        (path.hops[shared] === first[shared] || JSON.stringify(path.hops[shared]) === JSON.stringify(first[shared])),
    )
  )
    shared++;
  const branches: TraceBranch[] = [];
  if (verdict === 'DNAT') {
    const total = dnatPaths.reduce((sum, path) => sum + path.probability, 0);
    const byEndpoint = new Map<string, TraceBranch>();
    for (const path of dnatPaths) {
      const existing = byEndpoint.get(path.endpoint!);
      if (existing) {
        existing.probability += path.probability / total;
        continue;
      }
      const branch: TraceBranch = {
        endpoint: path.endpoint!,
        probability: path.probability / total,
        hops: path.hops.slice(shared),
        masquerade: path.masquerade,
        masqueradeReason: path.masquerade ? path.masqueradeReason : 'no masquerade mark: the source address is kept',
      };
      byEndpoint.set(path.endpoint!, branch);
      branches.push(branch);
    }
  }

  let servicePort: string | undefined;
  for (const hop of chosen[0].hops) {
    const match = servicePortChain.exec(hop.target) ?? servicePortChain.exec(hop.chain);
    if (match) {
      servicePort = `${match[1]}/${match[2]}${match[3] ? `:${match[3]}` : ''}`;
      break;
    }
    const comment = /comment "([^"]+)"/.exec(hop.rule);
    if (/^[^/\s]+\/[^/\s]+$/.test(comment?.[1] ?? '')) servicePort = comment![1];
  }
  if (!servicePort) {
    const key = `${packet.dstIP} . ${packet.protocol.toLowerCase()} . ${packet.dstPort}`;
    const element = ruleset.sets.get('no-endpoint-services')?.elements.find((candidate) => candidate.key === key);
    if (element?.comment) servicePort = element.comment;
  }
  if (verdict === 'REJECT' && servicePort) walker.warnings.add(`${servicePort} has no endpoints`);
  return {
    packet,
    verdict,
    hops: verdict === 'DNAT' ? first.slice(0, shared) : chosen[0].hops,
    branches,
    ...(servicePort ? {servicePort} : {}),
    warnings: [...walker.warnings],
  };
}
