// The trace method: a packet's path through the applied rules, with warnings when the rules it
// passes differ from the desired ones.
import {isIP} from 'node:net';
import type {IPFamily} from '../../../core/model/index.ts';
import type {TraceAnswer, TraceParams} from '../../../protocol/methods.ts';
import type {RuntimeState} from '../runtime-state.ts';

export async function answerTrace(state: RuntimeState, params: TraceParams): Promise<TraceAnswer> {
  const {nodeName, families, backend} = state;
  const family: IPFamily = isIP(params.packet.dstIP) === 6 ? 'IPv6' : 'IPv4';
  if (!families.includes(family))
    throw new Error(`node ${nodeName} proxies ${families.join(' and ')} only; ${params.packet.dstIP} is ${family}`);
  const model = state.models().find(([f]) => f === family)?.[1];
  if (!model) throw new Error(`node ${nodeName} has no ${family} rules yet: its first sync has not finished`);
  const current = await state.readApplied(family);
  const result = backend.trace(current.rules, params.packet, {localAddresses: await state.localAddresses()});
  const warnings = [...result.warnings];
  const service = result.servicePort ?? params.service;
  if (
    params.service &&
    result.servicePort &&
    !`${result.servicePort}:`.startsWith(`${params.service}:`) &&
    result.servicePort !== params.service
  ) {
    warnings.push(`the rules on node ${nodeName} send this packet to ${result.servicePort}, not to ${params.service}`);
  }
  const changed = state.fullDiff(model, current).groups.filter((group) => group.added.length > 0 || group.removed.length > 0);
  const repair = `see kubectl proxyctl diff ${nodeName}; kubectl proxyctl sync ${nodeName} rewrites them`;
  const ownDrift =
    service !== undefined && changed.some((group) => group.servicePort === service || group.servicePort.startsWith(`${service}:`));
  if (ownDrift) warnings.push(`the rules applied on node ${nodeName} for ${service} differ from the desired ones: ${repair}`);
  // Rules of no single service (KUBE-SERVICES' last rules, jumps from built-in chains, masquerading) can change any packet's path.
  const sharedDrift = changed.some((group) => group.servicePort === '');
  if (sharedDrift)
    warnings.push(
      `rules on node ${nodeName} that belong to no single service differ from the desired ones, so this path may not be what the agent meant: ${repair}`,
    );
  const drifted = ownDrift || sharedDrift;
  return {...result, warnings, readAt: new Date(current.readAt).toISOString(), drifted};
}
