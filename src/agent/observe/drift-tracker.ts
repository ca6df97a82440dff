// DriftTracker: how long each service port, and the node, has differed from what kube-proxy should
// have programmed, from the observer's whole-node drift checks. One log line when a service port
// enters drift and one when it leaves, naming it; two gauges for alerts ("node X has served stale
// endpoints for service Y for 10 minutes"): the service ports in drift and the seconds the node
// has drifted, both labelled with the node.
import {Gauge, type Registry} from 'prom-client';
import type {DiffGroup} from '../../protocol/methods.ts';
import type {Logger} from '../log.ts';
import {age} from './drift-explanation.ts';

export interface DriftTrackerOptions {
  nodeName: string;
  log: Logger;
  registry?: Registry;
  now: () => number;
}

export class DriftTracker {
  readonly #options: DriftTrackerOptions;
  /** Service port (or "" for rules of no service) -> when the checks first found it drifted. */
  readonly #since = new Map<string, number>();
  #rulesGone = false;

  constructor(options: DriftTrackerOptions) {
    this.#options = options;
    if (options.registry) this.#registerGauges(options.registry);
  }

  /** When the node started to differ (the oldest drifted service port's start); undefined when it does not. */
  get nodeDriftSince(): number | undefined {
    let oldest: number | undefined;
    for (const since of this.#since.values()) if (oldest === undefined || since < oldest) oldest = since;
    return oldest;
  }

  /**
   * Whether the last check found no kube-proxy rules at all on the node, of the mode observed:
   * kube-proxy is gone, or runs another mode now (each mode removes the others' rules at start).
   */
  get kubeProxyRulesGone(): boolean {
    return this.#rulesGone;
  }

  /** When `servicePort` started to differ, if it does. */
  since(servicePort: string): number | undefined {
    return this.#since.get(servicePort);
  }

  /** A whole-node drift check found these groups, reading the kernel at `at`. */
  checked(groups: DiffGroup[], at: number): void {
    const {log, nodeName, now} = this.#options;
    const drifted = new Map<string, DiffGroup>();
    for (const group of groups) if (group.added.length > 0 || group.removed.length > 0) drifted.set(group.servicePort, group);
    this.#rulesGone =
      drifted.size > 0 &&
      [...drifted.values()].every((group) => group.explanations?.some((explanation) => explanation.kind === 'no-kube-proxy-rules'));
    for (const [port, group] of drifted) {
      if (this.#since.has(port)) continue;
      this.#since.set(port, at);
      log.warn('service port drifted from what kube-proxy should have programmed', {
        node: nodeName,
        servicePort: port || '(rules of no service)',
        reason:
          group.explanations?.map((explanation) => explanation.text).join('; ') ||
          `${group.added.length} rules missing, ${group.removed.length} unexpected`,
      });
    }
    for (const [port, since] of this.#since) {
      if (drifted.has(port)) continue;
      this.#since.delete(port);
      log.info('service port no longer drifts', {
        node: nodeName,
        servicePort: port || '(rules of no service)',
        drifted: age(now() - since),
      });
    }
  }

  #registerGauges(registry: Registry): void {
    const tracker = this;
    const labels = {node: this.#options.nodeName};
    registry.registerMetric(
      new Gauge({
        name: 'proxyctl_observe_drifted_service_ports',
        help: 'Service ports whose rules on this node differ from what kube-proxy should have programmed, at the last check',
        labelNames: ['node'],
        registers: [],
        collect() {
          this.set(labels, tracker.#since.size);
        },
      }),
    );
    registry.registerMetric(
      new Gauge({
        name: 'proxyctl_observe_drift_seconds',
        help: 'Seconds this node has differed from what kube-proxy should have programmed (0 when it does not)',
        labelNames: ['node'],
        registers: [],
        collect() {
          const since = tracker.nodeDriftSince;
          this.set(labels, since === undefined ? 0 : Math.max(0, (tracker.#options.now() - since) / 1000));
        },
      }),
    );
  }
}
