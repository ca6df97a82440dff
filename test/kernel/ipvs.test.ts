// ipvs mode against the kernel: render each node's model, load the virtual servers, ipsets,
// kube-ipvs0 addresses and iptables layer into the node namespaces of a namespace cluster, send real
// TCP and UDP, and check what the endpoints saw, what the tracer predicted from the state read back,
// and that the state read back equals the desired one.
//
// This machine's kernel has no IP_VS, so on such a host the file boots a qemu guest with Debian's
// stock kernel (scripts/qemu/guest.ts) once and runs all its cases there in one go.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {diffIpvs, planIpvsSync, renderIpvs, traceIpvs, type IpvsState} from '../../src/core/ipvs/index.ts';
import type {EndpointSliceInput} from '../../src/core/model/index.ts';
import {execInNamespace, type NodeDescription} from '../../src/lab/netns/index.ts';
import {hostHasIpvs} from '../../scripts/qemu/guest.ts';
import {itRunsInGuest} from './in-guest.ts';
import {applyIpvsState, readIpvsState} from './ipvs-state.ts';
import {demoPorts, kernelUnavailable, nodeAddresses} from './namespace-lab.ts';
import {
  clusterIPs,
  firstPacket,
  type ModeBehaviour,
  type NodeTracer,
  replies,
  ServiceScenario,
  sharedServiceCases,
  slice,
} from './service-scenario.ts';

/** Where this file's cases run: here (root, kernel with IP_VS), in a qemu guest, or nowhere (and why). */
const inGuest = process.env.PROXYCTL_IN_GUEST === '1';
const runHere = !kernelUnavailable && (inGuest || hostHasIpvs());

const scenario = new ServiceScenario(() =>
  kernelUnavailable ? `needs root: ${kernelUnavailable}` : 'runs in the qemu guest (see the guest case)',
);
const desiredStates = new Map<string, IpvsState>();
const appliedStates = new Map<string, IpvsState>();

/**
 * What ipvs mode does differently: a virtual server stays without real servers (the node's stack
 * answers instead of a DROP rule), rr spreads exactly evenly, hairpin is masqueraded through
 * KUBE-LOOP-BACK, and the emulated guest is slower.
 */
const ipvsBehaviour: ModeBehaviour = {
  noLocalEndpoint: 'not-delivered',
  hairpinSource: 'masqueraded',
  spread: 'round-robin',
  probeTimeoutMs: 4000,
  dropTimeoutMs: 2000,
  refusalWithinMs: 2000,
};

/** desiredFor renders what the proxy on `entry` wants for these objects. */
function desiredFor(entry: NodeDescription, slices: EndpointSliceInput[]): IpvsState {
  return renderIpvs(scenario.modelFor(entry, slices));
}

const trace: NodeTracer = (entry, sender, target) =>
  traceIpvs(appliedStates.get(entry.name)!, firstPacket(sender, target), {localAddresses: scenario.localAddresses.get(entry.name)!});

describe('ipvs mode in a kernel with IP_VS', {concurrency: false, timeout: 1_500_000}, () => {
  if (!runHere && !kernelUnavailable) {
    itRunsInGuest(import.meta.url, {timeoutMs: 1_400_000});
    return;
  }

  before(async () => {
    if (!runHere) return;
    assert.ok(hostHasIpvs(), 'modprobe ip_vs failed in a kernel that should have it');
    const lab = await scenario.start();
    for (const entry of lab.topology.nodes) {
      const desired = desiredFor(entry, scenario.slices);
      await applyIpvsState(entry, desired);
      desiredStates.set(entry.name, desired);
      appliedStates.set(entry.name, await readIpvsState(entry));
      scenario.localAddresses.set(entry.name, await nodeAddresses(entry));
    }
  });
  after(() => scenario.close());

  it('the state read back from the kernel equals the desired state', (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    for (const entry of scenario.lab!.topology.nodes) {
      const diff = diffIpvs(desiredStates.get(entry.name)!, appliedStates.get(entry.name)!);
      assert.ok(diff.equal, `${entry.name}:\n${diff.text}`);
    }
  });

  sharedServiceCases(scenario, trace, ipvsBehaviour);

  // Last: it changes the state the cases above rely on.
  it('an incremental sync swaps one endpoint; the removed one drains at weight 0 and gets no new connections', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const entry = scenario.node(0);
    const at = (name: string) => scenario.at(name);
    const slices = scenario.slices.map((candidate) =>
      candidate.metadata?.name === 'web-1' ? slice('web', [at('pod-0-1'), at('pod-0-2')], true) : candidate,
    );
    const desired = desiredFor(entry, slices);
    const plan = planIpvsSync(desired, await readIpvsState(entry));
    const removed = `TCP ${clusterIPs.web}:80 -> ${at('pod-1-0').ip}:${demoPorts.http}`;
    assert.ok(plan.draining.includes(removed), `draining ${plan.draining.join(', ')}`);
    assert.deepEqual([plan.bind, plan.unbind], [[], []]);
    assert.ok(
      plan.ipvsadm.trim().split('\n').length <= 2 && plan.ipvsadm.includes('-w 0'),
      `only the changed real servers:\n${plan.ipvsadm}`,
    );
    // ipvsadm -R adds to the table; ipvsadm-restore would clear it first.
    await execInNamespace(entry.namespace, ['ipvsadm', '-R'], {input: plan.ipvsadm});
    if (plan.ipset) await execInNamespace(entry.namespace, ['ipset', 'restore'], {input: plan.ipset});

    const after = await readIpvsState(entry);
    const web = after.virtualServers.find((server) => server.address === clusterIPs.web && server.port === 80)!;
    assert.deepEqual(
      web.realServers.map((real) => `${real.address}:${real.weight}`).sort(),
      [`${at('pod-0-1').ip}:1`, `${at('pod-0-2').ip}:1`, `${at('pod-1-0').ip}:0`].sort(),
    );
    assert.equal(planIpvsSync(desired, after).changes, 0, 'nothing left to change while the endpoint drains');
    const sender = scenario.pod('pod-0-0');
    const results = replies(
      await scenario.send(sender, {protocol: 'tcp', ip: clusterIPs.web, port: 80}, 10, ipvsBehaviour.probeTimeoutMs),
      'after the incremental sync',
    );
    assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].sort(), ['pod-0-1', 'pod-0-2']);

    // Both of the service's ports (TCP 80 and UDP 53) drained pod-1-0.
    const drop = planIpvsSync(desired, after, {drained: new Set(plan.draining)});
    await execInNamespace(entry.namespace, ['ipvsadm', '-R'], {input: drop.ipvsadm});
    const diff = diffIpvs(desired, await readIpvsState(entry));
    assert.ok(diff.equal, `once drained, the kernel holds exactly the desired state:\n${diff.text}`);
  });
});
