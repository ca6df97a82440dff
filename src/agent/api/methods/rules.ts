// The rules.desired and rules.applied methods: the rules the agent means, rendered from the models
// it wrote, and the rules the kernel holds.
import type {IPFamily} from '../../../core/model/index.ts';
import type {RulesResult} from '../../../protocol/methods.ts';
import {joinFamilies, type RuntimeState} from '../runtime-state.ts';

export async function answerDesiredRules(state: RuntimeState): Promise<RulesResult> {
  const {backend} = state;
  const parts = state.models().map(([family, model]) => ({family, text: backend.render(model)}));
  return {mode: backend.mode, text: joinFamilies(parts), readAt: new Date(state.now()).toISOString()};
}

export async function answerAppliedRules(state: RuntimeState): Promise<RulesResult> {
  const parts: {family: IPFamily; text: string}[] = [];
  let readAt = Infinity;
  for (const family of state.families) {
    const current = await state.readApplied(family);
    parts.push({family, text: current.text});
    readAt = Math.min(readAt, current.readAt);
  }
  return {mode: state.backend.mode, text: joinFamilies(parts), readAt: new Date(readAt).toISOString()};
}
