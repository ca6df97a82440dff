// A running lab as its user sees it: nodes with their agents, pods, external clients and services,
// read live from the lab's API server, plus the commands to try. `lab up` prints it once ready,
// `lab status` on demand.
import {servicePortChainName} from '../core/iptables/chains.ts';
import {servicePortChains, tableName as nftablesTableName} from '../core/nftables/index.ts';
import {existsSync} from 'node:fs';
import {readFile} from 'node:fs/promises';
import {delimiter, join} from 'node:path';
import {parse as parseYaml} from 'yaml';
import type {KubeObject} from './apiserver/object-log.ts';
import {agentNamespace, demoServices} from './lab-objects.ts';
import {labContextName, type LabState} from './lab-state.ts';
import {siblingProgram} from './workload/launch.ts';
import {errorText} from '../core/error-text.ts';

export interface LabStatus {
  name: string;
  phase: LabState['phase'];
  /** The mode the lab was asked for ('none' without agents). */
  proxyMode: string;
  /**
   * The mode the agents report running (their /proxyMode), when it differs from proxyMode: ipvs
   * mode falls back to iptables on a kernel without IP_VS, as kube-proxy does.
   */
  runningMode?: string;
  /** Each node's agent is an observer beside a stand-in for kube-proxy (lab up --observe). */
  observe?: boolean;
  supervisorPid: number;
  startedAt: string;
  /** Seconds from start to ready. */
  buildSeconds?: number;
  apiServer?: string;
  kubeconfig: string;
  /** The kubeconfig's context, named after the lab, for `kubectl --context` once merged with others. */
  context: string;
  /** Why the live part is missing, when the API server did not answer. */
  apiServerError?: string;
  nodes: Array<{
    name: string;
    ip: string;
    podCIDR: string;
    netns: string;
    ready?: boolean;
    agent?: {pod: string; ready?: boolean; pid?: number; restarts: number; healthz: string; metrics: string; api: string; log: string};
  }>;
  pods: Array<{name: string; node: string; ip: string; app: string; ready?: boolean; netns: string}>;
  externalClients: Array<{name: string; ip: string; netns: string; routes: string[]; gateway: string}>;
  services: Array<{namespace: string; name: string; type: string; clusterIP: string; ports: string; endpoints: number}>;
}

async function adminToken(kubeconfig: string): Promise<string | undefined> {
  try {
    const config = parseYaml(await readFile(kubeconfig, 'utf8')) as {users?: Array<{user?: {token?: string}}>};
    return config.users?.[0]?.user?.token;
  } catch {
    return undefined;
  }
}

async function listObjects(base: string, path: string, token: string | undefined): Promise<KubeObject[]> {
  const response = await fetch(`${base}${path}`, {
    headers: token ? {authorization: `Bearer ${token}`} : {},
    signal: AbortSignal.timeout(5000),
  });
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
  return ((await response.json()) as {items: KubeObject[]}).items;
}

function conditionTrue(object: KubeObject | undefined, type: string): boolean | undefined {
  if (!object) return undefined;
  const conditions = (object.status?.conditions ?? []) as Array<{type: string; status: string}>;
  return conditions.find((condition) => condition.type === type)?.status === 'True';
}

/** agentProxyMode asks an agent's metrics server which mode it runs, as kube-proxy's /proxyMode answers. */
async function agentProxyMode(metricsPort: number): Promise<string | undefined> {
  try {
    const response = await fetch(`http://127.0.0.1:${metricsPort}/proxyMode`, {signal: AbortSignal.timeout(2000)});
    return response.ok ? (await response.text()).trim() : undefined;
  } catch {
    return undefined;
  }
}

/** readLabStatus joins state.json with what the lab's API server says now. */
export async function readLabStatus(state: LabState): Promise<LabStatus> {
  const topology = state.topology;
  let nodes: KubeObject[] = [];
  let pods: KubeObject[] = [];
  let services: KubeObject[] = [];
  let slices: KubeObject[] = [];
  let apiServerError: string | undefined;
  if (state.apiServer) {
    const token = await adminToken(state.kubeconfig);
    try {
      [nodes, pods, services, slices] = await Promise.all([
        listObjects(state.apiServer.url, '/api/v1/nodes', token),
        listObjects(state.apiServer.url, '/api/v1/pods', token),
        listObjects(state.apiServer.url, '/api/v1/services', token),
        listObjects(state.apiServer.url, '/apis/discovery.k8s.io/v1/endpointslices', token),
      ]);
    } catch (error) {
      apiServerError = `the API server at ${state.apiServer.url} did not answer: ${errorText(error)}`;
    }
  } else apiServerError = 'the API server is not started yet';

  const podObject = (namespace: string, name: string) =>
    pods.find((pod) => pod.metadata.namespace === namespace && pod.metadata.name === name);
  const readyEndpoints = (service: KubeObject) =>
    slices
      .filter(
        (slice) =>
          slice.metadata.namespace === service.metadata.namespace &&
          slice.metadata.labels?.['kubernetes.io/service-name'] === service.metadata.name,
      )
      .flatMap((slice) => (slice.endpoints ?? []) as Array<{conditions?: {ready?: boolean}}>)
      .filter((endpoint) => endpoint.conditions?.ready !== false).length;
  const ready = state.readyAt ? (Date.parse(state.readyAt) - Date.parse(state.startedAt)) / 1000 : undefined;
  const runningModes = new Set(
    (await Promise.all(state.agents.map((agent) => agentProxyMode(agent.metricsPort)))).filter((mode) => mode !== undefined),
  );
  const runningMode = runningModes.size === 1 ? [...runningModes][0] : undefined;

  return {
    name: state.spec.name,
    phase: state.phase,
    proxyMode: state.spec.agents ? state.spec.proxyMode : 'none',
    ...(state.spec.agents && runningMode && runningMode !== state.spec.proxyMode ? {runningMode} : {}),
    ...(state.spec.observe && {observe: true}),
    supervisorPid: state.supervisorPid,
    startedAt: state.startedAt,
    ...(ready !== undefined ? {buildSeconds: ready} : {}),
    ...(state.apiServer ? {apiServer: state.apiServer.url} : {}),
    kubeconfig: state.kubeconfig,
    context: labContextName(state.spec.name),
    ...(apiServerError ? {apiServerError} : {}),
    nodes: (topology?.nodes ?? []).map((node) => {
      const agent = state.agents.find((candidate) => candidate.node === node.name);
      const object = nodes.find((candidate) => candidate.metadata.name === node.name);
      return {
        name: node.name,
        ip: node.ip,
        podCIDR: node.podCIDR,
        netns: node.namespace,
        ready: conditionTrue(object, 'Ready'),
        ...(agent
          ? {
              agent: {
                pod: `${agentNamespace}/${agent.pod}`,
                ready: conditionTrue(podObject(agentNamespace, agent.pod), 'Ready'),
                pid: agent.pid,
                restarts: agent.restarts,
                healthz: `http://127.0.0.1:${agent.healthzPort}/healthz`,
                metrics: `http://127.0.0.1:${agent.metricsPort}/metrics`,
                api: `ws://127.0.0.1:${agent.apiPort}`,
                log: agent.log,
              },
            }
          : {}),
      };
    }),
    pods: (topology?.nodes ?? []).flatMap((node) =>
      node.pods.map((pod) => {
        const object = podObject('default', pod.name);
        return {
          name: pod.name,
          node: node.name,
          ip: pod.ip,
          app: String(object?.metadata.labels?.app ?? (object ? '' : '(deleted)')),
          ready: conditionTrue(object, 'Ready'),
          netns: pod.namespace,
        };
      }),
    ),
    externalClients: (topology?.externalClients ?? []).map((client) => ({
      name: client.name,
      ip: client.ip,
      netns: client.namespace,
      routes: client.routes,
      gateway: client.gateway,
    })),
    services: services.map((service) => ({
      namespace: service.metadata.namespace ?? '',
      name: service.metadata.name,
      type: String(service.spec?.type ?? ''),
      clusterIP: String(service.spec?.clusterIP ?? ''),
      ports: ((service.spec?.ports ?? []) as Array<{port: number; protocol?: string; nodePort?: number}>)
        .map((port) => `${port.port}${port.nodePort ? `:${port.nodePort}` : ''}/${port.protocol ?? 'TCP'}`)
        .join(','),
      endpoints: readyEndpoints(service),
    })),
  };
}

/** columns aligns rows under a header, two spaces apart, as kubectl prints tables. */
function columns(rows: string[][]): string {
  const widths = rows[0].map((_, index) => Math.max(...rows.map((row) => (row[index] ?? '').length)));
  return rows.map((row) => row.map((cell, index) => (index === row.length - 1 ? cell : cell.padEnd(widths[index]))).join('  ')).join('\n');
}

/** count: "1 node", "2 nodes". */
export function count(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

const yesNo = (value: boolean | undefined) => (value === undefined ? '?' : value ? 'True' : 'False');

function onPath(program: string): boolean {
  return (process.env.PATH ?? '').split(delimiter).some((dir) => dir && existsSync(join(dir, program)));
}

/** usageExamples are the commands to try in this lab, each with what it shows when that is not plain. */
export function usageExamples(status: LabStatus): string[] {
  const nameFlag = status.name === 'proxyctl' ? '' : ` --name ${status.name}`;
  const [clusterIP, nodePort, udp, empty] = demoServices;
  const toolbox = status.pods.filter((pod) => pod.app === 'toolbox').at(-1) ?? status.pods.at(-1);
  const lastNode = status.nodes.at(-1);
  const client = status.externalClients[0];
  const demoClient = `${process.execPath} ${siblingProgram('workload/demoapp-client', import.meta.url)}`;
  const get = (host: string, port: number) =>
    onPath('curl') ? `curl -s http://${host}:${port}/` : `${demoClient} --host ${host} --port ${port}`;
  const exec = (target: string, command: string) => `kubectl proxyctl lab exec${nameFlag} ${target} -- ${command}`;
  const examples: Array<[string, string?]> = [
    [`export KUBECONFIG=${status.kubeconfig}`],
    ['kubectl get nodes,pods,services,endpointslices -o wide'],
    [
      `KUBECONFIG=$HOME/.kube/config:${status.kubeconfig} kubectl --context ${status.context} get nodes`,
      "beside your other clusters (the names are this lab's own)",
    ],
  ];
  if (toolbox) {
    examples.push(
      [exec(toolbox.name, get(clusterIP.clusterIP, clusterIP.port)), `${clusterIP.name}: one of its pods answers`],
      [exec(toolbox.name, get(empty.clusterIP, empty.port)), `${empty.name}: refused, no endpoints`],
    );
  }
  if (client && lastNode)
    examples.push([exec(client.name, get(lastNode.ip, nodePort.nodePort!)), `${nodePort.name} from outside the cluster`]);
  // What an operator would run on the node to see the rules of the lab's mode.
  const rulesCommand: Record<string, string> = {
    iptables: 'iptables-save -t nat',
    nftables: 'nft list table ip kube-proxy',
    ipvs: 'ipvsadm -Ln',
  };
  const showRules = rulesCommand[status.runningMode ?? status.proxyMode];
  if (lastNode && showRules) examples.push([exec(lastNode.name, showRules), `the rules on ${lastNode.name}`]);
  if (lastNode && status.observe) examples.push(...observeExamples(status, lastNode.name, exec));
  if (toolbox) {
    examples.push([
      `kubectl proxyctl trace ${clusterIP.name} --from ${toolbox.name} --probe 5`,
      'the path through the rules, then 5 real requests',
    ]);
    if (client && lastNode)
      examples.push([
        `kubectl proxyctl trace ${nodePort.name} --via node-port --from ${client.name} --node ${lastNode.name} --probe 5`,
        `the NodePort on ${lastNode.name} as ${client.name} reaches it`,
      ]);
    examples.push([
      exec(toolbox.name, `${demoClient} --protocol udp --host ${udp.clusterIP} --port ${udp.port}`),
      `${udp.name}: the UDP echo`,
    ]);
  }
  examples.push(
    ['kubectl create deployment web --image=nginx --replicas=3 --port=8080', 'every image runs the demo server, on its ports'],
    ['kubectl expose deployment web --port=80 --target-port=8080'],
    ['kubectl rollout restart deployment/web && kubectl get events -w', 'a rolling update, as the rules follow it'],
  );
  examples.push([`kubectl proxyctl lab down${nameFlag}`]);
  // Comments line up after the commands that fit on a line; longer commands carry theirs above.
  const width = Math.max(...examples.filter(([command, comment]) => comment && command.length <= 100).map(([command]) => command.length));
  return examples.flatMap(([command, comment]) => {
    if (!comment) return [command];
    return command.length <= width ? [`${command.padEnd(width)}   # ${comment}`] : [`# ${comment}`, command];
  });
}

/**
 * observeExamples: with lab up --observe, tamper with the stand-in's rules as someone on the node
 * might (flush the demo service's chain, in iptables or nftables mode) and let the observer name the service.
 */
function observeExamples(status: LabStatus, node: string, exec: (target: string, command: string) => string): Array<[string, string?]> {
  const [clusterIP] = demoServices;
  const examples: Array<[string, string?]> = [];
  const tamper = `tamper with ${clusterIP.name}'s rules on ${node} (its stand-in for kube-proxy repairs them within 30 s)`;
  const mode = status.runningMode ?? status.proxyMode;
  if (mode === 'iptables') {
    const chain = servicePortChainName({key: `default/${clusterIP.name}:http`, protocol: clusterIP.protocol});
    examples.push([exec(node, `iptables -t nat -F ${chain}`), tamper]);
  } else if (mode === 'nftables') {
    const chain = servicePortChains({
      namespace: 'default',
      serviceName: clusterIP.name,
      portName: 'http',
      protocol: clusterIP.protocol,
    }).cluster;
    examples.push([exec(node, `nft flush chain ip ${nftablesTableName} ${chain}`), tamper]);
  }
  examples.push([
    `kubectl proxyctl diff ${node}`,
    'the observer names each service port that differs from what kube-proxy should have, exit 1',
  ]);
  examples.push(['kubectl proxyctl status', 'MODE observe: kube-proxy ..., DRIFT and how long']);
  examples.push(['kubectl -n kube-system get daemonsets,pods -o wide', 'kube-proxy, and the observers of manifests/observe/']);
  // The switch users are asked to plan: checked first, then made as on a kubeadm cluster.
  const target = mode === 'nftables' ? 'iptables' : 'nftables';
  examples.push([`kubectl proxyctl migrate-check --to ${target}`, `what switching kube-proxy to ${target} would change, per service`]);
  examples.push(['kubectl -n kube-system edit configmap kube-proxy', `to switch: mode: ${target} in config.conf, then`]);
  examples.push(['kubectl -n kube-system rollout restart daemonset/kube-proxy', 'kube-proxy starts in that mode; the observers follow it']);
  return examples;
}

/** formatLabStatus is the text `lab status` and `lab up` print. */
export function formatLabStatus(status: LabStatus): string {
  const out: string[] = [];
  const built = status.buildSeconds !== undefined ? `, built in ${status.buildSeconds.toFixed(1)} s` : '';
  const agents =
    status.proxyMode === 'none'
      ? 'no agents'
      : status.observe
        ? `observing agents beside stand-ins for kube-proxy in ${status.runningMode ?? status.proxyMode} mode`
        : status.runningMode
          ? `agents in ${status.runningMode} mode (asked for ${status.proxyMode}; see the agents' logs for why)`
          : `agents in ${status.proxyMode} mode`;
  out.push(
    `Lab ${status.name}: ${status.phase}, ${count(status.nodes.length, 'node')}, ${count(status.pods.length, 'pod')}, ${agents} ` +
      `(started ${status.startedAt}${built}, supervisor pid ${status.supervisorPid})`,
  );
  out.push(`API server  ${status.apiServer ?? '-'}`, `kubeconfig  ${status.kubeconfig} (context ${status.context})`);
  if (status.apiServerError) out.push(`warning: ${status.apiServerError}`);
  out.push('');
  out.push(
    columns([
      ['NODE', 'IP', 'POD CIDR', 'READY', 'AGENT', 'AGENT PORTS (127.0.0.1)'],
      ...status.nodes.map((node) => [
        node.name,
        node.ip,
        node.podCIDR,
        yesNo(node.ready),
        node.agent
          ? `${node.agent.ready ? 'synced' : node.agent.pid ? 'starting' : 'not running'}${node.agent.restarts ? ` (${node.agent.restarts} restarts)` : ''}`
          : '-',
        node.agent
          ? `healthz ${new URL(node.agent.healthz).port}, metrics ${new URL(node.agent.metrics).port}, api ${new URL(node.agent.api).port}`
          : '',
      ]),
    ]),
  );
  if (status.pods.length > 0) {
    out.push('');
    out.push(
      columns([
        ['POD', 'NODE', 'IP', 'APP', 'READY'],
        ...status.pods.map((pod) => [pod.name, pod.node, pod.ip, pod.app, yesNo(pod.ready)]),
      ]),
    );
  }
  out.push('');
  out.push(
    columns([
      ['EXTERNAL CLIENT', 'IP', 'ROUTES'],
      ...status.externalClients.map((client) => [client.name, client.ip, `${client.routes.join(', ')} via ${client.gateway}`]),
    ]),
  );
  if (status.services.length > 0) {
    out.push('');
    out.push(
      columns([
        ['SERVICE', 'TYPE', 'CLUSTER-IP', 'PORT(S)', 'READY ENDPOINTS'],
        ...status.services.map((service) => [
          `${service.namespace}/${service.name}`,
          service.type,
          service.clusterIP,
          service.ports,
          String(service.endpoints),
        ]),
      ]),
    );
  }
  out.push('', 'Try:', ...usageExamples(status).map((line) => `  ${line}`));
  return `${out.join('\n')}\n`;
}
