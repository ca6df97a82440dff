// releaseGarbage gives back what a sync read, also when the last regular-expression match of the
// sync was on a rule cut out of a large iptables-save output. Run in a Node with --expose-gc, as
// bin/proxyctl-agent starts the agent.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {test} from 'node:test';
import {fileURLToPath} from 'node:url';

const bookkeeping = fileURLToPath(new URL('../../../src/agent/sync/sync-bookkeeping.ts', import.meta.url));

test('releaseGarbage frees a large output whose rule was the last regular-expression match', () => {
  const script = `
    const {releaseGarbage} = await import(${JSON.stringify(bookkeeping)});
    const heapUsed = () => process.memoryUsage().heapUsed;
    releaseGarbage();
    const before = heapUsed();
    (() => {
      // A 32 MB output, as iptables-save prints 10,000 services; one rule of it matched last.
      let output = '';
      for (let i = 0; output.length < 32e6; i++) output += '-A KUBE-SEP-' + String(i).padStart(16, '0') + ' -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:8080\\n';
      const rule = output.slice(output.lastIndexOf('\\n', output.length - 2) + 1, output.length - 1);
      if (!/^-A\\s+(\\S+)/.test(rule.trim())) throw new Error('the rule did not match');
    })();
    releaseGarbage();
    console.log(JSON.stringify({retainedMiB: (heapUsed() - before) / 1048576}));
  `;
  const output = execFileSync(process.execPath, ['--expose-gc', '--input-type=module', '-e', script], {encoding: 'utf8'});
  const {retainedMiB} = JSON.parse(output) as {retainedMiB: number};
  assert.ok(retainedMiB < 4, `${retainedMiB.toFixed(1)} MiB of the 32 MB output still held after releaseGarbage`);
});
