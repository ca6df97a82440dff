// ipvs mode: render the ProxyModel to virtual servers, ipsets, kube-ipvs0 addresses and the small
// iptables layer; read that state back; diff and trace it.
export {renderIpvs, ipsetName, ipsetNames, nodePortAddresses, ipvsIptablesChains, ipvsJumpRules, type RenderIpvsOptions} from './render.ts';
export {
  compare as compareIpvsNames,
  sortedIncludes,
  sortedIndex,
  flagProtocol,
  dummyDevice,
  formatIpsetRestore,
  formatIpvsadmRestore,
  ipvsadmRuns,
  parseBoundAddresses,
  parseIpsetSave,
  parseIpvsadmSave,
  parseIpvsadmSaveSince,
  patchedServers,
  serverNamed,
  virtualServerKey,
  virtualServerLines,
  virtualServerText,
  type IpvsadmBlock,
  IpvsParseError,
  type Ipset,
  type IpvsRealServer,
  type IpvsState,
  type IpvsVirtualServer,
} from './state.ts';
export {
  savedTextSince,
  ServerTableComparison,
  ServerTableShaper,
  type SpelledSince,
  serverTableBlocks,
  serverTableShape,
  serverTableShapeBytes,
} from './kernel-table.ts';
export {
  desiredServerOwners,
  diffIpvs,
  ipvsDiffText,
  withJumpRules,
  type DiffIpvsOptions,
  type IpvsDiff,
  type IpvsDiffGroup,
} from './diff.ts';
export {traceIpvs} from './trace.ts';
export {accessFilterVerdict, tableSection, type AccessFilterVerdict} from './access-filter.ts';
export {planIpvsSync, realServerKey, type IpvsSyncOptions, type IpvsSyncPlan} from './sync.ts';
