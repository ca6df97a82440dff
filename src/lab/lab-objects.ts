// The Kubernetes objects a lab registers: its Nodes, the demo Pods and the agents' Pods as a kubelet
// would report them, and the demo Services. Pure functions; the supervisor writes them.
import {arch, release} from 'node:os';
import {defaultAgentPort} from '../protocol/version.ts';
import type {KubeObject} from './apiserver/object-log.ts';
import type {NodeDescription, PodDescription} from './netns/index.ts';
import type {LabSpec} from './lab-state.ts';

/** Pods carry the network namespace they live in, so that a client can run probes from them. */
export const netnsAnnotation = 'lab.proxyctl.dev/netns';
/** The agent's WebSocket API on the host's loopback, for `--agent-url`. */
export const agentUrlAnnotation = 'lab.proxyctl.dev/agent-url';
export const agentNamespace = 'kube-system';
export const agentLabel = {'app.kubernetes.io/name': 'proxyctl-agent'} as const;
export const partOfLabel = {'app.kubernetes.io/part-of': 'proxyctl-lab'} as const;

/** Ports every demo pod listens on (src/lab/workload/demoapp.ts). */
export const demoPorts = {http: 8080, udp: 5353} as const;
/** The agent's container ports, as in manifests/daemonset.yaml; the lab maps them to per-node loopback ports. */
export const agentContainerPorts = {api: defaultAgentPort, healthz: 10256, metrics: 10249} as const;

/** How many pods (spread over the nodes, one per node in turn) get app=demoapp. */
export const demoReplicas = 3;

/** DemoServiceInfo: one demo Service, for the summary `lab up` prints. */
export interface DemoServiceInfo {
  name: string;
  type: 'ClusterIP' | 'NodePort';
  clusterIP: string;
  port: number;
  protocol: 'TCP' | 'UDP';
  nodePort?: number;
  what: string;
}

// Fixed addresses, those of examples/cluster.yaml, so that the docs' commands work in every lab.
export const demoServices: DemoServiceInfo[] = [
  {
    name: 'demoapp',
    type: 'ClusterIP',
    clusterIP: '10.96.0.10',
    port: 80,
    protocol: 'TCP',
    what: `HTTP, ${demoReplicas} replicas (app=demoapp)`,
  },
  {
    name: 'demoapp-nodeport',
    type: 'NodePort',
    clusterIP: '10.96.0.80',
    port: 80,
    protocol: 'TCP',
    nodePort: 30080,
    what: 'HTTP on every node address, port 30080',
  },
  {name: 'demoapp-udp', type: 'ClusterIP', clusterIP: '10.96.0.53', port: 53, protocol: 'UDP', what: 'UDP echo'},
  {name: 'empty', type: 'ClusterIP', clusterIP: '10.96.0.99', port: 80, protocol: 'TCP', what: 'no endpoints: connections are refused'},
];

function zoneOf(index: number): string {
  return `zone-${String.fromCharCode(97 + (index % 3))}`;
}

const kubeletVersion = 'v1.33.0-proxyctl-lab';

function nodeArchitecture(): string {
  return arch() === 'x64' ? 'amd64' : arch();
}

export function nodeObject(node: NodeDescription, index: number, now: string): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name: node.name,
      labels: {
        'kubernetes.io/hostname': node.name,
        'kubernetes.io/os': 'linux',
        'kubernetes.io/arch': nodeArchitecture(),
        'topology.kubernetes.io/zone': zoneOf(index),
        ...partOfLabel,
      },
      annotations: {[netnsAnnotation]: node.namespace},
    },
    spec: {podCIDR: node.podCIDR, podCIDRs: [node.podCIDR]},
    status: {
      addresses: [
        {type: 'InternalIP', address: node.ip},
        {type: 'Hostname', address: node.name},
      ],
      conditions: [
        {
          type: 'Ready',
          status: 'True',
          reason: 'KubeletReady',
          message: 'lab node namespace is up',
          lastHeartbeatTime: now,
          lastTransitionTime: now,
        },
      ],
      nodeInfo: {
        kubeletVersion,
        kubeProxyVersion: '',
        operatingSystem: 'linux',
        architecture: nodeArchitecture(),
        osImage: 'proxyctl lab (network namespace)',
        kernelVersion: release(),
        containerRuntimeVersion: 'netns://lab',
      },
    },
  };
}

/** demoPodRoles gives the first demoReplicas pods, taken one node after the other, app=demoapp; the rest are toolbox pods (clients). */
export function demoPodRoles(nodes: NodeDescription[]): Map<string, 'demoapp' | 'toolbox'> {
  const roles = new Map<string, 'demoapp' | 'toolbox'>();
  const deepest = Math.max(0, ...nodes.map((node) => node.pods.length));
  let servers = 0;
  for (let slot = 0; slot < deepest; slot++) {
    for (const node of nodes) {
      const pod = node.pods[slot];
      if (!pod) continue;
      roles.set(pod.name, servers < demoReplicas ? 'demoapp' : 'toolbox');
      if (servers < demoReplicas) servers++;
    }
  }
  return roles;
}

interface PodStatusOptions {
  hostIP: string;
  podIP: string;
  ready: boolean;
  now: string;
  containerName: string;
  image: string;
  /** Whether the container's process runs (default: when pid is given); a pid becomes the containerID. */
  running?: boolean;
  pid?: number;
  restartCount?: number;
}

export function podStatus(options: PodStatusOptions): KubeObject['status'] {
  const ready = options.ready ? 'True' : 'False';
  const running = options.running ?? options.pid !== undefined;
  return {
    phase: 'Running',
    hostIP: options.hostIP,
    hostIPs: [{ip: options.hostIP}],
    podIP: options.podIP,
    podIPs: [{ip: options.podIP}],
    startTime: options.now,
    conditions: [
      {type: 'PodScheduled', status: 'True', lastTransitionTime: options.now},
      {type: 'Initialized', status: 'True', lastTransitionTime: options.now},
      {type: 'ContainersReady', status: ready, lastTransitionTime: options.now},
      {type: 'Ready', status: ready, lastTransitionTime: options.now},
    ],
    containerStatuses: [
      {
        name: options.containerName,
        image: options.image,
        imageID: '',
        ready: options.ready,
        started: running,
        restartCount: options.restartCount ?? 0,
        ...(options.pid !== undefined ? {containerID: `pid://${options.pid}`} : {}),
        state: running ? {running: {startedAt: options.now}} : {waiting: {reason: 'ContainerCreating'}},
      },
    ],
  };
}

const demoImage = 'proxyctl/demoapp:lab';
const agentImage = 'proxyctl/proxyctl-agent:lab';

/**
 * demoPodObject is a demo pod, Running and Ready. The lab registers it before its server starts, so
 * that the agents' first sync already has every endpoint; `lab up` returns once the servers listen.
 */
export function demoPodObject(pod: PodDescription, hostIP: string, role: 'demoapp' | 'toolbox', now: string): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {name: pod.name, namespace: 'default', labels: {app: role, ...partOfLabel}, annotations: {[netnsAnnotation]: pod.namespace}},
    spec: {
      nodeName: pod.node,
      terminationGracePeriodSeconds: 5,
      containers: [
        {
          name: 'demoapp',
          image: demoImage,
          ports: [
            {name: 'http', containerPort: demoPorts.http, protocol: 'TCP'},
            {name: 'udp-echo', containerPort: demoPorts.udp, protocol: 'UDP'},
          ],
        },
      ],
    },
    status: podStatus({hostIP, podIP: pod.ip, ready: true, running: true, now, containerName: 'demoapp', image: demoImage}),
  };
}

export function agentPodName(node: string): string {
  return `proxyctl-agent-${node}`;
}

/**
 * The Pod of a lab node's own agent. Given the Node's uid, the Node owns it, as a node owns the
 * mirror pod of its static pod: no controller adopts it (a DaemonSet selecting
 * app.kubernetes.io/name=proxyctl-agent would), and it goes with its node.
 */
export function agentPodObject(node: NodeDescription, agentUrl: string, now: string, nodeUid?: string): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: agentPodName(node.name),
      namespace: agentNamespace,
      labels: {...agentLabel, ...partOfLabel},
      annotations: {[netnsAnnotation]: node.namespace, [agentUrlAnnotation]: agentUrl},
      ...(nodeUid && {ownerReferences: [{apiVersion: 'v1', kind: 'Node', name: node.name, uid: nodeUid, controller: true}]}),
    },
    spec: {
      nodeName: node.name,
      hostNetwork: true,
      priorityClassName: 'system-node-critical',
      containers: [
        {
          name: 'proxyctl-agent',
          image: agentImage,
          ports: Object.entries(agentContainerPorts).map(([name, containerPort]) => ({name, containerPort, protocol: 'TCP'})),
        },
      ],
    },
    status: podStatus({
      hostIP: node.ip,
      podIP: node.ip,
      ready: false,
      running: false,
      now,
      containerName: 'proxyctl-agent',
      image: agentImage,
    }),
  };
}

export function agentPodStatus(
  node: NodeDescription,
  state: {ready: boolean; pid?: number; restarts: number},
  now: string,
): KubeObject['status'] {
  return podStatus({
    hostIP: node.ip,
    podIP: node.ip,
    ready: state.ready,
    running: state.pid !== undefined,
    now,
    containerName: 'proxyctl-agent',
    image: agentImage,
    pid: state.pid,
    restartCount: state.restarts,
  });
}

export function demoServiceObjects(): KubeObject[] {
  const selector = {app: 'demoapp'};
  const service = (info: DemoServiceInfo, spec: Record<string, unknown>): KubeObject => ({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name: info.name, namespace: 'default', labels: {...partOfLabel}},
    spec: {type: info.type, clusterIP: info.clusterIP, clusterIPs: [info.clusterIP], ...spec},
  });
  const [clusterIP, nodePort, udp, empty] = demoServices;
  return [
    service(clusterIP, {selector, ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http}]}),
    service(nodePort, {
      selector,
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http, nodePort: nodePort.nodePort}],
    }),
    service(udp, {selector, ports: [{name: 'echo', protocol: 'UDP', port: 53, targetPort: demoPorts.udp}]}),
    service(empty, {
      selector: {app: 'nothing-has-this-label'},
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: demoPorts.http}],
    }),
  ];
}

/**
 * The KubeProxyConfiguration of a lab's stand-ins for kube-proxy (`lab up --observe`): the mode
 * and the cluster CIDR, everything else kube-proxy's default.
 */
export function standInConfiguration(mode: LabSpec['proxyMode'], clusterCIDR: string): string {
  return [
    'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
    'kind: KubeProxyConfiguration',
    `mode: ${mode}`,
    `clusterCIDR: ${clusterCIDR}`,
    '',
  ].join('\n');
}

/** The image of kube-proxy's DaemonSet; a lab kubelet runs the stand-in for it (kubelet/agent-container.ts). */
export const kubeProxyImage = 'registry.k8s.io/kube-proxy:v1.34.0';
export const kubeProxyLabel = {'k8s-app': 'kube-proxy'} as const;

/**
 * kube-proxy as kubeadm installs it: the ServiceAccount kube-proxy, bound to the ClusterRole
 * system:node-proxier (which kube-apiserver keeps; the lab's makes it here), and the DaemonSet
 * kube-system/kube-proxy, which reads its KubeProxyConfiguration from the ConfigMap kube-proxy,
 * mounted at /var/lib/kube-proxy.
 */
export function kubeProxyObjects(): KubeObject[] {
  const labels = {...kubeProxyLabel};
  const serviceAccount = {apiVersion: 'v1', kind: 'ServiceAccount', metadata: {name: 'kube-proxy', namespace: 'kube-system'}};
  const nodeProxier = {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRole',
    metadata: {name: 'system:node-proxier', labels: {'kubernetes.io/bootstrapping': 'rbac-defaults'}},
    rules: [
      {apiGroups: [''], resources: ['endpoints', 'services'], verbs: ['list', 'watch']},
      {apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch']},
      {apiGroups: ['', 'events.k8s.io'], resources: ['events'], verbs: ['create', 'patch', 'update']},
      {apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['list', 'watch']},
      {apiGroups: ['networking.k8s.io'], resources: ['servicecidrs'], verbs: ['list', 'watch']},
    ],
  };
  const binding = {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRoleBinding',
    metadata: {name: 'kubeadm:node-proxier'},
    roleRef: {apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'system:node-proxier'},
    subjects: [{kind: 'ServiceAccount', name: 'kube-proxy', namespace: 'kube-system'}],
  };
  const daemonSet = {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: {name: 'kube-proxy', namespace: 'kube-system', labels},
    spec: {
      selector: {matchLabels: labels},
      updateStrategy: {type: 'RollingUpdate'},
      template: {
        metadata: {labels},
        spec: {
          serviceAccountName: 'kube-proxy',
          priorityClassName: 'system-node-critical',
          hostNetwork: true,
          nodeSelector: {'kubernetes.io/os': 'linux'},
          tolerations: [{operator: 'Exists'}],
          containers: [
            {
              name: 'kube-proxy',
              image: kubeProxyImage,
              command: ['/usr/local/bin/kube-proxy', '--config=/var/lib/kube-proxy/config.conf', '--hostname-override=$(NODE_NAME)'],
              env: [{name: 'NODE_NAME', valueFrom: {fieldRef: {apiVersion: 'v1', fieldPath: 'spec.nodeName'}}}],
              securityContext: {privileged: true},
              volumeMounts: [
                {name: 'kube-proxy', mountPath: '/var/lib/kube-proxy'},
                {name: 'xtables-lock', mountPath: '/run/xtables.lock'},
                {name: 'lib-modules', mountPath: '/lib/modules', readOnly: true},
              ],
            },
          ],
          volumes: [
            {name: 'kube-proxy', configMap: {name: 'kube-proxy'}},
            {name: 'xtables-lock', hostPath: {path: '/run/xtables.lock', type: 'FileOrCreate'}},
            {name: 'lib-modules', hostPath: {path: '/lib/modules'}},
          ],
        },
      },
    },
  };
  return [serviceAccount, nodeProxier, binding, daemonSet] as KubeObject[];
}

/**
 * The ConfigMap kubeadm gives kube-proxy, kube-system/kube-proxy with its KubeProxyConfiguration
 * under config.conf: the stand-ins start from the same text (--config), and the observers read
 * the ConfigMap as they read kube-proxy's on a kubeadm cluster.
 */
export function kubeProxyConfigMapObject(configuration: string): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: {name: 'kube-proxy', namespace: 'kube-system', labels: {app: 'kube-proxy', ...partOfLabel}},
    data: {'config.conf': configuration},
  };
}
