// diffBehaviour: the packet classes traced through two rulesets, and those whose outcomes differ,
// grouped by service port. Pure: the caller parses the rules and prints the answer.
import type {EntryKind, PacketClass} from './classes.ts';
import {sourceText} from './classes.ts';
import {answers, changedAspects, describeOutcome, localAddressCheck, outcomeKey, outcomeOf, type Outcome} from './outcome.ts';
import type {BehaviourSide} from './sides.ts';

export interface BehaviourChange {
  class: PacketClass;
  before: Outcome;
  after: Outcome;
  /** What changed: 'verdict', 'delivery', 'endpoints', 'masquerade', 'affinity'. */
  aspects: string[];
  /** A warning either tracer gave for this class (rules it could not read, say). */
  warnings?: string[];
}

export interface ServicePortChanges {
  /** "ns/name:port"; '' for the node-wide classes. */
  servicePort: string;
  changes: BehaviourChange[];
}

export interface BehaviourSummary {
  classes: number;
  servicePorts: number;
  changedClasses: number;
  changedServicePorts: number;
  /** Changed classes per entry point. */
  byEntry: Partial<Record<EntryKind, number>>;
  /** Classes that answer under `before` and would not under `after`, and the reverse. */
  stopAnswering: number;
  startAnswering: number;
}

export interface BehaviourDiff {
  before: string;
  after: string;
  equal: boolean;
  groups: ServicePortChanges[];
  summary: BehaviourSummary;
}

export interface DiffBehaviourOptions {
  /** Called as classes are traced (done of total), for a progress bar. */
  onProgress?: (done: number, total: number) => void;
}

const progressEvery = 1000;

/** Warnings that speak of the rules' reading, not of the packet's fate, are worth passing on. */
function readingWarnings(warnings: string[]): string[] {
  return warnings.filter((warning) => /cannot (evaluate|be read)|not modelled|treated as not matching/.test(warning));
}

export function diffBehaviour(
  classes: PacketClass[],
  before: BehaviourSide,
  after: BehaviourSide,
  options: DiffBehaviourOptions = {},
): BehaviourDiff {
  const localBefore = localAddressCheck(before.localAddresses);
  const localAfter = localAddressCheck(after.localAddresses);
  const groups = new Map<string, ServicePortChanges>();
  const servicePorts = new Set<string>();
  const summary: BehaviourSummary = {
    classes: classes.length,
    servicePorts: 0,
    changedClasses: 0,
    changedServicePorts: 0,
    byEntry: {},
    stopAnswering: 0,
    startAnswering: 0,
  };
  classes.forEach((packetClass, index) => {
    if (packetClass.servicePort) servicePorts.add(packetClass.servicePort);
    if (options.onProgress && index % progressEvery === 0) options.onProgress(index, classes.length);
    const beforeTrace = before.trace(packetClass.packet);
    const afterTrace = after.trace(packetClass.packet);
    const was = outcomeOf(beforeTrace, localBefore);
    const will = outcomeOf(afterTrace, localAfter);
    if (outcomeKey(was) === outcomeKey(will)) return;
    const change: BehaviourChange = {class: packetClass, before: was, after: will, aspects: changedAspects(was, will)};
    const warnings = [...new Set(readingWarnings([...beforeTrace.warnings, ...afterTrace.warnings]))];
    if (warnings.length > 0) change.warnings = warnings;
    let group = groups.get(packetClass.servicePort);
    if (!group) groups.set(packetClass.servicePort, (group = {servicePort: packetClass.servicePort, changes: []}));
    group.changes.push(change);
    summary.changedClasses++;
    summary.byEntry[packetClass.entry] = (summary.byEntry[packetClass.entry] ?? 0) + 1;
    if (answers(was) && !answers(will)) summary.stopAnswering++;
    if (!answers(was) && answers(will)) summary.startAnswering++;
  });
  options.onProgress?.(classes.length, classes.length);
  summary.servicePorts = servicePorts.size;
  const sorted = [...groups.values()].sort((a, b) =>
    a.servicePort === '' ? 1 : b.servicePort === '' ? -1 : a.servicePort < b.servicePort ? -1 : 1,
  );
  summary.changedServicePorts = sorted.filter((group) => group.servicePort !== '').length;
  return {before: before.label, after: after.label, equal: summary.changedClasses === 0, groups: sorted, summary};
}

/** Words for the two sides in sentences: "today" / "after the switch", or "desired" / "applied". */
export interface SideWords {
  before: string;
  after: string;
}

/**
 * changeSentence: one change in plain words. Changes of the same target and outcomes from several
 * sources read as one sentence: pass them together.
 */
export function changeSentence(changes: BehaviourChange[], words: SideWords): string {
  const [first] = changes;
  const from = changes.map((change) => sourceText(change.class.source));
  const who = from.length === 1 ? from[0] : `${from.slice(0, -1).join(', ')} and ${from[from.length - 1]}`;
  const subject = `${capitalize(first.class.target)}, from ${who},`;
  const both = `${words.before} it ${describeOutcome(first.before)}; ${words.after} it ${describeOutcome(first.after)}.`;
  if (answers(first.before) && !answers(first.after)) return `${subject} answers ${words.before} and would not ${words.after}: ${both}`;
  if (!answers(first.before) && answers(first.after)) return `${subject} does not answer ${words.before} and would ${words.after}: ${both}`;
  return `${subject} behaves differently: ${both}`;
}

/** sentenceGroups: a group's changes gathered by target and outcomes, in the order they came. */
export function sentenceGroups(group: ServicePortChanges): BehaviourChange[][] {
  const byKey = new Map<string, BehaviourChange[]>();
  for (const change of group.changes) {
    const key = `${change.class.target}|${outcomeKey(change.before)}|${outcomeKey(change.after)}`;
    const list = byKey.get(key);
    if (list) list.push(change);
    else byKey.set(key, [change]);
  }
  return [...byKey.values()];
}

function capitalize(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}
