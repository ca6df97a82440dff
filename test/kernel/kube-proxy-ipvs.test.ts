// kube-proxy's ipvs state from its own tests (test/fixtures/kube-proxy/ipvs) loaded into a node
// namespace with ipset restore and ipvsadm-restore, with its service addresses on kube-ipvs0 (the
// KUBE-IPVS-IPS entries). Read back with ipvsadm-save -n and ipset save, `diff --rules` against the
// case's objects finds no drift, and real connections from a pod to the ClusterIP reach the real
// servers `trace --rules` over the read-back state predicts, masqueraded exactly when it says (the
// fixtures hold no iptables layer, so neither the kernel nor the trace masquerades).
//
// This machine's kernel has no IP_VS: on such a host the file runs itself in the qemu guest.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {readFileSync} from 'node:fs';
import {join} from 'node:path';
import {hostHasIpvs} from '../../scripts/qemu/guest.ts';
import {
  createNamespaces,
  deleteNamespacesWithPrefix,
  execInNamespace,
  newNamespacePrefix,
  runIpBatch,
  setSysctls,
} from '../../src/lab/netns/index.ts';
import {DemoAppGroup, probeFromNamespace} from '../../src/lab/workload/launch.ts';
import {diffOffline} from '../../src/plugin/lib/offline-diff.ts';
import {readRulesDump, splitDump, traceDump} from '../../src/plugin/lib/rules-dump.ts';
import {kubeProxyCaseModel, kubeProxyCases} from '../fixtures/kube-proxy/fixtures.ts';
import {itRunsInGuest} from './in-guest.ts';
import {kernelUnavailable, nodeStartTimeoutMs} from './namespace-lab.ts';

const inGuest = process.env.PROXYCTL_IN_GUEST === '1';
const runHere = !kernelUnavailable && (inGuest || hostHasIpvs());
const pod = '10.0.0.2';

describe("kube-proxy's ipvs state in a kernel with IP_VS", {concurrency: false, timeout: 1_200_000}, () => {
  if (!runHere && !kernelUnavailable) {
    itRunsInGuest(import.meta.url, {timeoutMs: 1_000_000});
    return;
  }
  const skip = runHere ? false : `needs root: ${kernelUnavailable}`;

  for (const fixture of kubeProxyCases('ipvs')) {
    describe(fixture.name, {skip}, () => {
      const prefix = newNamespacePrefix('pxkpvs');
      const node = `${prefix}node`;
      const podNs = `${prefix}pod`;
      const apps = new DemoAppGroup();
      const text = readFileSync(join(fixture.dir, 'kube-proxy.ipvs'), 'utf8').replace(/^#.*\n/gm, '');
      const ipvsadm = text.split('\n').filter((line) => /^-[Aa] /.test(line));
      const ipset = text.split('\n').filter((line) => /^(create|add) /.test(line));
      const endpoints = [...new Set(ipvsadm.filter((line) => line.startsWith('-a ')).map((line) => line.split(' ')[4].split(':')[0]))];
      const boundAddresses = ipset.filter((line) => line.startsWith('add KUBE-IPVS-IPS ')).map((line) => line.split(' ')[2]);
      const endpointNs = (index: number) => `${prefix}ep${index}`;
      let readBack = '';

      before(async () => {
        await createNamespaces([node, podNs, ...endpoints.map((_, index) => endpointNs(index))]);
        await runIpBatch(`veths of ${prefix}`, [
          `link add vpod netns ${node} type veth peer name eth0 netns ${podNs}`,
          ...endpoints.map((_, index) => `link add vep${index} netns ${node} type veth peer name eth0 netns ${endpointNs(index)}`),
        ]);
        await runIpBatch(
          `node ${node}`,
          [
            'link set lo up',
            'link set vpod up',
            'addr add 10.0.0.1/24 dev vpod',
            'link add kube-ipvs0 type dummy',
            ...boundAddresses.map((address) => `addr add ${address}/32 dev kube-ipvs0`),
            ...endpoints.flatMap((ip, index) => [`link set vep${index} up`, `route add ${ip}/32 dev vep${index}`]),
          ],
          node,
        );
        await setSysctls(node, {
          'net.ipv4.ip_forward': 1,
          'net.ipv4.conf.all.send_redirects': 0,
          ...Object.fromEntries(endpoints.map((_, index) => [`net.ipv4.conf.vep${index}.proxy_arp`, 1])),
        });
        await runIpBatch(
          `pod ${podNs}`,
          ['link set lo up', 'link set eth0 up', `addr add ${pod}/24 dev eth0`, 'route add default via 10.0.0.1'],
          podNs,
        );
        for (const [index, ip] of endpoints.entries()) {
          await runIpBatch(
            `endpoint ${ip}`,
            ['link set lo up', 'link set eth0 up', `addr add ${ip}/32 dev eth0`, 'route add default dev eth0'],
            endpointNs(index),
          );
        }
        await execInNamespace(node, ['ipset', 'restore'], {input: `${ipset.join('\n')}\n`});
        await execInNamespace(node, ['ipvsadm', '-R'], {input: `${ipvsadm.join('\n')}\n`});
        // One dump after the other, each on its own lines, as a user saves them into one file.
        const saved = [(await execInNamespace(node, ['ipvsadm', '-Sn'])).stdout, (await execInNamespace(node, ['ipset', 'save'])).stdout];
        readBack = saved.map((part) => `${part.trimEnd()}\n`).join('');
        await apps.start(
          endpoints.map((ip, index) => ({namespace: endpointNs(index), name: `ep-${ip}`, httpPort: 80, udpPort: 5353})),
          {startTimeoutMs: nodeStartTimeoutMs},
        );
      });
      after(async () => {
        await apps.stopAll();
        await deleteNamespacesWithPrefix(prefix);
      });

      it('ipvsadm -Sn and ipset save of the loaded state: diff --rules finds no drift', async () => {
        const offline = await kubeProxyCaseModel(fixture);
        const dump = readRulesDump(splitDump('read back', readBack), offline.model.family);
        const result = diffOffline(offline.model, dump, {
          serviceCIDRs: offline.serviceCIDRs,
          scheduler: offline.flags['ipvs-scheduler'],
        });
        assert.equal(result.equal, true, `${result.text}\nread back:\n${readBack}`);
      });

      it('a pod reaches the ClusterIP through the real servers trace --rules predicts', async () => {
        const [ip, protoPort] = ipset
          .find((line) => line.startsWith('add KUBE-CLUSTER-IP '))!
          .split(' ')[2]
          .split(',');
        const port = protoPort.split(':')[1];
        const dump = readRulesDump(splitDump('read back', readBack));
        const predicted = traceDump(dump, {srcIP: pod, dstIP: ip, dstPort: Number(port), protocol: 'TCP', origin: 'arriving'}, [
          '10.0.0.1',
        ]);
        assert.equal(predicted.verdict, 'DNAT', JSON.stringify(predicted));
        const results = await probeFromNamespace(
          podNs,
          {protocol: 'tcp', host: ip, port: Number(port), timeoutMs: 4000},
          2 * predicted.branches.length,
          {startTimeoutMs: nodeStartTimeoutMs},
        );
        const reached = new Set<string>();
        for (const result of results) {
          assert.equal(result.outcome, 'reply', JSON.stringify(result));
          if (result.outcome !== 'reply') continue;
          const branch = predicted.branches.find((candidate) => candidate.endpoint === `${result.reply.podIP}:80`);
          assert.ok(branch, `reached ${result.reply.podIP}:80, not a predicted real server`);
          assert.equal(branch.masquerade, result.reply.clientIP !== pod, `the endpoint saw ${result.reply.clientIP}`);
          reached.add(branch.endpoint);
        }
        // rr over 2n connections reaches every real server.
        assert.equal(reached.size, predicted.branches.length);
      });
    });
  }
});
