// Packet flows: Services and EndpointSlices -> buildProxyModel -> renderIptables -> parseIptablesSave
// -> traceIptables, one row per feature, so that the renderer and the tracer are checked against
// each other and against what kube-proxy promises.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {renderIptables} from '../../../src/core/iptables/render.ts';
import {parseIptablesSave} from '../../../src/core/iptables/parse.ts';
import {traceIptables} from '../../../src/core/iptables/trace.ts';
import {buildProxyModel, type ModelOptions} from '../../../src/core/model/build.ts';
import type {EndpointSliceInput, ServiceInput} from '../../../src/core/model/objects.ts';
import type {Packet, TraceResult, TraceVerdict} from '../../../src/core/trace/types.ts';
import {type EndpointSpec, node, service, slice} from '../model/cluster-objects.ts';

// This node: node-1, 10.240.0.11, pods 10.244.1.0/24 behind cni0 (10.244.1.1); node-2 holds 10.244.2.0/24.
const nodeIP = '10.240.0.11';
const localAddresses = [nodeIP, '10.244.1.1'];
const fromPod = {srcIP: '10.244.1.20', inInterface: 'cni0'};
const fromOutside = {srcIP: '10.240.0.100', inInterface: 'eth0'};
const local = (ip: string) => ({ip, node: 'node-1'});
const remote = (ip: string) => ({ip, node: 'node-2'});
const http = {name: 'http', protocol: 'TCP', port: 80, targetPort: 8080};
const lbStatus = (ip: string): Partial<ServiceInput> => ({status: {loadBalancer: {ingress: [{ip}]}}});

interface Flow {
  name: string;
  services: ServiceInput[];
  slices: EndpointSliceInput[];
  options?: Partial<ModelOptions>;
  packet: Partial<Packet> & Pick<Packet, 'dstIP' | 'dstPort'>;
  verdict: TraceVerdict;
  /** endpoint -> probability */
  endpoints?: Record<string, number>;
  masquerade?: boolean;
  servicePort?: string;
  /** A warning that must be there. */
  warning?: RegExp;
  /** A hop that must be on the path: "table chain -> target". */
  hop?: string;
  /** Fields of the objects the model reports as problems (default none). */
  expectedProblems?: string[];
}

const web = (spec: Parameters<typeof service>[1] = {}, extra: Partial<ServiceInput> = {}) =>
  service('web', {clusterIP: '10.96.0.10', ports: [http], ...spec}, extra);
const webSlice = (...endpoints: Array<{ip: string; node: string}>) => slice('web-1', 'web', endpoints);
const threeEndpoints = webSlice(local('10.244.1.5'), local('10.244.1.6'), remote('10.244.2.5'));
const servingTerminating = {ready: false, serving: true, terminating: true};
/** podToWeb: a pod's connection to web's ClusterIP, with these endpoints, reaching `endpoints` unmasqueraded. */
const podToWeb = (name: string, webEndpoints: EndpointSpec[], endpoints: Record<string, number>): Flow => ({
  name,
  services: [web()],
  slices: [slice('web-1', 'web', webEndpoints)],
  packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
  verdict: 'DNAT',
  endpoints,
  masquerade: false,
});
const third = {'10.244.1.5:8080': 1 / 3, '10.244.1.6:8080': 1 / 3, '10.244.2.5:8080': 1 / 3};

const flows: Flow[] = [
  {
    name: 'ClusterIP from a pod: three endpoints, a third each, source kept',
    services: [web()],
    slices: [threeEndpoints],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: third,
    masquerade: false,
    servicePort: 'default/web:http',
  },
  {
    name: 'ClusterIP from outside the cluster CIDR: masqueraded',
    services: [web()],
    slices: [threeEndpoints],
    packet: {...fromOutside, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: third,
    masquerade: true,
  },
  {
    name: 'ClusterIP, other port: not a service port',
    services: [web()],
    slices: [threeEndpoints],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 81},
    verdict: 'ACCEPT',
  },
  {
    name: 'ClusterIP with two ports: each goes to its own target port',
    services: [web({ports: [http, {name: 'https', protocol: 'TCP', port: 443, targetPort: 8443}]})],
    slices: [
      slice('web-1', 'web', [local('10.244.1.5')], {
        ports: [
          {name: 'http', protocol: 'TCP', port: 8080},
          {name: 'https', protocol: 'TCP', port: 8443},
        ],
      }),
    ],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 443},
    verdict: 'DNAT',
    endpoints: {'10.244.1.5:8443': 1},
    servicePort: 'default/web:https',
  },
  {
    name: 'masqueradeAll: even a pod is masqueraded',
    services: [web()],
    slices: [threeEndpoints],
    options: {config: {masqueradeAll: true}},
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: third,
    masquerade: true,
  },
  {
    name: 'detect-local NodeCIDR: a pod of another node is masqueraded',
    services: [web()],
    slices: [threeEndpoints],
    options: {clusterCIDRs: undefined, detectLocalMode: 'NodeCIDR'},
    packet: {srcIP: '10.244.2.30', inInterface: 'flannel.1', dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: third,
    masquerade: true,
  },
  {
    name: 'no endpoints, TCP: refused',
    services: [web()],
    slices: [],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'REJECT',
    servicePort: 'default/web:http',
    warning: /default\/web:http has no endpoints/,
  },
  {
    name: 'no endpoints, UDP: refused',
    services: [service('dns', {clusterIP: '10.96.0.53', ports: [{name: 'dns', protocol: 'UDP', port: 53, targetPort: 53}]})],
    slices: [],
    packet: {...fromPod, dstIP: '10.96.0.53', dstPort: 53, protocol: 'UDP'},
    verdict: 'REJECT',
    servicePort: 'default/dns:dns',
  },
  {
    name: 'UDP service: endpoints of the UDP port',
    services: [service('dns', {clusterIP: '10.96.0.53', ports: [{name: 'dns', protocol: 'UDP', port: 53, targetPort: 5353}]})],
    slices: [slice('dns-1', 'dns', [local('10.244.1.7'), remote('10.244.2.7')], {ports: [{name: 'dns', protocol: 'UDP', port: 5353}]})],
    packet: {...fromPod, dstIP: '10.96.0.53', dstPort: 53, protocol: 'UDP'},
    verdict: 'DNAT',
    endpoints: {'10.244.1.7:5353': 0.5, '10.244.2.7:5353': 0.5},
    masquerade: false,
  },
  {
    name: 'NodePort, externalTrafficPolicy Cluster: masqueraded',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30080}]})],
    slices: [webSlice(remote('10.244.2.8'))],
    packet: {...fromOutside, dstIP: nodeIP, dstPort: 30080},
    verdict: 'DNAT',
    endpoints: {'10.244.2.8:8080': 1},
    masquerade: true,
  },
  {
    name: 'NodePort, externalTrafficPolicy Local: local endpoint only, source kept',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30081}], externalTrafficPolicy: 'Local'})],
    slices: [webSlice(local('10.244.1.9'), remote('10.244.2.9'))],
    packet: {...fromOutside, dstIP: nodeIP, dstPort: 30081},
    verdict: 'DNAT',
    endpoints: {'10.244.1.9:8080': 1},
    masquerade: false,
  },
  // Endpoint choices among fewer endpoints than the service has: the chosen ones share evenly.
  {
    name: 'NodePort, externalTrafficPolicy Local: 2 of 3 endpoints local, a half each',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30081}], externalTrafficPolicy: 'Local'})],
    slices: [threeEndpoints],
    packet: {...fromOutside, dstIP: nodeIP, dstPort: 30081},
    verdict: 'DNAT',
    endpoints: {'10.244.1.5:8080': 1 / 2, '10.244.1.6:8080': 1 / 2},
    masquerade: false,
  },
  podToWeb(
    'ClusterIP, one of 3 endpoints not ready: a half each for the others',
    [local('10.244.1.5'), {...local('10.244.1.6'), ready: false, serving: false}, remote('10.244.2.5')],
    {'10.244.1.5:8080': 1 / 2, '10.244.2.5:8080': 1 / 2},
  ),
  podToWeb(
    'ClusterIP, none ready: the 2 serving terminating endpoints of 3',
    [
      {...local('10.244.1.5'), ...servingTerminating},
      {...local('10.244.1.6'), ready: false, serving: false, terminating: true},
      {...remote('10.244.2.5'), ...servingTerminating},
    ],
    {'10.244.1.5:8080': 1 / 2, '10.244.2.5:8080': 1 / 2},
  ),
  podToWeb(
    'ClusterIP, one ready endpoint wins over 2 serving terminating ones',
    [local('10.244.1.5'), {...local('10.244.1.6'), ...servingTerminating}, {...remote('10.244.2.5'), ...servingTerminating}],
    {'10.244.1.5:8080': 1},
  ),
  {
    name: 'NodePort, externalTrafficPolicy Local, no local endpoint: dropped',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30082}], externalTrafficPolicy: 'Local'})],
    slices: [webSlice(remote('10.244.2.10'))],
    packet: {...fromOutside, dstIP: nodeIP, dstPort: 30082},
    verdict: 'DROP',
    warning: /default\/web:http has a Local traffic policy and no endpoint on this node/,
  },
  {
    name: 'NodePort, no endpoints at all: refused',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30083}]})],
    slices: [],
    packet: {...fromOutside, dstIP: nodeIP, dstPort: 30083},
    verdict: 'REJECT',
  },
  {
    name: 'NodePort through localhost, sent by the node: masqueraded',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30080}]})],
    slices: [webSlice(remote('10.244.2.8'))],
    packet: {srcIP: '127.0.0.1', dstIP: '127.0.0.1', dstPort: 30080, origin: 'local'},
    verdict: 'DNAT',
    endpoints: {'10.244.2.8:8080': 1},
    masquerade: true,
  },
  {
    name: 'nodePortAddresses: a node address outside them is no node port',
    services: [web({type: 'NodePort', ports: [{...http, nodePort: 30080}]})],
    slices: [webSlice(remote('10.244.2.8'))],
    options: {config: {nodePortAddresses: ['10.240.0.0/24']}},
    packet: {...fromPod, dstIP: '10.244.1.1', dstPort: 30080},
    verdict: 'ACCEPT',
  },
  {
    name: 'externalIP from outside: masqueraded',
    services: [web({externalIPs: ['192.0.2.20']})],
    slices: [webSlice(remote('10.244.2.11'))],
    packet: {...fromOutside, dstIP: '192.0.2.20', dstPort: 80},
    verdict: 'DNAT',
    endpoints: {'10.244.2.11:8080': 1},
    masquerade: true,
    servicePort: 'default/web:http',
  },
  {
    name: 'externalIP with externalTrafficPolicy Local: local endpoint, source kept',
    services: [web({externalIPs: ['192.0.2.20'], externalTrafficPolicy: 'Local'})],
    slices: [webSlice(local('10.244.1.11'), remote('10.244.2.11'))],
    packet: {...fromOutside, dstIP: '192.0.2.20', dstPort: 80},
    verdict: 'DNAT',
    endpoints: {'10.244.1.11:8080': 1},
    masquerade: false,
  },
  {
    name: 'load-balancer IP, client inside loadBalancerSourceRanges',
    services: [
      web(
        {type: 'LoadBalancer', ports: [{...http, nodePort: 30084}], loadBalancerSourceRanges: ['10.240.0.100/32']},
        lbStatus('203.0.113.30'),
      ),
    ],
    slices: [webSlice(local('10.244.1.12'), remote('10.244.2.12'))],
    packet: {...fromOutside, dstIP: '203.0.113.30', dstPort: 80},
    verdict: 'DNAT',
    endpoints: {'10.244.1.12:8080': 0.5, '10.244.2.12:8080': 0.5},
    masquerade: true,
  },
  {
    name: 'load-balancer IP, client outside loadBalancerSourceRanges: dropped',
    services: [
      web(
        {type: 'LoadBalancer', ports: [{...http, nodePort: 30084}], loadBalancerSourceRanges: ['10.240.0.100/32']},
        lbStatus('203.0.113.30'),
      ),
    ],
    slices: [webSlice(local('10.244.1.12'), remote('10.244.2.12'))],
    packet: {srcIP: '10.240.0.101', inInterface: 'eth0', dstIP: '203.0.113.30', dstPort: 80},
    verdict: 'DROP',
  },
  {
    name: 'load-balancer IP without source ranges: everyone',
    services: [web({type: 'LoadBalancer', ports: [{...http, nodePort: 30084}]}, lbStatus('203.0.113.30'))],
    slices: [webSlice(remote('10.244.2.12'))],
    packet: {srcIP: '10.240.0.101', inInterface: 'eth0', dstIP: '203.0.113.30', dstPort: 80},
    verdict: 'DNAT',
    endpoints: {'10.244.2.12:8080': 1},
    masquerade: true,
  },
  {
    name: 'hairpin: a pod to itself through its service is masqueraded',
    services: [web()],
    slices: [webSlice(local('10.244.1.13'))],
    packet: {srcIP: '10.244.1.13', inInterface: 'cni0', dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: {'10.244.1.13:8080': 1},
    masquerade: true,
  },
  {
    name: 'session affinity: spread for a first connection, with a note that later ones stick',
    services: [web({sessionAffinity: 'ClientIP'})],
    slices: [threeEndpoints],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: third,
    masquerade: false,
    warning: /session affinity \(ClientIP\)/,
  },
  {
    name: "internalTrafficPolicy Local: a pod reaches this node's endpoints only",
    services: [web({internalTrafficPolicy: 'Local'})],
    slices: [threeEndpoints],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DNAT',
    endpoints: {'10.244.1.5:8080': 0.5, '10.244.1.6:8080': 0.5},
    masquerade: false,
  },
  {
    name: 'internalTrafficPolicy Local without a local endpoint: dropped',
    services: [web({internalTrafficPolicy: 'Local'})],
    slices: [webSlice(remote('10.244.2.5'))],
    packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80},
    verdict: 'DROP',
  },
  {
    name: 'sent by the node itself: through OUTPUT, masqueraded',
    services: [web()],
    slices: [threeEndpoints],
    packet: {srcIP: nodeIP, dstIP: '10.96.0.10', dstPort: 80, origin: 'local'},
    verdict: 'DNAT',
    endpoints: third,
    masquerade: true,
  },
  {
    name: 'health check node port of a Local load balancer: the probe is let in',
    services: [
      web(
        {type: 'LoadBalancer', ports: [{...http, nodePort: 30084}], externalTrafficPolicy: 'Local', healthCheckNodePort: 32000},
        lbStatus('203.0.113.30'),
      ),
    ],
    slices: [webSlice(local('10.244.1.12'))],
    packet: {...fromOutside, dstIP: nodeIP, dstPort: 32000},
    verdict: 'ACCEPT',
    hop: 'filter KUBE-NODEPORTS -> ACCEPT',
  },
  {
    name: 'an address of no service: left alone',
    services: [web()],
    slices: [threeEndpoints],
    packet: {...fromPod, dstIP: '93.184.216.34', dstPort: 443},
    verdict: 'ACCEPT',
  },
  ...badSourceRangeFlows(),
];

/**
 * One loadBalancerSourceRanges entry that is no CIDR: the load-balancer IP fails closed, even for
 * a client inside the readable range; the cluster IP, NodePort and external IP the ranges do not
 * govern keep working.
 */
function badSourceRangeFlows(): Flow[] {
  const services = [
    web(
      {
        type: 'LoadBalancer',
        ports: [{...http, nodePort: 30084}],
        externalIPs: ['198.51.100.7'],
        loadBalancerSourceRanges: ['10.240.0.100/32', '10.0.0.0/33'],
      },
      lbStatus('203.0.113.30'),
    ),
  ];
  const slices = [webSlice(remote('10.244.2.12'))];
  const reached = {verdict: 'DNAT' as const, endpoints: {'10.244.2.12:8080': 1}};
  const name = (what: string) => `loadBalancerSourceRanges with an entry that is no CIDR: ${what}`;
  const flows: Flow[] = [
    {
      name: name('the load-balancer IP drops every client'),
      services,
      slices,
      packet: {...fromOutside, dstIP: '203.0.113.30', dstPort: 80},
      verdict: 'DROP',
      hop: 'filter KUBE-PROXY-FIREWALL -> DROP',
    },
    {name: name('the cluster IP works'), services, slices, packet: {...fromPod, dstIP: '10.96.0.10', dstPort: 80}, ...reached},
    {name: name('the NodePort works'), services, slices, packet: {...fromOutside, dstIP: nodeIP, dstPort: 30084}, ...reached},
    {name: name('the external IP works'), services, slices, packet: {...fromOutside, dstIP: '198.51.100.7', dstPort: 80}, ...reached},
  ];
  return flows.map((flow) => ({...flow, expectedProblems: ['spec.loadBalancerSourceRanges[1]']}));
}

function run(flow: Flow): TraceResult {
  const model = buildProxyModel(
    {services: flow.services, endpointSlices: flow.slices, node: node('node-1')},
    {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16'], ...flow.options},
  );
  assert.deepEqual(
    model.problems.map((problem) => problem.field),
    flow.expectedProblems ?? [],
    'model problems',
  );
  const ruleset = parseIptablesSave(renderIptables(model, {includeJumps: true}));
  return traceIptables(ruleset, {srcIP: fromPod.srcIP, protocol: 'TCP', origin: 'arriving', ...flow.packet}, {localAddresses});
}

for (const flow of flows) {
  test(flow.name, () => {
    const result = run(flow);
    const describe = `${result.verdict} [${result.branches.map((branch) => `${branch.endpoint} ${branch.probability.toFixed(3)} masq=${branch.masquerade}`).join(', ')}]\n${[...result.hops, ...result.branches.flatMap((branch) => branch.hops)].map((hop) => `${hop.hook} ${hop.table} ${hop.chain} -> ${hop.target}`).join('\n')}\n${result.warnings.join('\n')}`;
    assert.equal(result.verdict, flow.verdict, describe);
    if (flow.endpoints) {
      assert.deepEqual(result.branches.map((branch) => branch.endpoint).sort(), Object.keys(flow.endpoints).sort(), describe);
      for (const branch of result.branches) assert.ok(Math.abs(branch.probability - flow.endpoints[branch.endpoint]) < 1e-6, describe);
    } else {
      assert.deepEqual(result.branches, [], describe);
    }
    if (flow.masquerade !== undefined)
      for (const branch of result.branches)
        assert.equal(branch.masquerade, flow.masquerade, `${branch.endpoint}: ${branch.masqueradeReason}`);
    if (flow.servicePort) assert.equal(result.servicePort, flow.servicePort);
    if (flow.warning)
      assert.ok(
        result.warnings.some((warning) => flow.warning!.test(warning)),
        result.warnings.join('\n'),
      );
    if (flow.hop)
      assert.ok(
        [...result.hops, ...result.branches.flatMap((branch) => branch.hops)].some(
          (hop) => `${hop.table} ${hop.chain} -> ${hop.target}` === flow.hop,
        ),
        describe,
      );
    // Rules written by the renderer are all ones the tracer understands.
    assert.deepEqual(
      result.warnings.filter((warning) => /treated as not matching|not modelled/.test(warning)),
      [],
    );
    for (const hop of [...result.hops, ...result.branches.flatMap((branch) => branch.hops)])
      assert.match(hop.explanation, /^[A-Za-z0-9].*\.$/);
  });
}
