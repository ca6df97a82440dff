// parseIptablesSave: dumps of both front ends, counters, foreign chains, quoting, unknown matches,
// iptables-restore input normalised to what iptables-save prints, and bad lines.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {test} from 'node:test';
import {formatIptablesRuleset, IptablesParseError, parseIptablesSave} from '../../../src/core/iptables/parse.ts';
import {findChain, type IptablesRuleset} from '../../../src/core/iptables/ruleset.ts';

const dump = (name: string) => readFileSync(new URL(`./dumps/${name}`, import.meta.url), 'utf8');

function ruleTexts(ruleset: IptablesRuleset): string[] {
  return [...ruleset.tables.values()]
    .flatMap((table) => [...table.chains.values()].flatMap((chain) => chain.rules.map((rule) => `${table.name} ${rule.text}`)))
    .sort();
}

function chainNames(ruleset: IptablesRuleset, table: string): string[] {
  return [...(ruleset.tables.get(table)?.chains.keys() ?? [])].sort();
}

/** One rule of a one-rule filter table, as parsed. */
function parseRule(rule: string, declare = ['X']) {
  const text = ['*filter', ...declare.map((chain) => `:${chain} - [0:0]`), `-A X ${rule}`, 'COMMIT', ''].join('\n');
  const rules = findChain(parseIptablesSave(text), 'filter', 'X')!.rules;
  assert.equal(rules.length, 1);
  return rules[0];
}

test('legacy dump with counters and nf_tables dump with its warning hold the same rules', () => {
  const legacy = parseIptablesSave(dump('node-a.legacy.txt'));
  const nft = parseIptablesSave(dump('node-a.nft.txt'));
  assert.equal(legacy.frontEnd, 'legacy');
  assert.equal(nft.frontEnd, 'nf_tables');
  assert.deepEqual(nft.notes, ['Warning: iptables-legacy tables present, use iptables-legacy-save to see them']);
  assert.deepEqual(legacy.notes, []);
  assert.deepEqual(ruleTexts(legacy), ruleTexts(nft));
  for (const table of ['mangle', 'nat', 'filter']) assert.deepEqual(chainNames(legacy, table), chainNames(nft, table), table);
  assert.equal(legacy.family, 'IPv4');
});

test('counters are dropped from rules and policies are kept', () => {
  const legacy = parseIptablesSave(dump('node-a.legacy.txt'));
  for (const text of ruleTexts(legacy)) assert.doesNotMatch(text, /\[\d+:\d+\]/, text);
  assert.equal(findChain(legacy, 'filter', 'FORWARD')?.policy, 'DROP');
  assert.equal(findChain(legacy, 'filter', 'INPUT')?.policy, 'ACCEPT');
  assert.equal(findChain(legacy, 'nat', 'KUBE-SERVICES')?.policy, undefined);
  const output = findChain(legacy, 'nat', 'OUTPUT')!;
  assert.equal(output.rules[0].text, '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES');
  assert.equal(output.rules[0].line, 63);
});

test("chains are built-in, the proxy's, or foreign (kubelet, Docker, flannel)", () => {
  const ruleset = parseIptablesSave(dump('node-a.nft.txt'));
  const kind = (table: string, chain: string) => findChain(ruleset, table, chain)?.kind;
  assert.equal(kind('nat', 'PREROUTING'), 'builtin');
  assert.equal(kind('nat', 'KUBE-SERVICES'), 'proxy');
  assert.equal(kind('nat', 'KUBE-SVC-CDGGSHYLG3RE2FKL'), 'proxy');
  assert.equal(kind('nat', 'KUBE-SEP-25M36I63GRYNYR7P'), 'proxy');
  assert.equal(kind('nat', 'KUBE-MARK-MASQ'), 'proxy');
  assert.equal(kind('filter', 'KUBE-PROXY-FIREWALL'), 'proxy');
  assert.equal(kind('filter', 'KUBE-FIREWALL'), 'foreign');
  assert.equal(kind('nat', 'KUBE-KUBELET-CANARY'), 'foreign');
  assert.equal(kind('mangle', 'KUBE-IPTABLES-HINT'), 'foreign');
  assert.equal(kind('filter', 'DOCKER-USER'), 'foreign');
  assert.equal(kind('nat', 'FLANNEL-POSTRTG'), 'foreign');
  // Foreign rules are kept whole.
  assert.deepEqual(
    findChain(ruleset, 'filter', 'DOCKER-ISOLATION-STAGE-1')!.rules.map((rule) => rule.text),
    ['-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2', '-A DOCKER-ISOLATION-STAGE-1 -j RETURN'],
  );
});

test('rules read into conditions, matches and target', () => {
  const ruleset = parseIptablesSave(dump('node-a.legacy.txt'));
  const svc = findChain(ruleset, 'nat', 'KUBE-SVC-CDGGSHYLG3RE2FKL')!;
  const masq = svc.rules[0];
  assert.deepEqual(masq.source, {cidr: '10.244.0.0/16', negated: true});
  assert.deepEqual(masq.destination, {cidr: '10.96.0.10/32', negated: false});
  assert.deepEqual(masq.protocol, {name: 'tcp', negated: false});
  assert.equal(masq.comment, 'default/web:http cluster IP');
  assert.deepEqual(
    masq.matches.map((match) => match.module),
    ['comment', 'tcp'],
  );
  assert.deepEqual(masq.matches[1].options, [{name: 'dport', negated: false, values: ['80']}]);
  assert.deepEqual(masq.target, {name: 'KUBE-MARK-MASQ', goto: false, options: []});
  const pick = svc.rules[1];
  assert.deepEqual(pick.matches[1], {
    module: 'statistic',
    options: [
      {name: 'mode', negated: false, values: ['random']},
      {name: 'probability', negated: false, values: ['0.33333333349']},
    ],
  });
  const dnat = findChain(ruleset, 'nat', 'KUBE-SEP-25M36I63GRYNYR7P')!.rules.find((rule) => rule.target?.name === 'DNAT')!;
  assert.match(dnat.target!.options[0].values[0], /^10\.244\.\d+\.\d+:\d+$/);
});

test('iptables-restore input as kube-proxy writes it reads as iptables-save prints it', () => {
  // Pairs: what the proxier writes, what iptables-save prints after loading it (legacy and nf_tables alike).
  const pairs: Array<[string, string]> = [
    [
      '-m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-X',
      '-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-X',
    ],
    [
      '-m comment --comment default/web:http -s 10.244.1.5 -j KUBE-MARK-MASQ',
      '-s 10.244.1.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ',
    ],
    [
      '-m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.3333333333 -j KUBE-SVC-X',
      '-m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SVC-X',
    ],
    [
      '-m comment --comment "default/web:http -> 10.244.1.5:8080" -m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SVC-X',
      '-m comment --comment "default/web:http -> 10.244.1.5:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SVC-X',
    ],
    [
      '-m comment --comment default/web:http -m recent --name KUBE-SEP-A --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.5:8080',
      '-p tcp -m comment --comment "default/web:http" -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.5:8080',
    ],
    ['-m mark ! --mark 0x4000/0x4000 -j RETURN', '-m mark ! --mark 0x4000/0x4000 -j RETURN'],
    ['-j MARK --or-mark 0x4000', '-j MARK --set-xmark 0x4000/0x4000'],
    ['-j MARK --xor-mark 0x4000', '-j MARK --set-xmark 0x4000/0x0'],
    ['-j MARK --set-mark 0x10/0xf0', '-j MARK --set-xmark 0x10/0xf0'],
    ['-j MARK --and-mark 0x10', '-j MARK --set-xmark 0x0/0xffffffef'],
    [
      '-m comment --comment "default/empty:http has no endpoints" -m tcp -p tcp -d 10.96.0.12 --dport 80 -j REJECT',
      '-d 10.96.0.12/32 -p tcp -m comment --comment "default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable',
    ],
    [
      '-m comment --comment "x" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30081 -j DROP',
      '-p tcp -m comment --comment x -m addrtype --dst-type LOCAL -m tcp --dport 30081 -j DROP',
    ],
    ['-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT', '-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT'],
    ['-p tcp --dport 80 -j ACCEPT', '-p tcp -m tcp --dport 80 -j ACCEPT'],
    ['--protocol TCP --source 10.1.2.3 --destination-port 80:90 -j ACCEPT', '-s 10.1.2.3/32 -p tcp -m tcp --dport 80:90 -j ACCEPT'],
    ['--src 10.1.0.0/16 ! --dst 10.2.0.1 -j RETURN', '-s 10.1.0.0/16 ! -d 10.2.0.1/32 -j RETURN'],
    ['--destination 10.2.0.0/16 -j RETURN', '-d 10.2.0.0/16 -j RETURN'],
    ['-p tcp -m tcp --dport 1 --sport 2 --syn -j ACCEPT', '-p tcp -m tcp --sport 2 --dport 1 --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT'],
    ['! -i cbr0 -o eth+ -s 10.0.0.1/8 ! -d 10.0.0.0/255.255.0.0 -j RETURN', '-s 10.0.0.0/8 ! -d 10.0.0.0/16 ! -i cbr0 -o eth+ -j RETURN'],
    ['-m mark --mark 16 -j RETURN', '-m mark --mark 0x10 -j RETURN'],
    ['-p 6 -j ACCEPT', '-p tcp -j ACCEPT'],
    ['-j REJECT --reject-with tcp-reset -p tcp', '-p tcp -j REJECT --reject-with tcp-reset'],
  ];
  for (const [written, saved] of pairs) {
    assert.equal(parseRule(written, ['X', 'KUBE-SVC-X', 'KUBE-MARK-MASQ']).text, `-A X ${saved}`, written);
    assert.equal(parseRule(saved, ['X', 'KUBE-SVC-X', 'KUBE-MARK-MASQ']).text, `-A X ${saved}`, `already saved: ${saved}`);
  }
});

test('comments with spaces, quotes and backslashes keep their text', () => {
  const quoted = parseRule('-m comment --comment "a \\"quoted\\" comment" -j ACCEPT');
  assert.equal(quoted.comment, 'a "quoted" comment');
  assert.equal(quoted.text, '-A X -m comment --comment "a \\"quoted\\" comment" -j ACCEPT');
  const looksLikeARule = parseRule('-m comment --comment "-A X -j DROP" -j ACCEPT');
  assert.equal(looksLikeARule.comment, '-A X -j DROP');
  assert.equal(looksLikeARule.target?.name, 'ACCEPT');
  const bare = parseRule('-m comment --comment nospace -j ACCEPT');
  assert.equal(bare.text, '-A X -m comment --comment nospace -j ACCEPT');
  const backslash = parseRule('-m comment --comment "back\\\\slash" -j ACCEPT');
  assert.equal(backslash.comment, 'back\\slash');
  assert.equal(backslash.text, '-A X -m comment --comment "back\\\\slash" -j ACCEPT');
});

test('unknown matches and targets are kept as written', () => {
  const physdev = parseRule('-m physdev --physdev-is-bridged -j ACCEPT');
  assert.deepEqual(physdev.matches, [{module: 'physdev', options: [{name: 'physdev-is-bridged', negated: false, values: []}]}]);
  assert.equal(physdev.text, '-A X -m physdev --physdev-is-bridged -j ACCEPT');
  const set = parseRule('-m set ! --match-set cali40all-hosts-net dst,src -m foo --bar 1 2 --baz -j ACCEPT');
  assert.equal(set.text, '-A X -m set ! --match-set cali40all-hosts-net dst,src -m foo --bar 1 2 --baz -j ACCEPT');
  assert.deepEqual(set.matches[1], {
    module: 'foo',
    options: [
      {name: 'bar', negated: false, values: ['1', '2']},
      {name: 'baz', negated: false, values: []},
    ],
  });
  const log = parseRule('-j LOG --log-prefix "dropped: " --log-level 4');
  assert.equal(log.text, '-A X -j LOG --log-prefix "dropped: " --log-level 4');
  const custom = parseRule('-j CUSTOMTARGET --weird-option value');
  assert.deepEqual(custom.target, {
    name: 'CUSTOMTARGET',
    goto: false,
    options: [{name: 'weird-option', negated: false, values: ['value']}],
  });
});

test('a goto, an address list and a rule with no target', () => {
  assert.deepEqual(parseRule('-g Y', ['X', 'Y']).target, {name: 'Y', goto: true, options: []});
  const text = ['*filter', ':X - [0:0]', '-A X -s 10.0.0.1,10.0.0.2 -j ACCEPT', '-A X -m comment --comment "count only"', 'COMMIT'].join(
    '\n',
  );
  const rules = findChain(parseIptablesSave(text), 'filter', 'X')!.rules;
  assert.deepEqual(
    rules.map((rule) => rule.text),
    ['-A X -s 10.0.0.1/32 -j ACCEPT', '-A X -s 10.0.0.2/32 -j ACCEPT', '-A X -m comment --comment "count only"'],
  );
  assert.equal(rules[2].target, undefined);
});

test('ip6tables dumps: IPv6 family, canonical addresses, icmp6 REJECT', () => {
  const text = [
    '# Generated by ip6tables-nft-save v1.8.9 (nf_tables) on Mon Nov 23 00:41:12 2026',
    '*filter',
    ':INPUT ACCEPT [0:0]',
    ':KUBE-SERVICES - [0:0]',
    '-A KUBE-SERVICES -d fd00:0:0::10 -p tcp -m comment --comment "default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT',
    'COMMIT',
    '*nat',
    ':KUBE-SEP-A - [0:0]',
    '-A KUBE-SEP-A -p tcp -m recent --set --name KUBE-SEP-A -m tcp -j DNAT --to-destination [fd00::5]:8080',
    'COMMIT',
  ].join('\n');
  // Hand-written, though the header says ip6tables-nft-save: read and re-spell every rule.
  const ruleset = parseIptablesSave(text, {keepSavedText: false});
  assert.equal(ruleset.family, 'IPv6');
  assert.equal(
    findChain(ruleset, 'filter', 'KUBE-SERVICES')!.rules[0].text,
    '-A KUBE-SERVICES -d fd00::10/128 -p tcp -m comment --comment "default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable',
  );
  assert.equal(
    findChain(ruleset, 'nat', 'KUBE-SEP-A')!.rules[0].text,
    '-A KUBE-SEP-A -p tcp -m recent --set --name KUBE-SEP-A --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -m tcp -j DNAT --to-destination [fd00::5]:8080',
  );
});

test('iptables-restore commands: new, insert, delete, flush, policy, delete chain', () => {
  const text = [
    '*filter',
    '-N X',
    '-N GONE',
    '-A X -j RETURN',
    '-I X -s 10.0.0.1 -j ACCEPT',
    '-I X 2 -s 10.0.0.2 -j ACCEPT',
    '-A X -s 10.0.0.3 -j DROP',
    '-D X -s 10.0.0.3/32 -j DROP',
    '-D X 1',
    '-P FORWARD DROP',
    '-A GONE -j ACCEPT',
    '-F GONE',
    '-X GONE',
    'COMMIT',
  ].join('\n');
  const ruleset = parseIptablesSave(text);
  assert.deepEqual(
    findChain(ruleset, 'filter', 'X')!.rules.map((rule) => rule.text),
    ['-A X -s 10.0.0.2/32 -j ACCEPT', '-A X -j RETURN'],
  );
  assert.equal(findChain(ruleset, 'filter', 'FORWARD')!.policy, 'DROP');
  assert.equal(findChain(ruleset, 'filter', 'GONE'), undefined);
});

test('a dump without COMMIT at the end is read, with a note', () => {
  const ruleset = parseIptablesSave('*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j ACCEPT\n');
  assert.equal(findChain(ruleset, 'nat', 'PREROUTING')!.rules.length, 1);
  assert.deepEqual(ruleset.notes, ['table nat (line 1) has no COMMIT: the dump may be cut short']);
});

test('written back, a parsed dump reads the same', () => {
  const ruleset = parseIptablesSave(dump('node-a.legacy.txt'));
  const again = parseIptablesSave(formatIptablesRuleset(ruleset));
  assert.deepEqual(ruleTexts(again), ruleTexts(ruleset));
  assert.equal(findChain(again, 'filter', 'FORWARD')!.policy, 'DROP');
});

test('bad lines: an error that names the line and the reason', () => {
  const cases: Array<[string, number, RegExp]> = [
    ['*filter\n:X - [0:0]\nhello world\nCOMMIT\n', 3, /not a table .* rule .* or COMMIT line: hello world/],
    ['-A INPUT -j ACCEPT\n', 1, /rule outside a table/],
    ['*filter\n-A NOPE -j ACCEPT\nCOMMIT\n', 2, /chain NOPE is not declared in table filter/],
    ['*filter\n:X - [0:0]\n-A X -m comment --comment "open -j ACCEPT\nCOMMIT\n', 3, /unterminated double quote/],
    ['*filter\n:X - [0:0]\n-A X --dport 80 -j ACCEPT\nCOMMIT\n', 3, /option --dport belongs to no match or target/],
    ['*filter\n:X - [0:0]\n-A X -s 10.0.0.300 -j ACCEPT\nCOMMIT\n', 3, /-s 10\.0\.0\.300: not an IP address or CIDR/],
    ['*filter\n:X - [0:0]\n-A X -s 10.0.0.1 --src 10.0.0.2 -j ACCEPT\nCOMMIT\n', 3, /-s given twice/],
    ['*filter\n:X - [0:0]\n-A X --dst 10.0.0.1 --destination 10.0.0.2 -j ACCEPT\nCOMMIT\n', 3, /-d given twice/],
    [
      '*filter\n:X - [0:0]\n-A X -m statistic --mode random --probability 2 -j ACCEPT\nCOMMIT\n',
      3,
      /--probability 2: not a number between 0 and 1/,
    ],
    ['*filter\n*nat\nCOMMIT\n', 2, /table nat starts before table filter \(line 1\) ends with COMMIT/],
    ['*filter\n:INPUT MAYBE [0:0]\nCOMMIT\n', 2, /policy of built-in chain INPUT must be ACCEPT or DROP/],
    ['*filter\n:X - [0:0]\n-A X -j MARK --set-mark banana\nCOMMIT\n', 3, /-j MARK --set-mark banana: not a number/],
    ['COMMIT\n', 1, /COMMIT outside a table/],
  ];
  for (const [text, line, reason] of cases) {
    assert.throws(
      () => parseIptablesSave(text),
      (error: unknown) => {
        assert.ok(error instanceof IptablesParseError, String(error));
        assert.equal(error.line, line, error.message);
        assert.match(error.message, new RegExp(`^iptables rules line ${line}: `));
        assert.match(error.message, reason);
        return true;
      },
      text,
    );
  }
});

test('matches the tracer does not evaluate are listed as unknown matches, and the rules kept whole', () => {
  const ruleset = parseIptablesSave(dump('calico-node.nft.txt'));
  assert.deepEqual(
    ruleset.unknownMatches.map((entry) => `${entry.table} ${entry.chain} ${entry.line} ${entry.module}`),
    [
      'raw cali-PREROUTING 32 rpfilter',
      'filter cali-fw-cali1234567890a 80 set',
      'nat cali-nat-outgoing 128 set',
      'nat cali-nat-outgoing 128 set',
    ],
  );
  assert.equal(
    findChain(ruleset, 'nat', 'cali-nat-outgoing')!.rules[0].text,
    '-A cali-nat-outgoing -m comment --comment "cali:flqWnvo8yq4ULQLa" -m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE --random-fully',
  );
  assert.equal(findChain(ruleset, 'filter', 'cali-FORWARD')!.kind, 'foreign');
  assert.deepEqual(parseIptablesSave(dump('node-a.legacy.txt')).unknownMatches, []);
});

test('what iptables-nft-save cannot show is kept and noted, not an error', () => {
  const text = [
    '# Generated by iptables-nft-save v1.8.9 (nf_tables) on Mon Nov 23 01:15:02 2026',
    "# Table `mangle' is incompatible, use 'nft' tool.",
    '*filter',
    ':FOO - [0:0]',
    '-A FOO -m tcp --dport 80 [unsupported revision] -j ACCEPT',
    '-A FOO -m bpf [unsupported revision] -j DROP',
    'COMMIT',
  ].join('\n');
  const ruleset = parseIptablesSave(text);
  assert.deepEqual(ruleset.notes, ["Table `mangle' is incompatible, use 'nft' tool."]);
  assert.deepEqual(
    findChain(ruleset, 'filter', 'FOO')!.rules.map((rule) => rule.text),
    ['-A FOO -m tcp --dport 80 [unsupported revision] -j ACCEPT', '-A FOO -m bpf [unsupported revision] -j DROP'],
  );
});

test('rule text iptables-save printed is kept as printed, and reads the same as when re-spelled', () => {
  for (const name of ['node-a.legacy.txt', 'node-a.nft.txt', 'calico-node.nft.txt', 'kube-proxy-1.20.legacy.txt']) {
    const kept = parseIptablesSave(dump(name));
    const respelled = parseIptablesSave(dump(name), {keepSavedText: false});
    assert.deepEqual(ruleTexts(kept), ruleTexts(respelled), name);
    const parts = (ruleset: IptablesRuleset) =>
      [...ruleset.tables.values()].flatMap((table) =>
        [...table.chains.values()].flatMap((chain) => chain.rules.map((rule) => JSON.stringify(rule))),
      );
    assert.deepEqual(parts(kept), parts(respelled), name);
    assert.deepEqual(kept.unknownMatches, respelled.unknownMatches, name);
  }
});

test('a rule kept as printed that turns out unreadable names its line when it is read', () => {
  const ruleset = parseIptablesSave(
    [
      '# Generated by iptables-save v1.8.9 on Mon Nov 23 00:58:12 2026',
      '*filter',
      ':X - [0:0]',
      '-A X --dport 80 -j ACCEPT',
      'COMMIT',
    ].join('\n'),
  );
  const rule = findChain(ruleset, 'filter', 'X')!.rules[0];
  assert.equal(rule.text, '-A X --dport 80 -j ACCEPT');
  assert.throws(() => rule.matches, /^IptablesParseError: iptables rules line 4: option --dport belongs to no match or target/);
});
