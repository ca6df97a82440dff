// readRulesDump: which saved rulesets a behaviour diff reads, and the error for each it cannot.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {DumpFormatError, readRulesDump} from '../../../src/core/behaviour/index.ts';
import {renderIptables} from '../../../src/core/iptables/index.ts';
import {renderIpvs, withJumpRules} from '../../../src/core/ipvs/index.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {renderNftables} from '../../../src/core/nftables/index.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

const model = buildProxyModel(
  {services: [service('web')], endpointSlices: [slice('web-1', 'web', [{ip: '10.244.1.5', node: 'node-1'}])], node: node('node-1')},
  {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
);

describe('readRulesDump', () => {
  it('reads iptables-save output and nft -f scripts as their modes', () => {
    assert.equal(readRulesDump(renderIptables(model, {includeJumps: true}), 'dump').mode, 'iptables');
    assert.equal(readRulesDump(renderNftables(model), 'dump').mode, 'nftables');
  });

  it('refuses what it cannot read, saying what it expected', () => {
    const refusal = (text: string) => {
      try {
        readRulesDump(text, 'node-1.rules');
      } catch (error) {
        assert.ok(error instanceof DumpFormatError, String(error));
        return error.message;
      }
      assert.fail('no error');
    };
    assert.match(refusal(''), /^node-1\.rules is empty/);
    assert.match(refusal('hello\n'), /^node-1\.rules: unknown format: expected iptables-save output/);
    assert.match(refusal('{"foo": 1}'), /is JSON but not nft -j output/);
    assert.match(refusal('table ip kube-proxy {\n}\n'), /nft's text listing.*nft -j list table/);
    assert.match(refusal(withJumpRules(renderIpvs(model).iptables)), /the iptables layer of an ipvs-mode node/);
  });
});
