// ipvs <-> nftables and ipvs <-> iptables: what the behaviour diff predicts for leaving or entering
// ipvs mode is what real packets do (the check is test/kernel/mode-switch.ts). This machine's kernel has no
// IP_VS, so on such a host the file boots the qemu guest (scripts/qemu/guest.ts) once and runs its
// cases there.
import {describe} from 'node:test';
import {behaviourSide} from '../../src/core/behaviour/index.ts';
import {renderIpvs} from '../../src/core/ipvs/index.ts';
import {CommandHost} from '../../src/agent/host/command-host.ts';
import {memoryLogger} from '../../src/agent/log.ts';
import {cleanupIpvsMode} from '../../src/agent/sync/ipvs-host.ts';
import {hostHasIpvs} from '../../scripts/qemu/guest.ts';
import {itRunsInGuest} from './in-guest.ts';
import {applyIpvsState, readIpvsState} from './ipvs-state.ts';
import {iptablesMode, type KnownChange, type ModeAdapter, nftablesMode, registerModeSwitches} from './mode-switch.ts';
import {kernelUnavailable} from './namespace-lab.ts';
import {ServiceScenario} from './service-scenario.ts';

const inGuest = process.env.PROXYCTL_IN_GUEST === '1';
// hostHasIpvs loads ip_vs when it can: in the guest too, before any namespace asks for its sysctls.
const runHere = !kernelUnavailable && (hostHasIpvs() || inGuest);

const ipvsMode: ModeAdapter = {
  mode: 'ipvs',
  load: (entry, model) => applyIpvsState(entry, renderIpvs(model)),
  async cleanUp(entry) {
    const result = await cleanupIpvsMode(new CommandHost({netns: entry.namespace}), memoryLogger(), ['IPv4']);
    if (result.errors.length > 0) throw new Error(`ipvs cleanup on ${entry.name}: ${result.errors.join('; ')}`);
  },
  applied: async (entry, addresses) => behaviourSide({mode: 'ipvs', rules: await readIpvsState(entry)}, addresses),
};

const unavailable = () => (kernelUnavailable ? `needs root: ${kernelUnavailable}` : 'runs in the qemu guest (see the guest case)');

if (!runHere && !kernelUnavailable) {
  describe('leaving and entering ipvs mode in a kernel with IP_VS', () => itRunsInGuest(import.meta.url, {timeoutMs: 1_400_000}));
} else {
  // The emulated guest is slower: a probe that gets through may take seconds.
  const probeTimeoutMs = inGuest ? 4000 : 1500;
  const concurrency = 8;
  // One cluster for the four switches into and out of ipvs mode. NodePorts answer on 127.0.0.1 in
  // iptables mode only.
  const loopback: KnownChange[] = ['node-port-loopback'];
  registerModeSwitches(
    new ServiceScenario(unavailable),
    [
      {from: iptablesMode, to: ipvsMode, known: loopback},
      {from: ipvsMode, to: nftablesMode, known: []},
      {from: nftablesMode, to: ipvsMode, known: []},
      {from: ipvsMode, to: iptablesMode, known: loopback},
    ],
    {probeTimeoutMs, concurrency},
  );
}
