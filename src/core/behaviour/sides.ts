// One side of a behaviour diff: a ruleset any tracer reads (iptables, nftables in either layout,
// ipvs), and the addresses the node holds while it runs, since ipvs mode binds every service
// address to kube-ipvs0 and so makes them the node's own.
import {traceIptables, type IptablesRuleset} from '../iptables/index.ts';
import type {IpvsState} from '../ipvs/index.ts';
import {traceIpvs} from '../ipvs/trace.ts';
import type {NftRuleset} from '../nftables/index.ts';
import {traceNftables} from '../nftables/trace.ts';
import type {Packet, TraceResult} from '../trace/types.ts';

export type ProxyMode = 'iptables' | 'nftables' | 'ipvs';

export type ModeRules =
  | {mode: 'iptables'; rules: IptablesRuleset}
  | {mode: 'nftables'; rules: NftRuleset}
  | {mode: 'ipvs'; rules: IpvsState};

export interface BehaviourSide {
  /** How sentences name it: "iptables mode". */
  label: string;
  mode: ProxyMode;
  trace(packet: Packet): TraceResult;
  /** The node's own addresses while these rules run. */
  localAddresses: string[];
}

/** behaviourSide wraps parsed rules of one mode; `nodeAddresses` are the node's addresses of every kind. */
export function behaviourSide(rules: ModeRules, nodeAddresses: string[], label = `${rules.mode} mode`): BehaviourSide {
  switch (rules.mode) {
    case 'iptables': {
      const context = {localAddresses: nodeAddresses};
      return {label, mode: 'iptables', localAddresses: nodeAddresses, trace: (packet) => traceIptables(rules.rules, packet, context)};
    }
    case 'nftables': {
      const context = {localAddresses: nodeAddresses};
      return {label, mode: 'nftables', localAddresses: nodeAddresses, trace: (packet) => traceNftables(rules.rules, packet, context)};
    }
    case 'ipvs': {
      const localAddresses = [...nodeAddresses, ...rules.rules.boundAddresses];
      const context = {localAddresses};
      return {label, mode: 'ipvs', localAddresses, trace: (packet) => traceIpvs(rules.rules, packet, context)};
    }
  }
}
