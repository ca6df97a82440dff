// kube-proxy's focused iptables tests publish packet flows rather than whole rulesets: for each
// case of test/fixtures/kube-proxy/iptables-flows, the rules proxyctl renders for kube-proxy's
// objects and node settings, traced as `trace --rules` traces a dump, send every packet where
// kube-proxy's test says its own rules send it (the endpoints, REJECT, DROP, or untouched) and
// masquerade it exactly when kube-proxy does.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {join} from 'node:path';
import {describe, it} from 'node:test';
import {parse} from 'yaml';
import {renderIptables} from '../../src/core/iptables/index.ts';
import {readRulesDump, splitDump, traceDump} from '../../src/plugin/lib/rules-dump.ts';
import {kubeProxyCaseModel, kubeProxyCases} from '../fixtures/kube-proxy/fixtures.ts';

/** The IPv4 addresses of kube-proxy's fake node (testNodeIP, testNodeIPAlt, testExternalIP). */
const nodeIPs = ['192.168.0.2', '192.168.1.2', '192.168.99.11'];

interface Flow {
  name: string;
  source: string;
  destination: string;
  port: number;
  /** "ip:port, ip:port", REJECT, DROP, or "" (no rule changes the packet). */
  output: string;
  masq?: boolean;
}

for (const fixture of kubeProxyCases('iptables-flows')) {
  describe(`kube-proxy's packet flows: ${fixture.name}`, async () => {
    const offline = await kubeProxyCaseModel(fixture);
    const dump = readRulesDump(splitDump('render', renderIptables(offline.model, {includeJumps: true})));
    const flows = parse(readFileSync(join(fixture.dir, 'flows.yaml'), 'utf8')) as Flow[];

    it('the objects are valid', () => assert.deepEqual(offline.problems, []));

    for (const flow of flows) {
      it(flow.name, () => {
        const origin = nodeIPs.includes(flow.source) ? 'local' : 'arriving';
        const packet = {srcIP: flow.source, dstIP: flow.destination, dstPort: flow.port, protocol: 'TCP', origin} as const;
        const result = traceDump(dump, packet, nodeIPs);
        const context = JSON.stringify({verdict: result.verdict, branches: result.branches, warnings: result.warnings});
        if (flow.output === 'REJECT' || flow.output === 'DROP') {
          assert.equal(result.verdict, flow.output, context);
        } else if (flow.output === '') {
          assert.equal(result.verdict, 'ACCEPT', context);
        } else {
          assert.equal(result.verdict, 'DNAT', context);
          const endpoints = flow.output.split(', ').sort();
          assert.deepEqual(result.branches.map((branch) => branch.endpoint).sort(), endpoints, context);
          for (const branch of result.branches) assert.equal(branch.masquerade, flow.masq ?? false, `${branch.endpoint}: ${context}`);
        }
      });
    }
  });
}
