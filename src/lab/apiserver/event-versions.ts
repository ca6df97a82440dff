// Events are stored as core/v1 and served as events.k8s.io/v1 too, as kube-apiserver serves one
// storage under both groups: the same fields under the newer names (regarding, note, deprecated*).
import type {KubeObject} from './object-log.ts';

/** core/v1 field -> events.k8s.io/v1 field, for the fields whose names differ. */
const renamed: Array<[string, string]> = [
  ['involvedObject', 'regarding'],
  ['message', 'note'],
  ['source', 'deprecatedSource'],
  ['firstTimestamp', 'deprecatedFirstTimestamp'],
  ['lastTimestamp', 'deprecatedLastTimestamp'],
  ['count', 'deprecatedCount'],
  ['reportingComponent', 'reportingController'],
];

function rename(event: KubeObject, pairs: Array<[string, string]>, apiVersion: string): KubeObject {
  const out: KubeObject = {...event, apiVersion};
  for (const [from, to] of pairs) {
    delete out[from];
    if (event[from] !== undefined) out[to] = event[from];
  }
  return out;
}

export function eventToEventsV1(event: KubeObject): KubeObject {
  return rename(event, renamed, 'events.k8s.io/v1');
}

export function eventFromEventsV1(event: KubeObject): KubeObject {
  return rename(
    event,
    renamed.map(([core, events]) => [events, core]),
    'v1',
  );
}

export function isEventsV1(type: {group: string; resource: string}): boolean {
  return type.group === 'events.k8s.io' && type.resource === 'events';
}
