// The function-length check counts every kind of function, nested ones on their own, by name.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {longFunctions} from '../../scripts/check-function-length.ts';

const body = (lines: number): string => Array.from({length: lines}, (_, i) => `  const v${i} = ${i};`).join('\n');

test('functions, methods and arrow functions over the limit are named with their line and length', () => {
  const text = [
    `export function short() {\n${body(3)}\n}`,
    `export function long() {\n${body(8)}\n}`,
    `class Box {\n  method() {\n${body(9)}\n  }\n}`,
    `const arrow = () => {\n${body(10)}\n};`,
  ].join('\n');
  assert.deepEqual(
    longFunctions('x.ts', text, 8).map(({name, line, lines}) => ({name, line, lines})),
    [
      {name: 'long', line: 6, lines: 10},
      {name: 'method', line: 17, lines: 11},
      {name: 'arrow', line: 29, lines: 12},
    ],
  );
});

test('a long function holding a short one is named once; a function at the limit passes', () => {
  const text = `function outer() {\n  const inner = () => 1;\n${body(4)}\n}`;
  assert.deepEqual(longFunctions('x.ts', text, 7), []);
  assert.deepEqual(
    longFunctions('x.ts', text, 6).map((f) => f.name),
    ['outer'],
  );
});
