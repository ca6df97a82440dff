// nftables mode: render (`nft -f` scripts), parse (`nft -j list table`), diff and trace.
export {deleteStaleChains, masqueradeMark, nftablesCleanupScript, nodePortPlan, renderNftables, renderNftablesSync, type NftablesRenderOptions, type NftablesState, type NftablesSync} from './render.ts';
export {isAffinitySetName, isServiceChainName, tableName} from './names.ts';
