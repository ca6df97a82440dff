// An observer of kube-proxy's nftables table follows a foreign change by listing only the chains
// and sets nft monitor named (at 10,000 services the whole table takes tens of seconds to list),
// and compares only what changed. Real kernel: kube-proxy's layout loaded into a fresh network
// namespace with nft monitor listening in it; each followed reading must say what a whole listing
// says, and each diff what a diff that remembers nothing says.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {AppliedState} from '../../../src/agent/applied/applied-state.ts';
import {watchNftRuleset} from '../../../src/agent/applied/ruleset-changes.ts';
import type {ParsedRules} from '../../../src/agent/api/rules/backend.ts';
import {formatNftablesRules, nftablesBackend} from '../../../src/agent/api/rules/nftables.ts';
import {CommandHost} from '../../../src/agent/host/command-host.ts';
import {memoryLogger} from '../../../src/agent/log.ts';
import {kubeProxyNftablesBackend} from '../../../src/agent/observe/kube-proxy-nftables.ts';
import {buildProxyModel} from '../../../src/core/model/index.ts';
import {diffNftables} from '../../../src/core/nftables/diff.ts';
import type {NftRuleset} from '../../../src/core/nftables/parse.ts';
import {parseNftablesListing} from '../../../src/core/nftables/parse-listing.ts';
import {renderNftables} from '../../../src/core/nftables/render.ts';
import {
  fakeProxierRenderOptions,
  fixtureModel,
  fixtureObjects,
  fixtureText,
  kubeProxyTable,
  transactionOrder,
} from '../../core/nftables/kube-proxy-fixtures.ts';
import {isRoot, until} from '../../plugin/agent-cluster.ts';
import {createNetns, inNetns} from '../netns.ts';
import {node, service, slice} from '../sync/cluster.ts';

test('observer, nftables: a foreign change is followed by listing the chains and sets it touched, and says what a whole listing says', async (t) => {
  if (!isRoot) {
    t.skip('needs root: loads kube-proxy nftables rules and runs nft monitor in a fresh network namespace');
    return;
  }
  const netns = createNetns(t);
  const nft = (...args: string[]) => inNetns(netns, ['nft', ...args]);

  const model = buildProxyModel(
    {
      services: [service('web', '10.96.0.10'), service('db', '10.96.0.20')],
      endpointSlices: [slice('web-1', 'web', ['10.244.2.5', '10.244.2.6']), slice('db-1', 'db', ['10.244.2.7'])],
      node: node(),
    },
    {family: 'IPv4', nodeName: 'node-1'},
  );
  const backend = kubeProxyNftablesBackend({serviceCIDRs: () => ['10.96.0.0/16']});
  inNetns(netns, ['nft', '-f', '-'], backend.render(model));

  const host = new CommandHost({netns});
  const changes = await watchNftRuleset({netns, log: memoryLogger()});
  t.after(() => changes.close());
  await until('the monitor to listen', () => changes.watching());
  let wholeReadings = 0;
  const listed: string[] = [];
  const applied = new AppliedState({
    read: async (family) => {
      wholeReadings++;
      return backend.readApplied!(host, family);
    },
    parse: backend.parse,
    format: backend.format,
    follow: (family, rules, touched) => backend.follow!(countingLists(host, listed), family, rules, touched),
    changes,
    now: Date.now,
  });
  const desired = backend.desired!(model);
  const first = await applied.get('IPv4');
  assert.equal(wholeReadings, 1);
  assert.equal(backend.diff(desired, first.rules).equal, true, 'the loaded table is what the model asks for');
  // Once compared, the reading keeps the desired chains and sets it holds the same of, not copies.
  const shared = (rules: NftRuleset, names: 'chains' | 'sets') =>
    [...rules[names]].filter(([name, part]) => (desired as NftRuleset)[names].get(name) === part).length;
  const firstRules = first.rules as NftRuleset;
  assert.deepEqual([shared(firstRules, 'chains'), shared(firstRules, 'sets')], [firstRules.chains.size, firstRules.sets.size]);

  const web = [...(first.rules as NftRuleset).chains.keys()].find((name) => /^service-\w+-default\/web\/tcp\/p$/.test(name))!;
  const steps: Array<{what: string; change: () => void; lists: string[]; drifted: string[]}> = [
    {
      what: "web's service-ips element deleted",
      change: () => nft('delete', 'element', 'ip', 'kube-proxy', 'service-ips', '{ 10.96.0.10 . tcp . 80 }'),
      lists: ['map service-ips'],
      drifted: ['default/web:p'],
    },
    {
      what: "web's service chain flushed",
      change: () => nft('flush', 'chain', 'ip', 'kube-proxy', web),
      lists: [`chain ${web}`],
      drifted: ['default/web:p'],
    },
    {
      what: 'a chain and a set of no service added',
      change: () => {
        nft('add', 'chain', 'ip', 'kube-proxy', 'extra');
        nft('add', 'rule', 'ip', 'kube-proxy', 'extra', 'ip', 'daddr', '10.9.9.9', 'drop');
        nft('add', 'set', 'ip', 'kube-proxy', 'blocked', '{ type ipv4_addr; elements = { 10.8.8.8 } }');
      },
      lists: ['chain extra', 'set blocked'],
      drifted: ['', 'default/web:p'],
    },
    {
      what: 'the chain of no service deleted again',
      change: () => {
        nft('flush', 'chain', 'ip', 'kube-proxy', 'extra');
        nft('delete', 'chain', 'ip', 'kube-proxy', 'extra');
      },
      lists: ['chain extra'],
      drifted: ['', 'default/web:p'],
    },
  ];
  for (const step of steps) {
    listed.length = 0;
    step.change();
    const followed = await applied.get('IPv4');
    assert.equal(wholeReadings, 1, `${step.what}: the table is not listed whole`);
    assert.deepEqual([...new Set(listed)].sort(), [...step.lists].sort(), `${step.what}: what was listed alone`);
    const whole = backend.parse(await backend.readApplied!(host, 'IPv4'));
    assert.equal(backend.diff(whole, followed.rules).equal, true, `${step.what}: the followed rules are the whole listing's`);
    // The diff that skips what earlier diffs found the same says what a diff that remembers nothing says.
    const remembered = backend.diff(desired, followed.rules);
    const fresh = diffNftables(desired as NftRuleset, followed.rules as NftRuleset);
    assert.deepEqual(remembered.groups, fresh.groups, step.what);
    assert.deepEqual(
      remembered.groups.map((group) => group.servicePort),
      step.drifted,
      step.what,
    );
    // Their text, printed as nft lists the table, reads back as the same rules.
    assert.equal(backend.diff(parseNftablesListing(followed.text) as ParsedRules, followed.rules).equal, true, `${step.what}: text`);
    assert.equal(followed.text, formatNftablesRules(followed.rules));
    // The drift explanation's search finds the lines of that text, without printing it.
    for (const needle of ['-default/web/tcp/p', '10.244.2.5', '10.96.0.20', 'goto', 'no such name']) {
      const lines = [...backend.rulesWith!(followed.rules, needle)!];
      assert.equal(lines.length, followed.text.split('\n').filter((line) => line.includes(needle)).length, `${step.what}: ${needle}`);
      for (const line of lines) assert.ok(line.includes(needle) && followed.text.includes(line), `${step.what}: ${line}`);
    }
    // Near a drifted line, only the chains and sets it names are searched: here a service-ips
    // element names its map and its service chain.
    const serviceChain = /\tchain (service-\S+-default\/web\/tcp\/\S+) \{/.exec(followed.text)?.[1];
    assert.ok(serviceChain, `${step.what}: the listing has a service chain for default/web`);
    const near = [`element service-ips { 10.96.0.99 . tcp . 80 : goto ${serviceChain} }`];
    for (const needle of ['-default/web/tcp/p', '10.244.2.5', '10.96.0.20', 'goto', 'no such name'])
      assert.deepEqual(
        [...backend.rulesNear!(followed.rules, needle, near)!].sort(),
        linesOfBlocks(followed.text, ['service-ips', serviceChain])
          .filter((line) => line.includes(needle))
          .sort(),
        `${step.what}: near ${needle}`,
      );
  }

  nft('delete', 'table', 'ip', 'kube-proxy');
  const gone = await applied.get('IPv4');
  assert.equal(wholeReadings, 2, 'a table deleted is listed whole');
  assert.equal((gone.rules as NftRuleset).chains.size, 0);
});

/**
 * The lines of `nft list table` text inside the chains, sets and maps named, one line per element
 * (the listing wraps several elements on a line).
 */
function linesOfBlocks(text: string, names: string[]): string[] {
  const lines: string[] = [];
  let block: 'chain' | 'set' | undefined;
  for (const line of text.split('\n')) {
    const opening = /^\t(chain|set|map) (\S+) \{$/.exec(line);
    if (opening) {
      block = !names.includes(opening[2]) ? undefined : opening[1] === 'chain' ? 'chain' : 'set';
      if (block === 'chain') lines.push(line);
    } else if (line === '\t}') block = undefined;
    else if (block === 'chain') lines.push(line);
    else if (block === 'set' && /^(\t\telements = \{ |\t\t\t {5})/.test(line))
      lines.push(line.replace(/^(\t\telements = \{ |\t\t\t {5})/, '').replace(/(,| \})$/, ''));
  }
  return lines;
}

/** The host, noting each chain, set or map listed alone ("chain NAME", "map NAME"). */
function countingLists(host: CommandHost, listed: string[]): CommandHost {
  return new Proxy(host, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (property !== 'nft') return typeof value === 'function' ? value.bind(target) : value;
      return (args: string[], input?: string) => {
        if (args[0] === '-j' && args[1] === 'list' && args[2] !== 'table') listed.push(`${args[2]} ${args[5]}`);
        return target.nft(args, input);
      };
    },
  });
}

test("observer, nftables: kube-proxy's own table, loaded and followed, shows no drift; an element deleted by hand names its service port", async (t) => {
  if (!isRoot) {
    t.skip("needs root: loads kube-proxy's published nftables rules and runs nft monitor in a fresh network namespace");
    return;
  }
  const netns = createNetns(t);
  // TestOverallNFTablesRules (kube-proxy's pkg/proxy/nftables): its table and objects, on its fake node.
  inNetns(netns, ['nft', '-f', '-'], transactionOrder(kubeProxyTable('overall.nft')));
  const model = fixtureModel(fixtureObjects('overall.yaml'));
  const backend = kubeProxyNftablesBackend({serviceCIDRs: () => fakeProxierRenderOptions.serviceCIDRs!});
  // Rendered with the fake node's addresses (its nodeport-ips), which an observer reads from its own node.
  const desired = nftablesBackend.parse(renderNftables(model, fakeProxierRenderOptions));
  const host = new CommandHost({netns});
  const changes = await watchNftRuleset({netns, log: memoryLogger()});
  t.after(() => changes.close());
  await until('the monitor to listen', () => changes.watching());
  let wholeReadings = 0;
  const applied = new AppliedState({
    read: async (family) => (wholeReadings++, backend.readApplied!(host, family)),
    parse: backend.parse,
    format: backend.format,
    follow: (family, rules, touched) => backend.follow!(host, family, rules, touched),
    changes,
    now: Date.now,
  });
  assert.deepEqual(backend.diff(desired, (await applied.get('IPv4')).rules).groups, [], "kube-proxy's table is what its objects ask for");

  const element =
    /^add element ip kube-proxy service-ips \{ (172\.30\.0\.41 \. tcp \. 80) : goto (service-\w+-ns1\/svc1\/tcp\/p80) \}$/m.exec(
      fixtureText('overall.nft'),
    );
  assert.ok(element, "svc1's ClusterIP element in the fixture");
  inNetns(netns, ['nft', 'delete', 'element', 'ip', 'kube-proxy', 'service-ips', `{ ${element[1]} }`]);
  const followed = await applied.get('IPv4');
  assert.equal(wholeReadings, 1, 'the change was followed, not the table listed whole');
  const diff = backend.diff(desired, followed.rules);
  assert.deepEqual(
    diff.groups.map((group) => [group.servicePort, group.added]),
    [['ns1/svc1:p80', [`element service-ips { ${element[1]} : goto ${element[2]} }`]]],
  );
});
