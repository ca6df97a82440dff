// The plugin run with any Node 24 (`node bin/run.js ...`); bin/kubectl-proxyctl starts the same bundle.
import '../dist/plugin/kubectl-proxyctl.js';
