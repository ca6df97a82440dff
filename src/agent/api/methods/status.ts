// The status method: the node's mode, last sync, counts and the last drift check, answered at once.
import type {ObserveStatus, StatusResult} from '../../../protocol/methods.ts';
import {type ObserveRuntime, syncKind, type RuntimeState} from '../runtime-state.ts';

export async function answerStatus(state: RuntimeState): Promise<StatusResult> {
  const {proxier, families, applied, lastOutcome} = state;
  const byFamily = proxier.appliedModels();
  const {services, endpoints} = state.modelCounts(byFamily);
  // status answers at once with the last drift check (checkedAt says when); a stale one is
  // redone in the background, since on a large node a check reads the kernel for seconds; after a
  // failed one, only once the wait after it is over.
  const check = state.drift;
  if (byFamily.size > 0 && !state.driftCurrent(state.drift) && state.driftRetryDue()) state.warmUp();
  const readings = families.map((family) => applied.last(family)?.readAt).filter((at): at is number => at !== undefined);
  return {
    node: state.nodeName,
    mode: state.backend.mode,
    version: state.version,
    ready: state.everSynced,
    lastSync: lastOutcome
      ? {
          at: new Date(lastOutcome.startedAt).toISOString(),
          durationMs: lastOutcome.durationMs,
          kind: syncKind(lastOutcome),
          ok: lastOutcome.ok,
        }
      : null,
    services,
    endpoints,
    drift: {services: check?.services ?? [], checkedAt: check?.checkedAt ?? null},
    syncFailures: state.failures,
    rulesReadAt: readings.length > 0 ? new Date(Math.max(...readings)).toISOString() : null,
    ...(state.observe && {observe: observeStatus(state.observe)}),
  };
}

function observeStatus(observe: ObserveRuntime): ObserveStatus {
  const {detection, settings, problems} = observe.report;
  const since = observe.tracker.nodeDriftSince;
  return {
    observing: `kube-proxy ${detection.mode}`,
    finding: detection.finding,
    summary: detection.summary,
    settings,
    problems,
    driftSince: since === undefined ? null : new Date(since).toISOString(),
  };
}
