// The iptables backend's RulesBackend: core/iptables' render, parse, diff and trace.
import {diffIptables} from '../../core/iptables/diff.ts';
import {parseIptablesSave} from '../../core/iptables/parse.ts';
import {renderIptables} from '../../core/iptables/render.ts';
import {traceIptables} from '../../core/iptables/trace.ts';
import type {ParsedRules, RulesBackend} from './rules-backend.ts';

type IptablesRules = ReturnType<typeof parseIptablesSave>;

export const iptablesBackend: RulesBackend = {
  mode: 'iptables',
  render: (model) => renderIptables(model, {includeJumps: true}),
  parse: (text) => parseIptablesSave(text) as ParsedRules,
  diff: (desired, applied, service) => {
    const result = diffIptables(desired as IptablesRules, applied as IptablesRules, {service});
    return {equal: result.equal, groups: result.groups, text: result.text};
  },
  trace: (rules, packet, context) => traceIptables(rules as IptablesRules, packet, context),
};
