// oclif as main.ts loads it, after its own setup: a module of its own so that the bundle keeps the
// import lazy (a chunk) and the named export (oclif is CommonJS).
export {execute} from '@oclif/core';
