// The iptables backend's public surface.
export * from './chains.ts';
export {
  countRules,
  isLargeCluster,
  largeClusterEndpointsThreshold,
  masqueradeMark,
  probabilityText,
  renderIptables,
  renderIptablesChunks,
  renderIptablesWrite,
  insertLine,
  type IptablesRender,
  type IptablesRenderRecord,
  type RenderedTable,
  renderJumpRules,
  type IptablesJumpRule,
  type RenderIptablesOptions,
} from './render.ts';
export {formatIptablesRuleset, IptablesParseError, parseIptablesSave, type ParseOptions} from './parse.ts';
export {
  nodeAddressesComment,
  readNodeAddressesComment,
  type IptablesChain,
  type IptablesRule,
  type IptablesRuleset,
  type RulesetTable,
} from './ruleset.ts';
export {diffIptables, type DiffIptablesOptions, type IptablesDiff, type IptablesDiffGroup} from './diff.ts';
export {traceIptables} from './trace.ts';
export {IptablesSaveSpelling, type SpelledTable} from './save-spelling.ts';
