// The settings of kube-proxy that shape its rules, as an observing agent learns them: from the
// ConfigMap kube-system/kube-proxy (key config.conf, a KubeProxyConfiguration) when it can read
// it, else from the agent's own flags, else kube-proxy's defaults. Each setting says where it
// came from; unknown fields and an unreadable ConfigMap are named, and the agent keeps observing
// with what it has.
import {type AgentConfig, defaultAgentConfig, type ProxyMode} from '../config/agent-config.ts';
import {applyKubeProxyConfiguration} from '../config/kube-proxy-configuration.ts';
import {errorText} from '../../core/error-text.ts';

export const kubeProxyConfigMapPath = '/api/v1/namespaces/kube-system/configmaps/kube-proxy';
export const kubeProxyConfigMapName = 'ConfigMap kube-system/kube-proxy';
const configKey = 'config.conf';

/** One setting the observer renders with: its value as text and where it came from. */
export interface ObservedSetting {
  /** The KubeProxyConfiguration field, e.g. "iptables.masqueradeBit". */
  name: string;
  value: string;
  /** "ConfigMap kube-system/kube-proxy", "flag --cluster-cidr", "config file F" or "kube-proxy's default". */
  source: string;
}

export interface KubeProxySettings {
  /** The agent's config with kube-proxy's settings in place. */
  config: AgentConfig;
  settings: ObservedSetting[];
  /** What could not be read, by name: the ConfigMap, its key, or fields of it. */
  problems: string[];
  /** The mode kube-proxy's configuration names (empty means iptables), when the ConfigMap was read. */
  configuredMode?: ProxyMode;
}

interface ShapingSetting {
  path: string;
  copy: (from: AgentConfig, to: AgentConfig) => void;
  show: (config: AgentConfig) => string;
}

type ConfigSection = 'detectLocal' | 'iptables' | 'nftables' | 'ipvs';

/** A setting held as one value at `section.key` of an AgentConfig: copied as it is, shown as text. */
function sectionScalar<S extends ConfigSection, K extends keyof AgentConfig[S] & string>(
  section: S,
  key: K,
  show: (value: AgentConfig[S][K]) => string = String,
): ShapingSetting {
  return {
    path: `${section}.${key}`,
    copy: (from, to) => {
      to[section][key] = from[section][key];
    },
    show: (config) => show(config[section][key]),
  };
}

/**
 * The settings that shape kube-proxy's rules, by their KubeProxyConfiguration path, with how to
 * read and copy each in an AgentConfig.
 */
const shapingSettings: ShapingSetting[] = [
  {path: 'clusterCIDR', copy: (f, t) => (t.clusterCIDRs = [...f.clusterCIDRs]), show: (c) => c.clusterCIDRs.join(',')},
  {path: 'detectLocalMode', copy: (f, t) => (t.detectLocalMode = f.detectLocalMode), show: (c) => c.detectLocalMode},
  sectionScalar('detectLocal', 'bridgeInterface'),
  sectionScalar('detectLocal', 'interfaceNamePrefix'),
  sectionScalar('iptables', 'masqueradeBit'),
  sectionScalar('iptables', 'masqueradeAll'),
  sectionScalar('iptables', 'localhostNodePorts'),
  sectionScalar('nftables', 'masqueradeBit'),
  sectionScalar('nftables', 'masqueradeAll'),
  {path: 'nodePortAddresses', copy: (f, t) => (t.nodePortAddresses = [...f.nodePortAddresses]), show: (c) => c.nodePortAddresses.join(',')},
  sectionScalar('ipvs', 'scheduler', (scheduler) => scheduler || 'rr'),
  sectionScalar('ipvs', 'strictARP'),
  {path: 'ipvs.excludeCIDRs', copy: (f, t) => (t.ipvs.excludeCIDRs = [...f.ipvs.excludeCIDRs]), show: (c) => c.ipvs.excludeCIDRs.join(',')},
];

/** The flags that set each path, for paths whose flag name differs from kube-proxy's field (the agent's source map names them). */
export type SetBy = ReadonlyMap<string, string>;

/**
 * learnKubeProxySettings: `read` fetches the ConfigMap (undefined when the cluster has none);
 * `agent` is the agent's checked config and `setBy` names the flag or file field behind each of
 * its settings; with `mode`, only the settings that shape that mode's rules are listed. Per setting:
 * the ConfigMap's value when it sets it, else the agent's own when a flag or its file set it, else kube-proxy's default.
 */
export async function learnKubeProxySettings(
  agent: AgentConfig,
  setBy: SetBy,
  read: () => Promise<unknown>,
  mode?: ProxyMode,
): Promise<KubeProxySettings> {
  const problems: string[] = [];
  const fromConfigMap = defaultAgentConfig();
  let configMapFields = new Set<string>();
  let configuredMode: ProxyMode | undefined;
  try {
    const object = await read();
    const text = configText(object);
    configMapFields = applyKubeProxyConfiguration(text, `${kubeProxyConfigMapName} key ${configKey}`, fromConfigMap, (path, reason) =>
      problems.push(`${kubeProxyConfigMapName} key ${configKey}: ${path}: ${reason} (ignored)`),
    );
    configuredMode = fromConfigMap.mode;
  } catch (error) {
    problems.push(`${kubeProxyConfigMapName}: cannot read it (${errorText(error).split('\n')[0]}); using the agent's flags`);
  }
  const config = structuredClone(agent);
  const settings: ObservedSetting[] = [];
  for (const setting of shapingSettings) {
    let source: string;
    if (configMapFields.has(setting.path)) {
      setting.copy(fromConfigMap, config);
      source = kubeProxyConfigMapName;
    } else {
      const flag = setBy.get(setting.path);
      if (flag === undefined) setting.copy(defaultAgentConfig(), config);
      source = flag ?? "kube-proxy's default";
    }
    if (mode === undefined || appliesTo(setting.path, mode)) settings.push({name: setting.path, value: setting.show(config), source});
  }
  return {config, settings, problems, ...(configuredMode !== undefined && configMapFields.has('mode') ? {configuredMode} : {})};
}

/** Whether a setting shapes the rules of `mode` (the other modes' sections do not); all are still learnt. */
function appliesTo(path: string, mode: ProxyMode): boolean {
  const section = /^(iptables|nftables|ipvs)\./.exec(path)?.[1];
  if (section === undefined) return true;
  // ipvs mode writes an iptables layer with the iptables section's settings, as kube-proxy does.
  return section === mode || (mode === 'ipvs' && section === 'iptables');
}

/** The KubeProxyConfiguration text in a ConfigMap object; throws naming what is missing. */
function configText(object: unknown): string {
  const data = (object as {data?: Record<string, unknown>} | undefined)?.data;
  const text = data?.[configKey];
  if (typeof text !== 'string') throw new Error(`it has no key ${configKey}`);
  return text;
}
