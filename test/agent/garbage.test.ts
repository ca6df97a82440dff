// releaseGarbage gives back what a sync read, also when the last regular-expression match of the
// sync was on a rule cut out of a large iptables-save output. Run in a Node with --expose-gc, as
// bin/proxyctl-agent starts the agent.
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import {test} from 'node:test';
import {fileURLToPath} from 'node:url';

const garbage = fileURLToPath(new URL('../../src/agent/garbage.ts', import.meta.url));

test('releaseGarbage frees a large output whose rule was the last regular-expression match', () => {
  const script = `
    const {releaseGarbage} = await import(${JSON.stringify(garbage)});
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

test('a collection asked for while a text is deflated waits for it, and frees the text it was given', () => {
  const compressedText = fileURLToPath(new URL('../../src/agent/api/rules/compressed-text.ts', import.meta.url));
  const script = `
    const {releaseGarbage, releaseGarbageSoon} = await import(${JSON.stringify(garbage)});
    const {CompressedText} = await import(${JSON.stringify(compressedText)});
    const heapUsed = () => process.memoryUsage().heapUsed;
    releaseGarbage();
    const before = heapUsed();
    let text = '';
    for (let i = 0; text.length < 32e6; i++) text += '-A KUBE-SEP-' + String(i).padStart(16, '0') + ' -p tcp -m tcp -j DNAT --to-destination 10.0.0.' + (i % 250) + ':8080\\n';
    const held = new CompressedText(text);
    text = undefined;
    // Asked for at once, as a reading asks once it is parsed: the text is still being deflated.
    releaseGarbageSoon();
    const whileDeflating = held.compressedBytes === undefined;
    await held.deflated;
    for (let turn = 0; turn < 3; turn++) await new Promise((resolve) => setImmediate(resolve));
    console.log(JSON.stringify({whileDeflating, retainedMiB: (heapUsed() - before) / 1048576, compressedMiB: held.compressedBytes / 1048576}));
  `;
  const output = execFileSync(process.execPath, ['--expose-gc', '--input-type=module', '-e', script], {encoding: 'utf8'});
  const {whileDeflating, retainedMiB, compressedMiB} = JSON.parse(output) as {
    whileDeflating: boolean;
    retainedMiB: number;
    compressedMiB: number;
  };
  assert.ok(whileDeflating, 'the collection was asked for after the text was deflated: the test shows nothing');
  assert.ok(compressedMiB < 8, `${compressedMiB.toFixed(1)} MiB deflated`);
  assert.ok(
    retainedMiB < compressedMiB + 4,
    `${retainedMiB.toFixed(1)} MiB held once the 32 MB text was deflated (${compressedMiB.toFixed(1)} MiB of it)`,
  );
});
