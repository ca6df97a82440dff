// An observer of nftables mode: kube-proxy's table read as it is, and the desired rules rendered in
// kube-proxy's own layout (a chain per endpoint, the service-ips / service-nodeports verdict maps),
// the second nftables layout of core. kube-proxy 1.34 and later unless the agent's
// --nftables-layout names kube-proxy-1.33; proxyctl's own layout is never what kube-proxy wrote.
import type {IPFamily, ProxyModel} from '../../core/model/index.ts';
import {renderNftables} from '../../core/nftables/render.ts';
import {followNftablesChanges, formatNftablesRules, nftablesBackend} from '../api/rules/nftables.ts';
import type {ParsedRules, RulesBackend} from '../api/rules/backend.ts';
import type {Host} from '../host/host.ts';
import {nftFamily} from '../sync/nftables-proxier.ts';

/** The desired table of an observed node in kube-proxy's nftables layout (see the header). */
function renderKubeProxyLayout(model: ProxyModel, serviceCIDRs: string[]): string {
  const layout = model.config.nftablesLayout === 'kube-proxy-1.33' ? 'kube-proxy-1.33' : 'kube-proxy';
  return renderNftables({...model, config: {...model.config, nftablesLayout: layout}}, {serviceCIDRs});
}

/**
 * The RulesBackend an observer of nftables mode answers with: kube-proxy's table read as it is,
 * desired rules in kube-proxy's layout. A foreign change is followed by listing the chains and
 * sets it touched, and the desired rules are kept per model: a drift check after a change then
 * compares only what changed (the diff skips the chains and sets it found the same before).
 */
export function kubeProxyNftablesBackend(options: {serviceCIDRs: () => string[]}): RulesBackend {
  const kept = new WeakMap<ProxyModel, {cidrs: string; rules: ParsedRules}>();
  const render = (model: ProxyModel) => renderKubeProxyLayout(model, options.serviceCIDRs());
  return {
    ...nftablesBackend,
    render,
    desired: (model) => {
      const cidrs = options.serviceCIDRs().join();
      let known = kept.get(model);
      if (known?.cidrs !== cidrs) kept.set(model, (known = {cidrs, rules: nftablesBackend.parse(render(model))}));
      return known.rules;
    },
    readApplied: (host: Host, family: IPFamily) => listKubeProxyTable(host, family),
    follow: followNftablesChanges,
    format: formatNftablesRules,
    // The table is kept parsed to follow changes: its text is printed from it when asked (as `nft
    // list table` prints it, read or patched alike), not kept as well (16 MiB deflated at 10,000 services).
    textOf: (rules) => () => formatNftablesRules(rules),
  };
}

/** `nft -j list table ip kube-proxy` (ip6 for IPv6); an empty listing when kube-proxy has no table. */
async function listKubeProxyTable(host: Host, family: IPFamily): Promise<string> {
  try {
    return await host.nft(['-j', 'list', 'table', nftFamily(family), 'kube-proxy']);
  } catch (error) {
    if (/No such file or directory/.test(String(error))) return '{"nftables": []}';
    throw error;
  }
}
