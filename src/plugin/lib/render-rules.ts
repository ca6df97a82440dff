// What `render` prints for each proxy mode: the text each kernel tool loads as it is, so that a
// user can read the desired state and also apply it to a scratch network namespace.
import {nodeAddressesComment, renderIptables} from '../../core/iptables/index.ts';
import {dummyDevice, formatIpsetRestore, formatIpvsadmRestore, renderIpvs, withJumpRules} from '../../core/ipvs/index.ts';
import type {ProxyModel} from '../../core/model/index.ts';
import {renderNftables} from '../../core/nftables/index.ts';

export const renderModes = ['iptables', 'nftables', 'ipvs'] as const;
export type RenderMode = (typeof renderModes)[number];

/**
 * The parts of ipvs mode's state, each in the input format of the tool that loads it. ipvs mode
 * needs all four on a node; no single tool reads them all.
 */
export const ipvsParts = ['ipvsadm', 'ipset', 'iptables', 'addresses'] as const;
export type IpvsPart = (typeof ipvsParts)[number];

const ipvsPartTitles: Record<IpvsPart, string> = {
  ipvsadm: 'virtual and real servers: load with ipvsadm-restore',
  ipset: 'ipsets: load with ipset restore',
  iptables: 'iptables layer (nat and filter): load with iptables-restore',
  addresses: `service addresses bound to ${dummyDevice}: load with ip -batch -`,
};

/**
 * renderRules is the desired state of one proxy mode as text. For ipvs, `part` picks one part;
 * without it every part is printed in its own section, in the order they must be loaded (sets
 * before the iptables rules that match them). Section headings start with '#', a comment for
 * each of the four tools.
 */
export function renderRules(
  model: ProxyModel,
  mode: RenderMode,
  part?: IpvsPart,
  options: {serviceCIDRs?: string[]; scheduler?: string} = {},
): string {
  // The node addresses go along, so that `trace --rules` over this text knows the node's own addresses.
  if (mode === 'iptables') return `${nodeAddressesComment(model.nodeIPs)}\n${renderIptables(model, {includeJumps: true})}`;
  if (mode === 'nftables') return renderNftables(model, {serviceCIDRs: options.serviceCIDRs});
  const state = renderIpvs(model, {scheduler: options.scheduler});
  const texts: Record<IpvsPart, string> = {
    ipvsadm: formatIpvsadmRestore(state.virtualServers),
    ipset: formatIpsetRestore(state.sets, state.family),
    // The proxy adds the jumps from the built-in chains itself; a user loading the layer by hand needs them too.
    iptables: withJumpRules(state.iptables),
    addresses:
      [
        `link add ${dummyDevice} type dummy`,
        ...state.boundAddresses.map((address) => `addr add ${address}/${state.family === 'IPv6' ? 128 : 32} dev ${dummyDevice}`),
      ].join('\n') + '\n',
  };
  if (part) return texts[part];
  const order: IpvsPart[] = ['ipset', 'iptables', 'addresses', 'ipvsadm'];
  return order.map((name) => `# ==== ${name}: ${ipvsPartTitles[name]} (render --mode ipvs --part ${name})\n${texts[name]}`).join('\n');
}
