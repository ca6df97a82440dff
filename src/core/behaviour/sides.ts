// One side of a behaviour diff: a ruleset any tracer reads (iptables, nftables in either layout,
// ipvs), and the addresses the node holds while it runs, since ipvs mode binds every service
// address to kube-ipvs0 and so makes them the node's own.
import {parseIptablesSave, renderIptables, traceIptables, type IptablesRuleset} from '../iptables/index.ts';
import {renderIpvs, type IpvsState} from '../ipvs/index.ts';
import {traceIpvs} from '../ipvs/trace.ts';
import type {ProxyModel} from '../model/types.ts';
import {parseNftablesScript, renderNftables, type NftRuleset} from '../nftables/index.ts';
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
      const context = {localAddresses: nodeAddresses, explain: false};
      return {label, mode: 'iptables', localAddresses: nodeAddresses, trace: (packet) => traceIptables(rules.rules, packet, context)};
    }
    case 'nftables': {
      const context = {localAddresses: nodeAddresses, explain: false};
      return {label, mode: 'nftables', localAddresses: nodeAddresses, trace: (packet) => traceNftables(rules.rules, packet, context)};
    }
    case 'ipvs': {
      const localAddresses = [...nodeAddresses, ...rules.rules.boundAddresses];
      const context = {localAddresses, explain: false};
      return {label, mode: 'ipvs', localAddresses, trace: (packet) => traceIpvs(rules.rules, packet, context)};
    }
  }
}

export interface RenderedSideOptions {
  /** Every address the node holds (NodePorts, addrtype LOCAL); default the model's node IPs. */
  nodeAddresses?: string[];
  /** The cluster's service CIDRs, for nftables mode's drop of unallocated service addresses. */
  serviceCIDRs?: string[];
  label?: string;
}

/** renderedRules: the rules `mode` would write for the model, parsed as a tracer reads them. */
export function renderedRules(model: ProxyModel, mode: ProxyMode, options: RenderedSideOptions = {}): ModeRules {
  switch (mode) {
    case 'iptables':
      return {mode, rules: parseIptablesSave(renderIptables(model, {includeJumps: true}))};
    case 'nftables':
      return {
        mode,
        rules: parseNftablesScript(renderNftables(model, {serviceCIDRs: options.serviceCIDRs, nodeAddresses: options.nodeAddresses})),
      };
    case 'ipvs':
      return {mode, rules: renderIpvs(model)};
  }
}

/** renderedSide: the side a switch to `mode` would bring, for the same objects and settings. */
export function renderedSide(model: ProxyModel, mode: ProxyMode, options: RenderedSideOptions = {}): BehaviourSide {
  return behaviourSide(renderedRules(model, mode, options), options.nodeAddresses ?? model.nodeIPs, options.label);
}
