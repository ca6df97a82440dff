// The sync method: asks the proxier's runner for a sync (a full one when rules drifted) and waits
// for the sync it starts.
import type {SyncParams, SyncResult as SyncAnswer} from '../../../protocol/methods.ts';
import {syncKind, type RuntimeState} from '../runtime-state.ts';

export async function answerSync(state: RuntimeState, params: SyncParams): Promise<SyncAnswer> {
  const {nodeName, proxier, log} = state;
  if (state.observe) throw new Error(`node ${nodeName}'s agent observes kube-proxy and writes no rules: syncing is kube-proxy's job there`);
  if (!proxier.status().initialized)
    throw new Error(`node ${nodeName} cannot sync yet: the agent is still waiting for the lists of services, endpoint slices and its node`);
  // A partial sync rewrites only changed services: drifted rules need a full one to be repaired.
  const check = await state.currentDrift();
  const drifted = check?.services.length ?? 0;
  const full = params.full === true || drifted > 0;
  log.detail(2, 'agent api: sync requested', {full, driftedServices: drifted});
  const requestedAt = state.now();
  const done = state.waitForSync(requestedAt);
  proxier.requestSync({full});
  const outcome = await done;
  if (!outcome.ok) throw new Error(`the sync on node ${nodeName} failed: ${outcome.error}`);
  return {
    durationMs: outcome.durationMs,
    kind: syncKind(outcome),
    rules: outcome.rules,
    driftBefore: {services: check?.services ?? [], checkedAt: check?.checkedAt ?? null},
  };
}
