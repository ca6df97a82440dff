// diffIptables: desired (what the proxier writes) against applied (iptables-save of the node),
// grouped by service port; counters, declaration order and other people's chains do not count.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {test} from 'node:test';
import {diffIptables} from '../../../src/core/iptables/diff.ts';
import {parseIptablesSave} from '../../../src/core/iptables/parse.ts';

const dump = (name: string) => readFileSync(new URL(`./dumps/${name}`, import.meta.url), 'utf8');
const desired = dump('node-a.restore.txt');
const applied = dump('node-a.legacy.txt');

function edit(text: string, change: (lines: string[]) => string[]): string {
  return `${change(text.split('\n')).join('\n')}\n`;
}

const without = (pattern: RegExp) => (lines: string[]) => lines.filter((line) => !pattern.test(line));

test("the proxier's input and what iptables-save printed after loading it are equal, on both front ends", () => {
  for (const name of ['node-a.legacy.txt', 'node-a.nft.txt']) {
    const result = diffIptables(desired, dump(name));
    assert.deepEqual(result, {equal: true, groups: [], text: ''}, name);
  }
  assert.equal(diffIptables(dump('node-a.nft.txt'), dump('node-a.legacy.txt')).equal, true);
  // Parsed rulesets work as well as text.
  assert.equal(diffIptables(parseIptablesSave(desired), parseIptablesSave(applied)).equal, true);
});

test('counters, chain declaration order and foreign chains do not count', () => {
  const shuffled = edit(applied, (lines) => {
    // Each table's user chain declarations reversed, counters changed, a Docker rule added, a flannel rule gone.
    const out: string[] = [];
    let run: string[] = [];
    for (const line of lines) {
      if (/^:[A-Z0-9-]+ - /.test(line)) {
        run.push(line);
        continue;
      }
      out.push(...run.reverse());
      run = [];
      out.push(line);
    }
    return out
      .map((line) => line.replace(/^\[\d+:\d+\]/, '[999:99999]'))
      .flatMap((line) =>
        line === '[999:99999] -A DOCKER-USER -j RETURN' ? ['[1:1] -A DOCKER-USER -s 192.0.2.1/32 -j DROP', line] : [line],
      )
      .filter((line) => !/FLANNEL-POSTRTG ! -s/.test(line));
  });
  assert.notEqual(shuffled, applied);
  assert.deepEqual(diffIptables(desired, shuffled), {equal: true, groups: [], text: ''});
});

test('a missing endpoint chain is reported under its service, with the chain and its rules', () => {
  const missing = edit(applied, without(/KUBE-SEP-AFGSLHOD2HFNCBX4/));
  const result = diffIptables(desired, missing);
  assert.equal(result.equal, false);
  assert.deepEqual(result.groups, [
    {
      servicePort: 'default/web:http',
      added: [
        '-t nat -N KUBE-SEP-AFGSLHOD2HFNCBX4',
        '-t nat -A KUBE-SEP-AFGSLHOD2HFNCBX4 -s 10.244.1.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ',
        '-t nat -A KUBE-SEP-AFGSLHOD2HFNCBX4 -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.5:8080',
        '-t nat -A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-AFGSLHOD2HFNCBX4',
      ],
      removed: [],
    },
  ]);
});

test('a changed rule shows as removed and added, in a unified-diff text grouped by service', () => {
  const changed = edit(applied, (lines) =>
    lines.map((line) =>
      line.replace('--probability 0.50000000000 -j KUBE-SEP-F7BHZ7WL3PFYMSRY', '--probability 0.25000000000 -j KUBE-SEP-F7BHZ7WL3PFYMSRY'),
    ),
  );
  const result = diffIptables(desired, changed);
  const want =
    '-t nat -A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.1.6:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-F7BHZ7WL3PFYMSRY';
  const have = want.replace('0.50000000000', '0.25000000000');
  assert.deepEqual(result.groups, [{servicePort: 'default/web:http', added: [want], removed: [have]}]);
  assert.equal(result.text, ['--- desired', '+++ applied', '@@ default/web:http @@', `-${want}`, `+${have}`, ''].join('\n'));
});

test('missing jump rules and stale chains: rules of no service and of a deleted service', () => {
  const changed = edit(applied, (lines) => {
    const out = lines.filter((line) => !/-A PREROUTING -m comment --comment "kubernetes service portals"/.test(line));
    const nat = out.indexOf(':KUBE-SERVICES - [0:0]');
    out.splice(nat + 1, 0, ':KUBE-SVC-OLDOLDOLDOLDOLDO - [0:0]');
    const commit = out.indexOf('COMMIT', nat);
    out.splice(commit, 0, '-A KUBE-SVC-OLDOLDOLDOLDOLDO -m comment --comment "default/old:http -> 10.244.9.9:80" -j RETURN');
    return out;
  });
  const result = diffIptables(desired, changed);
  assert.deepEqual(result.groups, [
    {
      servicePort: 'default/old:http',
      added: [],
      removed: [
        '-t nat -N KUBE-SVC-OLDOLDOLDOLDOLDO',
        '-t nat -A KUBE-SVC-OLDOLDOLDOLDOLDO -m comment --comment "default/old:http -> 10.244.9.9:80" -j RETURN',
      ],
    },
    {servicePort: '', added: ['-t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'], removed: []},
  ]);
  assert.match(result.text, /@@ default\/old:http @@\n\+-t nat -N KUBE-SVC-OLDOLDOLDOLDOLDO\n/);
  assert.match(result.text, /@@ \(rules of no service\) @@\n--t nat -A PREROUTING /);
});

test('rules of a fixed chain are grouped by the service their comment names', () => {
  const changed = edit(applied, without(/default\/empty:http has no endpoints/));
  const result = diffIptables(desired, changed);
  assert.deepEqual(
    result.groups.map((group) => [group.servicePort, group.added.length, group.removed.length]),
    [['default/empty:http', 1, 0]],
  );
  assert.match(
    result.groups[0].added[0],
    /^-t filter -A KUBE-SERVICES -d 10\.96\.0\.12\/32 .* -j REJECT --reject-with icmp-port-unreachable$/,
  );
});

test('rules in the wrong order differ', () => {
  const reordered = edit(applied, (lines) => {
    const first = lines.findIndex((line) =>
      line.includes('-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.1.5:8080"'),
    );
    [lines[first], lines[first + 1]] = [lines[first + 1], lines[first]];
    return lines;
  });
  const result = diffIptables(desired, reordered);
  assert.equal(result.equal, false);
  assert.deepEqual(
    result.groups.map((group) => group.servicePort),
    ['default/web:http'],
  );
  assert.equal(result.groups[0].added.length, 1);
  assert.equal(result.groups[0].removed.length, 1);
});

test('the service filter keeps one service or one service port', () => {
  const changed = edit(applied, (lines) =>
    lines.filter((line) => !/KUBE-SEP-AFGSLHOD2HFNCBX4|default\/empty:http has no endpoints|kube-system\/kube-dns:dns-tcp -> /.test(line)),
  );
  const all = diffIptables(desired, changed);
  assert.deepEqual(
    all.groups.map((group) => group.servicePort),
    ['default/empty:http', 'default/web:http', 'kube-system/kube-dns:dns-tcp'],
  );
  assert.deepEqual(
    diffIptables(desired, changed, {service: 'default/web'}).groups.map((group) => group.servicePort),
    ['default/web:http'],
  );
  assert.deepEqual(
    diffIptables(desired, changed, {service: 'kube-system/kube-dns:dns-tcp'}).groups.map((group) => group.servicePort),
    ['kube-system/kube-dns:dns-tcp'],
  );
  const other = diffIptables(desired, changed, {service: 'kube-system/kube-dns:dns'});
  assert.deepEqual(other, {equal: true, groups: [], text: ''});
});

test('endpoint chains without comments (large clusters) belong to the service that jumps to them', () => {
  const rules = (probability: string) =>
    [
      '*nat',
      ':KUBE-SERVICES - [0:0]',
      ':KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]',
      ':KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]',
      ':KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]',
      '-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "big/api:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-AAAAAAAAAAAAAAAA',
      `-A KUBE-SVC-AAAAAAAAAAAAAAAA -m statistic --mode random --probability ${probability} -j KUBE-SEP-BBBBBBBBBBBBBBBB`,
      '-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-CCCCCCCCCCCCCCCC',
      '-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 10.1.0.1:6443',
      '-A KUBE-SEP-CCCCCCCCCCCCCCCC -p tcp -m tcp -j DNAT --to-destination 10.1.0.2:6443',
      'COMMIT',
    ].join('\n');
  const result = diffIptables(
    rules('0.5'),
    edit(rules('0.5'), (lines) => lines.map((line) => line.replace('10.1.0.2:6443', '10.1.0.3:6443'))),
  );
  assert.deepEqual(result.groups, [
    {
      servicePort: 'big/api:https',
      added: ['-t nat -A KUBE-SEP-CCCCCCCCCCCCCCCC -p tcp -m tcp -j DNAT --to-destination 10.1.0.2:6443'],
      removed: ['-t nat -A KUBE-SEP-CCCCCCCCCCCCCCCC -p tcp -m tcp -j DNAT --to-destination 10.1.0.3:6443'],
    },
  ]);
});

test('a desired ruleset in text and an applied one that cannot be read: the error names the line', () => {
  assert.throws(() => diffIptables(desired, '*nat\nbroken line\nCOMMIT\n'), /iptables rules line 2: /);
});

test("the order of KUBE-SERVICES' service rules does not count (kube-proxy writes them in map order); its KUBE-NODEPORTS jump must stay last", () => {
  const serviceRules = (lines: string[]) =>
    lines.map((line, index) => ({line, index})).filter(({line}) => /^(\[\d+:\d+\] )?-A KUBE-SERVICES .*cluster IP/.test(line));
  const swapped = edit(applied, (lines) => {
    const rules = serviceRules(lines);
    const [a, b] = [rules[0], rules.at(-1)!];
    [lines[a.index], lines[b.index]] = [b.line, a.line];
    return lines;
  });
  assert.notEqual(swapped, applied);
  assert.deepEqual(diffIptables(desired, swapped), {equal: true, groups: [], text: ''});

  const nodePortsFirst = edit(applied, (lines) => {
    const jump = lines.findIndex((line) => /^(\[\d+:\d+\] )?-A KUBE-SERVICES .*-j KUBE-NODEPORTS$/.test(line));
    const first = lines.findIndex((line) => /^(\[\d+:\d+\] )?-A KUBE-SERVICES /.test(line));
    const [moved] = lines.splice(jump, 1);
    lines.splice(first, 0, moved);
    return lines;
  });
  const result = diffIptables(desired, nodePortsFirst);
  assert.equal(result.equal, false);
  assert.match(result.text, /KUBE-NODEPORTS/);
});
