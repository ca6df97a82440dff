// The agent as the image runs it: each program the agent process runs (the agent, and the two it
// starts inside a network namespace: the socket binder and the probe) bundled by esbuild into one
// module, at the place its tsc output would have in dist/src, with a package.json naming the
// release. Together with a Node runtime that is everything the agent needs: no node_modules.
// The tree is dist/agent/ here and /app in the image (scripts/release/agent-image.ts, manifests/Dockerfile).
//
// Node started with --conditions=proxyctl-bundle resolves the agent's "#client-node" import to the
// tree-shaken copy of client-node (scripts/bundle-client-node.ts); esbuild resolves it the same way.
import {mkdir, readFile, rm, writeFile} from 'node:fs/promises';
import {dirname, relative} from 'node:path';
import {fileURLToPath} from 'node:url';
import {build} from 'esbuild';
import {importMetaOf} from './esbuild-import-meta.ts';

const root = fileURLToPath(new URL('..', import.meta.url));
const sourceDir = `${root}src/`;
export const agentBundleDir = `${root}dist/agent/`;

/** The programs, by their path under src/. */
const programs = ['agent/main.ts', 'agent/health/netns-binder.ts', 'agent/api/probe.ts'];

/** The node flags the image's entrypoint and bin/proxyctl-agent start the agent with (see there why). */
export const agentNodeFlags = ['--max-semi-space-size=8', '--expose-gc'];
export const agentEnvironment = {MALLOC_TRIM_THRESHOLD_: '1048576', MALLOC_MMAP_THRESHOLD_: '65536'};
export const agentMainInBundle = 'dist/src/agent/main.js';

async function bundleProgram(program: string): Promise<void> {
  const outputInSource = program.replace(/\.ts$/, '.js');
  const towards = (pathInSource: string) => {
    const path = relative(dirname(outputInSource), pathInSource);
    return path.startsWith('.') ? path : `./${path}`;
  };
  await build({
    absWorkingDir: root,
    entryPoints: [`src/${program}`],
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node24',
    conditions: ['proxyctl-bundle'],
    outfile: `${agentBundleDir}dist/src/${outputInSource}`,
    // Some of the dependencies are CommonJS: require() as in CommonJS.
    banner: {js: "import {createRequire as __createRequire} from 'node:module'; const require = __createRequire(import.meta.url);"},
    plugins: [importMetaOf({sourceDir, target: towards, entry: `${sourceDir}${program}`})],
    minifyWhitespace: true,
    minifySyntax: true,
    legalComments: 'linked',
    logLevel: 'warning',
  });
}

export async function bundleAgent(): Promise<string> {
  await rm(agentBundleDir, {recursive: true, force: true});
  await mkdir(agentBundleDir, {recursive: true});
  for (const program of programs) await bundleProgram(program);
  const {name, version, license} = JSON.parse(await readFile(`${root}package.json`, 'utf8')) as Record<string, string>;
  await writeFile(`${agentBundleDir}package.json`, `${JSON.stringify({name, version, license, type: 'module', private: true}, null, 2)}\n`);
  return agentBundleDir;
}

if (import.meta.main) await bundleAgent();
