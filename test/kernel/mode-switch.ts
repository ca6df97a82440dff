// The mode-switch check, shared by the files that run it on this kernel and in the qemu guest.
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
  type ProxyMode,
} from '../../src/core/behaviour/index.ts';
import {outcomeKey, outcomeOf} from '../../src/core/behaviour/outcome.ts';
import {parseIptablesSave, renderIptables} from '../../src/core/iptables/index.ts';
import {cidrContains, parseCIDR, parseIP, type ProxyModel} from '../../src/core/model/index.ts';
import {nftablesCleanupScript, parseNftablesJson, renderNftables} from '../../src/core/nftables/index.ts';
import {cleanupRestoreInput, readOwnedRules} from '../../src/agent/sync/owned-rules.ts';
import {execInNamespace, type NodeDescription} from '../../src/lab/netns/index.ts';
import type {ProbeResult} from '../../src/lab/workload/demoapp-client.ts';
import {type NamespaceProber, openProber} from '../../src/lab/workload/launch.ts';
import {demoPorts, kernelUnavailable, nodeAddresses, restoreIptables, saveIptables} from './namespace-lab.ts';
import {type ServiceScenario, serviceCIDR, type Sender} from './service-scenario.ts';

/**
 * ModeAdapter: how one mode's rules get onto a node and go again, as kube-proxy writes and cleans
 * them, and how the node's rules are read back for the tracer.
 */
export interface ModeAdapter {
  mode: ProxyMode;
  load(entry: NodeDescription, model: ProxyModel): Promise<void>;
  /** Removes this mode's rules, as kube-proxy in another mode cleans them up when it starts. */
  cleanUp(entry: NodeDescription): Promise<void>;
  applied(entry: NodeDescription, addresses: string[]): Promise<BehaviourSide>;
}

export const iptablesMode: ModeAdapter = {
  mode: 'iptables',
  async load(entry, model) {
    // iptables mode serves NodePorts on 127.0.0.1 through route_localnet, which it sets.
    await execInNamespace(entry.namespace, ['sysctl', '-qw', 'net.ipv4.conf.all.route_localnet=1']);
    await restoreIptables(entry, renderIptables(model, {includeJumps: true}));
  },
  async cleanUp(entry) {
    for (const table of ['nat', 'filter'] as const) {
      const input = cleanupRestoreInput(readOwnedRules(table, await saveIptables(entry)));
      if (input !== '') await execInNamespace(entry.namespace, ['iptables-restore', '--noflush'], {input});
    }
  },
  async applied(entry, addresses) {
    return behaviourSide({mode: 'iptables', rules: parseIptablesSave(await saveIptables(entry))}, addresses);
  },
};

export const nftablesMode: ModeAdapter = {
  mode: 'nftables',
  async load(entry, model) {
    await execInNamespace(entry.namespace, ['nft', '-f', '-'], {
      input: renderNftables(model, {serviceCIDRs: [serviceCIDR], nodeAddresses: await nodeAddresses(entry)}),
    });
  },
  async cleanUp(entry) {
    await execInNamespace(entry.namespace, ['nft', '-f', '-'], {input: nftablesCleanupScript('IPv4')});
  },
  async applied(entry, addresses) {
    const listing = (await execInNamespace(entry.namespace, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy'])).stdout;
    return behaviourSide({mode: 'nftables', rules: parseNftablesJson(listing)}, addresses);
  },
};

/** switchTo: every node's old mode cleaned up, as kube-proxy in the new mode does when it starts, and the new one loaded. */
async function switchTo(
  scenario: ServiceScenario,
  from: ModeAdapter | undefined,
  to: ModeAdapter,
  models: Map<string, ProxyModel>,
): Promise<void> {
  for (const entry of scenario.lab!.topology.nodes) {
    if (from) await from.cleanUp(entry);
    await to.load(entry, models.get(entry.name)!);
  }
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

async function sendAll(
  classes: PacketClass[],
  senderOf: (packetClass: PacketClass) => Sender,
  probeTimeoutMs: number,
  concurrency: number,
): Promise<Sighting[]> {
  const sightings: Sighting[] = [];
  // One demo client per sending namespace for all its probes: a Node process per probe takes
  // seconds to start in the qemu guest.
  const probers = new Map<string, NamespaceProber>();
  const proberIn = (namespace: string) => {
    let prober = probers.get(namespace);
    if (!prober) probers.set(namespace, (prober = openProber(namespace)));
    return prober;
  };
  try {
    for (let start = 0; start < classes.length; start += concurrency) {
      const batch = classes.slice(start, start + concurrency);
      sightings.push(
        ...(await Promise.all(
          batch.map(async (packetClass) => {
            const sender = senderOf(packetClass);
            const {dstIP, dstPort} = packetClass.packet;
            const result = await proberIn(sender.namespace).probe({protocol: 'tcp', host: dstIP, port: dstPort, timeoutMs: probeTimeoutMs});
            return {result, sender};
          }),
        )),
      );
    }
  } finally {
    await Promise.all([...probers.values()].map((prober) => prober.close()));
  }
  return sightings;
}

function describeClass(packetClass: PacketClass): string {
  return `${packetClass.target} from ${packetClass.source} (${packetClass.packet.srcIP})`;
}

/** The sighting agrees with the outcome: the kind, and for a reply the endpoint and the source it saw. */
function assertAgrees(packetClass: PacketClass, outcome: Outcome, sighting: Sighting, mode: ProxyMode): void {
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

/** A difference the two modes are known for, which the wire must show. */
export type KnownChange = 'node-port-loopback' | 'node-port-not-primary';

/**
 * registerModeSwitch: the case for one switch, over the scenario's cluster (started and closed here).
 * `probeTimeoutMs`: how long a probe that gets through may take (the qemu guest is slower).
 */
export function registerModeSwitch(
  scenario: ServiceScenario,
  from: ModeAdapter,
  to: ModeAdapter,
  options: {known: KnownChange[]; probeTimeoutMs?: number; concurrency?: number},
): void {
  const probeTimeoutMs = options.probeTimeoutMs ?? 1500;
  // Probes at once, through one demo client per sending namespace.
  const concurrency = options.concurrency ?? 8;
  describe(`switching ${from.mode} -> ${to.mode}: the packets change as the behaviour diff says`, {
    concurrency: false,
    // In the qemu guest, beside the host's tests in CI, a case took 140 s.
    timeout: process.env.PROXYCTL_IN_GUEST === '1' ? 900_000 : 300_000,
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

      await switchTo(scenario, undefined, from, models);
      const before = await from.applied(entry, addresses);
      const seenBefore = await sendAll(classes, senderOf, probeTimeoutMs, concurrency);
      await switchTo(scenario, from, to, models);
      const after = await to.applied(entry, addresses);
      const seenAfter = await sendAll(classes, senderOf, probeTimeoutMs, concurrency);

      const diff = diffBehaviour(classes, before, after);
      const predicted = new Set(diff.groups.flatMap((group) => group.changes.map((change) => change.class)));
      const outcome = (side: BehaviourSide, packetClass: PacketClass) =>
        outcomeOf(side.trace(packetClass.packet), (address) => side.localAddresses.includes(address) || address.startsWith('127.'));
      let shown = 0;
      classes.forEach((packetClass, index) => {
        const was = outcome(before, packetClass);
        const will = outcome(after, packetClass);
        assertAgrees(packetClass, was, seenBefore[index], from.mode);
        assertAgrees(packetClass, will, seenAfter[index], to.mode);
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
      // The known differences are among what the wire showed.
      const wireChanged = (packetClass: PacketClass) => {
        const index = classes.indexOf(packetClass);
        return seenBefore[index].result.outcome !== seenAfter[index].result.outcome;
      };
      const knownClasses: Record<KnownChange, PacketClass[]> = {
        'node-port-loopback': classes.filter((packetClass) => packetClass.entry === 'node-port-loopback'),
        'node-port-not-primary': classes.filter(
          (packetClass) =>
            packetClass.entry === 'node-port' && packetClass.packet.dstIP === entry.podGateway && packetClass.source === 'pod-here',
        ),
      };
      for (const known of options.known) {
        assert.ok(knownClasses[known].length > 0, `no class for ${known}`);
        for (const packetClass of knownClasses[known]) assert.ok(wireChanged(packetClass), `${describeClass(packetClass)} did not change`);
      }
      t.diagnostic(`${classes.length} classes sent; ${predicted.size} predicted to change; ${shown} changed on the wire`);
    });
  });
}
