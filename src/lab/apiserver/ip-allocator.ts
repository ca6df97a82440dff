// ClusterIP allocation from the service CIDRs and NodePort allocation from the node port range.
import {isIPv4, isIPv6} from 'node:net';
import type {IPFamily} from '../../core/model/types.ts';

export function ipFamilyOf(ip: string): IPFamily | undefined {
  if (isIPv4(ip)) return 'IPv4';
  if (isIPv6(ip)) return 'IPv6';
  return undefined;
}

export function ipToBigInt(ip: string): bigint {
  if (isIPv4(ip)) return ip.split('.').reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
  const [head, tail] = ip.includes('::') ? ip.split('::') : [ip, undefined];
  const headParts = head ? head.split(':') : [];
  const tailParts = tail ? tail.split(':') : [];
  const expand = (parts: string[]) =>
    parts.flatMap((p) => {
      if (p.includes('.')) {
        const v = ipToBigInt(p);
        return [Number(v >> 16n), Number(v & 0xffffn)];
      }
      return [parseInt(p, 16)];
    });
  const h = expand(headParts);
  const t = expand(tailParts);
  const groups = tail === undefined ? h : [...h, ...new Array(8 - h.length - t.length).fill(0), ...t];
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(g), 0n);
}

export function bigIntToIp(value: bigint, family: IPFamily): string {
  if (family === 'IPv4') return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 0xffn)).join('.');
  const groups: string[] = [];
  for (let s = 112n; s >= 0n; s -= 16n) groups.push(((value >> s) & 0xffffn).toString(16));
  // Compress the longest run of zero groups, as RFC 5952 asks.
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== '0') {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === '0') j++;
    if (j - i > bestLen && j - i > 1) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  if (bestStart < 0) return groups.join(':');
  return `${groups.slice(0, bestStart).join(':')}::${groups.slice(bestStart + bestLen).join(':')}`;
}

export class Cidr {
  readonly text: string;
  readonly family: IPFamily;
  readonly base: bigint;
  readonly prefix: number;
  readonly size: bigint;

  constructor(text: string) {
    const [ip, bits] = text.trim().split('/');
    const family = ipFamilyOf(ip);
    const width = family === 'IPv4' ? 32 : 128;
    const prefix = Number(bits);
    if (!family || !Number.isInteger(prefix) || prefix < 0 || prefix > width) throw new Error(`service CIDR ${text}: not a CIDR`);
    this.family = family;
    this.prefix = prefix;
    this.size = 1n << BigInt(width - prefix);
    this.base = (ipToBigInt(ip) / this.size) * this.size;
    this.text = `${bigIntToIp(this.base, family)}/${prefix}`;
  }

  contains(ip: string): boolean {
    if (ipFamilyOf(ip) !== this.family) return false;
    const v = ipToBigInt(ip);
    return v >= this.base && v < this.base + this.size;
  }
}

/** Hands out addresses of one CIDR: never the network address, nor the broadcast address for IPv4. */
export class ClusterIPAllocator {
  readonly cidr: Cidr;
  private readonly used = new Set<bigint>();
  private readonly first: bigint;
  private readonly last: bigint;

  constructor(cidr: Cidr) {
    this.cidr = cidr;
    this.first = cidr.base + 1n;
    const maxOffset = cidr.size - (cidr.family === 'IPv4' ? 2n : 1n);
    // Very large IPv6 ranges: only the first 2^16 addresses are handed out automatically.
    this.last = cidr.base + (maxOffset > 65536n ? 65536n : maxOffset);
  }

  /** Reserves `ip`; the error text is the allocator's own, to be wrapped in a field error. */
  allocate(ip: string): string | undefined {
    if (!this.cidr.contains(ip)) return `provided IP (${ip}) is not in the valid range. The range of valid IPs is ${this.cidr.text}`;
    const v = ipToBigInt(ip);
    const lastValid = this.cidr.base + this.cidr.size - (this.cidr.family === 'IPv4' ? 2n : 1n);
    if (v < this.first || v > lastValid)
      return `provided IP (${ip}) is not in the valid range. The range of valid IPs is ${this.cidr.text}`;
    if (this.used.has(v)) return 'provided IP is already allocated';
    this.used.add(v);
    return undefined;
  }

  allocateNext(): string | undefined {
    for (let v = this.first; v <= this.last; v++) {
      if (!this.used.has(v)) {
        this.used.add(v);
        return bigIntToIp(v, this.cidr.family);
      }
    }
    return undefined;
  }

  release(ip: string): void {
    if (this.cidr.contains(ip)) this.used.delete(ipToBigInt(ip));
  }

  isAllocated(ip: string): boolean {
    return this.cidr.contains(ip) && this.used.has(ipToBigInt(ip));
  }
}

export class PortRange {
  readonly base: number;
  readonly size: number;

  constructor(text: string) {
    const m = text.trim().match(/^(\d+)(?:-(\d+)|\+(\d+))?$/);
    if (!m) throw new Error(`node port range ${text}: expected FROM-TO`);
    this.base = Number(m[1]);
    const last = m[2] !== undefined ? Number(m[2]) : m[3] !== undefined ? this.base + Number(m[3]) : this.base;
    this.size = last - this.base + 1;
    if (this.base < 1 || last > 65535 || this.size < 1) throw new Error(`node port range ${text}: ports must be 1-65535, FROM <= TO`);
  }

  contains(port: number): boolean {
    return port >= this.base && port < this.base + this.size;
  }

  toString(): string {
    return `${this.base}-${this.base + this.size - 1}`;
  }
}

export class NodePortAllocator {
  readonly range: PortRange;
  private readonly used = new Set<number>();

  constructor(range: PortRange) {
    this.range = range;
  }

  allocate(port: number): string | undefined {
    if (!this.range.contains(port)) return `provided port is not in the valid range. The range of valid ports is ${this.range}`;
    if (this.used.has(port)) return 'provided port is already allocated';
    this.used.add(port);
    return undefined;
  }

  allocateNext(): number | undefined {
    for (let p = this.range.base; p < this.range.base + this.range.size; p++) {
      if (!this.used.has(p)) {
        this.used.add(p);
        return p;
      }
    }
    return undefined;
  }

  release(port: number): void {
    this.used.delete(port);
  }

  isAllocated(port: number): boolean {
    return this.used.has(port);
  }
}
