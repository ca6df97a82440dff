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
import {after, before, describe, it, type TestContext} from 'node:test';
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

/**
 * sendAll sends one probe per class and returns the sightings in the classes' order. The probes go
 * through a pool of `concurrency` at once, so a probe that waits out its timeout holds up one slot,
 * not a batch, and each from the scenario's demo client in its sender's namespace.
 */
async function sendAll(scenario: ServiceScenario, plan: ProbePlan, probeTimeoutMs: number, concurrency: number): Promise<Sighting[]> {
  const sightings: Sighting[] = new Array(plan.classes.length);
  let next = 0;
  const worker = async () => {
    for (let index = next++; index < plan.classes.length; index = next++) {
      const sender = plan.senderOf(plan.classes[index]);
      const {dstIP, dstPort} = plan.classes[index].packet;
      const [result] = await scenario.send(sender, {protocol: 'tcp', ip: dstIP, port: dstPort}, 1, probeTimeoutMs);
      sightings[index] = {result, sender};
    }
  };
  await Promise.all(Array.from({length: Math.min(concurrency, plan.classes.length)}, worker));
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

/** One switch of a node from one mode to another, and the differences the wire must show for it. */
export interface ModeSwitch {
  from: ModeAdapter;
  to: ModeAdapter;
  known: KnownChange[];
}

/** What was sent, and where from: every TCP class of node-0 that a namespace of the lab can send. */
interface ProbePlan {
  entry: NodeDescription;
  addresses: string[];
  classes: PacketClass[];
  senderOf(packetClass: PacketClass): Sender;
}

function probePlan(scenario: ServiceScenario, model: ProxyModel, addresses: string[]): ProbePlan {
  const entry = scenario.node(0);
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
      (!packetClass.source.startsWith('external') || clientRoutes.some((cidr) => cidrContains(cidr, parseIP(packetClass.packet.dstIP)!))),
  );
  assert.ok(classes.some((packetClass) => packetClass.source === 'external-allowed' && packetClass.packet.srcIP === allowed.ip));
  const senders: Record<PacketClass['source'], Sender> = {
    'pod-here': podHere,
    'pod-elsewhere': podElsewhere,
    node: asNode,
    external: other,
    'external-denied': other,
    'external-allowed': allowed,
  };
  return {entry, addresses, classes, senderOf: (packetClass) => senders[packetClass.source]};
}

/** A mode loaded on every node, as the tracer reads it back on node-0 and as the packets showed it. */
interface ModeSeen {
  mode: ModeAdapter;
  side: BehaviourSide;
  sightings: Sighting[];
}

/**
 * registerModeSwitches: one case per switch, in order, over one cluster of the scenario (started and
 * closed here). Each switch starts from the mode the one before it left on the nodes, so a chain
 * A -> B -> A sends every class three times, not four; a switch whose `from` is not what the nodes
 * hold (the first, or one after a failed switch) loads it first.
 * `probeTimeoutMs`: how long a probe that gets through may take (the qemu guest is slower).
 */
export function registerModeSwitches(
  scenario: ServiceScenario,
  switches: ModeSwitch[],
  options: {probeTimeoutMs?: number; concurrency?: number} = {},
): void {
  const probeTimeoutMs = options.probeTimeoutMs ?? 1500;
  // Probes at once, through one demo client per sending namespace.
  const concurrency = options.concurrency ?? 8;
  const chain = [switches[0].from, ...switches.map((step) => step.to)].map((adapter) => adapter.mode).join(' -> ');
  describe(`switching ${chain}: the packets change as the behaviour diff says`, {
    concurrency: false,
    timeout: (process.env.PROXYCTL_IN_GUEST === '1' ? 300_000 : 120_000) * switches.length,
  }, () => {
    const models = new Map<string, ProxyModel>();
    let plan: ProbePlan | undefined;
    // The mode the nodes hold once a switch has loaded it; `seen` only once its probes are in.
    let loaded: ModeAdapter | undefined;
    let seen: ModeSeen | undefined;
    before(async () => {
      if (kernelUnavailable) return;
      const lab = await scenario.start();
      for (const entry of lab.topology.nodes) models.set(entry.name, scenario.modelFor(entry));
      const entry = scenario.node(0);
      plan = probePlan(scenario, models.get(entry.name)!, await nodeAddresses(entry));
    });
    after(() => scenario.close());

    const look = async (mode: ModeAdapter): Promise<ModeSeen> => ({
      mode,
      side: await mode.applied(plan!.entry, plan!.addresses),
      sightings: await sendAll(scenario, plan!, probeTimeoutMs, concurrency),
    });

    for (const step of switches)
      it(`${step.from.mode} -> ${step.to.mode}: every class behaves as predicted before and after, and the changes are the predicted ones`, async (t) => {
        if (!scenario.skipUnlessLab(t)) return;
        if (seen?.mode !== step.from) {
          seen = undefined;
          await switchTo(scenario, loaded, step.from, models);
          loaded = step.from;
          seen = await look(step.from);
        }
        const before = seen;
        seen = undefined;
        await switchTo(scenario, step.from, step.to, models);
        loaded = step.to;
        const after = await look(step.to);
        seen = after;
        assertSwitchAsPredicted(t, plan!, before, after, step.known);
      });
  });
}

/**
 * assertSwitchAsPredicted: every sighting agrees with its side's outcome, every change the wire shows
 * was predicted, every predicted change that cannot look alike on the wire shows, and the known
 * differences are among what it showed.
 */
function assertSwitchAsPredicted(t: TestContext, plan: ProbePlan, before: ModeSeen, after: ModeSeen, known: KnownChange[]): void {
  const {classes, entry} = plan;
  const diff = diffBehaviour(classes, before.side, after.side);
  const predicted = new Set(diff.groups.flatMap((group) => group.changes.map((change) => change.class)));
  const outcome = (side: BehaviourSide, packetClass: PacketClass) =>
    outcomeOf(side.trace(packetClass.packet), (address) => side.localAddresses.includes(address) || address.startsWith('127.'));
  const wireChanged = (index: number) => before.sightings[index].result.outcome !== after.sightings[index].result.outcome;
  let shown = 0;
  classes.forEach((packetClass, index) => {
    const was = outcome(before.side, packetClass);
    const will = outcome(after.side, packetClass);
    assertAgrees(packetClass, was, before.sightings[index], before.mode.mode);
    assertAgrees(packetClass, will, after.sightings[index], after.mode.mode);
    if (wireChanged(index)) {
      shown++;
      assert.ok(predicted.has(packetClass), `${describeClass(packetClass)} changed on the wire but was not predicted`);
    }
    // A predicted change whose two outcomes cannot look alike must show.
    const alike = expectedSightings(was).some((sighting) => expectedSightings(will).includes(sighting));
    if (predicted.has(packetClass) && !alike)
      assert.ok(
        wireChanged(index),
        `${describeClass(packetClass)}: predicted ${outcomeKey(was)} -> ${outcomeKey(will)}, the wire showed no change`,
      );
  });
  const knownClasses: Record<KnownChange, PacketClass[]> = {
    'node-port-loopback': classes.filter((packetClass) => packetClass.entry === 'node-port-loopback'),
    'node-port-not-primary': classes.filter(
      (packetClass) =>
        packetClass.entry === 'node-port' && packetClass.packet.dstIP === entry.podGateway && packetClass.source === 'pod-here',
    ),
  };
  for (const change of known) {
    assert.ok(knownClasses[change].length > 0, `no class for ${change}`);
    for (const packetClass of knownClasses[change])
      assert.ok(wireChanged(classes.indexOf(packetClass)), `${describeClass(packetClass)} did not change`);
  }
  t.diagnostic(`${classes.length} classes sent; ${predicted.size} predicted to change; ${shown} changed on the wire`);
}
