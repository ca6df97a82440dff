// The plugin's small pieces, without a cluster: flag parsing, tables, diff colours, probe
// comparison, agent choice.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {parseDestination} from '../../src/plugin/commands/trace.ts';
import {agentOnNode, type AgentPod} from '../../src/plugin/lib/agent-pods.ts';
import {colorDiff} from '../../src/plugin/lib/diff-text.ts';
import {inHelpGroup} from '../../src/plugin/lib/help-group.ts';
import {examples, helpText} from '../../src/plugin/lib/help-text.ts';
import {formatAge, formatTable, palette, useColor} from '../../src/plugin/lib/output.ts';
import {PluginError} from '../../src/plugin/lib/plugin-error.ts';
import {compareProbe, endpointIP} from '../../src/plugin/lib/probe-text.ts';
import {parseRequestTimeout} from '../../src/plugin/lib/request-timeout.ts';
import type {TraceAnswer} from '../../src/protocol/methods.ts';

describe('help text', () => {
  it('helpText: the lines of a paragraph join with one space, paragraphs with a blank line', () => {
    const port = 10260;
    const text = helpText`
      Asks every agent how it is
      doing,   at \`ws://127.0.0.1:${port}/\`.

      A second
      paragraph.
    `;
    assert.equal(text, 'Asks every agent how it is doing, at `ws://127.0.0.1:10260/`.\n\nA second paragraph.');
  });

  it('examples: a # description above each command, kubectl proxyctl as the bin, long ones over several lines', () => {
    const node = 'node-1';
    assert.deepEqual(
      examples`
        # What differs on ${node}
        kubectl proxyctl diff ${node}

        # Offline, over the node's three dumps
        # (ipvs mode)
        (ipvsadm-save -n; ipset save; iptables-save) > node-1.ipvs &&
          kubectl proxyctl diff --rules node-1.ipvs -f services.yaml
      `,
      [
        {description: 'What differs on node-1', command: '<%= config.bin %> diff node-1'},
        {
          description: "Offline, over the node's three dumps (ipvs mode)",
          command:
            '(ipvsadm-save -n; ipset save; iptables-save) > node-1.ipvs && <%= config.bin %> diff --rules node-1.ipvs -f services.yaml',
        },
      ],
    );
    assert.throws(
      () => examples`
      kubectl proxyctl status
    `,
      /an example needs a # description and a command:\n\s*kubectl proxyctl status/,
    );
  });

  it('inHelpGroup: each flag of the set under the heading, the rest of it as it was', () => {
    const grouped = inHelpGroup('OFFLINE', {src: {summary: 'Source address.', multiple: false}, dst: {summary: 'Destination.'}});
    assert.deepEqual(grouped, {
      src: {summary: 'Source address.', multiple: false, helpGroup: 'OFFLINE'},
      dst: {summary: 'Destination.', helpGroup: 'OFFLINE'},
    });
  });
});

describe('--request-timeout', () => {
  for (const [text, ms] of [
    ['0', 0],
    ['30', 30_000],
    ['30s', 30_000],
    ['1m30s', 90_000],
    ['500ms', 500],
    ['1h', 3_600_000],
  ] as const) {
    it(`${text} is ${ms} ms`, () => assert.equal(parseRequestTimeout(text), ms));
  }
  for (const text of ['', 'soon', '10x', '-1s', '1m foo']) {
    it(`${JSON.stringify(text)} is refused naming the flag`, () =>
      assert.throws(
        () => parseRequestTimeout(text),
        (error: PluginError) => error.exitCode === 2 && /^--request-timeout /.test(error.message),
      ));
  }
});

describe('trace --dst', () => {
  it('reads IP:PORT with a protocol, TCP by default, and [IPv6]:PORT', () => {
    assert.deepEqual(parseDestination('10.96.0.10:80'), {dstIP: '10.96.0.10', dstPort: 80, protocol: 'TCP'});
    assert.deepEqual(parseDestination('10.96.0.53:53/udp'), {dstIP: '10.96.0.53', dstPort: 53, protocol: 'UDP'});
    assert.deepEqual(parseDestination('[fd00::10]:443/SCTP'), {dstIP: 'fd00::10', dstPort: 443, protocol: 'SCTP'});
  });
  for (const text of ['10.96.0.10', '10.96.0.10:0', '10.96.0.10:70000', 'web:80', '10.96.0.10:80/icmp', 'fd00::10:80']) {
    it(`refuses ${text}`, () =>
      assert.throws(() => parseDestination(text), /^PluginError: --dst .*: must be IP:PORT\[\/PROTO\]|--dst .*: must be IP:PORT/));
  }
});

describe('output', () => {
  it('lays out tables as kubectl get does', () => {
    assert.equal(
      formatTable(
        ['NODE', 'READY'],
        [
          ['node-1', 'true'],
          ['node-10', 'false'],
        ],
      ),
      'NODE      READY\nnode-1    true\nnode-10   false\n',
    );
  });
  it('keeps columns aligned when cells are coloured', () => {
    const c = palette(true);
    assert.equal(formatTable(['A', 'B'], [[c.green('yes'), 'x']]).split('\n')[1], `${c.green('yes')}   x`);
  });
  it('colour: only on a terminal, never with NO_COLOR, FORCE_COLOR=0 or TERM=dumb, always with FORCE_COLOR=1', () => {
    const tty = {isTTY: true};
    const pipe = {isTTY: false};
    const cases: [Record<string, string>, {isTTY: boolean}, boolean][] = [
      [{}, tty, true],
      [{}, pipe, false],
      [{NO_COLOR: '1'}, tty, false],
      [{NO_COLOR: ''}, tty, true],
      [{FORCE_COLOR: '0'}, tty, false],
      [{TERM: 'dumb'}, tty, false],
      [{TERM: 'xterm-256color'}, tty, true],
      [{FORCE_COLOR: '1'}, pipe, true],
      [{FORCE_COLOR: '1', NO_COLOR: '1'}, tty, false],
    ];
    for (const [env, stream, expected] of cases)
      assert.equal(useColor('text', stream, env), expected, `${JSON.stringify(env)} ${stream.isTTY ? 'tty' : 'pipe'}`);
    assert.equal(useColor('json', tty, {FORCE_COLOR: '1'}), false, 'never for -o json');
  });
  it('writes ages as kubectl does', () => {
    assert.deepEqual([5_000, 125_000, 600_000, 7_200_000 * 3, 86_400_000 * 3].map(formatAge), ['5s', '2m5s', '10m', '6h', '3d']);
  });
  it('colours a diff only when asked', () => {
    const text = '--- desired\n+++ applied\n@@ default/web:http @@\n--t nat -A KUBE-SERVICES x\n+-t nat -A KUBE-SERVICES y';
    assert.equal(colorDiff(text, palette(false)), text);
    const lines = colorDiff(text, palette(true)).split('\n');
    assert.equal(lines[3], '\u001b[31m--t nat -A KUBE-SERVICES x\u001b[39m');
    assert.equal(lines[4], '\u001b[32m+-t nat -A KUBE-SERVICES y\u001b[39m');
  });
});

describe('probe against the trace', () => {
  const trace = {
    verdict: 'DNAT',
    branches: [
      {endpoint: '10.244.1.5:8080', probability: 0.5, hops: [], masquerade: false, masqueradeReason: ''},
      {endpoint: '10.244.2.7:8080', probability: 0.5, hops: [], masquerade: false, masqueradeReason: ''},
    ],
  } as unknown as TraceAnswer;

  it('joins branches and answers by address, and shows answers nobody predicted', () => {
    const rows = compareProbe(trace, {
      answers: [
        {endpoint: '10.244.1.5', count: 12},
        {endpoint: '10.244.9.9', count: 1},
      ],
      failures: [],
    });
    assert.deepEqual(rows, [
      {endpoint: '10.244.1.5:8080', pod: undefined, predicted: 0.5, answered: 12},
      {endpoint: '10.244.2.7:8080', pod: undefined, predicted: 0.5, answered: 0},
      {endpoint: '10.244.9.9', pod: undefined, predicted: 0, answered: 1},
    ]);
  });
  it('takes the address out of ip:port and [ip]:port', () => {
    assert.deepEqual([endpointIP('10.0.0.1:80'), endpointIP('[fd00::1]:80'), endpointIP('10.0.0.1')], ['10.0.0.1', 'fd00::1', '10.0.0.1']);
  });
});

describe('choosing the agent of a node', () => {
  const pods: AgentPod[] = [
    {namespace: 'kube-system', name: 'agent-old', node: 'node-1', port: 10260, running: false},
    {namespace: 'kube-system', name: 'agent-new', node: 'node-1', port: 10261, running: true},
    {namespace: 'kube-system', name: 'agent-b', node: 'node-2', port: 10260, running: true},
  ];
  it('prefers a running pod', () => assert.equal(agentOnNode(pods, 'node-1', 'kube-system').name, 'agent-new'));
  it('says which nodes have agents when the one asked for has none', () => {
    assert.throws(
      () => agentOnNode(pods, 'node-3', 'kube-system'),
      /^PluginError: no proxyctl agent runs on node node-3 \(pods labelled app.kubernetes.io\/name=proxyctl-agent in namespace kube-system run on node-1, node-2\)/,
    );
  });
});
