// How migrate-check and diff --behaviour print a behaviour diff: the verdict line, and the
// --all-nodes table with the node where most stops answering first.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import type {BehaviourDiff} from '../../src/core/behaviour/index.ts';
import {nodeReport, reportTable, switchWords} from '../../src/plugin/lib/behaviour-report.ts';
import {palette} from '../../src/plugin/lib/output.ts';

function diffWith(changedClasses: number, stopAnswering: number): BehaviourDiff {
  return {
    before: 'iptables mode',
    after: 'nftables mode',
    equal: changedClasses === 0,
    groups: [],
    summary: {
      classes: 40,
      servicePorts: 4,
      changedClasses,
      changedServicePorts: changedClasses > 0 ? 1 : 0,
      byEntry: {},
      stopAnswering,
      startAnswering: 0,
    },
  };
}

describe('behaviour report', () => {
  it('says in the verdict how many classes change and how many stop answering', () => {
    const report = nodeReport('node-1', diffWith(6, 2), [], switchWords, 'after the switch to nftables mode');
    assert.equal(
      report.verdict,
      '6 of 40 packet classes would behave differently after the switch to nftables mode, in 1 of 4 service ports; 2 of them answer today and would not after the switch',
    );
    const same = nodeReport('node-2', diffWith(0, 0), [], switchWords, 'after the switch to nftables mode');
    assert.equal(
      same.verdict,
      'nothing would change: all 40 packet classes of 4 service ports behave the same after the switch to nftables mode',
    );
  });

  it('lists the nodes worst first: most classes that stop answering, then most changes', () => {
    const reports = [
      nodeReport('node-a', diffWith(0, 0), [], switchWords, ''),
      nodeReport('node-b', diffWith(9, 1), [], switchWords, ''),
      nodeReport('node-c', diffWith(3, 3), [], switchWords, ''),
      nodeReport('node-d', diffWith(12, 1), [], switchWords, ''),
    ];
    const rows = reportTable(reports, palette(false)).trim().split('\n').slice(1);
    assert.deepEqual(
      rows.map((row) => row.split(/\s+/)[0]),
      ['node-c', 'node-d', 'node-b', 'node-a'],
    );
  });
});
