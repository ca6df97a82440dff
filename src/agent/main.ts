// proxyctl-agent: the node agent's process. Reads flags and --config, then either removes the
// agent's rules (--cleanup) or runs until SIGTERM, which stops it without touching the rules.
import {fileURLToPath} from 'node:url';
import {realpathSync} from 'node:fs';
import {ConfigError} from './config/agent-config.ts';
import {flagsHelp} from './config/flags.ts';
import {checkNetnsExists, loadAgentConfig} from './config/load-config.ts';
import {startAgent} from './agent.ts';
import {CommandHost} from './host/command-host.ts';
import {createLogger} from './log.ts';
import {cleanupProxyRules} from './sync/cleanup.ts';
import {errorText} from '../core/error-text.ts';

/** Exit codes: 0 done, 1 failed while running, 2 refused settings (as flag parsing errors are). */
export async function main(argv: string[]): Promise<number> {
  let loaded;
  try {
    loaded = loadAgentConfig(argv);
    if (!loaded.help) checkNetnsExists(loaded.config.netns);
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`proxyctl-agent: ${error.message}\n`);
      return 2;
    }
    throw error;
  }
  if (loaded.help) {
    process.stdout.write(`${flagsHelp()}\n`);
    return 0;
  }
  const {config} = loaded;
  const log = createLogger({verbosity: config.verbosity});

  if (config.cleanup) {
    const host = new CommandHost({netns: config.netns, onCommand: (command) => log.detail(4, 'run', {command: command.join(' ')})});
    const result = await cleanupProxyRules(host, log, undefined, {excludeCIDRs: config.ipvs.excludeCIDRs});
    log.info('cleanup done', {chains: result.removedChains, jumpRules: result.removedJumpRules, errors: result.errors.length});
    return result.errors.length === 0 ? 0 : 1;
  }

  let agent;
  try {
    agent = await startAgent(loaded, {log});
  } catch (error) {
    log.error('cannot start', {reason: errorText(error)});
    return 1;
  }
  // The handlers stay until the process exits: with none, a second SIGTERM or Ctrl-C during the
  // stop would kill the process halfway through closing its servers.
  const ended = await new Promise<{signal: string} | {restart: string}>((resolve) => {
    let received: string | undefined;
    const onSignal = (name: string) => {
      if (received) {
        log.info('already stopping', {signal: name});
        return;
      }
      received = name;
      resolve({signal: name});
    };
    for (const name of ['SIGTERM', 'SIGINT'] as const) process.on(name, onSignal);
    // Exit 0, for its pod's restartPolicy (or whoever runs it) to start it again.
    void agent.restartNeeded?.then((reason) => {
      received ??= 'restart';
      resolve({restart: reason});
    });
  });
  if ('signal' in ended) log.info('stopping', {signal: ended.signal});
  else log.warn('stopping, to start again', {reason: ended.restart});
  await agent.stop();
  return 0;
}

function runAsProcess(): boolean {
  if (!process.argv[1]) return false;
  try {
    return realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (runAsProcess()) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (error: unknown) => {
      process.stderr.write(`proxyctl-agent: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
      process.exit(1);
    },
  );
}
