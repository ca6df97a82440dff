// ProxierHealth: kube-proxy's health rule. Healthy unless an update has been queued for longer than
// healthTimeout (2 x syncPeriod) without a successful sync; the node is eligible for load-balancer
// traffic unless it is being deleted or tainted ToBeDeletedByClusterAutoscaler.
import {type Clock, systemClock} from '../clock.ts';

export const toBeDeletedTaint = 'ToBeDeletedByClusterAutoscaler';

export interface HealthState {
  healthy: boolean;
  nodeEligible: boolean;
  /** Time of the last successful sync; undefined before the first. */
  lastUpdated: number | undefined;
  currentTime: number;
}

export class ProxierHealth {
  readonly healthTimeout: number;
  readonly #clock: Clock;
  #lastUpdated: number | undefined;
  #oldestPendingQueued: number | undefined;
  #nodeEligible = true;

  constructor(healthTimeout: number, clock: Clock = systemClock) {
    this.healthTimeout = healthTimeout;
    this.#clock = clock;
  }

  /** queuedUpdate: a change arrived that a sync must apply. */
  queuedUpdate(): void {
    this.#oldestPendingQueued ??= this.#clock.now();
  }

  /** updated: a sync succeeded and applied everything queued before it started. */
  updated(): void {
    this.#lastUpdated = this.#clock.now();
    this.#oldestPendingQueued = undefined;
  }

  /** syncNode reads the Node object; without one the node counts as eligible. */
  syncNode(node: unknown): void {
    this.#nodeEligible = nodeEligible(node);
  }

  state(): HealthState {
    const now = this.#clock.now();
    const healthy = this.#oldestPendingQueued === undefined || now - this.#oldestPendingQueued < this.healthTimeout;
    return {healthy, nodeEligible: this.#nodeEligible, lastUpdated: this.#lastUpdated, currentTime: now};
  }
}

/** nodeEligible is false for a Node with deletionTimestamp or the cluster autoscaler's deletion taint. */
export function nodeEligible(node: unknown): boolean {
  if (typeof node !== 'object' || node === null) return true;
  const object = node as {metadata?: {deletionTimestamp?: unknown}; spec?: {taints?: unknown}};
  if (object.metadata?.deletionTimestamp) return false;
  const taints = object.spec?.taints;
  if (
    Array.isArray(taints) &&
    taints.some((taint) => typeof taint === 'object' && taint !== null && (taint as {key?: unknown}).key === toBeDeletedTaint)
  ) {
    return false;
  }
  return true;
}
