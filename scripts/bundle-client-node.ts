// The agent's own copy of @kubernetes/client-node: only what the agent imports from it (KubeConfig,
// Watch, the TokenReview and SubjectAccessReview clients), tree-shaken into one module at
// dist/vendor/client-node.js.
//
// Why: client-node's index, and its KubeConfig too, load the whole generated API, about 1,500
// modules. In the agent process that costs about 80 MiB of RSS and 0.8 s of start for classes it
// never uses; the tree-shaken module costs about 40 MiB and 0.3 s. The agent's RSS goal is
// 200 MiB at 10,000 services (docs/agent.md, Memory).
//
// The agent reaches it through the package's "#client-node" import: bin/proxyctl-agent and the
// image start Node with --conditions=proxyctl-bundle, which maps it here; without the condition
// (the plugin, tests from source) it is the package itself.
import {build} from 'esbuild';
import {fileURLToPath} from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));

await build({
  absWorkingDir: root,
  stdin: {
    contents: "export {AuthenticationV1Api, AuthorizationV1Api, KubeConfig, Watch} from '@kubernetes/client-node';",
    resolveDir: root,
    sourcefile: 'client-node-for-the-agent.js',
  },
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node24',
  outfile: 'dist/vendor/client-node.js',
  // Some of client-node's dependencies are CommonJS and call require().
  banner: {js: "import {createRequire} from 'node:module'; const require = createRequire(import.meta.url);"},
  legalComments: 'linked',
  // V8 keeps a module's source in the heap. Without comments and indentation, and in ASCII (a
  // comment's "\u2019" made V8 keep the 2.9 MB source two bytes a character), it is 1.9 MiB of the
  // agent's heap instead of 5.5. Names are kept, so stack traces still name functions.
  charset: 'ascii',
  minifyWhitespace: true,
  logLevel: 'warning',
});
