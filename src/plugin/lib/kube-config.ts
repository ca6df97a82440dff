// The kubeconfig the plugin uses: --kubeconfig, else the files $KUBECONFIG lists (merged as kubectl
// merges them), else ~/.kube/config, with --context picking a context as kubectl does.
import {KubeConfig} from '@kubernetes/client-node';
import {readFileSync} from 'node:fs';
import {findKubeconfig} from '../../core/kubeconfig/merge.ts';
import {errorLine, PluginError} from './plugin-error.ts';

export interface KubeConfigFlags {
  kubeconfig?: string;
  context?: string;
}

export function loadPluginKubeConfig(flags: KubeConfigFlags): KubeConfig {
  const config = new KubeConfig();
  let source: string;
  try {
    const found = findKubeconfig({file: flags.kubeconfig, env: process.env, readFile: (path) => readFileSync(path, 'utf8')});
    if (found.kind === 'in-cluster') {
      config.loadFromCluster();
      source = 'the in-cluster service account';
    } else {
      config.loadFromString(found.text);
      source = found.files.join(':');
    }
  } catch (error) {
    throw new PluginError(
      `${errorLine(error)}: pass --kubeconfig FILE or set KUBECONFIG (a lab's is shown by "kubectl proxyctl lab status")`,
    );
  }
  if (flags.context) {
    if (!config.getContextObject(flags.context)) {
      throw new PluginError(
        `context "${flags.context}" is not in ${source} (contexts: ${
          config
            .getContexts()
            .map((c) => c.name)
            .join(', ') || 'none'
        })`,
      );
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
