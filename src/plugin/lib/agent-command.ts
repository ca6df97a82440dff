// AgentCommand: what every command that talks to agents shares: kubectl's connection flags, the
// agent locator, asking several agents at once (and, from PluginCommand, how failures are printed).
import {Flags} from '@oclif/core';
import type {AgentClient} from './agent-client.ts';
import {AgentLocator, forEachNode} from './agent-locator.ts';
import {defaultAgentNamespace} from './agent-pods.ts';
import {inHelpGroup} from './help-group.ts';
import {PluginCommand} from './plugin-command.ts';
import {exitCodes, PluginError} from './plugin-error.ts';
import {parseRequestTimeout} from './request-timeout.ts';

/** How a command reaches the agents: kubectl's connection flags, or straight to one agent. */
export const connectionFlags = inHelpGroup('CONNECTION', {
  kubeconfig: Flags.string({summary: 'Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).'}),
  context: Flags.string({summary: 'The kubeconfig context to use.'}),
  'agent-namespace': Flags.string({summary: 'Namespace of the proxyctl agent pods.', default: defaultAgentNamespace}),
  'request-timeout': Flags.string({
    summary: 'How long to wait for the API server and each agent answer (e.g. 30s, 1m; 0: no limit).',
    default: '30s',
  }),
  'agent-url': Flags.string({
    summary: 'Talk to one agent directly at ws://HOST:PORT/ (its --api-bind-address) instead of through the API server.',
  }),
  token: Flags.string({
    summary: "Bearer token for --agent-url agents that listen beyond loopback (default: the kubeconfig user's token).",
  }),
});

/** --concurrency: how many agents a command asks at once. */
export function concurrencyFlag(summary: string) {
  return Flags.integer({summary, default: 10, min: 1, max: 200});
}

/** -n as kubectl has it: the namespace of the objects a command names (Services, pods), not of the agents. */
export const namespaceFlag = {
  namespace: Flags.string({
    char: 'n',
    summary: "Namespace of the Services and pods named (default: the kubeconfig context's, else default).",
  }),
};

export interface ConnectionFlagValues {
  kubeconfig?: string;
  context?: string;
  'agent-namespace': string;
  'request-timeout': string;
  'agent-url'?: string;
  token?: string;
}

/** AgentFailure: a node whose agent could not be asked, and why, on one line. */
export interface AgentFailure {
  /** The node asked for; empty for the agent --agent-url names. */
  node: string;
  error: string;
}

/** AgentAnswers: what asking several agents came to: the answers by node, and the failures. */
export interface AgentAnswers<T> {
  answered: T[];
  failed: AgentFailure[];
}

export abstract class AgentCommand extends PluginCommand {
  protected override async catch(error: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    // -n once named the agents' namespace; it is kubectl's -n now, and only where Services are named.
    if (/^Nonexistent flags?: (-n|--namespace)\b/.test(error.message ?? '')) {
      const command = this.id?.replaceAll(':', ' ') ?? '';
      return super.catch(
        new PluginError(
          `${command} has no -n: the agents' namespace is --agent-namespace (default kube-system); -n names the namespace of Services in trace and ` +
            `diff --service`,
        ),
      );
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

  /**
   * askAgents opens the agent on each node (undefined: the one --agent-url names), asks it, and
   * closes it, `concurrency` agents at a time; one agent failing never stops the others. The
   * failures are named on stderr and make the exit code an error; the command prints the answers,
   * sorted by node. `progress` ("agents answered") counts them on a terminal, when given.
   */
  protected async askAgents<T extends {node: string}>(
    locator: AgentLocator,
    nodes: (string | undefined)[],
    options: {concurrency: number; progress?: string},
    ask: (client: AgentClient, node: string | undefined) => Promise<T>,
  ): Promise<AgentAnswers<T>> {
    const {concurrency, progress} = options;
    const keys = nodes.map((node) => node ?? '');
    const results = await forEachNode(
      keys,
      concurrency,
      async (key) => {
        const client = await locator.open(key || undefined);
        try {
          return await ask(client, key || undefined);
        } finally {
          client.close();
        }
      },
      progress === undefined ? undefined : (_node, done) => this.progress(`${done}/${nodes.length} ${progress}`),
    );
    this.endProgress();
    const answers: AgentAnswers<T> = {answered: [], failed: []};
    for (const key of new Set(keys)) {
      const result = results.get(key);
      if (result?.ok) answers.answered.push(result.value);
      else if (result) answers.failed.push({node: key, error: result.error});
    }
    answers.answered.sort((a, b) => a.node.localeCompare(b.node));
    for (const failure of answers.failed) process.stderr.write(`error: ${failure.error}\n`);
    if (answers.failed.length > 0) process.exitCode = exitCodes.error;
    return answers;
  }
}
