// Behaviour diff: two rulesets compared by what they do to each class of packet, not by their text.
export {
  defaultSources,
  packetClasses,
  sourceText,
  uplinkInterface,
  type ClassOptions,
  type EntryKind,
  type PacketClass,
  type SourceKind,
  type Sources,
} from './classes.ts';
export {answers, describeOutcome, outcomeKey, outcomeOf, type Outcome, type OutcomePath} from './outcome.ts';
export {
  behaviourSide,
  renderedRules,
  renderedSide,
  type BehaviourSide,
  type ModeRules,
  type ProxyMode,
  type RenderedSideOptions,
} from './sides.ts';
export {
  changeSentence,
  diffBehaviour,
  sentenceGroups,
  type BehaviourChange,
  type BehaviourDiff,
  type BehaviourSummary,
  type DiffBehaviourOptions,
  type ServicePortChanges,
  type SideWords,
} from './diff.ts';
export {
  hostSocketSentences,
  parseListeningSockets,
  socketsOnServiceAddresses,
  socketText,
  type HostSocketFindings,
  type ListeningSocket,
  type SocketOnServiceAddresses,
} from './host-sockets.ts';
