// render --service-cidr: nftables mode's drop of traffic to service CIDR addresses that are no
// ClusterIP, as kube-proxy writes it once it knows the ServiceCIDRs; per family, and refused when
// the value is no CIDR. Runs the built CLI (npm run build first).
import assert from 'node:assert/strict';
import {join} from 'node:path';
import {describe, it} from 'node:test';
import {describeRun, root, runPlugin} from './agent-cluster.ts';

const example = join(root, 'examples/cluster.yaml');
// kube-proxy writes the set in braces; nft reads one element the same without them.
const dropRule =
  /^add rule ip kube-proxy cluster-ips-check ip daddr (\{ )?10\.96\.0\.0\/12( \})? drop comment "Drop traffic to unallocated ClusterIPs"$/m;

describe('kubectl proxyctl render --service-cidr', () => {
  it('nftables mode drops the unused addresses of the service CIDRs of its family', async () => {
    const run = await runPlugin(['render', '-f', example, '--mode', 'nftables', '--service-cidr', '10.96.0.0/12,fd00:10:96::/112']);
    assert.equal(run.code, 0, describeRun(run));
    assert.match(run.stdout, dropRule);
    assert.ok(!run.stdout.includes('fd00:10:96::/112'), 'the IPv6 CIDR is not in the IPv4 table');
  });

  it('without it, there is no such rule (kube-proxy before it has seen a ServiceCIDR)', async () => {
    const run = await runPlugin(['render', '-f', example, '--mode', 'nftables']);
    assert.equal(run.code, 0, describeRun(run));
    assert.ok(!run.stdout.includes('Drop traffic to unallocated ClusterIPs'), run.stdout);
  });

  it('a value that is no CIDR is bad input (exit 2) naming the flag', async () => {
    const run = await runPlugin(['render', '-f', example, '--mode', 'nftables', '--service-cidr', '10.96.0.0']);
    assert.equal(run.code, 2, describeRun(run));
    assert.match(run.stderr, /--service-cidr 10\.96\.0\.0: not a CIDR/);
  });
});
