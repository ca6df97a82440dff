// IP address and CIDR parsing with Go's "sloppy" rules and canonical text, so addresses read from
// API objects print the way kube-proxy prints them.
import type {IPFamily} from './types.ts';

export interface ParsedIP {
  family: IPFamily;
  /** Canonical text: dotted quad, or RFC 5952 IPv6 (lower case, longest zero run as "::"). */
  text: string;
  /** 4 bytes for IPv4, 16 for IPv6. */
  bytes: number[];
}

export interface ParsedCIDR {
  family: IPFamily;
  /** Canonical text of the network: host bits cleared, e.g. "10.0.0.0/8". */
  text: string;
  network: ParsedIP;
  prefixLength: number;
}

/**
 * parseIP reads an IPv4 or IPv6 address. Like Go's ParseIPSloppy it accepts IPv4 octets with
 * leading zeros (as decimal) and treats IPv4-mapped IPv6 (::ffff:a.b.c.d) as IPv4. Zones
 * ("%eth0") are rejected. Returns undefined for anything else.
 */
export function parseIP(input: string): ParsedIP | undefined {
  if (typeof input !== 'string' || input.length === 0 || input.length > 45) return undefined;
  if (input.includes(':')) {
    const bytes = parseIPv6Bytes(input);
    if (!bytes) return undefined;
    if (isIPv4Mapped(bytes)) {
      const v4 = bytes.slice(12);
      return {family: 'IPv4', text: v4.join('.'), bytes: v4};
    }
    return {family: 'IPv6', text: sameOrCanonical(input, formatIPv6(bytes)), bytes};
  }
  const bytes = parseIPv4Bytes(input);
  if (!bytes) return undefined;
  // Leading zeros are the one way to write an address longer than its canonical form.
  const canonicalLength = 3 + decimalLength(bytes[0]) + decimalLength(bytes[1]) + decimalLength(bytes[2]) + decimalLength(bytes[3]);
  return {family: 'IPv4', text: input.length === canonicalLength ? input : bytes.join('.'), bytes};
}

/**
 * The input itself when it is canonical already, as almost every address from the API is: the
 * model then shares the watched object's string instead of holding a copy per endpoint.
 */
function sameOrCanonical(input: string, canonical: string): string {
  return input === canonical ? input : canonical;
}

/** parseCIDR reads "address/prefix"; host bits are allowed and cleared, as Go's ParseCIDR does. */
export function parseCIDR(input: string): ParsedCIDR | undefined {
  if (typeof input !== 'string') return undefined;
  const slash = input.indexOf('/');
  if (slash < 0 || slash !== input.lastIndexOf('/')) return undefined;
  const addressText = input.slice(0, slash);
  const prefixText = input.slice(slash + 1);
  if (!/^\d{1,3}$/.test(prefixText)) return undefined;
  // A mapped address with an IPv6-sized prefix would change family under our feet; refuse it.
  if (addressText.includes(':') && addressText.includes('.')) {
    const raw = parseIPv6Bytes(addressText);
    if (!raw || isIPv4Mapped(raw)) return undefined;
  }
  const address = parseIP(addressText);
  if (!address) return undefined;
  const prefixLength = Number(prefixText);
  const bits = address.bytes.length * 8;
  if (prefixLength > bits) return undefined;
  const masked = address.bytes.map((byte, index) => {
    const keep = Math.min(8, Math.max(0, prefixLength - index * 8));
    return byte & ((0xff << (8 - keep)) & 0xff);
  });
  const networkText = address.family === 'IPv4' ? masked.join('.') : formatIPv6(masked);
  return {
    family: address.family,
    text: `${networkText}/${prefixLength}`,
    network: {family: address.family, text: networkText, bytes: masked},
    prefixLength,
  };
}

/** cidrContains tells whether the address lies inside the network. */
export function cidrContains(cidr: ParsedCIDR, ip: ParsedIP): boolean {
  if (cidr.family !== ip.family) return false;
  for (let index = 0; index < ip.bytes.length; index++) {
    const keep = Math.min(8, Math.max(0, cidr.prefixLength - index * 8));
    const mask = (0xff << (8 - keep)) & 0xff;
    if ((ip.bytes[index] & mask) !== cidr.network.bytes[index]) return false;
  }
  return true;
}

/** joinHostPort writes "ip:port", bracketing IPv6 addresses like Go's net.JoinHostPort. */
export function joinHostPort(ip: string, port: number): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`;
}

function decimalLength(byte: number): number {
  return byte >= 100 ? 3 : byte >= 10 ? 2 : 1;
}

/** parseIPv4Bytes reads four dot-separated decimal bytes of one to three digits each; by hand, as it runs once per endpoint. */
function parseIPv4Bytes(text: string): number[] | undefined {
  const bytes: number[] = [];
  let value = 0;
  let digits = 0;
  for (let at = 0; at <= text.length; at++) {
    const code = at < text.length ? text.charCodeAt(at) : 0x2e;
    if (code >= 0x30 && code <= 0x39) {
      value = value * 10 + (code - 0x30);
      if (++digits > 3) return undefined;
    } else if (code === 0x2e && digits > 0 && value <= 255 && bytes.length < 4) {
      bytes.push(value);
      value = 0;
      digits = 0;
    } else {
      return undefined;
    }
  }
  return bytes.length === 4 ? bytes : undefined;
}

function parseIPv6Bytes(text: string): number[] | undefined {
  if (!/^[0-9A-Fa-f:.]+$/.test(text)) return undefined;
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const head = halves[0] === '' ? [] : halves[0].split(':');
  const tail = halves.length === 2 ? (halves[1] === '' ? [] : halves[1].split(':')) : [];
  const groups: number[] = [];
  const readGroups = (parts: string[], allowIPv4Last: boolean): number[] | undefined => {
    const out: number[] = [];
    for (let index = 0; index < parts.length; index++) {
      const part = parts[index];
      if (part.includes('.')) {
        if (!allowIPv4Last || index !== parts.length - 1) return undefined;
        const v4 = parseIPv4Bytes(part);
        if (!v4) return undefined;
        out.push((v4[0] << 8) | v4[1], (v4[2] << 8) | v4[3]);
        continue;
      }
      if (!/^[0-9A-Fa-f]{1,4}$/.test(part)) return undefined;
      out.push(parseInt(part, 16));
    }
    return out;
  };
  const headGroups = readGroups(head, halves.length === 1);
  const tailGroups = readGroups(tail, true);
  if (!headGroups || !tailGroups) return undefined;
  if (halves.length === 1) {
    if (headGroups.length !== 8) return undefined;
    groups.push(...headGroups);
  } else {
    const missing = 8 - headGroups.length - tailGroups.length;
    if (missing < 1) return undefined;
    groups.push(...headGroups, ...new Array<number>(missing).fill(0), ...tailGroups);
  }
  return groups.flatMap((group) => [group >> 8, group & 0xff]);
}

function isIPv4Mapped(bytes: number[]): boolean {
  for (let index = 0; index < 10; index++) if (bytes[index] !== 0) return false;
  return bytes[10] === 0xff && bytes[11] === 0xff;
}

function formatIPv6(bytes: number[]): string {
  const groups: number[] = [];
  for (let index = 0; index < 16; index += 2) groups.push((bytes[index] << 8) | bytes[index + 1]);
  // Longest run of zero groups, first one on a tie; a single zero group is not shortened.
  let bestStart = -1;
  let bestLength = 0;
  for (let index = 0; index < 8; ) {
    if (groups[index] !== 0) {
      index++;
      continue;
    }
    let end = index;
    while (end < 8 && groups[end] === 0) end++;
    if (end - index > bestLength) {
      bestStart = index;
      bestLength = end - index;
    }
    index = end;
  }
  const hex = groups.map((group) => group.toString(16));
  if (bestLength < 2) return hex.join(':');
  const head = hex.slice(0, bestStart).join(':');
  const tail = hex.slice(bestStart + bestLength).join(':');
  return `${head}::${tail}`;
}
