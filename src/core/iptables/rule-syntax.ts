// Reading the arguments of one iptables rule ("-s 10.0.0.0/8 -p tcp -m tcp --dport 80 -j ACCEPT") into
// its parts, and writing them back the way iptables-save prints them, so that rules written for
// iptables-restore and rules read back from the kernel compare equal.
import {parseCIDR, parseIP} from '../model/ip.ts';
import type {IPFamily} from '../model/types.ts';
import type {AddressCondition, IptablesRule, RuleMatch, RuleOption, RuleTarget} from './ruleset.ts';

/** RuleSyntaxError: the rule cannot be read; the caller adds the line number. */
export class RuleSyntaxError extends Error {}

export interface Token {
  text: string;
  /** The token was quoted, so it is a value even when it starts with "-" or is "!". */
  quoted: boolean;
}

/**
 * tokenizeRule splits a line as iptables-restore does: on blanks, with double quotes grouping words
 * and a backslash escaping the next character.
 */
export function tokenizeRule(line: string): Token[] {
  if (!line.includes('"') && !line.includes('\\')) {
    const words: Token[] = [];
    for (const word of line.split(/[ \t]+/)) if (word !== '') words.push({text: word, quoted: false});
    return words;
  }
  const tokens: Token[] = [];
  let current = '';
  let inToken = false;
  let quoted = false;
  let inQuotes = false;
  for (let index = 0; index < line.length; index++) {
    const char = line[index];
    if (char === '\\' && index + 1 < line.length) {
      current += line[++index];
      inToken = true;
      continue;
    }
    if (char === '"') {
      inQuotes = !inQuotes;
      inToken = true;
      quoted = true;
      continue;
    }
    if (!inQuotes && (char === ' ' || char === '\t')) {
      if (inToken) tokens.push({text: current, quoted});
      current = '';
      inToken = false;
      quoted = false;
      continue;
    }
    current += char;
    inToken = true;
  }
  if (inQuotes) throw new RuleSyntaxError('unterminated double quote');
  if (inToken) tokens.push({text: current, quoted});
  return tokens;
}

/** ParsedRuleArgs: the parts of a rule after "-A CHAIN". */
export type ParsedRuleArgs = Pick<
  IptablesRule,
  'source' | 'destination' | 'inInterface' | 'outInterface' | 'protocol' | 'fragment' | 'matches' | 'target'
>;

// How many values each known option takes. Options of modules not listed here take the words up
// to the next option.
const matchOptionArity: Record<string, Record<string, number>> = {
  comment: {comment: 1},
  nfacct: {'nfacct-name': 1},
  tcp: {sport: 1, dport: 1, 'tcp-flags': 2, syn: 0, 'tcp-option': 1},
  udp: {sport: 1, dport: 1},
  sctp: {sport: 1, dport: 1, 'chunk-types': 2},
  udplite: {sport: 1, dport: 1},
  multiport: {dports: 1, sports: 1, ports: 1},
  addrtype: {'src-type': 1, 'dst-type': 1, 'limit-iface-in': 0, 'limit-iface-out': 0},
  mark: {mark: 1},
  conntrack: {
    ctstate: 1,
    ctproto: 1,
    ctorigsrc: 1,
    ctorigdst: 1,
    ctreplsrc: 1,
    ctrepldst: 1,
    ctorigsrcport: 1,
    ctorigdstport: 1,
    ctreplsrcport: 1,
    ctrepldstport: 1,
    ctstatus: 1,
    ctexpire: 1,
    ctdir: 1,
  },
  state: {state: 1},
  statistic: {mode: 1, probability: 1, every: 1, packet: 1},
  recent: {name: 1, set: 0, rcheck: 0, update: 0, remove: 0, seconds: 1, reap: 0, hitcount: 1, rttl: 0, mask: 1, rsource: 0, rdest: 0},
  physdev: {'physdev-in': 1, 'physdev-out': 1, 'physdev-is-in': 0, 'physdev-is-out': 0, 'physdev-is-bridged': 0},
  set: {'match-set': 2, 'return-nomatch': 0, 'update-counters': 0, 'update-subcounters': 0, 'packets-eq': 1, 'bytes-eq': 1},
  icmp: {'icmp-type': 1},
  icmp6: {'icmpv6-type': 1},
  pkttype: {'pkt-type': 1},
  iprange: {'src-range': 1, 'dst-range': 1},
};

const targetOptionArity: Record<string, Record<string, number>> = {
  DNAT: {'to-destination': 1, random: 0, persistent: 0},
  SNAT: {'to-source': 1, random: 0, 'random-fully': 0, persistent: 0},
  MASQUERADE: {'to-ports': 1, random: 0, 'random-fully': 0},
  MARK: {'set-xmark': 1, 'set-mark': 1, 'or-mark': 1, 'and-mark': 1, 'xor-mark': 1},
  REJECT: {'reject-with': 1},
  LOG: {'log-prefix': 1, 'log-level': 1, 'log-tcp-sequence': 0, 'log-tcp-options': 0, 'log-ip-options': 0, 'log-uid': 0},
  CT: {notrack: 0, zone: 1, helper: 1},
};

// Long spellings iptables accepts for the options iptables-save prints short.
const optionAliases: Record<string, Record<string, string>> = {
  tcp: {'source-port': 'sport', 'destination-port': 'dport'},
  udp: {'source-port': 'sport', 'destination-port': 'dport'},
  sctp: {'source-port': 'sport', 'destination-port': 'dport'},
  multiport: {'source-ports': 'sports', 'destination-ports': 'dports'},
};

/** The options that set the rule's addresses, in each spelling iptables takes; an error names the short one. */
const addressOptions = new Map<string, {part: 'source' | 'destination'; short: '-s' | '-d'}>([
  ...['-s', '--source', '--src'].map((spelling) => [spelling, {part: 'source', short: '-s'}] as const),
  ...['-d', '--destination', '--dst'].map((spelling) => [spelling, {part: 'destination', short: '-d'}] as const),
]);

const protocolMatches = new Set(['tcp', 'udp', 'sctp', 'udplite', 'icmp', 'icmp6']);
const protocolNumbers: Record<string, string> = {'1': 'icmp', '6': 'tcp', '17': 'udp', '58': 'ipv6-icmp', '132': 'sctp', '136': 'udplite'};

function optionName(token: Token): string | undefined {
  if (token.quoted) return undefined;
  return /^--[a-zA-Z0-9][-a-zA-Z0-9]*$/.test(token.text) ? token.text.slice(2) : undefined;
}

function isOptionLike(token: Token): boolean {
  return !token.quoted && (token.text === '!' || /^-[-a-zA-Z]/.test(token.text));
}

// A dotted quad as iptables-save prints it: no leading zeros.
const canonicalIPv4 = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\/32)?$/;

function canonicalAddress(text: string, family: IPFamily, flag: string): string {
  // Host addresses are most of a large ruleset's addresses; they need no network arithmetic.
  const host = canonicalIPv4.exec(text);
  if (host) return host[1] ? text : `${text}/32`;
  const slash = text.indexOf('/');
  let cidrText = text;
  if (slash >= 0) {
    const mask = text.slice(slash + 1);
    if (mask.includes('.') || (mask.includes(':') && family === 'IPv6')) {
      const prefix = prefixOfMask(mask);
      if (prefix === undefined) throw new RuleSyntaxError(`${flag} ${text}: ${mask} is not a contiguous netmask`);
      cidrText = `${text.slice(0, slash)}/${prefix}`;
    }
  } else {
    const ip = parseIP(text);
    if (!ip) throw new RuleSyntaxError(`${flag} ${text}: not an IP address or CIDR`);
    cidrText = `${text}/${ip.family === 'IPv4' ? 32 : 128}`;
  }
  const cidr = parseCIDR(cidrText);
  if (!cidr) throw new RuleSyntaxError(`${flag} ${text}: not an IP address or CIDR`);
  return cidr.text;
}

function prefixOfMask(mask: string): number | undefined {
  const ip = parseIP(mask);
  if (!ip) return undefined;
  let prefix = 0;
  let ended = false;
  for (const byte of ip.bytes) {
    for (let bit = 7; bit >= 0; bit--) {
      const set = (byte >> bit) & 1;
      if (set && ended) return undefined;
      if (set) prefix++;
      else ended = true;
    }
  }
  return prefix;
}

/**
 * parseRuleArgs reads the words after "-A CHAIN". An address list ("-s a,b") is returned as one
 * rule per address by the caller; here it is an error, since iptables-save never prints one.
 */
export function parseRuleArgs(tokens: Token[], family: IPFamily): ParsedRuleArgs {
  const parsed: ParsedRuleArgs = {matches: []};
  let negatePending = false;
  let index = 0;
  const next = (flag: string): string => {
    const token = tokens[index++];
    if (token === undefined) throw new RuleSyntaxError(`${flag} needs a value`);
    if (token.text === '!' && !token.quoted) {
      // Old syntax: "-s ! 10.0.0.0/8".
      negatePending = true;
      return next(flag);
    }
    return token.text;
  };
  // The value is read before the negation is taken: next() notes a "!" between option and value (the old syntax).
  const addressCondition = (word: string, option: '-s' | '-d'): AddressCondition => {
    const cidr = canonicalAddress(next(word), family, option);
    return {cidr, negated: takeNegation()};
  };
  const takeNegation = (): boolean => {
    const negated = negatePending;
    negatePending = false;
    return negated;
  };
  // The match that takes options that name no module (the most recent one).
  const ownerOf = (name: string): RuleMatch | RuleTarget | undefined => {
    if (parsed.target && (targetOptionArity[parsed.target.name] === undefined || name in targetOptionArity[parsed.target.name])) {
      return parsed.target;
    }
    for (let position = parsed.matches.length - 1; position >= 0; position--) {
      const match = parsed.matches[position];
      const known = matchOptionArity[match.module];
      const canonical = optionAliases[match.module]?.[name] ?? name;
      if (known && canonical in known) return match;
    }
    // iptables loads the protocol's match on its own for "-p tcp --dport 80".
    const protocol = parsed.protocol && !parsed.protocol.negated ? parsed.protocol.name : undefined;
    if (protocol && protocolMatches.has(protocol)) {
      const canonical = optionAliases[protocol]?.[name] ?? name;
      if (canonical in matchOptionArity[protocol]) {
        const implicit: RuleMatch = {module: protocol, options: []};
        parsed.matches.push(implicit);
        return implicit;
      }
    }
    const last = parsed.matches[parsed.matches.length - 1];
    if (last && !matchOptionArity[last.module]) return last;
    return undefined;
  };

  while (index < tokens.length) {
    const token = tokens[index++];
    if (token.quoted) throw new RuleSyntaxError(`unexpected value "${token.text}"`);
    const word = token.text;
    const address = addressOptions.get(word);
    if (address) {
      if (parsed[address.part]) throw new RuleSyntaxError(`${address.short} given twice`);
      parsed[address.part] = addressCondition(word, address.short);
      continue;
    }
    switch (word) {
      case '!':
        negatePending = true;
        break;
      case '-i':
      case '--in-interface': {
        const name = next(word);
        parsed.inInterface = {name, negated: takeNegation()};
        break;
      }
      case '-o':
      case '--out-interface': {
        const name = next(word);
        parsed.outInterface = {name, negated: takeNegation()};
        break;
      }
      case '-p':
      case '--protocol': {
        const raw = next(word).toLowerCase();
        const name = protocolNumbers[raw] ?? raw;
        const negated = takeNegation();
        if ((name === 'all' || name === '0') && !negated) parsed.protocol = undefined;
        else parsed.protocol = {name, negated};
        break;
      }
      case '-f':
      case '--fragment':
        parsed.fragment = {negated: takeNegation()};
        break;
      case '-m':
      case '--match':
        parsed.matches.push({module: next(word), options: []});
        if (negatePending) throw new RuleSyntaxError(`"!" cannot negate ${word}`);
        break;
      case '-j':
      case '--jump':
      case '-g':
      case '--goto':
        if (parsed.target) throw new RuleSyntaxError('more than one target (-j / -g)');
        parsed.target = {name: next(word), goto: word === '-g' || word === '--goto', options: []};
        break;
      case '-c':
      case '--set-counters':
        // Counters given inline ("-c PACKETS BYTES") mean nothing to a rule's meaning.
        next(word);
        next(word);
        break;
      default: {
        const name = optionName(token);
        const last = parsed.target ?? parsed.matches[parsed.matches.length - 1];
        // iptables-nft-save marks what it cannot show, e.g. "[unsupported revision]"; keep the words with the option before them.
        if (name === undefined && word.startsWith('[') && last) {
          const words = [word];
          while (!words[words.length - 1].endsWith(']') && index < tokens.length) words.push(tokens[index++].text);
          const lastOption = last.options[last.options.length - 1];
          if (lastOption) lastOption.values.push(...words);
          else last.options.push({name: '', negated: false, values: words});
          break;
        }
        if (name === undefined) throw new RuleSyntaxError(`unexpected word "${word}"`);
        const owner = ownerOf(name);
        if (!owner) throw new RuleSyntaxError(`option ${word} belongs to no match or target (is a "-m MODULE" missing?)`);
        const isTarget = owner === parsed.target;
        const moduleName = isTarget ? (owner as RuleTarget).name : (owner as RuleMatch).module;
        const canonical = isTarget ? name : (optionAliases[moduleName]?.[name] ?? name);
        const arity = (isTarget ? targetOptionArity : matchOptionArity)[moduleName]?.[canonical];
        const option: RuleOption = {name: canonical, negated: false, values: []};
        if (arity !== undefined) {
          for (let count = 0; count < arity; count++) option.values.push(next(word));
        } else {
          while (index < tokens.length && !isOptionLike(tokens[index])) option.values.push(tokens[index++].text);
        }
        // Both "! --dport 80" and the old "--dport ! 80".
        option.negated = takeNegation();
        owner.options.push(option);
      }
    }
  }
  if (negatePending) throw new RuleSyntaxError('"!" at the end of the rule negates nothing');
  for (const match of parsed.matches) canonicalizeMatch(match, family);
  if (parsed.target) canonicalizeTarget(parsed.target, family);
  return parsed;
}

function option(match: RuleMatch | RuleTarget, name: string): RuleOption | undefined {
  return match.options.find((candidate) => candidate.name === name);
}

/** orderOptions puts known options in the order iptables-save prints them; others keep their place after them. */
function orderOptions(options: RuleOption[], order: readonly string[]): RuleOption[] {
  const rank = (name: string) => {
    const position = order.indexOf(name);
    return position < 0 ? order.length : position;
  };
  return options
    .map((value, position) => ({value, position}))
    .sort((a, b) => rank(a.value.name) - rank(b.value.name) || a.position - b.position)
    .map((entry) => entry.value);
}

const conntrackStates = ['INVALID', 'NEW', 'RELATED', 'ESTABLISHED', 'UNTRACKED', 'SNAT', 'DNAT'];

function canonicalStates(text: string): string {
  const states = text.split(',').map((state) => state.toUpperCase());
  const rank = (state: string) => (conntrackStates.includes(state) ? conntrackStates.indexOf(state) : conntrackStates.length);
  return [...new Set(states)].sort((a, b) => rank(a) - rank(b)).join(',');
}

export function parseNumber(text: string): number | undefined {
  if (/^0x[0-9a-f]+$/i.test(text)) return parseInt(text.slice(2), 16);
  if (/^\d+$/.test(text)) return parseInt(text, 10);
  return undefined;
}

const hex = (value: number) => `0x${(value >>> 0).toString(16)}`;

/** parseMarkValue reads "VALUE[/MASK]"; the mask defaults to all ones. */
export function parseMarkValue(text: string): {value: number; mask: number} | undefined {
  const [valueText, maskText] = text.split('/');
  const value = parseNumber(valueText);
  const mask = maskText === undefined ? 0xffffffff : parseNumber(maskText);
  if (value === undefined || mask === undefined || value > 0xffffffff || mask > 0xffffffff) return undefined;
  return {value, mask};
}

/** Kernel's fixed point for statistic's probability: 31 bits. */
export function kernelProbability(probability: number): number {
  return Math.round(probability * 0x80000000) / 0x80000000;
}

function canonicalizeMatch(match: RuleMatch, family: IPFamily): void {
  switch (match.module) {
    case 'tcp': {
      for (const entry of match.options) {
        if (entry.name === 'syn') {
          entry.name = 'tcp-flags';
          entry.values = ['FIN,SYN,RST,ACK', 'SYN'];
        }
      }
      match.options = orderOptions(match.options, ['sport', 'dport', 'tcp-option', 'tcp-flags']);
      break;
    }
    case 'udp':
    case 'udplite':
      match.options = orderOptions(match.options, ['sport', 'dport']);
      break;
    case 'sctp':
      match.options = orderOptions(match.options, ['sport', 'dport', 'chunk-types']);
      break;
    case 'addrtype':
      for (const entry of match.options) if (entry.name.endsWith('-type')) entry.values = entry.values.map((value) => value.toUpperCase());
      match.options = orderOptions(match.options, ['src-type', 'dst-type', 'limit-iface-in', 'limit-iface-out']);
      break;
    case 'mark': {
      const mark = option(match, 'mark');
      const parsed = mark && parseMarkValue(mark.values[0]);
      if (mark && !parsed) throw new RuleSyntaxError(`-m mark --mark ${mark.values[0]}: not a number or number/mask`);
      if (mark && parsed) mark.values = [parsed.mask === 0xffffffff ? hex(parsed.value) : `${hex(parsed.value)}/${hex(parsed.mask)}`];
      break;
    }
    case 'conntrack':
      for (const entry of match.options)
        if (entry.name === 'ctstate' || entry.name === 'ctstatus') entry.values = [canonicalStates(entry.values[0])];
      match.options = orderOptions(match.options, [
        'ctstate',
        'ctproto',
        'ctorigsrc',
        'ctorigdst',
        'ctreplsrc',
        'ctrepldst',
        'ctorigsrcport',
        'ctorigdstport',
        'ctreplsrcport',
        'ctrepldstport',
        'ctstatus',
        'ctexpire',
        'ctdir',
      ]);
      break;
    case 'state':
      for (const entry of match.options) if (entry.name === 'state') entry.values = [canonicalStates(entry.values[0])];
      break;
    case 'statistic': {
      const probability = option(match, 'probability');
      if (probability) {
        const value = Number(probability.values[0]);
        if (!Number.isFinite(value) || value < 0 || value > 1)
          throw new RuleSyntaxError(`-m statistic --probability ${probability.values[0]}: not a number between 0 and 1`);
        probability.values = [kernelProbability(value).toFixed(11)];
      }
      match.options = orderOptions(match.options, ['mode', 'probability', 'every', 'packet']);
      break;
    }
    case 'recent': {
      if (!option(match, 'name')) match.options.push({name: 'name', negated: false, values: ['DEFAULT']});
      if (!option(match, 'mask'))
        match.options.push({
          name: 'mask',
          negated: false,
          values: [family === 'IPv4' ? '255.255.255.255' : 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'],
        });
      if (!option(match, 'rsource') && !option(match, 'rdest')) match.options.push({name: 'rsource', negated: false, values: []});
      match.options = orderOptions(match.options, [
        'rcheck',
        'set',
        'update',
        'remove',
        'seconds',
        'reap',
        'hitcount',
        'rttl',
        'name',
        'mask',
        'rsource',
        'rdest',
      ]);
      break;
    }
    default:
      break;
  }
}

function canonicalizeTarget(target: RuleTarget, family: IPFamily): void {
  switch (target.name) {
    case 'MARK': {
      // iptables-save prints every MARK form as --set-xmark VALUE/MASK: mark = (mark AND NOT mask) XOR value.
      const [entry] = target.options;
      if (!entry) throw new RuleSyntaxError('-j MARK needs --set-xmark, --set-mark, --or-mark, --and-mark or --xor-mark');
      const parsed = parseMarkValue(entry.values[0] ?? '');
      if (!parsed) throw new RuleSyntaxError(`-j MARK --${entry.name} ${entry.values[0] ?? ''}: not a number or number/mask`);
      let value = parsed.value;
      let mask = parsed.mask;
      switch (entry.name) {
        case 'set-xmark':
          break;
        case 'set-mark':
          mask = (parsed.value | parsed.mask) >>> 0;
          break;
        case 'or-mark':
          mask = parsed.value;
          break;
        case 'and-mark':
          value = 0;
          mask = ~parsed.value >>> 0;
          break;
        case 'xor-mark':
          mask = 0;
          break;
        default:
          throw new RuleSyntaxError(`-j MARK: unknown option --${entry.name}`);
      }
      target.options = [{name: 'set-xmark', negated: false, values: [`${hex(value)}/${hex(mask)}`]}];
      break;
    }
    case 'REJECT':
      if (!option(target, 'reject-with')) {
        target.options.push({
          name: 'reject-with',
          negated: false,
          values: [family === 'IPv4' ? 'icmp-port-unreachable' : 'icmp6-port-unreachable'],
        });
      }
      break;
    default:
      break;
  }
}

// xtables_save_string: words of these characters only are printed bare; others are quoted with
// '"', '\' and "'" escaped.
const bareWord = /^[-_0-9a-zA-Z]+$/;

export function quoteForSave(value: string): string {
  if (bareWord.test(value)) return value;
  return `"${value.replace(/["\\']/g, (char) => `\\${char}`)}"`;
}

// Values iptables-save prints with xtables_save_string; other values are printed as they are.
const savedAsString = new Set(['comment', 'log-prefix']);

function formatValue(name: string, value: string): string {
  if (savedAsString.has(name)) return quoteForSave(value);
  return value === '' || /[\s"\\]/.test(value) ? quoteForSave(value) : value;
}

function formatOptions(options: RuleOption[]): string[] {
  const words: string[] = [];
  for (const entry of options) {
    if (entry.negated) words.push('!');
    // iptables' nfacct extension prints its option with two blanks after it.
    if (entry.name === 'nfacct-name') words.push('--nfacct-name ');
    else if (entry.name !== '') words.push(`--${entry.name}`);
    for (const value of entry.values) words.push(formatValue(entry.name, value));
  }
  return words;
}

/** formatRuleArgs writes the parts back in iptables-save's order and spelling. */
export function formatRuleArgs(args: ParsedRuleArgs): string {
  const words: string[] = [];
  const condition = (flag: string, negated: boolean, value: string) => {
    if (negated) words.push('!');
    words.push(flag, formatValue('', value));
  };
  if (args.source) condition('-s', args.source.negated, args.source.cidr);
  if (args.destination) condition('-d', args.destination.negated, args.destination.cidr);
  if (args.inInterface) condition('-i', args.inInterface.negated, args.inInterface.name);
  if (args.outInterface) condition('-o', args.outInterface.negated, args.outInterface.name);
  if (args.protocol) condition('-p', args.protocol.negated, args.protocol.name);
  if (args.fragment) {
    if (args.fragment.negated) words.push('!');
    words.push('-f');
  }
  for (const match of args.matches) words.push('-m', match.module, ...formatOptions(match.options));
  if (args.target) words.push(args.target.goto ? '-g' : '-j', args.target.name, ...formatOptions(args.target.options));
  return words.join(' ');
}
