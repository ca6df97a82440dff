// migrate-check --to nftables asks whether the node can run nftables mode before it predicts
// anything: nft must answer, and the kernel must be one kube-proxy runs nftables mode on (5.13 or
// later). It asks nft a question that does not read every rule of every table.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {checkNftablesRuns} from '../../../src/agent/api/methods/behaviour.ts';
import {RecordingHost} from '../recording-host.ts';

function hostWithKernel(release: string): RecordingHost {
  const host = new RecordingHost();
  host.sysctls.set('kernel.osrelease', `${release}\n`);
  return host;
}

describe('can this node run nftables mode', () => {
  for (const release of ['5.13.0', '6.1.0-40-amd64', '10.0.1']) {
    it(`kernel ${release}: yes, asked with nft -t list sets, not nft list tables`, async () => {
      const host = hostWithKernel(release);
      await checkNftablesRuns(host);
      assert.deepEqual(
        host.calls.filter((call) => call.startsWith('nft ')),
        ['nft -t list sets'],
      );
    });
  }
  for (const release of ['5.10.0-28-amd64', '4.19.0', '5.4.0-150-generic']) {
    it(`kernel ${release}: no, in kube-proxy's words, naming the kernel`, async () => {
      await assert.rejects(
        checkNftablesRuns(hostWithKernel(release)),
        new RegExp(
          `^Error: kube-proxy in nftables mode requires kernel 5\\.13 or later; this node runs ${release.replaceAll('.', '\\.')}$`,
        ),
      );
    });
  }
});
