// iptables <-> nftables on this kernel: what the behaviour diff predicts for a switch is what real
// packets do (the check is test/kernel/mode-switch.ts). ipvs pairs: mode-switch-ipvs.test.ts.
import {iptablesMode, nftablesMode, registerModeSwitches} from './mode-switch.ts';
import {ServiceScenario} from './service-scenario.ts';

// NodePorts answer on 127.0.0.1 and on addresses other than the primary node IP in iptables mode only.
const known = ['node-port-loopback', 'node-port-not-primary'] as const;
registerModeSwitches(new ServiceScenario(), [
  {from: iptablesMode, to: nftablesMode, known: [...known]},
  {from: nftablesMode, to: iptablesMode, known: [...known]},
]);
