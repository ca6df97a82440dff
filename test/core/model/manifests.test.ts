// parseManifests: YAML streams, JSON objects and Lists in; objects by kind and located problems out.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {parseManifests} from '../../../src/core/model/manifests.ts';

const names = (objects: unknown[]) => objects.map((object) => (object as {metadata?: {name?: string}}).metadata?.name);

test('multi-document YAML is sorted by kind; other kinds kept in objects only', () => {
  const text = `---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
# a comment-only document is empty
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: []
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
---
apiVersion: v1
kind: Node
metadata: {name: node-1}
`;
  const parsed = parseManifests(text, 'cluster.yaml');
  assert.deepEqual(parsed.problems, []);
  assert.deepEqual(names(parsed.services), ['web']);
  assert.deepEqual(names(parsed.endpointSlices), ['web-1']);
  assert.deepEqual(names(parsed.nodes), ['node-1']);
  assert.deepEqual(names(parsed.objects), ['web', 'web-1', 'settings', 'node-1']);
  assert.equal((parsed.services[0] as {spec: {clusterIP: string}}).spec.clusterIP, '10.96.0.10');
});

test('a single JSON object', () => {
  const parsed = parseManifests(JSON.stringify({apiVersion: 'v1', kind: 'Service', metadata: {name: 'web'}}), 'web.json');
  assert.deepEqual(parsed.problems, []);
  assert.deepEqual(names(parsed.services), ['web']);
});

test('a v1 List, as kubectl get -o json prints it', () => {
  const list = {
    apiVersion: 'v1',
    kind: 'List',
    items: [
      {apiVersion: 'v1', kind: 'Service', metadata: {name: 'a'}},
      {apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: {name: 'a-1'}},
      {apiVersion: 'v1', kind: 'Node', metadata: {name: 'node-1'}},
    ],
    metadata: {resourceVersion: ''},
  };
  const parsed = parseManifests(JSON.stringify(list, null, 2), 'all.json');
  assert.deepEqual(parsed.problems, []);
  assert.deepEqual(names(parsed.services), ['a']);
  assert.deepEqual(names(parsed.endpointSlices), ['a-1']);
  assert.deepEqual(names(parsed.nodes), ['node-1']);
});

test('a typed list (ServiceList) whose items carry no kind', () => {
  const list = {apiVersion: 'v1', kind: 'ServiceList', items: [{metadata: {name: 'a'}}, {metadata: {name: 'b'}}]};
  const parsed = parseManifests(JSON.stringify(list), 'services.json');
  assert.deepEqual(parsed.problems, []);
  assert.deepEqual(names(parsed.services), ['a', 'b']);
  assert.equal((parsed.services[0] as {kind: string}).kind, 'Service');
  assert.equal((parsed.services[0] as {apiVersion: string}).apiVersion, 'v1');
});

test('EndpointSliceList items get the list apiVersion', () => {
  const list = {apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSliceList', items: [{metadata: {name: 'a-1'}}]};
  assert.deepEqual(names(parseManifests(JSON.stringify(list), 'slices.json').endpointSlices), ['a-1']);
});

test('a List in YAML, and a top-level array', () => {
  const yaml = `apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Service, metadata: {name: a}}
`;
  assert.deepEqual(names(parseManifests(yaml, 'list.yaml').services), ['a']);
  assert.deepEqual(names(parseManifests('[{"apiVersion":"v1","kind":"Service","metadata":{"name":"b"}}]', 'array.json').services), ['b']);
});

test('flow-style YAML starting with a brace is read as YAML', () => {
  const parsed = parseManifests('{apiVersion: v1, kind: Service, metadata: {name: flow}}', 'flow.yaml');
  assert.deepEqual(parsed.problems, []);
  assert.deepEqual(names(parsed.services), ['flow']);
});

interface BadRow {
  name: string;
  text: string;
  document: number;
  path?: string;
  message: RegExp;
  /** Service names that must still be read. */
  kept?: string[];
}

const service = (name: string) => `apiVersion: v1\nkind: Service\nmetadata: {name: ${name}}\n`;

const badRows: BadRow[] = [
  {
    name: 'a YAML syntax error in one document',
    text: `${service('first')}---\nkind: Service\nmetadata: {name: [unclosed\n---\n${service('third')}`,
    document: 2,
    message: /^bad\.yaml document 2: invalid YAML: /,
    kept: ['first', 'third'],
  },
  {
    name: 'a document without kind',
    text: `${service('first')}---\napiVersion: v1\nmetadata: {name: x}\n`,
    document: 2,
    message: /^bad\.yaml document 2: object has no kind$/,
    kept: ['first'],
  },
  {
    name: 'a document without apiVersion',
    text: 'kind: Service\nmetadata: {name: x}\n',
    document: 1,
    message: /^bad\.yaml document 1: Service has no apiVersion$/,
  },
  {
    name: 'a scalar document',
    text: `${service('first')}---\njust words\n`,
    document: 2,
    message: /^bad\.yaml document 2: the string "just words" is not a Kubernetes object$/,
    kept: ['first'],
  },
  {
    name: 'an EndpointSlice of an unsupported apiVersion',
    text: 'apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: old}\n',
    document: 1,
    message:
      /^bad\.yaml document 1: EndpointSlice of apiVersion discovery\.k8s\.io\/v1beta1 is not supported \(want discovery\.k8s\.io\/v1\)$/,
  },
  {
    name: 'a List without items',
    text: 'apiVersion: v1\nkind: List\n',
    document: 1,
    message: /^bad\.yaml document 1: List has no items list$/,
  },
  {
    name: 'a bad List item',
    text: `apiVersion: v1\nkind: List\nitems:\n  - {apiVersion: v1, kind: Service, metadata: {name: a}}\n  - 42\n`,
    document: 1,
    path: 'items[1]',
    message: /^bad\.yaml document 1 items\[1\]: the number 42 is not a Kubernetes object$/,
    kept: ['a'],
  },
  {name: 'invalid JSON', text: '{"apiVersion": "v1", "kind": "Service",,}', document: 1, message: /^bad\.yaml document 1: invalid JSON: /},
  {
    name: 'an alias bomb',
    text: [
      'a: &a [x, x, x, x, x, x, x, x, x, x]',
      ...Array.from(
        {length: 8},
        (_, i) =>
          `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [*${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}, *${String.fromCharCode(97 + i)}]`,
      ),
    ].join('\n'),
    document: 1,
    message: /^bad\.yaml document 1: unreadable YAML: /,
  },
];

for (const row of badRows) {
  test(`bad manifest: ${row.name}`, () => {
    const parsed = parseManifests(row.text, 'bad.yaml');
    assert.equal(parsed.problems.length, 1, parsed.problems.map((p) => p.message).join(' | '));
    const [problem] = parsed.problems;
    assert.equal(problem.source, 'bad.yaml');
    assert.equal(problem.document, row.document);
    assert.equal(problem.path, row.path);
    assert.match(problem.message, row.message);
    assert.deepEqual(names(parsed.services), row.kept ?? []);
  });
}

test('empty text and non-text give no objects and never throw', () => {
  assert.deepEqual(parseManifests('', 'empty.yaml'), {objects: [], services: [], endpointSlices: [], nodes: [], problems: []});
  assert.equal(parseManifests(undefined as unknown as string, 'x').problems.length, 1);
});
