// ChainIndexedRuleset: a dump read chain by chain answers exactly as the dump parsed whole: the
// same chains, rules and lines, the same traces and diffs, the same rules after a partial write.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {describe, it} from 'node:test';
import {iptablesBackend, patchIptablesRuleset} from '../../../src/agent/api/rules/iptables.ts';
import {ChainIndexedRuleset, spelledAsSaved, spelledRuleset, spellRender} from '../../../src/agent/api/rules/iptables-chains.ts';
import {diffIptables} from '../../../src/core/iptables/diff.ts';
import {formatIptablesRuleset, parseIptablesSave} from '../../../src/core/iptables/parse.ts';
import type {IptablesRuleset} from '../../../src/core/iptables/ruleset.ts';
import type {ParsedRules} from '../../../src/agent/api/rules/backend.ts';
import {traceIptables} from '../../../src/core/iptables/trace.ts';
import type {Packet} from '../../../src/core/trace/types.ts';
import type {ChainsWritten} from '../../../src/agent/sync/types.ts';

const read = (path: string) => readFileSync(new URL(`../../core/iptables/${path}`, import.meta.url), 'utf8');
const dumps = ['dumps/node-a.nft.txt', 'dumps/kube-proxy-1.20.legacy.txt', 'dumps/calico-node.nft.txt', 'dumps/node-a.restore.txt'];
const renders = [
  'golden/cluster-ipv4-with-jumps.rules',
  'golden/cluster-ipv4.rules',
  'golden/features-ipv4.rules',
  'golden/features-ipv6.rules',
];

function indexed(text: string): ChainIndexedRuleset {
  const ruleset = ChainIndexedRuleset.of(text);
  assert.ok(ruleset, 'the text is indexed');
  return ruleset;
}

/** Every table, chain and rule as plain data, in order (the rules' parts read through their getters). */
function contents(ruleset: IptablesRuleset) {
  return {
    family: ruleset.family,
    frontEnd: ruleset.frontEnd,
    notes: ruleset.notes,
    unknownMatches: ruleset.unknownMatches,
    tables: [...ruleset.tables.values()].map((table) => ({
      name: table.name,
      chains: [...table.chains.values()].map((chain) => ({
        ...chain,
        rules: chain.rules.map((rule) => ({
          text: rule.text,
          line: rule.line,
          chain: rule.chain,
          table: rule.table,
          comment: rule.comment,
          target: rule.target,
          matches: rule.matches,
          destination: rule.destination,
          source: rule.source,
        })),
      })),
    })),
  };
}

/** A packet to each ClusterIP, node port and external address the rules send somewhere, from a pod and from the node. */
function packets(text: string, family: 'IPv4' | 'IPv6'): Packet[] {
  const found: Packet[] = [];
  const srcIP = family === 'IPv4' ? '10.244.1.20' : 'fd00:244::20';
  for (const line of text.split('\n').filter((rule) => rule.startsWith('-A KUBE-SERVICES ') || rule.startsWith('-A KUBE-NODEPORTS '))) {
    const [dstIP, protocol, dstPort] = [
      / -d (\S+?)(?:\/(?:32|128))? /.exec(line)?.[1],
      / -p (tcp|udp|sctp) /.exec(line)?.[1],
      / --dport (\d+)/.exec(line)?.[1],
    ];
    if (!protocol || !dstPort) continue;
    const to = {
      dstIP: dstIP ?? (family === 'IPv4' ? '10.0.0.11' : 'fd00::1'),
      dstPort: Number(dstPort),
      protocol: protocol.toUpperCase() as Packet['protocol'],
    };
    found.push({srcIP, ...to, origin: 'arriving', inInterface: 'cni0'}, {srcIP, ...to, origin: 'local'});
  }
  assert.ok(found.length > 0, 'the rules send some packet somewhere');
  return found;
}

describe('ChainIndexedRuleset', () => {
  for (const path of [...dumps, ...renders]) {
    it(`${path}: the same chains and rules, traces and formatted text as the whole dump parsed`, () => {
      const text = read(path);
      const whole = parseIptablesSave(text);
      const byChain = indexed(text);
      assert.deepEqual(contents(byChain), contents(whole));
      assert.equal(formatIptablesRuleset(byChain), formatIptablesRuleset(whole));
      const localAddresses = whole.family === 'IPv4' ? ['10.0.0.11', '10.244.1.1'] : ['fd00::1'];
      for (const packet of packets(text, whole.family)) {
        assert.deepEqual(
          traceIptables(byChain, packet, {localAddresses}),
          traceIptables(whole, packet, {localAddresses}),
          `${packet.dstIP}:${packet.dstPort} from ${packet.origin}`,
        );
      }
    });
  }

  it('diffs a render against a dump as the whole parsed rulesets do, chain by chain, both ways', () => {
    for (const [desired, applied] of [
      ['golden/cluster-ipv4-with-jumps.rules', 'golden/cluster-ipv4.rules'],
      ['golden/features-ipv4.rules', 'golden/cluster-ipv4-with-jumps.rules'],
      ['golden/cluster-ipv4-with-jumps.rules', 'dumps/node-a.nft.txt'],
    ]) {
      const [a, b] = [read(desired), read(applied)];
      const expected = diffIptables(parseIptablesSave(a), parseIptablesSave(b, {family: 'IPv4'}));
      assert.equal(expected.equal, false);
      assert.deepEqual(diffIptables(indexed(a), indexed(b)), expected, `${desired} against ${applied}`);
      assert.deepEqual(diffIptables(indexed(b), indexed(a)), diffIptables(parseIptablesSave(b), parseIptablesSave(a, {family: 'IPv4'})));
      const service = expected.groups.find((group) => group.servicePort !== '')?.servicePort;
      if (service)
        assert.deepEqual(
          diffIptables(indexed(a), indexed(b), {service}),
          diffIptables(parseIptablesSave(a), parseIptablesSave(b), {service}),
        );
    }
  });

  it('after a partial write: the replaced chains hold what the write left, deleted ones are gone, the rest as before', () => {
    const text = read('dumps/node-a.nft.txt');
    const svc = /:(KUBE-SVC-\S+)/.exec(text)![1];
    const sep = /:(KUBE-SEP-\S+)/.exec(text)![1];
    const written = [
      {
        table: 'nat' as const,
        declared: [svc, sep, 'KUBE-SEP-NEWNEWNEWNEWNEWN'],
        chains: [svc, 'KUBE-SEP-NEWNEWNEWNEWNEWN'],
        rules: [
          `-A ${svc} -j KUBE-SEP-NEWNEWNEWNEWNEWN`,
          '-A KUBE-SEP-NEWNEWNEWNEWNEWN -p tcp -m tcp -j DNAT --to-destination 10.244.9.9:8080',
        ],
      },
    ];
    const before = indexed(text);
    const patched = before.patched(written);
    assert.deepEqual(contents(patched), contents(patchIptablesRuleset(parseIptablesSave(text), written)));
    assert.equal(patched.tables.get('nat')!.chains.has(sep), false);
    // Written again and again (a partial sync rewrites KUBE-SERVICES every time): the same rules as one write.
    let again = patched;
    for (let i = 0; i < 50; i++) again = again.patched(written);
    assert.deepEqual(contents(again), contents(patched));
    assert.equal(before.tables.get('nat')!.chains.has(sep), true, 'the rules the patch started from stay as they were');
    // Its text, put together without parsing, is what formatting the parsed rules prints.
    assert.equal(patched.savedText(), formatIptablesRuleset(patchIptablesRuleset(parseIptablesSave(text), written)));
    assert.equal(before.savedText(), formatIptablesRuleset(parseIptablesSave(text)));
    // Searched without that text: the same rule lines, none of the replaced or deleted chains'.
    const rulesIn = (saved: string, needle: string) =>
      saved
        .split('\n')
        .filter((line) => line.startsWith('-A ') && line.includes(needle))
        .sort();
    for (const needle of [svc, sep, '10.244.9.9', 'KUBE-SERVICES', '--to-destination', 'no such name']) {
      assert.deepEqual([...patched.rulesWith(needle)].sort(), rulesIn(patched.savedText(), needle), needle);
      assert.deepEqual([...before.rulesWith(needle)].sort(), rulesIn(before.savedText(), needle), needle);
    }
    assert.deepEqual([...patched.rulesWith('10.244.9.9')], [written[0].rules[1]], 'the written chain is searched');
    // Near a question, only the chains its lines name are searched, as they are now: a replaced
    // chain as written, a deleted one not at all.
    const otherSep = [...before.tables.get('nat')!.chains.keys()].filter((name) => name.startsWith('KUBE-SEP-')).at(-1)!;
    const writtenChain = written[0].chains[1];
    const near = [`-t nat -A KUBE-SERVICES -m comment --comment "default/x:y" -j ${otherSep}`, `-A ${sep} -g ${writtenChain}`];
    const inNamed = (lines: string[]) =>
      lines.filter((line) =>
        [`-A KUBE-SERVICES `, `-A ${otherSep} `, `-A ${sep} `, `-A ${writtenChain} `].some((start) => line.startsWith(start)),
      );
    for (const needle of ['--to-destination', 'KUBE-SERVICES', '-j ', '10.244.9.9', 'no such name']) {
      assert.deepEqual([...patched.rulesNear(needle, near)].sort(), inNamed(rulesIn(patched.savedText(), needle)), needle);
      assert.deepEqual([...before.rulesNear(needle, near)].sort(), inNamed(rulesIn(before.savedText(), needle)), needle);
    }
    assert.deepEqual([...patched.rulesNear('10.244.9.9', near)], [written[0].rules[1]], 'the written chain as written');
    assert.ok(
      [...patched.rulesWith(`-A ${sep} `)].length === 0 && [...before.rulesWith(`-A ${sep} `)].length > 0,
      'the deleted chain is not',
    );
  });

  it('parses only the chains a trace meets', () => {
    const text = read('golden/cluster-ipv4-with-jumps.rules');
    const ruleset = indexed(text);
    let parsed = 0;
    for (const table of ruleset.tables.values()) {
      const get = table.chains.get.bind(table.chains);
      table.chains.get = (name: string) => (parsed++, get(name));
    }
    const [packet] = packets(text, 'IPv4');
    traceIptables(ruleset, packet, {localAddresses: ['10.0.0.11']});
    const chains = [...ruleset.tables.values()].reduce((sum, table) => sum + table.chains.size, 0);
    assert.ok(parsed > 0 && parsed < chains, `${parsed} chain lookups of ${chains} chains`);
  });

  it('spells a render as iptables-save prints it, and diffs a reading by text where chains are the same, with the same answers', () => {
    for (const path of renders) {
      const rendered = read(path);
      const family = path.includes('ipv6') ? 'IPv6' : 'IPv4';
      const spelled = spelledAsSaved(rendered, family);
      // Every rule as the whole parser spells it, and the same chains.
      const plain = parseIptablesSave(rendered, {family, keepSavedText: false});
      const texts = (ruleset: IptablesRuleset) =>
        [...ruleset.tables.values()].map((table) => [
          table.name,
          [...table.chains.values()].map((chain) => [chain.name, chain.policy, chain.rules.map((rule) => rule.text)]),
        ]);
      assert.deepEqual(texts(indexed(spelled)), texts(plain), path);
      // Readings of the kernel, as iptables-save prints them: the same, and with the kinds of drift an observer meets.
      const kernel = spelled.replace(/^# Generated by .*$/m, '# Generated by iptables-save v1.8.9 (nf_tables) on Thu Nov 26 01:00:00 2026');
      const lines = kernel.split('\n');
      const services = lines.filter((line) => line.startsWith('-A KUBE-SERVICES '));
      const firstEndpointRule = lines.findIndex((line) => line.startsWith('-A KUBE-SEP-'));
      const readings = {
        same: kernel,
        // kube-proxy writes KUBE-SERVICES in Go map order: not a difference.
        reordered: kernel.replace(services.join('\n'), [...services.slice(0, -1).reverse(), services.at(-1)].join('\n')),
        'jump deleted': kernel.replace(`${services[0]}\n`, ''),
        'endpoint rule changed': lines
          .map((line, index) => (index === firstEndpointRule ? line.replace(/-j \S+/, '-j RETURN') : line))
          .join('\n'),
        'foreign rule added': kernel.replace(services[0], `${services[0]}\n-A KUBE-SERVICES -d 10.9.9.9/32 -j ACCEPT`),
      };
      const desired = indexed(spelled);
      for (const [drift, reading] of Object.entries(readings)) {
        const answer = iptablesBackend.diff(desired as ParsedRules, indexed(reading) as ParsedRules);
        const whole = diffIptables(plain, parseIptablesSave(reading, {family}));
        assert.deepEqual(answer, {equal: whole.equal, groups: whole.groups, text: whole.text}, `${path}: ${drift}`);
        assert.equal(answer.equal, drift === 'same' || drift === 'reordered', `${path}: ${drift}`);
      }
      // The same chain texts are told the same without a rule parsed; a rule of difference is not.
      const reading = indexed(readings['jump deleted']);
      const toCompare = (left: ChainIndexedRuleset, right: ChainIndexedRuleset) =>
        [...left.tables.keys()].flatMap((table) =>
          (left.chainsToCompare(right, table) ?? ['(every chain)']).map((chain) => `${table} ${chain}`),
        );
      const differing = toCompare(desired, reading);
      assert.equal(differing.length, 1, `${path}: ${differing.join()}`);
      assert.match(differing[0], / KUBE-SERVICES$/);
      assert.deepEqual(toCompare(desired, indexed(kernel)), [], path);
      // Rules that are not in iptables-save's spelling are never taken as the same by their text.
      assert.equal(indexed(rendered).chainsToCompare(indexed(rendered), 'nat'), undefined);
    }
  });

  it('compares a patched reading by the chains writes declared since it was read, with the same answers as a whole comparison', () => {
    const rendered = read('golden/cluster-ipv4-with-jumps.rules');
    const spelled = spelledAsSaved(rendered, 'IPv4');
    const kernel = spelled.replace(/^# Generated by .*$/m, '# Generated by iptables-save v1.8.9 (nf_tables) on Thu Nov 26 01:00:00 2026');
    const desired = indexed(spelled);
    const nat = kernel.slice(kernel.indexOf('*nat\n'));
    const lines = nat.slice(0, nat.indexOf('COMMIT\n')).split('\n');
    const services = lines.filter((line) => line.startsWith('-A KUBE-SERVICES '));
    const sep = /^:(KUBE-SEP-\S+)/m.exec(kernel)![1];
    const sepRules = lines.filter((line) => line.startsWith(`-A ${sep} `));
    const otherSep = lines.find((line) => line.startsWith('-A KUBE-SEP-') && !line.startsWith(`-A ${sep} `))!;
    // A reading with another endpoint chain drifted, then foreign changes followed chain by chain:
    // KUBE-SERVICES loses a jump, an endpoint chain is deleted, then both are put back.
    const foreign = otherSep.replace(/ -j \S+$/, ' -j RETURN');
    assert.notEqual(foreign, otherSep);
    const first = indexed(kernel.replace(otherSep, foreign));
    const drifted = `nat ${otherSep.split(' ')[1]}`;
    const steps: Array<{what: string; written: ChainsWritten[]; toCompare: string[]}> = [
      {
        what: 'a jump deleted',
        written: [{table: 'nat', declared: ['KUBE-SERVICES'], chains: ['KUBE-SERVICES'], rules: services.slice(1)}],
        toCompare: ['nat KUBE-SERVICES', drifted],
      },
      {
        what: 'an endpoint chain deleted',
        written: [{table: 'nat', declared: [sep], chains: [], rules: []}],
        toCompare: ['nat KUBE-SERVICES', `nat ${sep}`, drifted],
      },
      {
        what: 'both put back',
        written: [{table: 'nat', declared: ['KUBE-SERVICES', sep], chains: ['KUBE-SERVICES', sep], rules: [...services, ...sepRules]}],
        toCompare: ['nat KUBE-SERVICES', `nat ${sep}`, drifted],
      },
    ];
    const parsedDesired = parseIptablesSave(spelled, {family: 'IPv4'});
    let reading = first;
    let whole = parseIptablesSave(first.savedText(), {family: 'IPv4'});
    assert.deepEqual(iptablesBackend.diff(desired as ParsedRules, first as ParsedRules).groups, diffIptables(parsedDesired, whole).groups);
    for (const step of steps) {
      reading = reading.patched(step.written);
      whole = patchIptablesRuleset(whole, step.written);
      const toCompare = [...reading.tables.keys()].flatMap((table) =>
        desired.chainsToCompare(reading, table)!.map((chain) => `${table} ${chain}`),
      );
      assert.deepEqual(toCompare.sort(), step.toCompare.sort(), step.what);
      const answer = iptablesBackend.diff(desired as ParsedRules, reading as ParsedRules);
      const expected = diffIptables(parsedDesired, whole);
      assert.deepEqual(answer, {equal: expected.equal, groups: expected.groups, text: expected.text}, step.what);
      assert.equal(answer.equal, false, step.what);
    }
    // Put back, only the first reading's foreign rule still differs.
    assert.deepEqual(
      iptablesBackend.diff(desired as ParsedRules, reading as ParsedRules).groups.flatMap((group) => group.removed),
      [`-t nat ${foreign}`],
    );
  });

  it('spells a render from pieces cut anywhere as from its whole text, and reads it without searching the text', async () => {
    for (const path of renders) {
      const rendered = read(path);
      const family = path.includes('ipv6') ? 'IPv6' : 'IPv4';
      // Pieces of odd sizes, cutting lines and multi-byte characters (a comment in another script).
      const bytes = Buffer.from(rendered.replace('"kubernetes service portals"', '"kubernetes service portals ü 🚀"'), 'utf8');
      const pieces: Buffer[] = [];
      for (let at = 0, size = 1; at < bytes.length; at += size, size = (size * 7) % 4093) pieces.push(bytes.subarray(at, at + size));
      const dump = await spellRender(pieces, family);
      assert.ok(dump, path);
      const whole = spelledAsSaved(bytes.toString('utf8'), family);
      assert.equal(dump.text, whole, path);
      assert.deepEqual(contents(ChainIndexedRuleset.spelled(dump)), contents(indexed(whole)), path);
      // The same, from the whole text at once (an observer's desired rules made without waiting).
      assert.deepEqual(contents(spelledRuleset(bytes.toString('utf8'), family)), contents(indexed(whole)), path);
    }
    // A render of some megabytes lets the event loop run while it is spelled.
    const chains = Array.from({length: 20_000}, (_, i) => `KUBE-SEP-TEST${i}`);
    const big = [
      '*nat',
      ...chains.map((chain) => `:${chain} - [0:0]`),
      ...chains.map(
        (chain, i) =>
          `-A ${chain} -m comment --comment "ns/svc-${i}:http" -m tcp -p tcp -j DNAT --to-destination 10.1.${i >> 8}.${i & 255}:8080`,
      ),
      'COMMIT',
    ];
    let spelled = false;
    let ranWhileSpelling = false;
    setImmediate(() => (ranWhileSpelling = !spelled));
    const bigDump = await spellRender(
      [Buffer.from(`${big.join('\n')}\n`)].flatMap((all) => [all.subarray(0, 1 << 20), all.subarray(1 << 20)]),
      'IPv4',
    );
    spelled = true;
    assert.equal(bigDump?.tables[0].chains.length, 20_000);
    assert.ok(ranWhileSpelling, 'the event loop did not run while a render of some megabytes was spelled');
    // Lines of other commands: not SavedSpelling's to spell; spelledRuleset has the whole parser spell them.
    const inserted = '*nat\n:KUBE-X - [0:0]\n-I KUBE-X -j RETURN\nCOMMIT\n';
    assert.equal(await spellRender([Buffer.from(inserted)], 'IPv4'), undefined);
    assert.deepEqual(
      [...spelledRuleset(inserted, 'IPv4').tables.get('nat')!.chains.values()].map((chain) => chain.rules.map((rule) => rule.text)),
      [['-A KUBE-X -j RETURN']],
    );
  });

  it('a reading patched chain by chain (a foreign change followed) diffs as the whole parsed rulesets do, however often it is patched', () => {
    const path = renders[0];
    const spelled = spelledAsSaved(read(path), 'IPv4');
    const kernel = spelled.replace(/^# Generated by .*$/m, '# Generated by iptables-save v1.8.9 (nf_tables) on Thu Nov 26 01:00:00 2026');
    const lines = kernel.split('\n');
    // The nat table's KUBE-SERVICES (filter has one of its own).
    const natLines = lines.slice(lines.indexOf('*nat'));
    const services = natLines.filter((line) => line.startsWith('-A KUBE-SERVICES '));
    const sep = /^:(KUBE-SEP-\S+)/m.exec(kernel)![1];
    const sepRules = lines.filter((line) => line.startsWith(`-A ${sep} `));
    const desired = indexed(spelled);
    let reading = indexed(kernel);
    // What the kernel holds after each change, and what the followed reading is told of it.
    const changes: Array<{kernel: string; written: ChainsWritten}> = [
      {
        kernel: kernel.replace(`${services[0]}\n`, ''),
        written: {table: 'nat', declared: ['KUBE-SERVICES'], chains: ['KUBE-SERVICES'], rules: services.slice(1)},
      },
      {
        kernel: kernel.replace(`${services[0]}\n`, '').replace(sepRules[0], sepRules[0].replace(/-j \S+/, '-j RETURN')),
        written: {table: 'nat', declared: [sep], chains: [sep], rules: [sepRules[0].replace(/-j \S+/, '-j RETURN'), ...sepRules.slice(1)]},
      },
      // Both put back: the same as desired again.
      {
        kernel,
        written: {table: 'nat', declared: ['KUBE-SERVICES', sep], chains: ['KUBE-SERVICES', sep], rules: [...services, ...sepRules]},
      },
    ];
    const plain = parseIptablesSave(read(path), {family: 'IPv4', keepSavedText: false});
    assert.equal(iptablesBackend.diff(desired as ParsedRules, reading as ParsedRules).equal, true);
    for (const [index, change] of changes.entries()) {
      reading = reading.patched([change.written]);
      const answer = iptablesBackend.diff(desired as ParsedRules, reading as ParsedRules);
      const whole = diffIptables(plain, parseIptablesSave(change.kernel, {family: 'IPv4'}));
      assert.deepEqual(answer, {equal: whole.equal, groups: whole.groups, text: whole.text}, `change ${index + 1}`);
    }
  });

  it('names the service port of a drifted chain without comments by the chain that jumps to it, found in the text', () => {
    // A large cluster's endpoint rules carry no comments: only KUBE-SERVICES names the service port.
    const dump = (target: string, more = 0) =>
      [
        '# Generated by iptables-save v1.8.9 (nf_tables) on Thu Nov 26 01:00:00 2026',
        '*nat',
        ':KUBE-SERVICES - [0:0]',
        ':KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]',
        ':KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]',
        ...Array.from({length: more}, (_, i) => `:KUBE-SEP-OTHER${i} - [0:0]`),
        '-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA',
        '-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB',
        `-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination ${target}`,
        ...Array.from({length: more}, (_, i) => `-A KUBE-SEP-OTHER${i} -j RETURN`),
        'COMMIT',
        '',
      ].join('\n');
    const desired = indexed(dump('10.244.1.5:8080', 50));
    const applied = indexed(dump('10.244.1.6:8080', 50));
    let parsed = 0;
    for (const ruleset of [desired, applied])
      for (const table of ruleset.tables.values()) {
        const get = table.chains.get.bind(table.chains);
        table.chains.get = (name: string) => (parsed++, get(name));
        const values = table.chains.values.bind(table.chains);
        table.chains.values = () => ((parsed += 1000), values());
      }
    assert.equal(desired.callerOf('nat', 'KUBE-SEP-BBBBBBBBBBBBBBBB'), 'KUBE-SVC-AAAAAAAAAAAAAAAA');
    assert.equal(desired.callerOf('nat', 'KUBE-SVC-AAAAAAAAAAAAAAAA'), 'KUBE-SERVICES');
    assert.equal(desired.callerOf('nat', 'KUBE-SEP-OTHER1'), undefined);
    const answer = iptablesBackend.diff(desired as ParsedRules, applied as ParsedRules);
    assert.deepEqual(
      answer.groups.map((group) => [group.servicePort, group.added, group.removed]),
      [
        [
          'default/web:http',
          ['-t nat -A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.244.1.5:8080'],
          ['-t nat -A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.244.1.6:8080'],
        ],
      ],
    );
    assert.deepEqual(
      answer.groups,
      diffIptables(parseIptablesSave(dump('10.244.1.5:8080', 50)), parseIptablesSave(dump('10.244.1.6:8080', 50))).groups,
    );
    assert.ok(parsed < 1000, `chains read one by one (${parsed} lookups), never all of them`);
  });

  it('leaves input with other commands than -A, or with counters, to the whole parser', () => {
    assert.equal(ChainIndexedRuleset.of(read('dumps/node-a.legacy.txt')), undefined);
    assert.equal(ChainIndexedRuleset.of('*nat\n:KUBE-SERVICES - [0:0]\n-I KUBE-SERVICES -j RETURN\nCOMMIT\n'), undefined);
    assert.equal(ChainIndexedRuleset.of('*nat\n-A KUBE-NOT-DECLARED -j RETURN\nCOMMIT\n'), undefined);
  });
});
