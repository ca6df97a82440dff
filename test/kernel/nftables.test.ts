// nftables mode against the kernel: render each node's table, load it with `nft -f` into the node
// namespaces of a namespace cluster, send real TCP and UDP from pods and external clients, and
// check what the endpoints saw. Each case also traces the table read back with `nft -j list` and
// checks the tracer predicted what the kernel did. The same cases as iptables mode, plus what
// nftables mode does differently (unknown ports and unallocated ClusterIPs, NodePorts on the
// primary IP only) and partial transactions.
import assert from 'node:assert/strict';
import {after, before, describe, it} from 'node:test';
import {
  buildProxyModel,
  changedServicePorts,
  nftablesLayouts,
  type EndpointSliceInput,
  type ProxyModel,
  type ServiceInput,
} from '../../src/core/model/index.ts';
import {
  diffNftables,
  parseNftablesJson,
  parseNftablesListing,
  parseNftablesScript,
  renderNftables,
  renderNftablesSync,
  ruleComment,
  ruleText,
  traceNftables,
  type NftablesState,
  type NftRuleset,
} from '../../src/core/nftables/index.ts';
import {createNamespace, deleteNamespace, execInNamespace, newNamespacePrefix, type NodeDescription} from '../../src/lab/netns/index.ts';
import {addChosenEndpointServices, registerChosenEndpointCases} from './chosen-endpoints.ts';
import {kernelUnavailable, nodeAddresses} from './namespace-lab.ts';
import {
  assertTraceAgrees,
  clusterIPs,
  describeTrace,
  firstPacket,
  nodePorts,
  type NodeTracer,
  replies,
  ServiceScenario,
  serviceCIDR,
  sharedServiceCases,
  slice,
  type Target,
} from './service-scenario.ts';

const scenario = new ServiceScenario();
const savedRules = new Map<string, string>();
const syncStates = new Map<string, {model: ProxyModel; state: NftablesState; applied: NftRuleset}>();

/** trace walks the table read back from the entry node. */
const trace: NodeTracer = (entry, sender, target) =>
  traceNftables(parseNftablesJson(savedRules.get(entry.name)!), firstPacket(sender, target), {
    localAddresses: scenario.localAddresses.get(entry.name)!,
  });

/**
 * assertSameTable: the table the kernel lists holds exactly the chains, rules and elements the
 * scripts wrote (what clients added to affinity sets at run time aside).
 */
function assertSameTable(expected: NftRuleset, listed: NftRuleset, what: string): void {
  const chains = (ruleset: NftRuleset) =>
    Object.fromEntries(
      [...ruleset.chains.values()].map((chain) => [
        chain.name,
        {
          hook: chain.hook,
          priority: chain.priority,
          rules: chain.rules.map((rule) => (ruleComment(rule) ? `${ruleText(rule)} comment "${ruleComment(rule)}"` : ruleText(rule))),
        },
      ]),
    );
  const sets = (ruleset: NftRuleset) =>
    Object.fromEntries(
      [...ruleset.sets.values()].map((set) => [
        set.name,
        set.name.startsWith('affinity-')
          ? []
          : set.elements
              .map(
                (element) =>
                  `${element.key}${element.comment ? ` comment ${element.comment}` : ''}${element.value !== undefined ? ` : ${element.value}` : ''}`,
              )
              .sort(),
      ]),
    );
  assert.deepEqual(chains(listed), chains(expected), `${what}: chains and rules`);
  assert.deepEqual(sets(listed), sets(expected), `${what}: sets and maps`);
}

/** loadNftables applies a script to the node's namespace as one `nft -f` transaction. */
async function loadNftables(entry: NodeDescription, script: string): Promise<void> {
  await execInNamespace(entry.namespace, ['nft', '-f', '-'], {input: script});
}

async function listNftables(entry: NodeDescription): Promise<string> {
  return (await execInNamespace(entry.namespace, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy'])).stdout;
}

/** conntrackEntries: the node's connection-tracking entries toward one address and port. */
async function conntrackEntries(entry: NodeDescription, target: Target): Promise<string> {
  const {stdout} = await execInNamespace(entry.namespace, [
    'sh',
    '-c',
    `conntrack -L -p ${target.protocol} -d ${target.ip} --dport ${target.port} 2>/dev/null || true`,
  ]);
  return stdout.trim();
}

describe('nftables rules in the kernel', {concurrency: false, timeout: 120_000}, () => {
  before(async () => {
    if (kernelUnavailable) return;
    const lab = await scenario.start();
    addChosenEndpointServices(scenario);
    // Every node gets the rules its own proxy would write; node-1's differ for Local policies.
    for (const entry of lab.topology.nodes) {
      const model = scenario.modelFor(entry);
      const sync = renderNftablesSync(model, {serviceCIDRs: [serviceCIDR], recreateTable: true});
      await loadNftables(entry, sync.script);
      syncStates.set(entry.name, {model, state: sync.state, applied: parseNftablesScript(sync.script)});
      savedRules.set(entry.name, await listNftables(entry));
      scenario.localAddresses.set(entry.name, await nodeAddresses(entry));
    }
  });
  after(() => scenario.close());

  it('the kernel lists the table exactly as the script wrote it', (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    for (const entry of scenario.lab!.topology.nodes)
      assertSameTable(syncStates.get(entry.name)!.applied, parseNftablesJson(savedRules.get(entry.name)!), entry.name);
  });

  sharedServiceCases(scenario, trace);
  registerChosenEndpointCases(scenario, trace);

  it('a port no service defines on a ClusterIP is rejected by the node', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 81};
    const results = await scenario.send(sender, target, 1, 3000);
    assert.equal(results[0].outcome, 'refused', JSON.stringify(results[0]));
    // Forwarded packets would leave a connection entry on the node; rejected ones never do.
    assert.equal(await conntrackEntries(scenario.node(0), target), '', 'the node forwarded the packet instead of rejecting it');
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('an address of the service CIDR that is no ClusterIP is dropped', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    const target: Target = {protocol: 'tcp', ip: '10.96.0.200', port: 80};
    const results = await scenario.send(sender, target, 1, 1500);
    assert.equal(results[0].outcome, 'timeout', JSON.stringify(results[0]));
    assertTraceAgrees(trace(scenario.node(0), sender, target), results, sender, target);
  });

  it('NodePorts answer on the primary node IP only', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const sender = scenario.pod('pod-0-0');
    const primary: Target = {protocol: 'tcp', ip: scenario.node(0).ip, port: nodePorts.cluster};
    const reached = replies(await scenario.send(sender, primary, 2), 'NodePort on the primary IP');
    for (const result of reached) assert.equal(result.reply.pod, 'pod-1-0');
    assertTraceAgrees(trace(scenario.node(0), sender, primary), reached, sender, primary);

    // The pod gateway address is the node's too, but not its primary IP: nothing DNATs, and no
    // process listens there, so the node itself refuses.
    const gateway: Target = {protocol: 'tcp', ip: scenario.node(0).podGateway, port: nodePorts.cluster};
    const refused = await scenario.send(sender, gateway, 1, 3000);
    assert.equal(refused[0].outcome, 'refused', JSON.stringify(refused[0]));
    const predicted = trace(scenario.node(0), sender, gateway);
    assert.equal(predicted.verdict, 'ACCEPT', describeTrace(predicted));
  });

  it('a partial sync after one endpoint change touches only that service, traffic elsewhere undisturbed', async (t) => {
    if (!scenario.skipUnlessLab(t)) return;
    const entry = scenario.node(0);
    const before = syncStates.get(entry.name)!;
    const at = (name: string) => scenario.at(name);
    const changedSlices = scenario.slices.map((candidate) =>
      candidate.metadata?.name === 'np-cluster-1' ? slice('np-cluster', [at('pod-1-0'), at('pod-0-2')]) : candidate,
    );
    const model = scenario.modelFor(entry, changedSlices);
    const changed = changedServicePorts(before.model, model);
    assert.deepEqual([...changed], ['default/np-cluster:http/TCP']);
    const sync = renderNftablesSync(model, {existing: before.state, changedServicePorts: changed, serviceCIDRs: [serviceCIDR]});
    assert.equal(sync.kind, 'partial');
    const objects = sync.script.split('\n').filter((line) => line.length > 0);
    for (const line of objects) {
      const servicePortChain = /(?:chain|rule) ip kube-proxy (\S*\/\S*)/.exec(line)?.[1];
      if (servicePortChain) assert.match(servicePortChain, /-default\/np-cluster\/tcp\/http$/, line);
      else assert.match(line, /^(add|delete) element ip kube-proxy (endpoint-targets-tcp-\d+|hairpin-endpoints) /, line);
    }

    // Traffic to another service keeps flowing while the transaction is applied.
    const sender = scenario.pod('pod-0-0');
    const other: Target = {protocol: 'tcp', ip: clusterIPs.web, port: 80};
    const during = scenario.send(sender, other, 40, 2000);
    await loadNftables(entry, sync.script);
    replies(await during, 'traffic to web during the partial sync');
    const applied = parseNftablesScript(sync.script, before.applied);
    syncStates.set(entry.name, {model, state: sync.state, applied});
    savedRules.set(entry.name, await listNftables(entry));
    assertSameTable(applied, parseNftablesJson(savedRules.get(entry.name)!), 'after the partial sync');
    // A full render of the new model differs from the kernel only in endpoint-map keys, which diff ignores.
    const drift = diffNftables(
      parseNftablesScript(renderNftables(model, {serviceCIDRs: [serviceCIDR]})),
      parseNftablesJson(savedRules.get(entry.name)!),
    );
    assert.equal(drift.text, '');
    assert.ok(drift.equal);

    const target: Target = {protocol: 'tcp', ip: entry.ip, port: nodePorts.cluster};
    const results = replies(await scenario.send(scenario.client(0), target, 30), 'NodePort after the change');
    assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].sort(), ['pod-0-2', 'pod-1-0']);
    assertTraceAgrees(trace(entry, scenario.client(0), target), results, scenario.client(0), target);
  });
});

describe('nftables IPv6 table in the kernel', {timeout: 60_000}, () => {
  for (const layout of nftablesLayouts) {
    it(`${layout} layout: loads and lists exactly as written: ip6 addresses, bracketed DNAT, affinity, firewall`, async (t) => {
      if (kernelUnavailable) {
        t.skip(`needs root: ${kernelUnavailable}`);
        return;
      }
      const v6Port = {name: 'http', protocol: 'TCP', port: 80, targetPort: 8080};
      const v6Service = (
        name: string,
        clusterIP: string,
        spec: Partial<NonNullable<ServiceInput['spec']>> = {},
        status?: ServiceInput['status'],
      ): ServiceInput => ({
        apiVersion: 'v1',
        kind: 'Service',
        metadata: {name, namespace: 'default'},
        spec: {type: 'ClusterIP', clusterIP, clusterIPs: [clusterIP], ipFamilies: ['IPv6'], ports: [v6Port], ...spec},
        ...(status ? {status} : {}),
      });
      const v6Slice = (name: string, ips: Array<[string, string]>): EndpointSliceInput => ({
        apiVersion: 'discovery.k8s.io/v1',
        kind: 'EndpointSlice',
        metadata: {name: `${name}-1`, namespace: 'default', labels: {'kubernetes.io/service-name': name}},
        addressType: 'IPv6',
        ports: [{name: 'http', protocol: 'TCP', port: 8080}],
        endpoints: ips.map(([ip, nodeName]) => ({addresses: [ip], nodeName})),
      });
      const model = buildProxyModel(
        {
          services: [
            v6Service('web6', 'fd00::10'),
            v6Service(
              'sticky6',
              'fd00::11',
              {
                sessionAffinity: 'ClientIP',
                type: 'LoadBalancer',
                loadBalancerSourceRanges: ['2001:db8::/64', '2001:db8:5::7/128'],
                ports: [{...v6Port, nodePort: 30001}],
              },
              {loadBalancer: {ingress: [{ip: '2001:db8:1::1'}]}},
            ),
          ],
          endpointSlices: [
            v6Slice('web6', [['fd00:10:244:1::5', 'node-1']]),
            v6Slice('sticky6', [
              ['fd00:10:244:1::6', 'node-1'],
              ['fd00:10:244:2::6', 'node-2'],
            ]),
          ],
          node: {
            apiVersion: 'v1',
            kind: 'Node',
            metadata: {name: 'node-1'},
            status: {addresses: [{type: 'InternalIP', address: 'fd00:10:240::11'}]},
          },
        },
        {family: 'IPv6', clusterCIDRs: ['fd00:10:244::/48'], config: {nftablesLayout: layout}},
      );
      assert.deepEqual(model.problems, []);
      const script = renderNftablesSync(model, {serviceCIDRs: ['fd00::/108']}).script;
      const namespace = `${newNamespacePrefix()}nft6`;
      await createNamespace(namespace);
      try {
        await execInNamespace(namespace, ['nft', '-f', '-'], {input: script});
        const listed = (await execInNamespace(namespace, ['nft', '-j', 'list', 'table', 'ip6', 'kube-proxy'])).stdout;
        assertSameTable(parseNftablesScript(script), parseNftablesJson(listed), 'IPv6');
        // nft's text listing reads as its JSON does.
        const text = (await execInNamespace(namespace, ['nft', 'list', 'ruleset'])).stdout;
        assert.equal(diffNftables(parseNftablesJson(listed), parseNftablesListing(text)).text, '');
        const result = traceNftables(
          parseNftablesListing(text),
          {srcIP: 'fd00:10:244:1::9', dstIP: 'fd00::10', dstPort: 80, protocol: 'TCP', origin: 'arriving'},
          {localAddresses: ['fd00:10:240::11']},
        );
        assert.deepEqual(
          result.branches.map((branch) => branch.endpoint),
          ['[fd00:10:244:1::5]:8080'],
        );
      } finally {
        await deleteNamespace(namespace);
      }
    });
  }
});
