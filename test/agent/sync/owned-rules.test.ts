import assert from 'node:assert/strict';
import {test} from 'node:test';
import {applyPartialWrite, describeDrift, matchesRecord, readOwnedRules, recordOwned} from '../../../src/agent/sync/owned-rules.ts';

const save = (lines: string[]) => ['*nat', ':PREROUTING ACCEPT [0:0]', ':KUBE-SERVICES - [0:0]', ':KUBE-SVC-AAAA - [0:0]', ':KUBE-SEP-BBBB - [0:0]', ':KUBE-SEP-CCCC - [0:0]', ...lines, 'COMMIT', ''].join('\n');
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
