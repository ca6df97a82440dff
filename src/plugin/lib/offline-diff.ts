// `diff --rules`: the rules a saved dump holds against what kube-proxy (or the proxy) should have
// programmed for the given objects and node settings, in the dump's mode, grouped by service port.
import {diffIptables, parseIptablesSave, renderIptables} from '../../core/iptables/index.ts';
import {diffIpvs, ipvsDiffText, type IpvsState, renderIpvs} from '../../core/ipvs/index.ts';
import type {ProxyModel} from '../../core/model/index.ts';
import {diffNftables, parseNftablesScript, renderNftables} from '../../core/nftables/index.ts';
import {colorDiff} from './diff-text.ts';
import {offlineSettings} from './model-flags.ts';
import {InputError, readOfflineModel} from './model-input.ts';
import {formatData, palette, useColor} from './output.ts';
import {exitCodes, PluginError} from './plugin-error.ts';
import {readRulesFlag, type RulesDump} from './rules-dump.ts';

export interface OfflineDiffGroup {
  /** NAMESPACE/NAME:PORT, or "" for rules of no single service port. */
  servicePort: string;
  /** What should be there and is not. */
  missing: string[];
  /** What is there and should not be. */
  unexpected: string[];
}

export interface OfflineDiff {
  mode: RulesDump['mode'];
  equal: boolean;
  /** The service ports that differ, NAMESPACE/NAME:PORT, sorted. */
  drifted: string[];
  /** True when rules of no single service port differ too. */
  otherRulesDiffer: boolean;
  groups: OfflineDiffGroup[];
  /** Unified-diff text, "@@ service port @@" sections; empty when equal. */
  text: string;
}

export interface OfflineDiffOptions {
  /** nftables: the service CIDRs the drop of unused service addresses is rendered for. */
  serviceCIDRs: string[];
  /** ipvs: kube-proxy's ipvs.scheduler. */
  scheduler?: string;
  /** "namespace/name" or "namespace/name:port": only that service's differences. */
  service?: string;
}

/** The parts of ipvs mode's state the dump does not hold are taken as desired: only what was given is compared. */
function ipvsSides(model: ProxyModel, dump: Extract<RulesDump, {mode: 'ipvs'}>, scheduler?: string): [IpvsState, IpvsState] {
  const desired = renderIpvs(model, {scheduler});
  const given = new Set(dump.parts.map((part) => part.format));
  const applied: IpvsState = {
    family: desired.family,
    virtualServers: given.has('ipvsadm-save -n') ? dump.state.virtualServers : desired.virtualServers,
    sets: given.has('ipset save') ? dump.state.sets : desired.sets,
    boundAddresses: given.has('kube-ipvs0 addresses') ? dump.state.boundAddresses : desired.boundAddresses,
    iptables: given.has('iptables-save') ? dump.state.iptables : '',
  };
  // Without iptables-save output the iptables layer is not compared at all.
  return [given.has('iptables-save') ? desired : {...desired, iptables: ''}, applied];
}

/** diffOffline compares the dump with what the model asks for in the dump's mode. */
export function diffOffline(model: ProxyModel, dump: RulesDump, options: OfflineDiffOptions): OfflineDiff {
  let groups: Array<{servicePort: string; added: string[]; removed: string[]}>;
  let text: string;
  if (dump.mode === 'iptables') {
    const desired = parseIptablesSave(renderIptables(model, {includeJumps: true}), {family: model.family});
    ({groups, text} = diffIptables(desired, dump.ruleset, {service: options.service}));
  } else if (dump.mode === 'nftables') {
    const desired = parseNftablesScript(renderNftables(model, {serviceCIDRs: options.serviceCIDRs}));
    ({groups, text} = diffNftables(desired, dump.ruleset, {service: options.service}));
  } else {
    const [desired, applied] = ipvsSides(model, dump, options.scheduler);
    const nodePorts = new Map(
      model.servicePorts.filter((port) => port.nodePort > 0).map((port) => [`${port.protocol.toLowerCase()}:${port.nodePort}`, port.key]),
    );
    const result = diffIpvs(desired, applied, {nodePorts});
    groups = result.groups.filter((group) => matchesService(group.servicePort, options.service));
    text = groups.length === result.groups.length ? result.text : ipvsDiffText(groups);
  }
  const named = groups.map((group) => ({
    servicePort: servicePortLabel(model, group.servicePort),
    missing: group.added,
    unexpected: group.removed,
  }));
  const drifted = named.filter((group) => group.servicePort !== '').map((group) => group.servicePort);
  return {
    mode: dump.mode,
    equal: named.length === 0,
    drifted: [...new Set(drifted)].sort(),
    otherRulesDiffer: named.some((group) => group.servicePort === ''),
    groups: named,
    text,
  };
}

function matchesService(servicePort: string, filter: string | undefined): boolean {
  if (filter === undefined) return true;
  return filter.includes(':') ? servicePort === filter : servicePort === filter || servicePort.startsWith(`${filter}:`);
}

/** servicePortLabel names a service port NAMESPACE/NAME:PORT; an unnamed port (key "ns/name") by its number. */
export function servicePortLabel(model: ProxyModel, key: string): string {
  if (key === '' || key.includes(':')) return key;
  const port = model.servicePorts.find((servicePort) => servicePort.key === key);
  return port ? `${key}:${port.port}` : key;
}

type SavedRulesFlags = Parameters<typeof offlineSettings>[0] & {
  rules: string[];
  filename?: string[];
  mode?: RulesDump['mode'];
  'ipvs-scheduler': string;
  service?: string;
  namespace?: string;
  output: 'text' | 'json' | 'yaml';
};

/**
 * diffSavedRules runs `diff --rules FILE -f OBJECTS`: prints the drifting service ports and the
 * differences, and sets the exit code (0 equal, 1 differ, 2 bad input: objects the model skipped).
 */
export async function diffSavedRules(flags: SavedRulesFlags): Promise<void> {
  if (!flags.filename?.length) throw new PluginError('--rules needs -f FILE: the Services and EndpointSlices the rules were written for');
  const settings = offlineSettings(flags);
  let offline;
  try {
    offline = await readOfflineModel(flags.filename, settings);
  } catch (error) {
    if (error instanceof InputError) throw new PluginError(error.message);
    throw error;
  }
  const dump = readRulesFlag(flags.rules, settings.family);
  if (flags.mode !== undefined && flags.mode !== dump.mode) {
    const formats = [...new Set(dump.parts.map((part) => part.format))].join(', ');
    throw new PluginError(`--mode ${flags.mode}: the --rules files hold ${dump.mode} mode's rules (${formats})`);
  }
  const service =
    flags.service === undefined
      ? undefined
      : flags.service.includes('/')
        ? flags.service
        : `${flags.namespace ?? 'default'}/${flags.service}`;
  const result = diffOffline(offline.model, dump, {
    serviceCIDRs: offline.serviceCIDRs,
    scheduler: flags['ipvs-scheduler'],
    service,
  });
  const warnings = [...offline.warnings, ...dump.warnings];
  if (flags.output === 'json' || flags.output === 'yaml') {
    const files = dump.parts.map((part) => ({file: part.file, format: part.format, line: part.firstLine}));
    process.stdout.write(formatData({...result, files, warnings, skipped: offline.problems}, flags.output));
  } else if (!result.equal) {
    const color = useColor(flags.output);
    const lines = result.drifted.map((port) => `${port}: differs`);
    if (result.otherRulesDiffer) lines.push('(rules of no service): differ');
    process.stdout.write(`${lines.join('\n')}\n${colorDiff(result.text.replace(/\n?$/, ''), palette(color))}\n`);
  }
  for (const warning of warnings) process.stderr.write(`warning: ${warning}\n`);
  for (const problem of offline.problems) process.stderr.write(`skipped: ${problem}\n`);
  process.exitCode = offline.problems.length > 0 ? exitCodes.error : result.equal ? exitCodes.ok : exitCodes.differs;
}
