// Loaded into every Node process in the qemu guest (guest.ts puts it in NODE_OPTIONS as --import;
// V8's own flags are not allowed in NODE_OPTIONS). Under qemu's software emulation V8 died now and
// then with "Check failed: it->second.Size() > offset", always in Runtime_WasmTriggerTierUp: when
// WebAssembly code tiers up, V8 walks the stack and fails to find the code of a frame. Node runs
// WebAssembly of its own: the TypeScript type stripper (amaro, for every .ts file), cjs-module-lexer
// when ESM imports a CommonJS package, undici's llhttp. Keeping WebAssembly on its baseline compiler
// never calls that path; no run on a real CPU has shown the failure.
//
// Plain JavaScript on purpose: were this file TypeScript, Node would compile the type stripper's
// WebAssembly to read it, before these flags were set, and that code would still tier up.
import {setFlagsFromString} from 'node:v8';

setFlagsFromString('--liftoff-only');
setFlagsFromString('--no-wasm-dynamic-tiering');
