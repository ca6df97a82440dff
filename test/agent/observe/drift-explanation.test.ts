// Drift explained by Service: from the diff groups any backend gives, the desired model and the
// applied rules' text, each drifted service port gets the reason a person on call needs.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {buildProxyModel, type ProxyModel} from '../../../src/core/model/index.ts';
import {addressesIn, explainDrift, wholeText} from '../../../src/agent/observe/drift-explanation.ts';
import {DriftTracker} from '../../../src/agent/observe/drift-tracker.ts';
import {EndpointHistory} from '../../../src/agent/observe/observing-proxier.ts';
import {memoryLogger} from '../../../src/agent/log.ts';

function model(endpoints: string[]): ProxyModel {
  return buildProxyModel(
    {
      services: [
        {
          apiVersion: 'v1',
          kind: 'Service',
          metadata: {name: 'web', namespace: 'default'},
          spec: {clusterIP: '10.96.0.20', clusterIPs: ['10.96.0.20'], ports: [{name: 'http', port: 80, targetPort: 8080, protocol: 'TCP'}]},
        },
      ],
      endpointSlices: [
        {
          apiVersion: 'discovery.k8s.io/v1',
          kind: 'EndpointSlice',
          metadata: {name: 'web-1', namespace: 'default', labels: {'kubernetes.io/service-name': 'web'}},
          addressType: 'IPv4',
          ports: [{name: 'http', protocol: 'TCP', port: 8080}],
          endpoints: endpoints.map((address) => ({addresses: [address], conditions: {ready: true}, nodeName: 'node-2'})),
        },
      ],
    },
    {family: 'IPv4', nodeName: 'node-1'},
  );
}

const programmedText = '-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/web:http cluster IP" -j KUBE-SVC-X\n';

test('explainDrift: a stale endpoint, with how long ago it left the EndpointSlice', () => {
  const history = new EndpointHistory();
  const before = model(['10.244.1.7', '10.244.1.8']);
  const after = model(['10.244.1.8']);
  history.note(undefined, before, 0);
  history.note(before, after, 60_000);
  const [group] = explainDrift(
    [
      {
        servicePort: 'default/web:http',
        added: [],
        removed: [
          '-t nat -A KUBE-SEP-ABC -s 10.244.1.7/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ',
          '-t nat -A KUBE-SEP-ABC -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.7:8080',
        ],
      },
    ],
    {models: [after], applied: wholeText(() => programmedText), history, now: 60_000 + 4 * 60_000},
  );
  assert.deepEqual(group.explanations, [
    {
      kind: 'stale-endpoint',
      endpoint: '10.244.1.7',
      text: 'endpoint 10.244.1.7 still programmed, removed from the EndpointSlice 4m ago',
      since: new Date(60_000).toISOString(),
    },
  ]);
});

test('explainDrift: not programmed, no kube-proxy rules at all, rules not written by kube-proxy, a missing endpoint', () => {
  const history = new EndpointHistory();
  const current = model(['10.244.1.8']);
  const missingAll = {servicePort: 'default/web:http', added: ['-t nat -A KUBE-SERVICES -d 10.96.0.20/32 -j KUBE-SVC-X'], removed: []};
  const other = {servicePort: 'default/other:http', added: ['-t nat -A KUBE-SERVICES -d 10.96.0.30/32 -j KUBE-SVC-Y'], removed: []};
  // The other service's rules are there, web's are not.
  const notProgrammed = explainDrift([missingAll], {
    models: [current, model2('other', '10.96.0.30')],
    applied: wholeText(
      () => '-A KUBE-SERVICES -d 10.96.0.30/32 -p tcp -m comment --comment "default/other:http cluster IP" -j KUBE-SVC-Y\n',
    ),
    history,
    now: 0,
  });
  assert.deepEqual(notProgrammed[0].explanations, [{kind: 'not-programmed', text: 'not programmed on this node'}]);
  // Nothing of any service is there.
  const nothing = explainDrift([missingAll, other], {
    models: [current, model2('other', '10.96.0.30')],
    applied: wholeText(() => '*nat\nCOMMIT\n'),
    history,
    now: 0,
  });
  assert.deepEqual(
    nothing.map((group) => group.explanations),
    [
      [{kind: 'no-kube-proxy-rules', text: 'no kube-proxy rules at all on this node'}],
      [{kind: 'no-kube-proxy-rules', text: 'no kube-proxy rules at all on this node'}],
    ],
  );
  // A rule someone slipped in: not written by kube-proxy.
  const foreign = explainDrift(
    [{servicePort: '', added: [], removed: ['-t nat -A KUBE-SERVICES -p tcp --dport 22 -j DNAT --to-destination 10.0.0.1:22']}],
    {
      models: [current],
      applied: wholeText(() => programmedText),
      history,
      now: 0,
    },
  );
  assert.deepEqual(foreign[0].explanations, [
    {
      kind: 'foreign-rule',
      text: 'rule not written by kube-proxy: -t nat -A KUBE-SERVICES -p tcp --dport 22 -j DNAT --to-destination 10.0.0.1:22',
    },
  ]);
  // A Service deleted whose rules stay.
  const gone = explainDrift([{servicePort: 'default/old:http', added: [], removed: ['-t nat -A KUBE-SVC-OLD -j KUBE-SEP-OLD']}], {
    models: [current],
    applied: wholeText(() => programmedText),
    history,
    now: 0,
  });
  assert.deepEqual(gone[0].explanations, [{kind: 'stale-service', text: 'still programmed on this node, no longer a port of any Service'}]);
  const foreignNoAddress = explainDrift([{servicePort: '', added: [], removed: ['-t filter -A KUBE-FORWARD -j ACCEPT']}], {
    models: [current],
    applied: wholeText(() => programmedText),
    history,
    now: 0,
  });
  assert.deepEqual(foreignNoAddress[0].explanations, [
    {kind: 'foreign-rule', text: 'rule not written by kube-proxy: -t filter -A KUBE-FORWARD -j ACCEPT'},
  ]);
  // An endpoint that joined and was never programmed.
  const joined = new EndpointHistory();
  const grown = model(['10.244.1.8', '10.244.1.9']);
  joined.note(undefined, current, 0);
  joined.note(current, grown, 1000);
  const missing = explainDrift(
    [{servicePort: 'default/web:http', added: ['-t nat -A KUBE-SEP-Z -p tcp -j DNAT --to-destination 10.244.1.9:8080'], removed: []}],
    {models: [grown], applied: wholeText(() => programmedText), history: joined, now: 31_000},
  );
  assert.equal(missing[0].explanations?.[0].text, 'endpoint 10.244.1.9 not programmed, added to the EndpointSlice 30s ago');
});

function model2(name: string, clusterIP: string): ProxyModel {
  return buildProxyModel(
    {
      services: [
        {
          apiVersion: 'v1',
          kind: 'Service',
          metadata: {name, namespace: 'default'},
          spec: {clusterIP, clusterIPs: [clusterIP], ports: [{name: 'http', port: 80, targetPort: 8080, protocol: 'TCP'}]},
        },
      ],
      endpointSlices: [],
    },
    {family: 'IPv4', nodeName: 'node-1'},
  );
}

test('addressesIn: endpoints in rule lines of each mode, not networks', () => {
  assert.deepEqual(addressesIn('-A KUBE-SEP-X -s 10.244.1.7/32 -j KUBE-MARK-MASQ'), ['10.244.1.7']);
  assert.deepEqual(addressesIn('-A KUBE-SERVICES ! -s 10.244.0.0/16 -d 10.96.0.1/32 -j KUBE-MARK-MASQ'), ['10.96.0.1']);
  assert.deepEqual(addressesIn('-a -t 10.96.0.1:443 -r 172.18.0.2:6443 -m -w 1'), ['10.96.0.1', '172.18.0.2']);
  assert.deepEqual(addressesIn('dnat to [fd00:10:244::7]:8080'), ['fd00:10:244::7']);
  assert.deepEqual(addressesIn('ip6 daddr fd00:10:96::/112 drop'), []);
});

test('drift tracker: one log line when a service port enters drift and one when it leaves; node drift time', () => {
  const log = memoryLogger(0);
  let now = 1000;
  const tracker = new DriftTracker({nodeName: 'node-1', log, now: () => now});
  const drifted = [
    {
      servicePort: 'default/web:http',
      added: ['x'],
      removed: [],
      explanations: [{kind: 'not-programmed' as const, text: 'not programmed on this node'}],
    },
  ];
  tracker.checked(drifted, 1000);
  now = 5000;
  tracker.checked(drifted, 5000);
  assert.equal(tracker.nodeDriftSince, 1000);
  assert.equal(log.lines.filter((line) => line.includes('service port drifted')).length, 1);
  assert.match(log.lines[0], /servicePort=default\/web:http/);
  assert.match(log.lines[0], /not programmed on this node/);
  tracker.checked([{servicePort: 'default/web:http', added: [], removed: []}], 9000);
  assert.equal(tracker.nodeDriftSince, undefined);
  assert.match(log.lines[1], /service port no longer drifts .*servicePort=default\/web:http/);
});

test("drift tracker: kube-proxy's rules are gone when every drifted service port has none at all, not when one differs", () => {
  const tracker = new DriftTracker({nodeName: 'node-1', log: memoryLogger(0), now: () => 0});
  const none = {kind: 'no-kube-proxy-rules' as const, text: 'no kube-proxy rules at all on this node'};
  const gone = (servicePort: string) => ({servicePort, added: ['x'], removed: [], explanations: [none]});
  assert.equal(tracker.kubeProxyRulesGone, false);
  tracker.checked([gone('default/web:http'), gone('default/db:sql'), {servicePort: 'default/ok:http', added: [], removed: []}], 1);
  assert.equal(tracker.kubeProxyRulesGone, true);
  const missing = {kind: 'not-programmed' as const, text: 'not programmed on this node'};
  tracker.checked([gone('default/web:http'), {servicePort: 'default/db:sql', added: ['x'], removed: [], explanations: [missing]}], 2);
  assert.equal(tracker.kubeProxyRulesGone, false);
  tracker.checked([gone('default/web:http')], 3);
  tracker.checked([], 4);
  assert.equal(tracker.kubeProxyRulesGone, false, 'no drift: the rules are there');
});

test('explainDrift: an nftables table names its service ports in chain names; one element missing is no "not programmed"', () => {
  const history = new EndpointHistory();
  const current = model(['10.244.1.8']);
  const appliedText = '{"nftables": [{"chain": {"family": "ip", "table": "kube-proxy", "name": "service-U2PUS6B4-default/web/tcp/http"}}]}';
  const [group] = explainDrift(
    [
      {
        servicePort: 'default/web:http',
        added: ['element service-ips { 10.96.0.20 . tcp . 80 : goto service-U2PUS6B4-default/web/tcp/http }'],
        removed: [],
      },
    ],
    {models: [current], applied: wholeText(() => appliedText), history, now: 0},
  );
  assert.equal(group.explanations?.[0].kind, 'missing-rule');
});

test('explainDrift: a service port programmed only late in the model is found, past the ports looked for one by one', () => {
  // Forty service ports, only the last programmed, named three ways (comment, nft chain, ipvs server).
  const models = Array.from({length: 40}, (_, i) => model2(`svc${String(i).padStart(2, '0')}`, `10.96.1.${i + 1}`));
  const missing = {servicePort: 'default/svc00:http', added: ['-t nat -A KUBE-SERVICES -d 10.96.1.1/32 -j KUBE-SVC-X'], removed: []};
  const texts = [
    '-A KUBE-SERVICES -d 10.96.1.40/32 -p tcp -m comment --comment "default/svc39:http cluster IP" -j KUBE-SVC-Z\n',
    '{"chain": {"name": "service-ULMVA6XW-default/svc39/tcp/http"}}\n',
    '-A -t 10.96.1.40:80 -s rr\n',
  ];
  for (const appliedText of texts) {
    const [group] = explainDrift([missing], {models, applied: wholeText(() => appliedText), history: new EndpointHistory(), now: 0});
    assert.deepEqual(group.explanations, [{kind: 'not-programmed', text: 'not programmed on this node'}], appliedText);
  }
  // Not part of a longer name or address: svc3 is not svc39, 10.96.1.4:80 not 10.96.1.40:80.
  const [none] = explainDrift([missing], {
    models: [model2('svc3', '10.96.1.4')],
    applied: wholeText(() => texts.join('')),
    history: new EndpointHistory(),
    now: 0,
  });
  assert.deepEqual(none.explanations, [{kind: 'no-kube-proxy-rules', text: 'no kube-proxy rules at all on this node'}]);
});

test('explainDrift: missing endpoints are searched one by one, then read from every address the rules hold, and 10.244.1.9 is not 10.244.1.90', () => {
  // Twenty endpoints joined; the rules program the odd ones, and 10.244.1.90, whose address begins as 10.244.1.9's.
  const addresses = Array.from({length: 20}, (_, i) => `10.244.1.${i + 1}`);
  const programmed = addresses.filter((_, i) => i % 2 === 0);
  const rulesText = [...programmed, '10.244.1.90'].map((ip) => `-a -t 10.96.0.20:80 -r ${ip}:8080 -m -w 1\n`).join('');
  const expectMissing = addresses.filter((ip) => !programmed.includes(ip));
  for (const asked of [3, 20]) {
    const added = addresses.slice(0, asked).map((ip) => `-a -t 10.96.0.20:80 -r ${ip}:8080 -m -w 1`);
    let readWhole = 0;
    const text = wholeText(() => `-A -t 10.96.0.20:80 -s rr\n${rulesText}`);
    const [group] = explainDrift([{servicePort: 'default/web:http', added, removed: []}], {
      models: [model(addresses)],
      applied: {linesWith: (needle) => text.linesWith(needle), linesNear: () => [], whole: () => (readWhole++, text.whole())},
      history: new EndpointHistory(),
      now: 0,
    });
    assert.deepEqual(
      group.explanations?.map((explanation) => explanation.endpoint),
      expectMissing.filter((ip) => addresses.indexOf(ip) < asked),
      `${asked} endpoints asked`,
    );
    // Up to 16 addresses are searched for alone; more are answered from every address at once.
    assert.equal(readWhole, asked <= 16 ? 0 : 1, `${asked} endpoints asked`);
  }
});
