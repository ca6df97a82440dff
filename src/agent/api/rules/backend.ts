// RulesBackend: the pure parts of a proxy backend that the agent API answers with (render the
// desired rules, parse what the kernel holds, diff the two, trace a packet), behind one interface so
// that the runtime does not care which mode wrote the rules. The three backends sit beside it:
// iptables.ts, nftables.ts, ipvs.ts.
import type {IPFamily, ProxyModel} from '../../../core/model/index.ts';
import type {Host} from '../../host/host.ts';
import type {Packet, TraceContext, TraceResult} from '../../../core/trace/types.ts';
import type {DiffGroup, ProxyMode} from '../../../protocol/methods.ts';
import type {ParsedRules} from '../../applied/applied-state.ts';
import type {ChainsWritten} from '../../sync/types.ts';
import type {TouchedObjects} from '../../applied/ruleset-changes.ts';
import {errorText} from '../../../core/error-text.ts';

/** A parsed ruleset; only the backend that made it looks inside. */
export type {ParsedRules} from '../../applied/applied-state.ts';

export interface RulesDiff {
  equal: boolean;
  groups: DiffGroup[];
  text: string;
}

export interface RulesBackend {
  mode: ProxyMode;
  /** The complete ruleset the model asks for, in the syntax the kernel tools print. */
  render(model: ProxyModel): string;
  parse(text: string): ParsedRules;
  /**
   * The desired rules of `model` parsed, as parse(render(model)) reads them; a backend may keep
   * them while the model lives. Without it, they are rendered and parsed for each use.
   */
  desired?(model: ProxyModel): ParsedRules;
  /** Makes what desired(model) will give, off the main thread where the backend can; desired() makes it there otherwise. */
  prepareDesired?(model: ProxyModel): Promise<void>;
  /** `service`: "namespace/name[:port]" limits the diff to that service. */
  diff(desired: ParsedRules, applied: ParsedRules, service?: string): RulesDiff;
  trace(rules: ParsedRules, packet: Packet, context: TraceContext): TraceResult;
  /**
   * The rules with the chains a partial write replaced taken from `tables` (a new value; `rules`
   * stays as it was): what the agent wrote, without reading the kernel again. Without it, such a
   * write makes the next request read the kernel.
   */
  patch?(rules: ParsedRules, tables: ChainsWritten[]): ParsedRules;
  /** The text of parsed rules, as the kernel tools print them (for patched rules). */
  format?(rules: ParsedRules): string;
  /**
   * The rule lines of the rules' text (format's) that hold `needle`, found without putting that
   * text together; undefined when the rules do not keep their text in pieces (search the text).
   */
  rulesWith?(rules: ParsedRules, needle: string): Iterable<string> | undefined;
  /**
   * rulesWith, only in the pieces (chains, sets) that the rule lines `near` name
   * (AppliedText.linesNear); undefined when the rules do not keep their text in pieces.
   */
  rulesNear?(rules: ParsedRules, needle: string, near: readonly string[]): Iterable<string> | undefined;
  /**
   * Reads back the text parsed rules were read from, when they keep it as it was given, or prints
   * them again as the kernel tools would (rules kept parsed anyway); undefined when neither.
   */
  textOf?(rules: ParsedRules): (() => string) | undefined;
  /**
   * The applied rules brought up to date with foreign changes by reading only the objects they
   * touched (every table of the family the monitor named is in `touched`; a backend looks at the
   * tables it reads): `rules` itself when none of those was touched, undefined when the changes
   * cannot be followed so (the whole tables are read again).
   */
  follow?(host: Host, family: IPFamily, rules: ParsedRules, touched: Map<string, TouchedObjects>): Promise<ParsedRules | undefined>;
  /** Reads the applied rules from the kernel; default iptables-save -t filter + -t nat. */
  readApplied?(host: Host, family: IPFamily): Promise<string>;
}
