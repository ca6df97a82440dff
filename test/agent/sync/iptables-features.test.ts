// What the agent tells core about the node in iptables mode: the nfacct objects it created (or
// could not), --random-fully by iptables version, nf_conntrack_tcp_be_liberal; and the nfacct
// counters on /metrics.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {createAgentMetrics} from '../../../src/agent/health/metrics.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {detectIptablesFeatures, readNfacctCounters, readNfacctPackets} from '../../../src/agent/sync/iptables-features.ts';
import {RecordingHost} from '../recording-host.ts';

describe('detectIptablesFeatures', () => {
  it('creates the missing nfacct objects, keeps existing ones, and reads the rest of the node', async () => {
    const host = new RecordingHost();
    host.nfacctObjects!.set('ct_state_invalid_dropped_pkts', 7);
    host.sysctls.set('net.netfilter.nf_conntrack_tcp_be_liberal', '0');
    const features = await detectIptablesFeatures(host, memoryLogger(), {families: ['IPv4'], createCounters: true});
    assert.deepEqual(features, {
      nfacctCounters: ['ct_state_invalid_dropped_pkts', 'localhost_nps_accepted_pkts'],
      randomFully: true,
      conntrackTCPLiberal: false,
    });
    assert.deepEqual(
      host.calls.filter((call) => call.startsWith('nfacct add')),
      ['nfacct add localhost_nps_accepted_pkts'],
    );
    assert.equal(await readNfacctPackets(host, 'ct_state_invalid_dropped_pkts'), 7, 'an existing counter keeps its count');
  });

  it('without nfnetlink_acct: no counters, logged by name; old iptables: no --random-fully; liberal conntrack: no INVALID drop', async () => {
    const host = new RecordingHost();
    host.nfacctObjects = undefined;
    host.iptablesVersionText = 'iptables v1.6.1';
    host.sysctls.set('net.netfilter.nf_conntrack_tcp_be_liberal', '1');
    const log = memoryLogger();
    const features = await detectIptablesFeatures(host, log, {families: ['IPv4'], createCounters: true});
    assert.deepEqual(features, {nfacctCounters: [], randomFully: false, conntrackTCPLiberal: true});
    assert.equal(log.lines.filter((line) => /cannot create nfacct counter/.test(line)).length, 2);
    assert.ok(log.lines.some((line) => line.includes('localhost_nps_accepted_pkts')));
  });

  it('only reads when told not to create (an agent that must not change the node)', async () => {
    const host = new RecordingHost();
    host.nfacctObjects!.set('localhost_nps_accepted_pkts', 0);
    const features = await detectIptablesFeatures(host, memoryLogger(), {families: ['IPv4'], createCounters: false});
    assert.deepEqual(features.nfacctCounters, ['localhost_nps_accepted_pkts']);
    assert.ok(!host.calls.some((call) => call.startsWith('nfacct add')));
  });
});

describe('nfacct metrics', () => {
  it('publishes each counter read at scrape time under kube-proxy names, and no sample for one that cannot be read', async () => {
    const host = new RecordingHost();
    host.nfacctObjects!.set('ct_state_invalid_dropped_pkts', 3);
    const metrics = createAgentMetrics({nfacct: () => readNfacctCounters(host)});
    const callsBefore = host.calls.length;
    let page = await metrics.registry.metrics();
    assert.deepEqual(host.calls.slice(callsBefore), ['nfacct list'], 'one command per scrape, for both counters');
    assert.match(page, /^# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter$/m);
    assert.match(page, /^kubeproxy_iptables_ct_state_invalid_dropped_packets_total 3$/m);
    assert.doesNotMatch(page, /^kubeproxy_iptables_localhost_nodeports_accepted_packets_total /m);
    host.nfacctObjects!.set('ct_state_invalid_dropped_pkts', 4);
    page = await metrics.registry.metrics();
    assert.match(page, /^kubeproxy_iptables_ct_state_invalid_dropped_packets_total 4$/m);
    assert.doesNotMatch(
      await createAgentMetrics().registry.metrics(),
      /kubeproxy_iptables_ct_state/,
      'not registered outside iptables mode',
    );
  });
});
