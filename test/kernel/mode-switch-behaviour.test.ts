// What migrate-check predicts is what real packets do. The namespace cluster of service-scenario.ts
// runs mode A (rules rendered for each node, loaded as the proxy loads them); every TCP packet class
// of node-0 that a namespace of the lab can send is sent once; the node then switches to mode B as
// kube-proxy does (B's rules loaded, A's cleaned up), and every class is sent again. Each
// observation must be what the behaviour diff's outcome for that side says, so every change the
// packets show was predicted, and every predicted change the packets can show happened.
//
// What a probe can tell apart: a reply (and from which endpoint, with which source), a refusal, a
// timeout. A refused connection is a REJECT, or an untouched packet to the node itself (nothing
// listens on those ports), or one routed on to the lab's upstream, which holds every address and
// listens on none; so some predicted changes (untouched -> REJECT) look alike on the wire, and are
// checked only as far as they show. Not sent: UDP classes, and segments conntrack marks INVALID
// (no namespace of the lab can make one on purpose).
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {
  behaviourSide,
  diffBehaviour,
  packetClasses,
  type BehaviourSide,
  type Outcome,
  type PacketClass,
} from '../../src/core/behaviour/index.ts';
import {outcomeKey, outcomeOf} from '../../src/core/behaviour/outcome.ts';
import {parseIptablesSave, renderIptables} from '../../src/core/iptables/index.ts';
import {cidrContains, parseCIDR, parseIP, type ProxyModel} from '../../src/core/model/index.ts';
import {nftablesCleanupScript, parseNftablesJson, renderNftables} from '../../src/core/nftables/index.ts';
import {cleanupRestoreInput, readOwnedRules} from '../../src/agent/sync/owned-rules.ts';
import {execInNamespace, type NodeDescription} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {probeFromNamespace} from '../../src/lab/workload/launch.ts';
import {demoPorts, kernelUnavailable, nodeAddresses, restoreIptables, saveIptables} from './namespace-lab.ts';
import {ServiceScenario, serviceCIDR, type Sender} from './service-scenario.ts';

type Mode = 'iptables' | 'nftables';
const scenario = new ServiceScenario();
const probeTimeoutMs = 1500;
const concurrency = 8;

/** load writes mode's rules for every node; the other mode's rules go, as kube-proxy cleans them up on start. */
async function switchTo(mode: Mode, models: Map<string, ProxyModel>): Promise<void> {
  for (const entry of scenario.lab!.topology.nodes) {
    const model = models.get(entry.name)!;
    if (mode === 'iptables') {
      // iptables mode serves NodePorts on 127.0.0.1 through route_localnet, which it sets.
      await execInNamespace(entry.namespace, ['sysctl', '-qw', 'net.ipv4.conf.all.route_localnet=1']);
      await restoreIptables(entry, renderIptables(model, {includeJumps: true}));
      await execInNamespace(entry.namespace, ['nft', '-f', '-'], {input: nftablesCleanupScript('IPv4')});
    } else {
      await execInNamespace(entry.namespace, ['nft', '-f', '-'], {
        input: renderNftables(model, {serviceCIDRs: [serviceCIDR], nodeAddresses: await nodeAddresses(entry)}),
      });
      for (const table of ['nat', 'filter'] as const) {
        const input = cleanupRestoreInput(readOwnedRules(table, await saveIptables(entry)));
        if (input !== '') await execInNamespace(entry.namespace, ['iptables-restore', '--noflush'], {input});
      }
    }
  }
}

/** The rules node-0 holds now, read back from the kernel, as the behaviour diff's side. */
async function appliedSide(mode: Mode, entry: NodeDescription, addresses: string[]): Promise<BehaviourSide> {
  if (mode === 'iptables') return behaviourSide({mode, rules: parseIptablesSave(await saveIptables(entry))}, addresses);
  const listing = (await execInNamespace(entry.namespace, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy'])).stdout;
  return behaviourSide({mode, rules: parseNftablesJson(listing)}, addresses);
}

type Seen = 'reply' | 'refused' | 'timeout' | 'unreachable' | 'error';

/** What a probe may show for an outcome. */
function expectedSightings(outcome: Outcome): Seen[] {
  switch (outcome.verdict) {
    case 'DNAT':
      return ['reply'];
    case 'REJECT':
      return ['refused', 'unreachable'];
    case 'DROP':
      return ['timeout'];
    case 'ACCEPT':
      return outcome.deliveredTo === 'node' ? ['refused'] : ['refused', 'timeout', 'unreachable'];
  }
}

interface Sighting {
  result: ProbeResult;
  sender: Sender;
}

async function sendAll(classes: PacketClass[], senderOf: (packetClass: PacketClass) => Sender): Promise<Sighting[]> {
  const sightings: Sighting[] = [];
  for (let start = 0; start < classes.length; start += concurrency) {
    const batch = classes.slice(start, start + concurrency);
    sightings.push(
      ...(await Promise.all(
        batch.map(async (packetClass) => {
          const sender = senderOf(packetClass);
          const {dstIP, dstPort} = packetClass.packet;
          const [result] = await probeFromNamespace(
            sender.namespace,
            {protocol: 'tcp', host: dstIP, port: dstPort, timeoutMs: probeTimeoutMs},
            1,
          );
          return {result, sender};
        }),
      )),
    );
  }
  return sightings;
}

function describeClass(packetClass: PacketClass): string {
  return `${packetClass.target} from ${packetClass.source} (${packetClass.packet.srcIP})`;
}

/** The sighting agrees with the outcome: the kind, and for a reply the endpoint and the source it saw. */
function assertAgrees(packetClass: PacketClass, outcome: Outcome, sighting: Sighting, mode: Mode): void {
  const what = `${mode}: ${describeClass(packetClass)}: predicted ${outcomeKey(outcome)}, saw ${JSON.stringify(sighting.result)}`;
  assert.ok(expectedSightings(outcome).includes(sighting.result.outcome), what);
  if (sighting.result.outcome !== 'reply') return;
  const endpoint = `${sighting.result.reply.podIP}:${demoPorts.http}`;
  const path = outcome.paths.find((candidate) => candidate.to === endpoint);
  assert.ok(path, `reached ${endpoint}, not a predicted endpoint; ${what}`);
  // The node's own packets take the source address the kernel picks; only other senders' is theirs.
  if (packetClass.source !== 'node')
    assert.equal(sighting.result.reply.clientIP !== sighting.sender.ip, path.masquerade, `masquerade; ${what}`);
}

for (const [from, to] of [
  ['iptables', 'nftables'],
  ['nftables', 'iptables'],
] as const) {
  describe(`switching ${from} -> ${to} on this kernel: the packets change as the behaviour diff says`, {
    concurrency: false,
    timeout: 300_000,
  }, () => {
    const models = new Map<string, ProxyModel>();
    before(async () => {
      if (kernelUnavailable) return;
      const lab = await scenario.start();
      for (const entry of lab.topology.nodes) models.set(entry.name, scenario.modelFor(entry));
    });
    after(() => scenario.close());

    it('every class behaves as predicted before and after, and the changes are the predicted ones', async (t) => {
      if (!scenario.skipUnlessLab(t)) return;
      const entry = scenario.node(0);
      const addresses = await nodeAddresses(entry);
      const model = models.get(entry.name)!;
      const podHere = scenario.pod('pod-0-0');
      const podElsewhere = {...scenario.pod('pod-1-2'), inInterface: entry.interface};
      const clients = scenario.lab!.topology.externalClients;
      assert.equal(clients[0].gateway, entry.ip, 'the clients enter the cluster through node-0');
      const [allowed, other] = [scenario.client(0), scenario.client(1)];
      const clientRoutes = [scenario.lab!.topology.nodeCIDR, ...clients[0].routes].map((text) => parseCIDR(text)!);
      const asNode: Sender = {name: entry.name, namespace: entry.namespace, ip: entry.ip, inInterface: ''};
      const classes = packetClasses(model, {
        nodeAddresses: addresses,
        serviceCIDRs: [serviceCIDR],
        sources: {podHere, podElsewhere, external: other},
      }).filter(
        (packetClass) =>
          packetClass.packet.protocol === 'TCP' &&
          packetClass.entry !== 'conntrack-invalid' &&
          // The clients route only the node network, the service CIDR and the external addresses to node-0.
          (!packetClass.source.startsWith('external') ||
            clientRoutes.some((cidr) => cidrContains(cidr, parseIP(packetClass.packet.dstIP)!))),
      );
      const senderOf = (packetClass: PacketClass): Sender =>
        ({
          'pod-here': podHere,
          'pod-elsewhere': podElsewhere,
          node: asNode,
          external: other,
          'external-denied': other,
          'external-allowed': allowed,
        })[packetClass.source];
      assert.ok(classes.some((packetClass) => packetClass.source === 'external-allowed' && packetClass.packet.srcIP === allowed.ip));

      await switchTo(from, models);
      const before = await appliedSide(from, entry, addresses);
      const seenBefore = await sendAll(classes, senderOf);
      await switchTo(to, models);
      const after = await appliedSide(to, entry, addresses);
      const seenAfter = await sendAll(classes, senderOf);

      const diff = diffBehaviour(classes, before, after);
      const predicted = new Set(diff.groups.flatMap((group) => group.changes.map((change) => change.class)));
      const outcome = (side: BehaviourSide, packetClass: PacketClass) =>
        outcomeOf(side.trace(packetClass.packet), (address) => side.localAddresses.includes(address) || address.startsWith('127.'));
      let shown = 0;
      classes.forEach((packetClass, index) => {
        const was = outcome(before, packetClass);
        const will = outcome(after, packetClass);
        assertAgrees(packetClass, was, seenBefore[index], from);
        assertAgrees(packetClass, will, seenAfter[index], to);
        const changedOnTheWire = seenBefore[index].result.outcome !== seenAfter[index].result.outcome;
        if (changedOnTheWire) {
          shown++;
          assert.ok(predicted.has(packetClass), `${describeClass(packetClass)} changed on the wire but was not predicted`);
        }
        // A predicted change whose two outcomes cannot look alike must show.
        const alike = expectedSightings(was).some((seen) => expectedSightings(will).includes(seen));
        if (predicted.has(packetClass) && !alike)
          assert.ok(
            changedOnTheWire,
            `${describeClass(packetClass)}: predicted ${outcomeKey(was)} -> ${outcomeKey(will)}, the wire showed no change`,
          );
      });
      // The known differences are among what the wire showed: NodePorts on 127.0.0.1, and on an
      // address of the node that is not its primary IP (the pod gateway), answer in iptables mode only.
      const wireChanged = (packetClass: PacketClass) => {
        const index = classes.indexOf(packetClass);
        return seenBefore[index].result.outcome !== seenAfter[index].result.outcome;
      };
      const loopback = classes.filter((packetClass) => packetClass.entry === 'node-port-loopback');
      const secondary = classes.filter(
        (packetClass) =>
          packetClass.entry === 'node-port' && packetClass.packet.dstIP === entry.podGateway && packetClass.source === 'pod-here',
      );
      assert.ok(loopback.length > 0 && secondary.length > 0);
      for (const packetClass of [...loopback, ...secondary])
        assert.ok(wireChanged(packetClass), `${describeClass(packetClass)} did not change`);
      t.diagnostic(`${classes.length} classes sent; ${predicted.size} predicted to change; ${shown} changed on the wire`);
    });
  });
}
