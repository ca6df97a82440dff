// The kernel accepts what the renderer writes: each ruleset is loaded with iptables-restore into
// a fresh network namespace (nf_tables and, when installed, legacy front end), read back, and
// compared. Partial renders applied with --noflush must leave what a full render leaves.
// Needs root; namespaces are named rndr-<pid>-<n> and deleted afterwards, on failure too.
import assert from 'node:assert/strict';
import {execFileSync, spawnSync} from 'node:child_process';
import {readFileSync} from 'node:fs';
import {describe, it, type TestContext} from 'node:test';
import {buildProxyModel, changedServicePorts, parseManifests, type ModelOptions, type ProxyModel} from '../../../src/core/model/index.ts';
import {countRules, nfacctCounters, parseIptablesSave, renderIptables} from '../../../src/core/iptables/index.ts';
import {service, slice} from '../model/cluster-objects.ts';

const isRoot = process.getuid?.() === 0;
const onPath = (command: string): boolean => spawnSync('sh', ['-c', `command -v ${command}`], {stdio: 'ignore'}).status === 0;
let namespaceCount = 0;

/** Why the test cannot run here, or undefined when it can. */
function missing(tools: string[]): string | undefined {
  if (!isRoot) return 'needs root: loads rules into a new network namespace';
  const absent = ['ip', ...tools].filter((tool) => !onPath(tool));
  return absent.length > 0 ? `needs ${absent.join(', ')} (Debian packages iproute2, iptables)` : undefined;
}

async function inNamespace<T>(body: (namespace: string) => T | Promise<T>): Promise<T> {
  const namespace = `rndr-${process.pid}-${++namespaceCount}`;
  execFileSync('ip', ['netns', 'add', namespace]);
  try {
    return await body(namespace);
  } finally {
    execFileSync('ip', ['netns', 'delete', namespace]);
  }
}

function run(namespace: string, command: string, args: string[], input?: string): string {
  const result = spawnSync('ip', ['netns', 'exec', namespace, command, ...args], {input, encoding: 'utf8'});
  if (result.status !== 0) throw new Error(`${command} ${args.join(' ')} failed (${result.status}): ${result.stderr}`);
  return result.stdout;
}

/** iptables-save text without comments and counters, one table, chains sorted (their order means nothing). */
function saved(namespace: string, save: string, table: string): string {
  const lines = run(namespace, save, ['-t', table])
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith('#'));
  const chains = lines
    .filter((line) => line.startsWith(':'))
    .map((line) => line.replace(/\s\[\d+:\d+\]$/, ''))
    .sort();
  return [...chains, ...lines.filter((line) => !line.startsWith(':'))].join('\n');
}

function exampleModel(): ProxyModel {
  const parsed = parseManifests(readFileSync(new URL('../../../examples/cluster.yaml', import.meta.url), 'utf8'), 'cluster.yaml');
  return buildProxyModel(
    {services: parsed.services, endpointSlices: parsed.endpointSlices, node: parsed.nodes[0]},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']},
  );
}

type Objects = {services: unknown[]; slices: unknown[]; node: unknown};

/** golden/features.yaml: one service per feature (affinity, Local policies, firewall chain, no endpoints, ...). */
function featureObjects(): Objects {
  const parsed = parseManifests(readFileSync(new URL('golden/features.yaml', import.meta.url), 'utf8'), 'features.yaml');
  assert.deepEqual(parsed.problems, []);
  return {services: parsed.services, slices: parsed.endpointSlices, node: parsed.nodes[0]};
}

function featureModel(family: 'IPv4' | 'IPv6', options: Partial<ModelOptions> = {}, objects = featureObjects()): ProxyModel {
  const m = buildProxyModel(
    {services: objects.services, endpointSlices: objects.slices, node: objects.node},
    {family, clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56'], ...options},
  );
  assert.deepEqual(m.problems, []);
  return m;
}

const nameOf = (object: unknown): string => String((object as {metadata?: {name?: string}}).metadata?.name);

const frontEnds = [
  {name: 'nf_tables', restore: 'iptables-restore', save: 'iptables-save', restore6: 'ip6tables-restore', save6: 'ip6tables-save'},
  {
    name: 'legacy',
    restore: 'iptables-legacy-restore',
    save: 'iptables-legacy-save',
    restore6: 'ip6tables-legacy-restore',
    save6: 'ip6tables-legacy-save',
  },
];

async function loadsWhole(t: TestContext, frontEnd: (typeof frontEnds)[number], model: ProxyModel): Promise<void> {
  const v6 = model.family === 'IPv6';
  const [restore, save] = v6 ? [frontEnd.restore6, frontEnd.save6] : [frontEnd.restore, frontEnd.save];
  const why = missing([restore, save]);
  if (why) return void t.skip(why);
  const text = renderIptables(model, {includeJumps: true});
  await inNamespace((namespace) => {
    run(namespace, restore, [], text);
    const back = run(namespace, save, []);
    assert.deepEqual(countRules(back), countRules(text), 'the kernel holds every rule written');
    for (const table of ['filter', 'nat']) {
      const start = text.indexOf(`*${table}`);
      const written = new Set(
        text
          .slice(start, text.indexOf('COMMIT', start))
          .split('\n')
          .filter((line) => line.startsWith(':'))
          .map((line) => line.slice(1).split(' ')[0]),
      );
      const kept = saved(namespace, save, table)
        .split('\n')
        .filter((line) => line.startsWith(':'))
        .map((line) => line.slice(1).split(' ')[0]);
      assert.deepEqual(new Set(kept), written, `${table} chains`);
    }
  });
}

describe('rendered rulesets load into the kernel', () => {
  for (const frontEnd of frontEnds) {
    it(`example cluster (${frontEnd.name})`, async (t) => loadsWhole(t, frontEnd, exampleModel()));
    it(`every feature, IPv4 (${frontEnd.name})`, async (t) => loadsWhole(t, frontEnd, featureModel('IPv4')));
    it(`every feature, IPv6 (${frontEnd.name})`, async (t) => loadsWhole(t, frontEnd, featureModel('IPv6')));
    it(`bridge and interface-prefix detectors, masqueradeAll, NodePort addresses (${frontEnd.name})`, async (t) => {
      await loadsWhole(
        t,
        frontEnd,
        featureModel('IPv4', {
          config: {localDetector: {mode: 'BridgeInterface', interfaceName: 'cbr0'}, nodePortAddresses: ['10.240.0.0/24', '127.0.0.0/8']},
        }),
      );
      await loadsWhole(
        t,
        frontEnd,
        featureModel('IPv4', {
          config: {localDetector: {mode: 'InterfaceNamePrefix', interfacePrefix: 'veth'}, masqueradeAll: true, localhostNodePorts: false},
        }),
      );
    });
  }
});

describe('nfacct counting rules', () => {
  it('load where the nfacct objects exist, and iptables-save prints them as the parser spells the rendered ones', async (t) => {
    const why = missing(['iptables-restore', 'iptables-save', 'nfacct']);
    if (why) return void t.skip(why);
    const counters = Object.values(nfacctCounters);
    const text = renderIptables(
      featureModel('IPv4', {config: {iptablesFeatures: {nfacctCounters: counters, randomFully: true, conntrackTCPLiberal: false}}}),
      {includeJumps: true},
    );
    const spelled = (dump: string): string[] => {
      const rules: string[] = [];
      for (const table of parseIptablesSave(dump, {family: 'IPv4'}).tables.values())
        for (const chain of table.chains.values()) for (const rule of chain.rules) if (rule.text.includes('nfacct')) rules.push(rule.text);
      return rules.sort();
    };
    await inNamespace((namespace) => {
      for (const name of counters) run(namespace, 'nfacct', ['add', name]);
      run(namespace, 'iptables-restore', [], text);
      const back = run(namespace, 'iptables-save', []);
      const kernel = back
        .split('\n')
        .filter((line) => line.includes('nfacct'))
        .sort();
      assert.ok(
        kernel.some((line) => line.includes('ct_state_invalid_dropped_pkts')) &&
          kernel.some((line) => line.includes('localhost_nps_accepted_pkts')),
        'both counters are used',
      );
      assert.deepEqual(spelled(text), kernel, 'the rendered rules, spelled by the parser, as iptables-save prints them');
      assert.deepEqual(spelled(back), kernel, 'the dump read back keeps its spelling');
    });
  });
});

describe('partial renders applied with --noflush', () => {
  it('leave the tables exactly as a full render of the new model does', async (t) => {
    const why = missing(['iptables-restore', 'iptables-save']);
    if (why) return void t.skip(why);
    const objects = featureObjects();
    const before = featureModel('IPv4', {}, objects);
    // One endpoint changes, one service goes away, one appears.
    const after = featureModel(
      'IPv4',
      {},
      {
        node: objects.node,
        services: [...objects.services.filter((object) => nameOf(object) !== 'itp'), service('fresh', {clusterIP: '10.96.0.30'})],
        slices: [
          ...objects.slices.filter((object) => !['itp-v4', 'sticky-v4'].includes(nameOf(object))),
          slice(
            'sticky-v4',
            'sticky',
            [
              {ip: '10.244.1.5', node: 'node-1'},
              {ip: '10.244.2.9', node: 'node-2'},
            ],
            {metadata: {name: 'sticky-v4', namespace: 'shop', labels: {'kubernetes.io/service-name': 'sticky'}}},
          ),
          slice('fresh-1', 'fresh', [{ip: '10.244.1.30'}]),
        ],
      },
    );
    const changed = changedServicePorts(before, after);
    assert.equal(changed.size, 3, 'a real partial sync: sticky, itp and fresh');

    const expected = await inNamespace((namespace) => {
      run(namespace, 'iptables-restore', [], renderIptables(after, {includeJumps: true}));
      return ['filter', 'nat'].map((table) => saved(namespace, 'iptables-save', table));
    });
    await inNamespace((namespace) => {
      run(namespace, 'iptables-restore', [], renderIptables(before, {includeJumps: true}));
      const existing = new Map<'filter' | 'nat', Set<string>>();
      for (const table of ['filter', 'nat'] as const) {
        existing.set(
          table,
          new Set(
            saved(namespace, 'iptables-save', table)
              .split('\n')
              .filter((line) => line.startsWith(':'))
              .map((line) => line.slice(1).split(' ')[0]),
          ),
        );
      }
      run(namespace, 'iptables-restore', ['--noflush'], renderIptables(after, {changedServicePorts: changed, existingChains: existing}));
      assert.deepEqual(
        ['filter', 'nat'].map((table) => saved(namespace, 'iptables-save', table)),
        expected,
      );
    });
  });
});
