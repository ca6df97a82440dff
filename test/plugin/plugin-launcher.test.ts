// The built plugin as kubectl starts it: bin/kubectl-proxyctl over the bundle in dist/plugin/.
// --version, --help and a command from a new process, through kubectl when it is installed; every
// command file in the bundle's command table; and a reader that closes the pipe early
// (`kubectl proxyctl --help | head`), which must end the plugin quietly, as it ends git and kubectl.
import assert from 'node:assert/strict';
import {execFile, spawn, spawnSync} from 'node:child_process';
import {cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join, relative} from 'node:path';
import {describe, it} from 'node:test';
import {fileURLToPath} from 'node:url';
import {Config} from '@oclif/core';
import {COMMANDS} from '../../src/plugin/command-table.ts';

const root = fileURLToPath(new URL('../../', import.meta.url));
const launcher = join(root, 'bin/kubectl-proxyctl');
const packageJson = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {version: string};
const built = existsSync(join(root, 'dist/plugin/kubectl-proxyctl.js')) && existsSync(join(root, 'dist/plugin/command-table.js'));
const skip = built ? undefined : 'needs the build: run `npm run build` first (bin/kubectl-proxyctl runs dist/plugin/)';
const env = {...process.env, NO_COLOR: '1', PATH: `${join(root, 'bin')}:${process.env.PATH}`};

function run(command: string, args: string[]): Promise<{code: number | null; stdout: string; stderr: string}> {
  return new Promise((resolve) => {
    execFile(command, args, {env, timeout: 60_000}, (error, stdout, stderr) =>
      resolve({code: error ? (typeof error.code === 'number' ? error.code : null) : 0, stdout, stderr}),
    );
  });
}

describe('the built plugin as a new process', {skip}, () => {
  it('--version says what oclif says: name/version platform-arch node-version', async () => {
    const oclif = await Config.load(root);
    const answer = await run(launcher, ['--version']);
    assert.equal(answer.code, 0, answer.stderr);
    assert.equal(answer.stdout, `${oclif.userAgent}\n`);
    assert.match(answer.stdout, new RegExp(`^proxyctl/${packageJson.version.replaceAll('.', '\\.')} `));
    assert.equal(answer.stderr, '');
  });

  it('--help lists the commands and the lab topic', async () => {
    const answer = await run(launcher, ['--help']);
    assert.equal(answer.code, 0, answer.stderr);
    for (const command of ['diff', 'help', 'render', 'status', 'sync', 'trace', 'version'])
      assert.match(answer.stdout, new RegExp(`^  ${command}\\s`, 'm'));
    assert.match(answer.stdout, /^TOPICS\n {2}lab\s/m);
  });

  it('runs commands from the bundle: version, help for a command, render of the bundled example', async () => {
    const version = await run(launcher, ['version']);
    assert.deepEqual(version, {code: 0, stdout: `${packageJson.version}\n`, stderr: ''});
    const help = await run(launcher, ['help', 'trace']);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, /Follow a Service's packet/);
    const render = await run(launcher, ['render', '-f', join(root, 'examples/cluster.yaml')]);
    assert.equal(render.code, 0, render.stderr);
    assert.match(render.stdout, /^\*nat$/m);
    assert.match(render.stdout, /^-A KUBE-SERVICES /m);
    assert.match(render.stdout, /^COMMIT$/m);
  });

  it('needs only package.json, oclif.manifest.json and dist/plugin/: no node_modules, no sources', async (t) => {
    const alone = mkdtempSync(join(tmpdir(), 'proxyctl-plugin-alone-'));
    t.after(() => rmSync(alone, {recursive: true, force: true}));
    for (const path of ['package.json', 'oclif.manifest.json', 'dist/plugin', 'examples/cluster.yaml'])
      cpSync(join(root, path), join(alone, path), {recursive: true});
    const bundle = join(alone, 'dist/plugin/kubectl-proxyctl.js');
    const version = await run(process.execPath, [bundle, 'version']);
    assert.deepEqual(version, {code: 0, stdout: `${packageJson.version}\n`, stderr: ''});
    const help = await run(process.execPath, [bundle, 'help', 'status']);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, /Show the proxyctl agents/);
    const render = await run(process.execPath, [bundle, 'render', '-f', join(alone, 'examples/cluster.yaml'), '--mode', 'nftables']);
    assert.equal(render.code, 0, render.stderr);
    assert.match(render.stdout, /^add table ip kube-proxy /m);
  });

  const kubectlMissing = spawnSync('kubectl', ['version', '--client'], {stdio: 'ignore'}).error;
  it('kubectl finds it as `kubectl proxyctl`', {
    skip: kubectlMissing ? `kubectl is not installed (${kubectlMissing.message})` : undefined,
  }, async () => {
    const answer = await run('kubectl', ['proxyctl', '--version']);
    assert.equal(answer.code, 0, answer.stderr);
    assert.match(answer.stdout, /^proxyctl\/\S+ \S+-\S+ node-v\d+/);
  });

  for (const args of [['--help'], ['render', '-f', join(root, 'examples/cluster.yaml')], ['--version']]) {
    it(`a reader that closes the pipe first ends \`kubectl proxyctl ${args[0]}\` by SIGPIPE, silently, as git and kubectl`, async () => {
      const child = spawn(launcher, args, {env, stdio: ['ignore', 'pipe', 'pipe']});
      // Closed before the plugin writes anything: its first write meets no reader (EPIPE).
      child.stdout.destroy();
      let stderr = '';
      child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
      const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
        child.once('close', (c, s) => resolve([c, s])),
      );
      assert.doesNotMatch(stderr, /unsettled top-level await|EPIPE|Error|\n\s+at /);
      // render may warn about its input on stderr; --help and --version have nothing to say there.
      if (args[0] !== 'render') assert.equal(stderr, '');
      assert.deepEqual({code, signal}, {code: null, signal: 'SIGPIPE'});
    });
  }
});

describe('the command table', () => {
  it('names every command file under src/plugin/commands by its oclif id', () => {
    const commandsDir = join(root, 'src/plugin/commands');
    const files = readdirSync(commandsDir, {recursive: true, encoding: 'utf8'}).filter((file) => file.endsWith('.ts'));
    const ids = files.map((file) => relative(commandsDir, join(commandsDir, file)).replace(/\.ts$/, '').split('/').join(':'));
    assert.deepEqual(
      Object.keys(COMMANDS)
        .filter((id) => id !== 'help')
        .sort(),
      ids.sort(),
    );
  });
});
