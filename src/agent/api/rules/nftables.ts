// The nftables backend's RulesBackend for the agent API: core/nftables' render, parse, diff and
// trace. The applied rules are the proxier's listing (`nft -j list table`, NftablesProxier.readApplied).
import {diffNftables, type PartNames, type SameParts, shareSameParts} from '../../../core/nftables/diff.ts';
import {type NftRuleset, type NftSet, parseNftablesJson, parseNftablesScript} from '../../../core/nftables/parse.ts';
import {formatNftablesListing, nftablesListingLinesNear, nftablesListingLinesWith} from '../../../core/nftables/parse-listing.ts';
import {renderNftables} from '../../../core/nftables/render.ts';
import {traceNftables} from '../../../core/nftables/trace.ts';
import type {IPFamily} from '../../../core/model/index.ts';
import type {TouchedObjects} from '../../applied/ruleset-changes.ts';
import type {Host} from '../../host/host.ts';
import type {ParsedRules, RulesBackend} from './backend.ts';

/** parseNftablesText reads either the kernel's JSON listing or an `nft -f` script render wrote. */
export function parseNftablesText(text: string): NftRuleset {
  return text.trimStart().startsWith('{') ? parseNftablesJson(text) : parseNftablesScript(text);
}

/**
 * nftablesRulesBackend: `serviceCIDRs` gives the service CIDRs the proxier's last write used, so
 * that the desired rules the API diffs and traces hold the same drop rule as the table.
 */
export function nftablesRulesBackend(options: {serviceCIDRs?: () => string[]} = {}): RulesBackend {
  return {...nftablesBackend, render: (model) => renderNftables(model, {serviceCIDRs: options.serviceCIDRs?.()})};
}

/** Chains and sets found the same by earlier diffs (the desired rules and a patched reading share most of them). */
const sameParts: SameParts = new WeakMap();

/**
 * Per applied table: the parts that may differ from a desired table (held weakly: a new model's
 * lets the old one go), every other part known to hold the same lines. A whole diff leaves the
 * parts it found differing; a foreign change followed part by part adds the parts it listed again.
 * The next diff against the same desired table then compares those parts alone.
 */
const mayDiffer = new WeakMap<NftRuleset, {desired: WeakRef<NftRuleset>; parts: PartNames}>();

/** The parts of `applied` that may differ from `desired`; undefined when any may (no diff against it since). */
function partsToCompare(desired: NftRuleset, applied: NftRuleset): PartNames | undefined {
  const known = mayDiffer.get(applied);
  return known?.desired.deref() === desired ? known.parts : undefined;
}

export const nftablesBackend: RulesBackend = {
  mode: 'nftables',
  render: (model) => renderNftables(model),
  parse: (text) => parseNftablesText(text) as ParsedRules,
  diff: (desired, applied, service) => {
    const [mine, theirs] = [desired as NftRuleset, applied as NftRuleset];
    const comparedParts = partsToCompare(mine, theirs);
    const result = diffNftables(mine, theirs, {service, sameParts, comparedParts});
    if (service === undefined) {
      mayDiffer.set(theirs, {desired: new WeakRef(mine), parts: result.differingParts});
      // The applied rules keep the desired chains and sets they hold the same of, not copies of their own.
      shareSameParts(mine, theirs, sameParts, comparedParts);
    }
    return {equal: result.equal, groups: result.groups, text: result.text};
  },
  trace: (rules, packet, context) => traceNftables(rules as NftRuleset, packet, context),
  // Searched in the parsed table: its JSON listing, or the text of a patched one, is tens of MB at 10,000 services.
  rulesWith: (rules, needle) => nftablesListingLinesWith(rules as NftRuleset, needle),
  rulesNear: (rules, needle, near) => nftablesListingLinesNear(rules as NftRuleset, needle, near),
};

/**
 * The most chains and sets foreign changes may touch for them to be listed one by one (`nft -j
 * list chain` takes about 0.05 s on a table of 1,000 services); past it the table is listed whole.
 */
const foreignObjectsFollowed = 32;

/**
 * followNftablesChanges: the chains and sets of the rules' table that foreign changes touched,
 * each listed alone (`nft -j list chain|set|map`) and put in place of what `rules` held (a new
 * ruleset sharing the rest); `rules` itself when the table was not touched; undefined when it was
 * touched as a whole (deleted, flushed) or in too many objects.
 */
export async function followNftablesChanges(
  host: Host,
  _family: IPFamily,
  rules: ParsedRules,
  touched: Map<string, TouchedObjects>,
): Promise<ParsedRules | undefined> {
  const ruleset = rules as NftRuleset;
  const objects = touched.get(ruleset.table);
  if (!objects) return rules;
  if (objects.whole || objects.chains.size + objects.sets.size > foreignObjectsFollowed) return undefined;
  const chains = new Map(ruleset.chains);
  const sets = new Map(ruleset.sets);
  const list = (kind: string, name: string) => listObject(host, [kind, ruleset.family, ruleset.table, name]);
  for (const name of objects.chains) {
    const listed = await list('chain', name);
    const chain = listed?.chains.get(name);
    if (chain) chains.set(name, chain);
    else chains.delete(name);
  }
  for (const name of objects.sets) {
    // A set and a map are listed by different words; one not known yet is looked for as both.
    const known = ruleset.sets.get(name)?.kind;
    let listed: NftSet | undefined;
    for (const kind of known ? [known] : ['set', 'map']) listed ??= (await list(kind, name))?.sets.get(name);
    if (listed) sets.set(name, listed);
    else sets.delete(name);
  }
  const followed: NftRuleset = {family: ruleset.family, table: ruleset.table, chains, sets};
  // What may differ from the desired table: what did before, and what the change touched. A
  // chain that picks from an endpoint map reads its elements: a touched map changes its lines.
  const before = mayDiffer.get(ruleset);
  if (before && ![...objects.sets].some((name) => name.startsWith('endpoint-targets-')))
    mayDiffer.set(followed, {
      desired: before.desired,
      parts: {chains: new Set([...before.parts.chains, ...objects.chains]), sets: new Set([...before.parts.sets, ...objects.sets])},
    });
  return followed as ParsedRules;
}

/** One chain or set listed alone and parsed; undefined when it does not exist. */
async function listObject(host: Host, what: string[]): Promise<NftRuleset | undefined> {
  try {
    return parseNftablesJson(await host.nft(['-j', 'list', ...what]), what[2]);
  } catch (error) {
    if (/No such file or directory/.test(String(error))) return undefined;
    throw error;
  }
}

/** Parsed rules as `nft list table` prints them: rules patched after they were read, or kept parsed instead of their text. */
export function formatNftablesRules(rules: ParsedRules): string {
  return formatNftablesListing(rules as NftRuleset);
}
