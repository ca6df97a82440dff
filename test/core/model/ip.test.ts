// Address and CIDR parsing: Go's sloppy rules in, canonical text out.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {cidrContains, joinHostPort, parseCIDR, parseIP} from '../../../src/core/model/ip.ts';

const addresses: Array<[string, string | undefined, ('IPv4' | 'IPv6')?]> = [
  ['10.96.0.10', '10.96.0.10', 'IPv4'],
  ['010.096.000.010', '10.96.0.10', 'IPv4'],
  ['255.255.255.255', '255.255.255.255', 'IPv4'],
  ['256.1.1.1', undefined],
  ['1.2.3', undefined],
  ['1.2.3.4.5', undefined],
  ['1.2.3.4.', undefined],
  ['1..2.3', undefined],
  ['1.2.3.0004', undefined],
  ['1.2.3.\u0664', undefined],
  ['0.0.0.0', '0.0.0.0', 'IPv4'],
  ['10.0.0.01', '10.0.0.1', 'IPv4'],
  [' 1.2.3.4', undefined],
  ['', undefined],
  ['fd00::1', 'fd00::1', 'IPv6'],
  ['FD00:0000:0000:0000:0000:0000:0000:000A', 'fd00::a', 'IPv6'],
  ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1', 'IPv6'],
  ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1', 'IPv6'],
  ['::', '::', 'IPv6'],
  ['::1', '::1', 'IPv6'],
  ['1::', '1::', 'IPv6'],
  ['::ffff:10.1.2.3', '10.1.2.3', 'IPv4'],
  ['64:ff9b::10.1.2.3', '64:ff9b::a01:203', 'IPv6'],
  ['1:2:3:4:5:6:7:8:9', undefined],
  ['1::2::3', undefined],
  ['fe80::1%eth0', undefined],
  ['12345::', undefined],
  ['not-an-ip', undefined],
];

for (const [input, text, family] of addresses) {
  test(`parseIP ${JSON.stringify(input)}`, () => {
    const ip = parseIP(input);
    assert.equal(ip?.text, text);
    assert.equal(ip?.family, family);
  });
}

const cidrs: Array<[string, string | undefined]> = [
  ['10.0.0.0/8', '10.0.0.0/8'],
  ['10.1.2.3/8', '10.0.0.0/8'],
  ['10.244.1.7/24', '10.244.1.0/24'],
  ['0.0.0.0/0', '0.0.0.0/0'],
  ['10.0.0.1/32', '10.0.0.1/32'],
  ['10.0.0.0/33', undefined],
  ['10.0.0.0', undefined],
  ['10.0.0.0/', undefined],
  ['10.0.0.0/8/8', undefined],
  ['fd00:10:244:1::7/64', 'fd00:10:244:1::/64'],
  ['2001:db8::/129', undefined],
  ['::ffff:10.0.0.0/104', undefined],
];

for (const [input, text] of cidrs) {
  test(`parseCIDR ${JSON.stringify(input)}`, () => assert.equal(parseCIDR(input)?.text, text));
}

test('cidrContains checks family and prefix', () => {
  const pods = parseCIDR('10.244.0.0/16')!;
  assert.equal(cidrContains(pods, parseIP('10.244.255.1')!), true);
  assert.equal(cidrContains(pods, parseIP('10.245.0.1')!), false);
  assert.equal(cidrContains(parseCIDR('fd00::/8')!, parseIP('fd12::1')!), true);
  assert.equal(cidrContains(parseCIDR('0.0.0.0/0')!, parseIP('::1')!), false);
  assert.equal(cidrContains(parseCIDR('10.0.0.0/12')!, parseIP('10.15.255.255')!), true);
  assert.equal(cidrContains(parseCIDR('10.0.0.0/12')!, parseIP('10.16.0.0')!), false);
});

test('joinHostPort brackets IPv6 like net.JoinHostPort', () => {
  assert.equal(joinHostPort('10.0.0.1', 80), '10.0.0.1:80');
  assert.equal(joinHostPort('fd00::1', 80), '[fd00::1]:80');
});
