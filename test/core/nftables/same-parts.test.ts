// A diff that remembers the chains and sets it found the same, and an applied table that keeps
// the desired ones in their place: what later diffs and traces read must not change.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {diffNftables, type SameParts, shareSameParts} from '../../../src/core/nftables/diff.ts';
import {parseNftablesScript} from '../../../src/core/nftables/parse.ts';

const table = (extra: string) =>
  parseNftablesScript(`add table ip kube-proxy
add chain ip kube-proxy services
add rule ip kube-proxy services ip daddr 10.96.0.10 tcp dport 80 goto service-AAAAAAAA-default/web/tcp/http
add chain ip kube-proxy service-AAAAAAAA-default/web/tcp/http
add rule ip kube-proxy service-AAAAAAAA-default/web/tcp/http ip daddr 10.96.0.10 counter
add set ip kube-proxy affinity-BBBBBBBB-default/web/tcp/http__10.244.1.5/tcp/8080 { type ipv4_addr ; flags dynamic,timeout ; timeout 3h ; }
${extra}`);

test('a whole diff remembers what it found the same, skips it next time, and the applied table takes those parts from the desired one', () => {
  const desired = table('');
  // As the kernel lists it: a counter with values, and an affinity set holding a client.
  const applied = table('add element ip kube-proxy affinity-BBBBBBBB-default/web/tcp/http__10.244.1.5/tcp/8080 { 10.244.2.9 }');
  applied.chains.get('service-AAAAAAAA-default/web/tcp/http')!.rules[0] = 'ip daddr 10.96.0.10 counter packets 4 bytes 240';
  const same: SameParts = new WeakMap();
  assert.equal(diffNftables(desired, applied, {sameParts: same}).equal, true);
  assert.equal(same.get(desired.chains.get('services')!), applied.chains.get('services'));

  shareSameParts(desired, applied, same);
  assert.equal(applied.chains.get('services'), desired.chains.get('services'), 'a chain that reads the same is shared');
  assert.equal(same.has(desired.chains.get('services')!), false, 'a shared chain is known the same by identity, not remembered');
  assert.notEqual(
    applied.chains.get('service-AAAAAAAA-default/web/tcp/http'),
    desired.chains.get('service-AAAAAAAA-default/web/tcp/http'),
    'a chain whose counter has values keeps its own (a trace shows them)',
  );
  const affinity = 'affinity-BBBBBBBB-default/web/tcp/http__10.244.1.5/tcp/8080';
  assert.deepEqual(applied.sets.get(affinity)!.elements, [{key: '10.244.2.9'}], 'an affinity set keeps its clients');

  // A change on the applied side alone (a patched reading shares the rest) is found, and only it.
  const patched = {...applied, chains: new Map(applied.chains)};
  patched.chains.set('services', {name: 'services', rules: []});
  const diff = diffNftables(desired, patched, {sameParts: same});
  assert.deepEqual(diff, diffNftables(desired, patched), 'what a diff that remembers nothing says');
  assert.deepEqual(
    diff.groups.flatMap((group) => group.added),
    ['rule services #1: ip daddr 10.96.0.10 tcp dport 80 goto service-AAAAAAAA-default/web/tcp/http'],
  );
});

test('a diff told which parts changed since a diff against the same desired table says what a whole diff says', () => {
  const desired = table('add chain ip kube-proxy only-desired');
  const applied = table('add chain ip kube-proxy foreign\nadd rule ip kube-proxy foreign ip daddr 10.9.9.9 drop');
  applied.chains.get('service-AAAAAAAA-default/web/tcp/http')!.rules.length = 0;
  const first = diffNftables(desired, applied);
  assert.deepEqual(
    [[...first.differingParts.chains].sort(), [...first.differingParts.sets]],
    [['foreign', 'only-desired', 'service-AAAAAAAA-default/web/tcp/http'], []],
    'the parts that differ, by name',
  );
  // Changed part by part since: a chain emptied, a set added, a foreign chain deleted.
  const changed = {...applied, chains: new Map(applied.chains), sets: new Map(applied.sets)};
  changed.chains.set('services', {name: 'services', rules: []});
  changed.chains.delete('foreign');
  changed.sets.set('blocked', {name: 'blocked', kind: 'set', flags: [], elements: [{key: '10.8.8.8'}]});
  const comparedParts = {
    chains: new Set([...first.differingParts.chains, 'services', 'foreign']),
    sets: new Set([...first.differingParts.sets, 'blocked']),
  };
  const told = diffNftables(desired, changed, {comparedParts});
  assert.deepEqual(told, diffNftables(desired, changed));
  assert.deepEqual(
    told.groups.map((group) => group.servicePort),
    ['', 'default/web:http'],
  );
});
