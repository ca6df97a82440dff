// iptables mode against the kernel: render the rules of each node's model, restore them into the
// node namespaces of a namespace cluster, send real TCP and UDP from pods and external clients,
// and check what the endpoints saw. Each case also traces the rules read back from the kernel
// and checks the tracer predicted what the kernel did. Runs through iptables-nft and iptables-legacy.
import {after, before, describe} from 'node:test';
import {parseIptablesSave, renderIptables, traceIptables} from '../../src/core/iptables/index.ts';
import {addChosenEndpointServices, registerChosenEndpointCases} from './chosen-endpoints.ts';
import {kernelUnavailable, nodeAddresses, restoreIptables, saveIptables} from './namespace-lab.ts';
import {firstPacket, type NodeTracer, ServiceScenario, sharedServiceCases} from './service-scenario.ts';

// Both kernel interfaces iptables can drive: rules written through either must behave the same,
// and the parser must read either front end's iptables-save.
for (const frontEnd of ['nft', 'legacy'] as const) {
  const scenario = new ServiceScenario();
  const savedRules = new Map<string, string>();

  /** trace walks the rules read back from the entry node. */
  const trace: NodeTracer = (entry, sender, target) =>
    traceIptables(parseIptablesSave(savedRules.get(entry.name)!), firstPacket(sender, target), {
      localAddresses: scenario.localAddresses.get(entry.name)!,
    });

  describe(`iptables rules in the kernel (iptables-${frontEnd})`, {concurrency: false, timeout: 120_000}, () => {
    before(async () => {
      if (kernelUnavailable) return;
      const lab = await scenario.start();
      addChosenEndpointServices(scenario);
      // Every node gets the rules its own proxy would write; node-1's differ for Local policies.
      for (const entry of lab.topology.nodes) {
        await restoreIptables(entry, renderIptables(scenario.modelFor(entry), {includeJumps: true}), frontEnd);
        savedRules.set(entry.name, await saveIptables(entry, frontEnd));
        scenario.localAddresses.set(entry.name, await nodeAddresses(entry));
      }
    });
    after(() => scenario.close());

    sharedServiceCases(scenario, trace);
    registerChosenEndpointCases(scenario, trace);
  });
}
