// What `trace` prints for a person, over real traces: Services and EndpointSlices rendered by core
// (iptables and nftables), parsed and traced, then formatted. A 3-endpoint ClusterIP stays within
// 30 lines, a 50-endpoint one within 40 (one screen); the path is there once, a hop a line; an
// endpoint whose path differs (hairpin) shows only its own hops; -o wide adds sentences and rules.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {parseIptablesSave, renderIptables, traceIptables} from '../../src/core/iptables/index.ts';
import {buildProxyModel} from '../../src/core/model/index.ts';
import {parseNftablesScript, renderNftables, traceNftables} from '../../src/core/nftables/index.ts';
import type {Packet, TraceResult} from '../../src/core/trace/types.ts';
import {palette} from '../../src/plugin/lib/output.ts';
import {diffKeys, formatTraceText, groupBranches, type EndpointInfo} from '../../src/plugin/lib/trace-text.ts';
import {node, service, slice} from '../core/model/cluster-objects.ts';

const nodeIP = '10.240.0.11';
const client = '10.244.1.200';

function endpointsOf(count: number) {
  return Array.from({length: count}, (_, i) => ({
    ip: `10.244.${1 + (i % 2)}.${10 + Math.floor(i / 2)}`,
    node: `node-${1 + (i % 2)}`,
    pod: `web-${i}`,
  }));
}

function traced(mode: 'iptables' | 'nftables', count: number, srcIP = client): {result: TraceResult; info: Map<string, EndpointInfo>} {
  const endpoints = endpointsOf(count);
  const model = buildProxyModel(
    {services: [service('web', {clusterIP: '10.96.0.10'})], endpointSlices: [slice('web-1', 'web', endpoints)], node: node('node-1')},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
  );
  const packet: Packet = {srcIP, dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP', origin: 'arriving'};
  const context = {localAddresses: [nodeIP]};
  // The base chains' jumps into the proxy's chains, as the agent adds them on a node.
  const jumps =
    '*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n-A FORWARD -j KUBE-FORWARD\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\nCOMMIT\n';
  const result =
    mode === 'iptables'
      ? traceIptables(parseIptablesSave(`${jumps}${renderIptables(model)}`), packet, context)
      : traceNftables(parseNftablesScript(renderNftables(model, {serviceCIDRs: ['10.96.0.0/16']})), packet, context);
  const info = new Map(endpoints.map((endpoint) => [`${endpoint.ip}:8080`, {pod: endpoint.pod, node: endpoint.node}]));
  return {result, info};
}

const text = (result: TraceResult, info: Map<string, EndpointInfo>, wide = false) =>
  formatTraceText(result, {palette: palette(false), wide, endpointInfo: info});
const lines = (output: string) => output.trimEnd().split('\n');

for (const mode of ['iptables', 'nftables'] as const) {
  describe(`trace text, ${mode} mode`, () => {
    it('3 endpoints: within 30 lines, each hop once and on one line, each endpoint a row', () => {
      const {result, info} = traced(mode, 3);
      assert.equal(result.verdict, 'DNAT');
      assert.equal(result.branches.length, 3);
      const output = text(result, info);
      assert.ok(lines(output).length <= 30, `${lines(output).length} lines:\n${output}`);
      const pathLines = lines(output).slice(lines(output).indexOf('Path') + 1, lines(output).indexOf('Endpoints') - 1);
      assert.equal(pathLines.length, result.hops.length + result.branches[0].hops.length, output);
      assert.equal(new Set(pathLines).size, pathLines.length, `no hop repeated:\n${output}`);
      for (const line of pathLines) assert.match(line, /^ {2}(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING)\s+\S.* -> \S+$/, line);
      for (const [endpoint, {pod, node: nodeName}] of info)
        assert.match(output, new RegExp(`^ {2}${endpoint.replaceAll('.', '\\.')}\\s+33\\.3%\\s+${pod}\\s+${nodeName}\\s+no$`, 'm'));
      assert.doesNotMatch(output, /The random draw|-A KUBE-|jump /, 'sentences and rule texts only under -o wide');
    });

    it('50 endpoints: on one screen (40 lines), every endpoint named', () => {
      const {result, info} = traced(mode, 50);
      assert.equal(result.branches.length, 50);
      const output = text(result, info);
      assert.ok(lines(output).length <= 40, `${lines(output).length} lines:\n${output}`);
      for (const endpoint of info.keys()) assert.ok(output.includes(endpoint), `${endpoint} in:\n${output}`);
      assert.match(output, /50 endpoints on 2 nodes, 2\.0% each, none masqueraded/);
      assert.ok(
        lines(output).every((line) => line.length <= 80 || !/^ {2}10\./.test(line)),
        'the endpoints fit 80 columns',
      );
    });

    it('-o wide: every hop with its sentence, each rule text, each endpoint with its reason (a hairpin endpoint too)', () => {
      for (const source of [client, '10.244.1.10']) {
        const {result, info} = traced(mode, 3, source);
        const output = text(result, info, true);
        for (const hop of [...result.hops, ...result.branches.flatMap((branch) => branch.hops)]) {
          assert.ok(output.includes(hop.explanation), `sentence "${hop.explanation}" in:\n${output}`);
          if (hop.rule) assert.ok(output.includes(hop.rule), `rule "${hop.rule}"`);
        }
        for (const branch of result.branches)
          assert.ok(output.includes(`masquerade: ${branch.masquerade ? 'yes' : 'no'} - ${branch.masqueradeReason}`), branch.endpoint);
      }
    });

    it('a hairpin endpoint: grouped apart, only the hops that differ, marked + and -', () => {
      const {result, info} = traced(mode, 3, '10.244.1.10');
      const groups = groupBranches(result.branches);
      assert.deepEqual(
        groups.map((group) => group.branches.length),
        [2, 1],
      );
      assert.equal(groups[1].branches[0].endpoint, '10.244.1.10:8080');
      const output = text(result, info);
      assert.ok(lines(output).length <= 30, `${lines(output).length} lines:\n${output}`);
      const section = output.slice(output.indexOf('10.244.1.10:8080 (web-0) takes another path:'));
      assert.ok(section.length > 0, output);
      const changes = lines(section)
        .slice(1)
        .filter((line) => /^ {4}[-+] /.test(line));
      assert.ok(changes.length > 0 && changes.length < groups[1].branches[0].hops.length + groups[0].key.length, section);
      assert.match(section, /masquerade: yes/);
    });
  });
}

describe('diffKeys', () => {
  it('names what only one side has, in order', () => {
    assert.deepEqual(diffKeys(['a', 'b', 'c', 'd'], ['a', 'x', 'c', 'd', 'e']), [
      {side: '+', index: 1},
      {side: '-', index: 1},
      {side: '+', index: 4},
    ]);
    assert.deepEqual(diffKeys(['a'], ['a']), []);
  });
});
