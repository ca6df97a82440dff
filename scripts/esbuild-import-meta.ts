// Code bundled by esbuild still finds files beside its source (programs it starts, package.json):
// each module's import.meta.url becomes the address of that module's file in a tree that holds the
// programs it looks for, instead of the address of whichever bundle file the module landed in.
// The plugin's bundle points at the tsc output in dist/src (scripts/bundle-plugin.ts); the agent's
// bundle at its own tree of bundled programs laid out as dist/src is (scripts/bundle-agent.ts).
import {readFile} from 'node:fs/promises';
import {relative} from 'node:path';
import type {Plugin} from 'esbuild';

/**
 * importMetaOf rewrites, in every module under `sourceDir` except those `keep` accepts,
 * `import.meta.url` to `new URL(target(path), import.meta.url).href`, where target(path) is the
 * address of the file standing for the module, relative to the bundle file. `import.meta.main`
 * becomes false outside `entry` (a module bundled into another program is not the main one).
 */
export function importMetaOf(options: {
  sourceDir: string;
  target: (pathInSource: string) => string;
  keep?: (path: string) => boolean;
  entry?: string;
}): Plugin {
  const {sourceDir, target, keep, entry} = options;
  return {
    name: 'import-meta-of-source-tree',
    setup(esbuild) {
      esbuild.onLoad({filter: /\.ts$/}, async ({path}) => {
        if (!path.startsWith(sourceDir) || keep?.(path)) return undefined;
        const contents = await readFile(path, 'utf8');
        if (!contents.includes('import.meta.url') && !contents.includes('import.meta.main')) return undefined;
        const address = JSON.stringify(target(relative(sourceDir, path).replace(/\.ts$/, '.js')));
        let rewritten = contents.replaceAll('import.meta.url', `new URL(${address}, import.meta.url).href`);
        if (path !== entry) rewritten = rewritten.replaceAll('import.meta.main', 'false');
        return {contents: rewritten, loader: 'ts'};
      });
    },
  };
}
