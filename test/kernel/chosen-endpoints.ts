// Services whose chosen endpoints are fewer than all their endpoints, and the real-packet cases
// that go with them. The proxy picks among the chosen ones only (externalTrafficPolicy Local picks
// the entry node's, readiness drops the not-ready, the terminating fallback picks the serving
// ones), so the random choice must range over exactly those: a choice over all endpoints sends
// some connections to a slot that points nowhere, or at another service's endpoint.
import assert from 'node:assert/strict';
import {it} from 'node:test';
import type {EndpointSliceInput} from '../../src/core/model/index.ts';
import {demoPorts} from './namespace-lab.ts';
import {
  assertTraceAgrees,
  describeTrace,
  type EndpointConditions,
  type NodeTracer,
  replies,
  type Sender,
  service,
  type ServiceScenario,
  slice,
  type Target,
} from './service-scenario.ts';

export const chosenEndpointIPs = {
  localSplit: '10.96.0.18',
  notReady: '10.96.0.19',
  terminating: '10.96.0.20',
  readyOverTerminating: '10.96.0.21',
};
export const localSplitNodePort = 30083;

type Condition = 'ready' | 'not-ready' | 'serving-terminating' | 'terminating';

const conditions: Record<Condition, EndpointConditions> = {
  ready: {ready: true, serving: true, terminating: false},
  'not-ready': {ready: false, serving: false, terminating: false},
  'serving-terminating': {ready: false, serving: true, terminating: true},
  terminating: {ready: false, serving: false, terminating: true},
};

/** A slice of pods with their conditions: [pod name, condition]. */
function sliceWithConditions(scenario: ServiceScenario, serviceName: string, pods: Array<[string, Condition]>): EndpointSliceInput {
  return slice(
    serviceName,
    pods.map(([name, condition]) => ({...scenario.at(name), conditions: conditions[condition]})),
  );
}

/** addChosenEndpointServices adds the services below to a started scenario, before its rules are rendered. */
export function addChosenEndpointServices(scenario: ServiceScenario): void {
  const http = {name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http};
  scenario.services.push(
    service('local-split', {
      type: 'NodePort',
      clusterIP: chosenEndpointIPs.localSplit,
      ports: [{...http, nodePort: localSplitNodePort}],
      externalTrafficPolicy: 'Local',
    }),
    service('not-ready', {clusterIP: chosenEndpointIPs.notReady}),
    service('terminating', {clusterIP: chosenEndpointIPs.terminating}),
    service('ready-over-terminating', {clusterIP: chosenEndpointIPs.readyOverTerminating}),
  );
  scenario.slices.push(
    sliceWithConditions(scenario, 'local-split', [
      ['pod-0-1', 'ready'],
      ['pod-0-2', 'ready'],
      ['pod-1-0', 'ready'],
    ]),
    sliceWithConditions(scenario, 'not-ready', [
      ['pod-0-1', 'ready'],
      ['pod-0-2', 'not-ready'],
      ['pod-1-0', 'ready'],
    ]),
    sliceWithConditions(scenario, 'terminating', [
      ['pod-0-1', 'serving-terminating'],
      ['pod-0-2', 'terminating'],
      ['pod-1-0', 'serving-terminating'],
    ]),
    sliceWithConditions(scenario, 'ready-over-terminating', [
      ['pod-0-1', 'ready'],
      ['pod-0-2', 'serving-terminating'],
      ['pod-1-0', 'serving-terminating'],
    ]),
  );
}

interface ChosenEndpointCase {
  name: string;
  /** A pod name, or an external client's index. */
  sender: string | number;
  /** The node the packet enters (whose rules choose). */
  entry: number;
  /** The service address: a ClusterIP, or 'node' for the entry node's IP (a NodePort). */
  destIP: string;
  destPort: number;
  /** Every pod the connections must reach, and no other. */
  output: string[];
  masq: boolean;
}

const chosenEndpointCases: ChosenEndpointCase[] = [
  {
    name: 'externalTrafficPolicy Local, 2 of 3 endpoints on the entry node',
    sender: 0,
    entry: 0,
    destIP: 'node',
    destPort: localSplitNodePort,
    output: ['pod-0-1', 'pod-0-2'],
    masq: false,
  },
  {
    name: 'externalTrafficPolicy Local, 1 of 3 endpoints on the entry node',
    sender: 0,
    entry: 1,
    destIP: 'node',
    destPort: localSplitNodePort,
    output: ['pod-1-0'],
    masq: false,
  },
  {
    name: 'the same service by ClusterIP picks all 3',
    sender: 'pod-0-0',
    entry: 0,
    destIP: chosenEndpointIPs.localSplit,
    destPort: 80,
    output: ['pod-0-1', 'pod-0-2', 'pod-1-0'],
    masq: false,
  },
  {
    name: 'one of 3 endpoints not ready',
    sender: 'pod-0-0',
    entry: 0,
    destIP: chosenEndpointIPs.notReady,
    destPort: 80,
    output: ['pod-0-1', 'pod-1-0'],
    masq: false,
  },
  {
    name: 'none ready: the 2 serving terminating endpoints of 3',
    sender: 'pod-1-2',
    entry: 1,
    destIP: chosenEndpointIPs.terminating,
    destPort: 80,
    output: ['pod-0-1', 'pod-1-0'],
    masq: false,
  },
  {
    name: 'one ready endpoint wins over 2 serving terminating ones',
    sender: 'pod-0-0',
    entry: 0,
    destIP: chosenEndpointIPs.readyOverTerminating,
    destPort: 80,
    output: ['pod-0-1'],
    masq: false,
  },
];

/**
 * registerChosenEndpointCases: for each row, enough connections that every chosen endpoint is
 * reached (each misses all of them with odds below 1 in 10^5), every connection is answered by
 * a chosen endpoint, and the tracer predicts exactly the chosen endpoints, evenly.
 */
export function registerChosenEndpointCases(scenario: ServiceScenario, trace: NodeTracer): void {
  for (const row of chosenEndpointCases) {
    it(`chosen endpoints fewer than all: ${row.name}`, async (t) => {
      if (!scenario.skipUnlessLab(t)) return;
      const sender: Sender = typeof row.sender === 'number' ? scenario.client(row.sender) : scenario.pod(row.sender);
      const entry = scenario.node(row.entry);
      const target: Target = {protocol: 'tcp', ip: row.destIP === 'node' ? entry.ip : row.destIP, port: row.destPort};
      const results = replies(await scenario.send(sender, target, 40), row.name);
      assert.deepEqual([...new Set(results.map((result) => result.reply.pod))].sort(), row.output);
      for (const result of results)
        assert.equal(result.reply.clientIP !== sender.ip, row.masq, `${result.reply.pod} saw ${result.reply.clientIP}`);

      const predicted = trace(entry, sender, target);
      const endpoints = row.output.map((name) => `${scenario.at(name).ip}:${demoPorts.http}`);
      assert.deepEqual(predicted.branches.map((branch) => branch.endpoint).sort(), endpoints.sort(), describeTrace(predicted));
      for (const branch of predicted.branches)
        assert.ok(Math.abs(branch.probability - 1 / endpoints.length) < 0.01, describeTrace(predicted));
      assertTraceAgrees(predicted, results, sender, target);
    });
  }
}
