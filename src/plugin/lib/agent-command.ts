// AgentCommand: what every command that talks to agents shares: kubectl's connection flags and the
// agent locator (and, from PluginCommand, how failures are printed).
import {Flags} from '@oclif/core';
import {AgentLocator} from './agent-locator.ts';
import {defaultAgentNamespace} from './agent-pods.ts';
import {PluginCommand} from './plugin-command.ts';
import {PluginError} from './plugin-error.ts';
import {parseRequestTimeout} from './request-timeout.ts';

export const connectionFlags = {
  kubeconfig: Flags.string({summary: 'Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).', helpGroup: 'CONNECTION'}),
  context: Flags.string({summary: 'The kubeconfig context to use.', helpGroup: 'CONNECTION'}),
  'agent-namespace': Flags.string({summary: 'Namespace of the proxyctl agent pods.', default: defaultAgentNamespace, helpGroup: 'CONNECTION'}),
  'request-timeout': Flags.string({summary: 'How long to wait for the API server and each agent answer (e.g. 30s, 1m; 0: no limit).', default: '30s', helpGroup: 'CONNECTION'}),
  'agent-url': Flags.string({summary: "Talk to one agent directly at ws://HOST:PORT/ (its --api-bind-address) instead of through the API server.", helpGroup: 'CONNECTION'}),
  token: Flags.string({summary: 'Bearer token for --agent-url agents that listen beyond loopback (default: the kubeconfig user\'s token).', helpGroup: 'CONNECTION'}),
};

/** -n as kubectl has it: the namespace of the objects a command names (Services, pods), not of the agents. */
export const namespaceFlag = {
  namespace: Flags.string({char: 'n', summary: "Namespace of the Services and pods named (default: the kubeconfig context's, else default)."}),
};

export interface ConnectionFlagValues {
  kubeconfig?: string;
  context?: string;
  'agent-namespace': string;
  'request-timeout': string;
  'agent-url'?: string;
  token?: string;
}

export abstract class AgentCommand extends PluginCommand {
  protected override async catch(error: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    // -n once named the agents' namespace; it is kubectl's -n now, and only where Services are named.
    if (/^Nonexistent flags?: (-n|--namespace)\b/.test(error.message ?? '')) {
      const command = this.id?.replaceAll(':', ' ') ?? '';
      return super.catch(new PluginError(`${command} has no -n: the agents' namespace is --agent-namespace (default kube-system); -n names the namespace of Services in trace and diff --service`));
    }
    return super.catch(error);
  }

  protected locator(flags: ConnectionFlagValues): AgentLocator {
    return new AgentLocator({
      kubeconfig: flags.kubeconfig,
      context: flags.context,
      agentNamespace: flags['agent-namespace'],
      agentUrl: flags['agent-url'],
      token: flags.token,
      timeoutMs: parseRequestTimeout(flags['request-timeout']),
    });
  }
}
