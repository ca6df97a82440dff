// `lab exec`'s split of its own arguments from the command's: the command after the first `--`
// reaches the process word for word (the real exec in a lab is in test/lab/lab.test.ts).
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {splitAtDoubleDash} from '../../src/plugin/commands/lab/exec.ts';

test('everything after the first -- is the command, repeated flags, a second -- and --name included', () => {
  const command = ['printf', '[%s]', 'curl', '-H', 'A: 1', '-v', '-H', 'B: 2', '--', '--name', 'x'];
  assert.deepEqual(splitAtDoubleDash(['--name', 'lab-a', 'node-1', '--', ...command]), {own: ['--name', 'lab-a', 'node-1'], command});
  assert.deepEqual(splitAtDoubleDash(['node-1', '--name=lab-a', '--', 'iptables', '-D', 'X', '-p', 'tcp', '-m', 'tcp']), {
    own: ['node-1', '--name=lab-a'],
    command: ['iptables', '-D', 'X', '-p', 'tcp', '-m', 'tcp'],
  });
});

test('without --, the parser sees every argument and an empty command after -- stays empty', () => {
  assert.deepEqual(splitAtDoubleDash(['node-1', 'ip', 'route']), {own: ['node-1', 'ip', 'route'], command: undefined});
  assert.deepEqual(splitAtDoubleDash(['node-1', '--']), {own: ['node-1'], command: []});
});
