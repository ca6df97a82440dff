import assert from 'node:assert/strict';
import {test} from 'node:test';
import {restoreInputText} from '../../../src/agent/host/host.ts';
import {coreIptablesRules} from '../../../src/agent/sync/iptables-rules.ts';
import {
  applyPartialWrite,
  describeDrift,
  matchesRecord,
  proxyTables,
  readOwnedRules,
  recordAfterFullWrite,
  recordOwned,
} from '../../../src/agent/sync/owned-rules.ts';
import {formatIptablesRuleset, parseIptablesSave} from '../../../src/core/iptables/index.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {node, service, slice} from '../../core/model/cluster-objects.ts';

const save = (lines: string[]) =>
  [
    '*nat',
    ':PREROUTING ACCEPT [0:0]',
    ':KUBE-SERVICES - [0:0]',
    ':KUBE-SVC-AAAA - [0:0]',
    ':KUBE-SEP-BBBB - [0:0]',
    ':KUBE-SEP-CCCC - [0:0]',
    ...lines,
    'COMMIT',
    '',
  ].join('\n');
const base = [
  '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
  '-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "ns/a:http cluster IP" -j KUBE-SVC-AAAA',
  '-A KUBE-SVC-AAAA -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BBBB',
  '-A KUBE-SVC-AAAA -j KUBE-SEP-CCCC',
  '-A KUBE-SEP-BBBB -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80',
  '-A KUBE-SEP-CCCC -p tcp -m tcp -j DNAT --to-destination 10.0.0.2:80',
];

test('a record matches the rules it was made from, and nothing that differs from them', () => {
  const record = recordOwned(readOwnedRules('nat', save(base)));
  assert.equal(record.ruleCount, 6);
  assert.ok(matchesRecord(record, readOwnedRules('nat', save(base))));
  const changedEndpoint = base.map((rule) => rule.replace('10.0.0.2:80', '10.0.0.3:80'));
  assert.ok(!matchesRecord(record, readOwnedRules('nat', save(changedEndpoint))));
  assert.match(describeDrift(record, readOwnedRules('nat', save(changedEndpoint))), /rules of KUBE-SEP-CCCC changed \(1 written, 1 now\)/);
  const reordered = [base[0], base[1], base[3], base[2], base[4], base[5]];
  assert.ok(!matchesRecord(record, readOwnedRules('nat', save(reordered))));
  const jumpGone = base.slice(1);
  assert.ok(!matchesRecord(record, readOwnedRules('nat', save(jumpGone))));
  assert.match(describeDrift(record, readOwnedRules('nat', save(jumpGone))), /rule missing: -A PREROUTING/);
  const slipped = [...base, '-A KUBE-SERVICES -j ACCEPT'];
  assert.match(describeDrift(record, readOwnedRules('nat', save(slipped))), /rule added: -A KUBE-SERVICES -j ACCEPT/);
  const chainGone = readOwnedRules('nat', save(base.slice(0, 5)).replace(':KUBE-SEP-CCCC - [0:0]\n', ''));
  assert.ok(!matchesRecord(record, chainGone));
  assert.match(describeDrift(record, chainGone), /chain KUBE-SEP-CCCC missing/);
});

test('after a partial write, the written chains are as the kernel holds them and the others as recorded', () => {
  const record = recordOwned(readOwnedRules('nat', save(base)));
  const next = base.map((rule) => rule.replace('10.0.0.2:80', '10.0.0.3:80'));
  const now = readOwnedRules('nat', save(next));
  applyPartialWrite(record, now, new Set(['KUBE-SEP-CCCC']));
  assert.ok(matchesRecord(record, now));
  assert.equal(record.ruleCount, 6);
  // Someone else's change to a chain the write did not replace is not adopted.
  const before = recordOwned(readOwnedRules('nat', save(base)));
  const foreign = readOwnedRules('nat', save(next.map((rule) => rule.replace('10.0.0.1:80', '10.0.0.9:80'))));
  applyPartialWrite(before, foreign, new Set(['KUBE-SEP-CCCC']));
  assert.ok(!matchesRecord(before, foreign));
});

test('matchesRecord: a chain whose rules come in more than one piece, empty chains, and chains whose names start alike', () => {
  const withMore = (lines: string[]) =>
    save(lines).replace(':KUBE-SEP-CCCC - [0:0]', ':KUBE-SEP-CCCC - [0:0]\n:KUBE-SEP-CCCCX - [0:0]\n:KUBE-SEP-DDDD - [0:0]');
  const lines = [...base, '-A KUBE-SEP-CCCCX -p tcp -m tcp -j DNAT --to-destination 10.0.0.4:80'];
  const record = recordOwned(readOwnedRules('nat', withMore(lines)));
  assert.ok(matchesRecord(record, readOwnedRules('nat', withMore(lines))), 'as recorded');
  // KUBE-SVC-AAAA's two rules on either side of KUBE-SEP-BBBB's: each chain's rules in the same order.
  const split = [lines[0], lines[1], lines[2], lines[4], lines[3], lines[5], lines[6]];
  assert.ok(matchesRecord(record, readOwnedRules('nat', withMore(split))), 'a chain in two pieces');
  const splitChanged = [lines[0], lines[1], lines[2], lines[4], lines[3].replace('KUBE-SEP-CCCC', 'KUBE-SEP-CCCCX'), lines[5], lines[6]];
  assert.ok(!matchesRecord(record, readOwnedRules('nat', withMore(splitChanged))), 'a chain in two pieces, one rule changed');
  const intoEmpty = [...lines, '-A KUBE-SEP-DDDD -j ACCEPT'];
  assert.ok(
    !matchesRecord(
      record,
      readOwnedRules('nat', withMore(intoEmpty).replace('-A KUBE-SERVICES -d 10.96.0.10/32', '-A KUBE-SERVICES -d 10.96.0.11/32')),
    ),
    'a rule in a chain recorded empty',
  );
  const moved = [
    ...base.slice(0, 5),
    lines[5].replace('-A KUBE-SEP-CCCC ', '-A KUBE-SEP-CCCCX '),
    lines[6].replace('-A KUBE-SEP-CCCCX ', '-A KUBE-SEP-CCCC '),
  ];
  assert.ok(!matchesRecord(record, readOwnedRules('nat', withMore(moved))), 'rules swapped between KUBE-SEP-CCCC and KUBE-SEP-CCCCX');
  const jumpMoved = [lines[0].replace('-A PREROUTING ', '-A OUTPUT '), ...lines.slice(1)];
  assert.ok(!matchesRecord(record, readOwnedRules('nat', withMore(jumpMoved))), 'the jump rule in another built-in chain');
});

test("a full write's record, from what the renderer told of it, matches the tables as iptables-save prints them once it is loaded, jumps into kubelet's chain left out", () => {
  const rules = coreIptablesRules();
  const objects = {
    services: Array.from({length: 6}, (_, i) => service(`svc-${i}`, {clusterIP: `10.96.0.${10 + i}`})),
    endpointSlices: Array.from({length: 6}, (_, i) =>
      slice(`svc-${i}-a`, `svc-${i}`, [{ip: `10.244.1.${i}`, node: 'node-1'}, {ip: `10.244.2.${i}`}]),
    ),
    node: node(),
  };
  const model = buildProxyModel(objects, {family: 'IPv4', nodeName: 'node-1', clusterCIDRs: ['10.244.0.0/16']});
  // With jump rules added, as a full sync adds the missing ones.
  const rendered = rules.render(model, {
    insertJumps: [
      {table: 'filter', chain: 'FORWARD', rule: ['-j', 'KUBE-FORWARD'], position: 'prepend'},
      // Into kubelet's chain, which the proxy writes but does not own: not part of its record.
      {table: 'filter', chain: 'INPUT', rule: ['-j', 'KUBE-FIREWALL'], position: 'prepend'},
      {table: 'nat', chain: 'POSTROUTING', rule: ['-j', 'KUBE-POSTROUTING'], position: 'append'},
    ],
  });
  const input = restoreInputText(rendered.input);
  const before = new Map(proxyTables.map((table) => [table, readOwnedRules(table, `*${table}\nCOMMIT\n`)]));
  const record = recordAfterFullWrite(rendered.written()!, before);
  assert.ok(record.get('nat')!.chains.size > 20);
  assert.ok(record.get('nat')!.countedChains > 0, 'per-service chains are known by their rule count');
  assert.deepEqual([...record.get('filter')!.jumps.keys(), ...record.get('nat')!.jumps.keys()], ['FORWARD', 'POSTROUTING']);
  // The input as iptables-save prints it once loaded (the parser's spelling is checked against the kernel's in test/kernel).
  const saved = formatIptablesRuleset(parseIptablesSave(input, {family: 'IPv4', keepSavedText: false}));
  for (const table of proxyTables) assert.ok(matchesRecord(record.get(table)!, readOwnedRules(table, saved)), `${table} as loaded`);
  const edited = saved.replace(/-A KUBE-SERVICES -d 10\.96\.0\.10\/32/, '-A KUBE-SERVICES -d 10.96.0.99/32');
  assert.ok(!matchesRecord(record.get('nat')!, readOwnedRules('nat', edited)), "a fixed chain's rule edited");
  const dropped = saved.replace(/^-A KUBE-SEP-[^\n]*DNAT[^\n]*\n/m, '');
  assert.ok(!matchesRecord(record.get('nat')!, readOwnedRules('nat', dropped)), "a per-service chain's rule gone");
});
