// The hash in kube-proxy's per-service object names: the first characters of the standard base32
// (RFC 4648) text of the SHA-256 of a name. Its iptables proxier keeps 16 (KUBE-SVC-*), its
// nftables proxier 8 (the "HASH-namespace/name/..." chains), so both layouts share this one.
import {hash} from 'node:crypto';

export const base32Alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** sha256Base32: the first `length` characters of the base32 text of the SHA-256 of `text`. */
export function sha256Base32(text: string, length: number): string {
  // As hex text: a Buffer made for each digest cost more than the hash (a render names 110,000
  // chains at 10,000 services x 10 endpoints).
  const digest = hash('sha256', text, 'hex');
  let out = '';
  let buffer = 0;
  let bits = 0;
  for (let index = 0; out.length < length; index++) {
    const code = digest.charCodeAt(index);
    buffer = (buffer << 4) | (code <= 0x39 ? code - 0x30 : code - 0x57);
    bits += 4;
    while (bits >= 5 && out.length < length) {
      bits -= 5;
      out += base32Alphabet[(buffer >> bits) & 31];
    }
    buffer &= (1 << bits) - 1;
  }
  return out;
}
