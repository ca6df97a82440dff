// The nftables backend's RulesBackend for the agent API: core/nftables' render, parse, diff and
// trace. The applied rules are the proxier's listing (`nft -j list table`, NftablesProxier.readApplied).
import {diffNftables} from '../../../core/nftables/diff.ts';
import {type NftRuleset, parseNftablesJson, parseNftablesScript} from '../../../core/nftables/parse.ts';
import {renderNftables} from '../../../core/nftables/render.ts';
import {traceNftables} from '../../../core/nftables/trace.ts';
import type {ParsedRules, RulesBackend} from './backend.ts';

/** parseNftablesText reads either the kernel's JSON listing or an `nft -f` script render wrote. */
export function parseNftablesText(text: string): NftRuleset {
  return text.trimStart().startsWith('{') ? parseNftablesJson(text) : parseNftablesScript(text);
}

/**
 * nftablesRulesBackend: `serviceCIDRs` gives the service CIDRs the proxier's last write used, so
 * that the desired rules the API diffs and traces hold the same drop rule as the table.
 */
export function nftablesRulesBackend(options: {serviceCIDRs?: () => string[]} = {}): RulesBackend {
  return {...nftablesBackend, render: (model) => renderNftables(model, {serviceCIDRs: options.serviceCIDRs?.()})};
}

export const nftablesBackend: RulesBackend = {
  mode: 'nftables',
  render: (model) => renderNftables(model),
  parse: (text) => parseNftablesText(text) as ParsedRules,
  diff: (desired, applied, service) => {
    const result = diffNftables(desired as NftRuleset, applied as NftRuleset, {service});
    return {equal: result.equal, groups: result.groups, text: result.text};
  },
  trace: (rules, packet, context) => traceNftables(rules as NftRuleset, packet, context),
};
