// prepareObservation: what an observing agent settles before it starts: a read-only host on the
// iptables front end kube-proxy wrote to, kube-proxy's mode (detect-mode.ts) and its settings
// (kube-proxy-settings.ts), turned into the config the agent renders the desired rules with.
import type {IPFamily} from '../../core/model/index.ts';
import type {AgentConfig} from '../config/agent-config.ts';
import {type CheckedConfig, validateAgentConfig} from '../config/load-config.ts';
import {CommandHost} from '../host/command-host.ts';
import type {Host} from '../host/host.ts';
import {ReadOnlyHost} from '../host/read-only-host.ts';
import type {Logger} from '../log.ts';
import type {KubernetesClient} from '../watch/kubernetes-client.ts';
import {detectKubeProxyMode, type DetectionHosts, type ModeDetection} from './detect-mode.ts';
import {kubeProxyConfigMapPath, learnKubeProxySettings, type ObservedSetting} from './kube-proxy-settings.ts';
import {errorText} from '../../core/error-text.ts';

/** ObserveReport: what the observer found and uses, for status and the log. */
export interface ObserveReport {
  detection: ModeDetection;
  settings: ObservedSetting[];
  /** The ConfigMap or its fields that could not be read, and a configured mode the kernel contradicts. */
  problems: string[];
}

export interface Observation extends CheckedConfig {
  host: ReadOnlyHost;
  report: ObserveReport;
  /** Looks at the kernel again for kube-proxy's mode (the same questions as at start). */
  detectAgain: () => Promise<ModeDetection>;
}

export interface ObservationDependencies {
  log: Logger;
  client: KubernetesClient;
  /** The node's commands (tests give a recording host); default CommandHosts per iptables front end. */
  host?: Host;
  /** The IP families the agent's own settings name (where kube-proxy's rules are looked for). */
  families: IPFamily[];
}

export async function prepareObservation(checked: CheckedConfig, dependencies: ObservationDependencies): Promise<Observation> {
  const {log, client} = dependencies;
  const {config} = checked;
  const onRefused = (error: Error) => log.error('observe mode: a command that writes was refused', {reason: error.message});
  const commandHost = (iptablesVariant: 'default' | 'nft' | 'legacy'): Host =>
    dependencies.host ??
    new CommandHost({netns: config.netns, iptablesVariant, onCommand: (command) => log.detail(4, 'run', {command: command.join(' ')})});
  const hosts: DetectionHosts = {
    node: new ReadOnlyHost(commandHost('default'), {onRefused}),
    iptables: {nf_tables: new ReadOnlyHost(commandHost('nft'), {onRefused}), legacy: new ReadOnlyHost(commandHost('legacy'), {onRefused})},
  };
  const detectAgain = () => detectKubeProxyMode(hosts, dependencies.families, config.observeMode);
  const detection = await detectAgain();
  (detection.finding === 'detected' || detection.finding === 'override' ? log.info : log.warn).call(log, 'observing kube-proxy', {
    mode: detection.mode,
    finding: detection.finding,
    summary: detection.summary,
  });
  for (const question of detection.unreadable) log.detail(1, 'observe mode: cannot tell', {question});

  const learned = await learnKubeProxySettings(
    config,
    checked.setBy ?? new Map(),
    async () => {
      if (!client.get) throw new Error('the client cannot read single objects');
      return client.get(kubeProxyConfigMapPath);
    },
    detection.mode,
  );
  const problems = [...learned.problems];
  if (learned.configuredMode !== undefined && detection.found.length > 0 && learned.configuredMode !== detection.mode)
    problems.push(`kube-proxy's configuration names mode ${learned.configuredMode}, the kernel holds ${detection.mode} mode's rules`);
  for (const problem of problems) log.warn('observe mode: problem', {problem});

  const merged: AgentConfig = {...learned.config, mode: detection.mode};
  let result: CheckedConfig;
  try {
    result = validateAgentConfig(merged, (path) => `kube-proxy setting ${path}`);
  } catch (error) {
    problems.push(`${errorText(error)}; using the agent's own settings`);
    log.warn('observe mode: kube-proxy settings refused', {reason: errorText(error)});
    result = validateAgentConfig({...structuredClone(config), mode: detection.mode});
  }
  const frontEnd = detection.frontEnd === 'legacy' ? 'legacy' : detection.frontEnd === 'nf_tables' ? 'nft' : 'default';
  return {
    ...result,
    setBy: checked.setBy,
    host: new ReadOnlyHost(commandHost(frontEnd), {onRefused}),
    report: {detection, settings: learned.settings, problems},
    detectAgain,
  };
}

export interface ModeFollowing {
  /** Whether the observer's last look found no kube-proxy rules at all (of the mode it observes). */
  rulesGone?: () => boolean;
  /** How often to look for kube-proxy's mode while its rules are gone; 5 s by default. */
  rulesGoneLookMs?: number;
  /** kube-proxy is found in another mode, alone: the observer must start again to observe it. */
  onModeChanged?: (mode: string) => void;
}

/**
 * followKubeProxyMode: while the observer found no kube-proxy mode, or several, it looks again every
 * `intervalMs`, and every 5 s while its last look found none of kube-proxy's rules any more
 * (kube-proxy may start after it, finish its switch, or have switched: each mode removes the
 * others' rules at start). The
 * same mode found alone settles it; another mode is said in status and the log, and handed to
 * `onModeChanged` (the agent starts again to observe it): the observer's desired rules are of the
 * mode it started with. Returns the stop function.
 */
export function followKubeProxyMode(observation: Observation, intervalMs: number, log: Logger, following: ModeFollowing = {}): () => void {
  const {report} = observation;
  const unsettled = () => report.detection.finding === 'none found' || report.detection.finding === 'several found';
  // Rules gone is most likely kube-proxy switching modes right now: looked at sooner than the
  // syncPeriod, which paces the looks while the finding is unsettled.
  const tickMs = following.rulesGone ? Math.min(intervalMs, following.rulesGoneLookMs ?? 5000) : intervalMs;
  let lastLook = Date.now();
  const lookAgain = () => (unsettled() && Date.now() - lastLook >= intervalMs - tickMs / 2) || (following.rulesGone?.() ?? false);
  const observed = report.detection.mode;
  let busy = false;
  /** The other mode already said, so that it is said once. */
  let told: string | undefined;
  const timer = setInterval(() => {
    if (busy || !lookAgain()) return;
    busy = true;
    lastLook = Date.now();
    observation
      .detectAgain()
      .then((next) => {
        if (next.finding !== 'detected') return;
        if (next.mode === observed) {
          if (!unsettled()) return;
          report.detection = next;
          log.info('observing kube-proxy: its rules are here now', {mode: next.mode, summary: next.summary});
          return;
        }
        if (told === next.mode) return;
        told = next.mode;
        const restarting = following.onModeChanged !== undefined;
        report.detection = {
          ...report.detection,
          found: next.found,
          summary:
            `${next.summary}, but this observer compares as ${observed} mode, as it found at start: ` +
            (restarting ? `it starts again to observe ${next.mode} mode` : `restart it to observe ${next.mode} mode`),
        };
        if (restarting) log.warn('observing kube-proxy: its mode changed; starting again to observe it', {now: next.mode, observed});
        else log.warn('observing kube-proxy: its mode is not the one observed; restart the observer', {now: next.mode, observed});
        following.onModeChanged?.(next.mode);
      })
      .catch((error: unknown) => log.detail(1, 'observe mode: looking for kube-proxy mode again failed', {reason: errorText(error)}))
      .finally(() => (busy = false));
  }, tickMs);
  timer.unref();
  return () => clearInterval(timer);
}
