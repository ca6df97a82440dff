// AgentCommand: what every command that talks to agents shares: kubectl's connection flags, the
// agent locator, and failures printed as one line "error: ..." with the PluginError's exit code.
import {Command, Flags} from '@oclif/core';
import {AgentLocator} from './agent-locator.ts';
import {defaultAgentNamespace} from './agent-pods.ts';
import {errorLine, exitCodes, PluginError} from './plugin-error.ts';
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

export abstract class AgentCommand extends Command {
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

  /** progress writes to stderr, and only for a person watching it. */
  protected progress(line: string): void {
    if (process.stderr.isTTY) process.stderr.write(`\r\u001b[2K${line}`);
  }

  protected endProgress(): void {
    if (process.stderr.isTTY) process.stderr.write('\r\u001b[2K');
  }

  protected override async catch(error: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    // this.exit() and oclif's own exits pass through.
    if (error.code === 'EEXIT') throw error;
    this.endProgress();
    const exitCode = error instanceof PluginError ? error.exitCode : (error.oclif?.exit ?? exitCodes.error);
    process.stderr.write(`error: ${errorLine(error)}\n`);
    process.exitCode = exitCode < 2 ? exitCodes.error : exitCode;
    return undefined;
  }
}
