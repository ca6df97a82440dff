// The plugin's launcher: what bin/kubectl-proxyctl runs, bundled with the commands by
// scripts/bundle-plugin.ts into dist/plugin/. It loads nothing before it has set up what every run
// needs: Node's compile cache (the bundle's code is then read compiled instead of parsed again on
// each start) and a quiet end when the reader of stdout goes away (`kubectl proxyctl --help | head`).
// oclif comes next, and the commands (client-node and the rest) only when a command runs: oclif
// answers --help from package.json and oclif.manifest.json. `--version` is answered here, in oclif's
// words, without loading oclif: scripts ask it to check the plugin is there.
import {readFileSync} from 'node:fs';
import module from 'node:module';
import {fileURLToPath} from 'node:url';

module.enableCompileCache?.();

/**
 * A closed pipe ends the plugin as it ends git and kubectl: killed by SIGPIPE, silently (status 141
 * in a shell). Node ignores SIGPIPE and reports EPIPE on the write instead; left alone, oclif waits
 * for a drain that never comes and Node exits 13 with a warning about the pending top-level await.
 */
function dieOnClosedPipe(error: NodeJS.ErrnoException): void {
  if (error.code !== 'EPIPE') throw error;
  // Listening to SIGPIPE and then no longer puts back its default action, which ends the process.
  const ignore = () => {};
  process.on('SIGPIPE', ignore).off('SIGPIPE', ignore);
  process.kill(process.pid, 'SIGPIPE');
}
process.stdout.on('error', dieOnClosedPipe);
process.stderr.on('error', dieOnClosedPipe);

if (process.argv[2] === '--version') {
  // oclif's Config.userAgent, as oclif prints it for --version as the first argument. (Read, not
  // imported: tsc would copy an imported package.json into dist/, where Node would take it for the
  // package.json of dist/src.)
  const packageJson = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {name: string; version: string};
  process.stdout.write(`${packageJson.name}/${packageJson.version} ${process.platform}-${process.arch} node-${process.version}\n`);
} else {
  // The project root: package.json, oclif.manifest.json and, for oclif, dist/plugin/command-table.js.
  const root = fileURLToPath(new URL('../..', import.meta.url));
  // Not a top-level await: nothing the run leaves pending can turn into Node's warning and exit 13.
  void import('./oclif-entry.ts').then(({execute}) => execute({dir: root}));
}
