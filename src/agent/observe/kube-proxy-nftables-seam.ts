// THE SEAM for kube-proxy's own nftables layout, in an observing agent.
//
// kube-proxy's nftables mode writes a chain per endpoint and the `service-ips` /
// `service-nodeports` verdict maps; proxyctl's nftables renderer (core/nftables) keeps kube-proxy's
// table, chain and map names but picks endpoints through `endpoint-targets-*` data maps, so its
// render is not what kube-proxy programs. The kube-proxy layout is a second nftables layout of
// core (ProxyConfig `nftablesLayout: 'kube-proxy'`). Until core has it, an observer of nftables
// mode reads and traces kube-proxy's table (the listing is parsed as any `nft -j` listing) but
// its desired rules are in proxyctl's layout, so diff and drift show layout differences; status
// says so (`kubeProxyNftablesLayoutProblem`).
//
// To plug the layout in: render with it in `renderKubeProxyLayout` below (e.g.
// `renderNftables({...model, config: {...model.config, nftablesLayout: 'kube-proxy'}}, {serviceCIDRs})`),
// and make `kubeProxyNftablesLayoutRendered` true. Nothing else in the agent changes: parse,
// diff and trace are core/nftables' and take either layout.
import type {IPFamily, ProxyModel} from '../../core/model/index.ts';
import {renderNftables} from '../../core/nftables/render.ts';
import {nftablesBackend} from '../api/rules/nftables.ts';
import type {RulesBackend} from '../api/rules/backend.ts';
import type {Host} from '../host/host.ts';
import {nftFamily} from '../sync/nftables-proxier.ts';

/** True once renderKubeProxyLayout renders kube-proxy's layout rather than proxyctl's. */
export const kubeProxyNftablesLayoutRendered = false;

/** What status says while the layout is not rendered. */
export const kubeProxyNftablesLayoutProblem =
  "this build renders proxyctl's nftables layout, not kube-proxy's: diff and drift show layout differences as well as real ones; trace reads kube-proxy's table as it is";

/** The desired table of an observed node in kube-proxy's nftables layout (see the header). */
function renderKubeProxyLayout(model: ProxyModel, serviceCIDRs: string[]): string {
  return renderNftables(model, {serviceCIDRs});
}

/** The RulesBackend an observer of nftables mode answers with: kube-proxy's table read as it is, desired rules in kube-proxy's layout. */
export function kubeProxyNftablesBackend(options: {serviceCIDRs: () => string[]}): RulesBackend {
  return {
    ...nftablesBackend,
    render: (model) => renderKubeProxyLayout(model, options.serviceCIDRs()),
    readApplied: (host: Host, family: IPFamily) => listKubeProxyTable(host, family),
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
