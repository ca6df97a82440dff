// nftables mode: render (`nft -f` scripts), parse (`nft -j list table`), diff and trace.
export {
  deleteStaleChains,
  endpointTargetsMap,
  masqueradeMark,
  nftablesCleanupScript,
  nodePortPlan,
  renderNftables,
  renderNftablesSync,
  type NftablesRenderOptions,
  type NftablesState,
  type NftablesSync,
} from './render.ts';
export {isAffinitySetName, isServiceChainName, servicePortChains, type ServicePortChains, tableName} from './names.ts';
export {
  parseNftablesJson,
  parseNftablesScript,
  listSpelling,
  exprText,
  statementText,
  ruleComment,
  ruleText,
  type NftChain,
  type NftRule,
  type NftRuleset,
  type NftSet,
  type NftSetElement,
} from './parse.ts';
export {parseNftablesListing} from './parse-listing.ts';
export {kubeProxyBaseChains, kubeProxyBaseChainsBefore134} from './kube-proxy-layout.ts';
export {traceNftables} from './trace.ts';
export {diffNftables, type DiffGroup, type NftablesDiff} from './diff.ts';
