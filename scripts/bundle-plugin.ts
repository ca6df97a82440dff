// The kubectl plugin as a few modules in dist/plugin/ (esbuild), which bin/kubectl-proxyctl runs:
// - kubectl-proxyctl.js, the launcher (src/plugin/main.ts);
// - command-table.js, every command, which oclif loads only when one runs (src/plugin/command-table.ts);
// - NAME-HASH.js, chunks they share (oclif first of all), and those loaded on demand.
// Node resolves and reads hundreds of files to load oclif, client-node and the rest from
// node_modules; from the bundle it reads a handful, and only the part of client-node the plugin
// uses (docs/development.md, Plugin start, has the figures).
//
// The lab's code (src/lab) starts programs that sit beside it (the supervisor, the demo workload,
// the agent): it finds them from import.meta.url, which inside the bundle would name dist/plugin/.
// Here each bundled module's import.meta.url is the address of its own tsc output in dist/src, which
// npm run build writes first.
import {rm} from 'node:fs/promises';
import {fileURLToPath} from 'node:url';
import {build} from 'esbuild';
import {importMetaOf} from './esbuild-import-meta.ts';

const root = fileURLToPath(new URL('..', import.meta.url));
const sourceDir = `${root}src/`;

// Chunk names carry a hash of their contents: the last build's would otherwise stay beside them.
await rm(`${root}dist/plugin`, {recursive: true, force: true});
await build({
  absWorkingDir: root,
  entryPoints: {
    'kubectl-proxyctl': 'src/plugin/main.ts',
    'command-table': 'src/plugin/command-table.ts',
    'command-not-found': 'src/plugin/hooks/command-not-found.ts',
  },
  bundle: true,
  splitting: true,
  platform: 'node',
  format: 'esm',
  target: 'node24',
  outdir: 'dist/plugin',
  // Beside the entries, not in a folder of their own: every module of the bundle lives in
  // dist/plugin/, which the addresses written for the lab's code count from.
  chunkNames: '[name]-[hash]',
  // oclif and some of client-node's dependencies are CommonJS: require() and __dirname as in CommonJS.
  banner: {
    js: [
      "import {createRequire as __createRequire} from 'node:module';",
      "import {dirname as __pathDirname} from 'node:path';",
      "import {fileURLToPath as __fileURLToPath} from 'node:url';",
      'const require = __createRequire(import.meta.url);',
      'const __filename = __fileURLToPath(import.meta.url);',
      'const __dirname = __pathDirname(__filename);',
    ].join(' '),
  },
  // oclif reads tsconfig.json with TypeScript only in development (NODE_ENV=development or test).
  external: ['typescript'],
  plugins: [
    importMetaOf({
      sourceDir,
      keep: (path) => path.startsWith(`${sourceDir}plugin/`),
      target: (pathInSource) => `../src/${pathInSource}`,
    }),
  ],
  minifyWhitespace: true,
  minifySyntax: true,
  legalComments: 'linked',
  logLevel: 'warning',
});
