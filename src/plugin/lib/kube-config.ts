// The kubeconfig the plugin uses: --kubeconfig, else $KUBECONFIG, else ~/.kube/config, with
// --context picking a context as kubectl does.
import {KubeConfig} from '@kubernetes/client-node';
import {errorLine, PluginError} from './plugin-error.ts';

export interface KubeConfigFlags {
  kubeconfig?: string;
  context?: string;
}

export function loadPluginKubeConfig(flags: KubeConfigFlags): KubeConfig {
  const config = new KubeConfig();
  const source = flags.kubeconfig ?? process.env.KUBECONFIG ?? '~/.kube/config';
  try {
    if (flags.kubeconfig) config.loadFromFile(flags.kubeconfig);
    else config.loadFromDefault();
  } catch (error) {
    throw new PluginError(`cannot read kubeconfig ${source}: ${errorLine(error)}: pass --kubeconfig FILE`);
  }
  if (flags.context) {
    if (!config.getContextObject(flags.context)) {
      throw new PluginError(`context "${flags.context}" is not in ${source} (contexts: ${config.getContexts().map((c) => c.name).join(', ') || 'none'})`);
    }
    config.setCurrentContext(flags.context);
  }
  if (!config.getCurrentCluster()) throw new PluginError(`no cluster to talk to in ${source}: pass --kubeconfig FILE or --context NAME`);
  return config;
}

/** The namespace of the objects a command names: -n, else the kubeconfig context's, else "default", as kubectl. */
export function objectNamespace(config: KubeConfig, namespaceFlag: string | undefined): string {
  return namespaceFlag || config.getContextObject(config.getCurrentContext())?.namespace || 'default';
}
