// The methods of protocol proxyctl.v1: their params and results as TypeScript types, and the schemas
// both sides check them with (the agent checks params, the plugin checks every answer).
import type {Protocol} from '../core/model/types.ts';
import type {BehaviourDiff, ProxyMode as SwitchMode} from '../core/behaviour/index.ts';
import type {Packet, TraceResult} from '../core/trace/types.ts';
import {array, boolean, integer, ipAddress, nullable, number, object, oneOf, optional, string, timestamp, type Schema} from './schema.ts';

export type ProxyMode = 'iptables' | 'nftables' | 'ipvs';
export type SyncKind = 'full' | 'partial';

/** NoParams: the method takes nothing (params absent or {}). */
export type NoParams = Record<string, never>;

/** SyncSummary says how the last sync went. Times are ISO 8601 strings. */
export interface SyncSummary {
  at: string;
  durationMs: number;
  kind: SyncKind;
  ok: boolean;
}

export interface StatusResult {
  node: string;
  mode: ProxyMode;
  /** The agent's version (package version), not the protocol's. */
  version: string;
  /** True once the first sync has written the rules. */
  ready: boolean;
  /** null until the first sync. */
  lastSync: SyncSummary | null;
  services: number;
  endpoints: number;
  /** Service ports whose applied rules differ from the desired ones at the last check. */
  drift: DriftReport;
  /** Failed syncs since the agent started. */
  syncFailures: number;
  /** When the applied rules were last read from the kernel; null if never. */
  rulesReadAt: string | null;
  /** Present when the agent observes kube-proxy (--observe) rather than proxying. */
  observe?: ObserveStatus;
}

export interface RulesParams {
  /** Only 'text' (iptables-save / nft list syntax) in v1; absent means 'text'. */
  format?: 'text';
}

export interface RulesResult {
  mode: ProxyMode;
  text: string;
  readAt: string;
}

export interface DiffParams {
  /** "namespace/name" or "namespace/name:port" to limit the diff to one service or service port. */
  service?: string;
}

export interface DiffGroup {
  /** Service port key ("ns/name:port"), or "" for rules that belong to no service. */
  servicePort: string;
  /** Rules desired but missing from the kernel. */
  added: string[];
  /** Rules in the kernel that are not desired. */
  removed: string[];
  /** An observing agent's reading of the difference, by Service (absent from a proxying agent). */
  explanations?: DriftExplanation[];
}

/** DriftKind: how a service port differs from what kube-proxy should have programmed. */
export type DriftKind =
  | 'not-programmed'
  | 'stale-service'
  | 'stale-endpoint'
  | 'missing-endpoint'
  | 'foreign-rule'
  | 'missing-rule'
  | 'no-kube-proxy-rules';

/** DriftExplanation: one reason a service port drifted, e.g. an endpoint still programmed after it left the EndpointSlice. */
export interface DriftExplanation {
  kind: DriftKind;
  /** As a person reads it: "endpoint 10.244.1.7 still programmed, removed from the EndpointSlice 4m ago". */
  text: string;
  /** The endpoint address, for stale-endpoint and missing-endpoint. */
  endpoint?: string;
  /** When the endpoint left or joined the EndpointSlice, when the agent saw it happen. */
  since?: string;
}

/** ObserveStatus: an observing agent's part of the status answer (absent from a proxying agent). */
export interface ObserveStatus {
  /** "kube-proxy iptables", "kube-proxy nftables", "kube-proxy ipvs". */
  observing: string;
  /** detected, override (--observe-mode), none found, several found. */
  finding: string;
  /** The finding in one sentence, e.g. that no kube-proxy rules are on the node. */
  summary: string;
  /** kube-proxy's settings the desired rules are rendered with, and where each came from. */
  settings: {name: string; value: string; source: string}[];
  /** What could not be read (the ConfigMap, unknown fields), by name. */
  problems: string[];
  /** Since when the node has differed from what kube-proxy should have programmed; null when it does not. */
  driftSince: string | null;
}

export interface DiffResult {
  equal: boolean;
  groups: DiffGroup[];
  /** The diff as a person reads it (unified-diff style). */
  text: string;
  readAt: string;
}

export interface TraceParams {
  packet: Packet;
  /** "namespace/name[:port]": warn when the rules attribute the packet to another service. */
  service?: string;
}

export interface BehaviourParams {
  /** Compare the applied rules with this mode's, rendered for the node; without it, with the desired rules. */
  to?: SwitchMode;
  /** "namespace/name[:port]": only this service's classes. */
  service?: string;
}

/** BehaviourAnswer: the behaviour diff of a node's applied rules, and what the node shows that bears on it. */
export interface BehaviourAnswer {
  node: string;
  diff: BehaviourDiff;
  /** Counters, sockets and settings of the node that bear on the changes, one sentence each. */
  evidence: string[];
  readAt: string;
}

/** TraceAnswer: the tracer's result over the applied rules, when they were read, and whether they drift. */
export type TraceAnswer = TraceResult & {readAt: string; drifted: boolean};

export interface ProbeTarget {
  ip: string;
  port: number;
  protocol: Protocol;
}

export interface ProbeParams {
  /** Where the probe connections start: a network namespace on the node, else the host namespace. */
  from?: {netns?: string};
  target: ProbeTarget;
  /** Connections to open. */
  count: number;
}

export interface ProbeResult {
  /** Which endpoint answered, and how many times. */
  answers: {endpoint: string; count: number}[];
  /** Connections that failed, grouped by reason (e.g. "connection refused", "timed out"). */
  failures: {reason: string; count: number}[];
}

export interface SyncParams {
  /** Rewrite every chain rather than only changed services. */
  full?: boolean;
}

export interface RuleCounts {
  filter: number;
  nat: number;
}

/** DriftReport: the service ports whose applied rules differed from the desired ones when last checked. */
export interface DriftReport {
  services: string[];
  /** When the applied rules were read for the check; null if no check has read them. */
  checkedAt: string | null;
}

export interface SyncResult {
  durationMs: number;
  kind: SyncKind;
  rules: RuleCounts;
  /**
   * The drift check the agent made before this sync: drifted services make the sync full, which
   * rewrites (repairs) them. Absent from agents older than this field.
   */
  driftBefore?: DriftReport;
}

export interface SubscribeResult {
  /** Names of the notifications this connection will now receive. */
  events: string[];
}

/** SyncEvent: params of the `events.sync` notification, sent after every sync. */
export interface SyncEvent extends SyncSummary {
  /** Rules written (present when ok). */
  rules?: RuleCounts;
  /** Why the sync failed (present when not ok). */
  error?: string;
}

/** EventsDropped: params of `events.dropped`, the last notification of a stream the agent stopped. */
export interface EventsDropped {
  reason: string;
}

/** MethodTypes maps each method to its params and result. */
export interface MethodTypes {
  status: {params: NoParams; result: StatusResult};
  'rules.desired': {params: RulesParams; result: RulesResult};
  'rules.applied': {params: RulesParams; result: RulesResult};
  diff: {params: DiffParams; result: DiffResult};
  trace: {params: TraceParams; result: TraceAnswer};
  behaviour: {params: BehaviourParams; result: BehaviourAnswer};
  probe: {params: ProbeParams; result: ProbeResult};
  sync: {params: SyncParams; result: SyncResult};
  'events.subscribe': {params: NoParams; result: SubscribeResult};
}

export type MethodName = keyof MethodTypes;
export type ParamsOf<M extends MethodName> = MethodTypes[M]['params'];
export type ResultOf<M extends MethodName> = MethodTypes[M]['result'];

export interface NotificationTypes {
  'events.sync': SyncEvent;
  'events.dropped': EventsDropped;
}

export type NotificationName = keyof NotificationTypes;

// Shapes shared by several methods. Requests reject unknown fields; answers allow them.
const strict = {unknownFields: 'reject'} as const;
const lenient = {unknownFields: 'allow'} as const;

const port = integer({min: 1, max: 65535});
const count = integer({min: 0});
const protocol = oneOf(['TCP', 'UDP', 'SCTP']);
const proxyMode = oneOf(['iptables', 'nftables', 'ipvs']);
const syncKind = oneOf(['full', 'partial']);
const serviceFilter = string({
  maxLength: 63 + 1 + 253 + 1 + 63,
  pattern: /^[a-z0-9]([-a-z0-9]*[a-z0-9])?\/[a-z0-9]([-.a-z0-9]*[a-z0-9])?(:[a-z0-9]([-a-z0-9]*[a-z0-9])?)?$/,
  patternHint: '"namespace/name" or "namespace/name:port"',
});
const ruleLines = array(string({maxLength: 64 * 1024}), {maxItems: 1_000_000});
const ruleCounts: Schema<RuleCounts> = object({filter: count, nat: count}, lenient);

const noParams: Schema<NoParams> = object({}, strict);
const driftReport: Schema<DriftReport> = object({services: array(string({maxLength: 512})), checkedAt: nullable(timestamp())}, lenient);

const syncSummaryFields = {at: timestamp(), durationMs: number({min: 0}), kind: syncKind, ok: boolean()};

export const statusResultSchema: Schema<StatusResult> = object(
  {
    node: string({maxLength: 253}),
    mode: proxyMode,
    version: string({maxLength: 256}),
    ready: boolean(),
    lastSync: nullable(object(syncSummaryFields, lenient)),
    services: count,
    endpoints: count,
    drift: driftReport,
    syncFailures: count,
    rulesReadAt: nullable(timestamp()),
    observe: optional(
      object(
        {
          observing: string({maxLength: 64}),
          finding: string({maxLength: 64}),
          summary: string({maxLength: 4096}),
          settings: array(
            object({name: string({maxLength: 128}), value: string({maxLength: 4096}), source: string({maxLength: 512})}, lenient),
          ),
          problems: array(string({maxLength: 4096})),
          driftSince: nullable(timestamp()),
        },
        lenient,
      ),
    ),
  },
  lenient,
);

const rulesParams: Schema<RulesParams> = object({format: optional(oneOf(['text']))}, strict);
export const rulesResultSchema: Schema<RulesResult> = object(
  {mode: proxyMode, text: string({maxLength: Number.MAX_SAFE_INTEGER}), readAt: timestamp()},
  lenient,
);

const diffParams: Schema<DiffParams> = object({service: optional(serviceFilter)}, strict);
export const diffResultSchema: Schema<DiffResult> = object(
  {
    equal: boolean(),
    groups: array(
      object(
        {
          servicePort: string({maxLength: 512}),
          added: ruleLines,
          removed: ruleLines,
          explanations: optional(
            array(
              object(
                {
                  kind: oneOf([
                    'not-programmed',
                    'stale-service',
                    'stale-endpoint',
                    'missing-endpoint',
                    'foreign-rule',
                    'missing-rule',
                    'no-kube-proxy-rules',
                  ]),
                  text: string({maxLength: 64 * 1024}),
                  endpoint: optional(ipAddress()),
                  since: optional(timestamp()),
                },
                lenient,
              ),
            ),
          ),
        },
        lenient,
      ),
    ),
    text: string({maxLength: Number.MAX_SAFE_INTEGER}),
    readAt: timestamp(),
  },
  lenient,
);

export const packetSchema: Schema<Packet> = object(
  {
    srcIP: ipAddress(),
    dstIP: ipAddress(),
    dstPort: port,
    protocol,
    origin: oneOf(['arriving', 'local']),
    // IFNAMSIZ is 16 with the terminating NUL.
    inInterface: optional(string({minLength: 1, maxLength: 15, pattern: /^[^\s/:]+$/, patternHint: 'an interface name'})),
  },
  strict,
);

const traceParams: Schema<TraceParams> = object({packet: packetSchema, service: optional(serviceFilter)}, strict);

const hook = oneOf(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);
const traceHop = object(
  {
    hook,
    table: string(),
    chain: string(),
    rule: string({maxLength: 64 * 1024}),
    target: string(),
    explanation: string({maxLength: 64 * 1024}),
  },
  lenient,
);
const answeredPacket = object(
  {
    srcIP: ipAddress(),
    dstIP: ipAddress(),
    dstPort: port,
    protocol,
    origin: oneOf(['arriving', 'local']),
    inInterface: optional(string({maxLength: 15})),
  },
  lenient,
);
export const traceAnswerSchema: Schema<TraceAnswer> = object(
  {
    packet: answeredPacket,
    verdict: oneOf(['DNAT', 'REJECT', 'DROP', 'ACCEPT']),
    hops: array(traceHop),
    branches: array(
      object(
        {
          endpoint: string({maxLength: 64}),
          probability: number({min: 0, max: 1}),
          hops: array(traceHop),
          masquerade: boolean(),
          masqueradeReason: string({maxLength: 64 * 1024}),
        },
        lenient,
      ),
    ),
    servicePort: optional(string({maxLength: 512})),
    warnings: array(string({maxLength: 64 * 1024})),
    readAt: timestamp(),
    drifted: boolean(),
  },
  lenient,
);

const behaviourParams: Schema<BehaviourParams> = object(
  {to: optional(oneOf(['iptables', 'nftables', 'ipvs'])), service: optional(serviceFilter)},
  strict,
);
// The changes themselves are the core's shape, passed through; the plugin reads the fields named here.
export const behaviourAnswerSchema = object(
  {
    node: string({maxLength: 253}),
    diff: object(
      {
        before: string({maxLength: 256}),
        after: string({maxLength: 256}),
        equal: boolean(),
        groups: array(object({servicePort: string({maxLength: 512}), changes: array(object({}, lenient))}, lenient)),
        summary: object({classes: integer({min: 0}), changedClasses: integer({min: 0}), stopAnswering: integer({min: 0})}, lenient),
      },
      lenient,
    ),
    evidence: array(string({maxLength: 64 * 1024})),
    readAt: timestamp(),
  },
  lenient,
) as unknown as Schema<BehaviourAnswer>;

const probeParams: Schema<ProbeParams> = object(
  {
    from: optional(
      object(
        {netns: optional(string({minLength: 1, maxLength: 255, pattern: /^[^/\0]+$/, patternHint: 'a network namespace name (no "/")'}))},
        strict,
      ),
    ),
    target: object({ip: ipAddress(), port, protocol}, strict),
    count: integer({min: 1, max: 1000}),
  },
  strict,
);
export const probeResultSchema: Schema<ProbeResult> = object(
  {
    answers: array(object({endpoint: string({maxLength: 64}), count}, lenient)),
    failures: array(object({reason: string({maxLength: 1024}), count}, lenient)),
  },
  lenient,
);

const syncParams: Schema<SyncParams> = object({full: optional(boolean())}, strict);
export const syncResultSchema: Schema<SyncResult> = object(
  {durationMs: number({min: 0}), kind: syncKind, rules: ruleCounts, driftBefore: optional(driftReport)},
  lenient,
);

const subscribeResult: Schema<SubscribeResult> = object({events: array(string({maxLength: 64}))}, lenient);

export const syncEventSchema: Schema<SyncEvent> = object(
  {...syncSummaryFields, rules: optional(ruleCounts), error: optional(string({maxLength: 64 * 1024}))},
  lenient,
);
const eventsDropped: Schema<EventsDropped> = object({reason: string({maxLength: 1024})}, lenient);

/**
 * Access says what a method may do to the node: 'read' methods only look; 'act' methods change
 * rules or send traffic, so agents that check access ask for more (see src/agent/api/access.ts).
 */
export type Access = 'read' | 'act';

export interface MethodSpec<M extends MethodName> {
  params: Schema<ParamsOf<M>>;
  result: Schema<ResultOf<M>>;
  access: Access;
  summary: string;
}

export const methodSpecs: {[M in MethodName]: MethodSpec<M>} = {
  status: {params: noParams, result: statusResultSchema, access: 'read', summary: 'node, mode, readiness, last sync, drift'},
  'rules.desired': {params: rulesParams, result: rulesResultSchema, access: 'read', summary: 'the rules the agent means to have'},
  'rules.applied': {params: rulesParams, result: rulesResultSchema, access: 'read', summary: 'the rules read from the kernel'},
  diff: {params: diffParams, result: diffResultSchema, access: 'read', summary: 'desired against applied rules'},
  trace: {params: traceParams, result: traceAnswerSchema, access: 'read', summary: 'a packet through the applied rules'},
  behaviour: {
    params: behaviourParams,
    result: behaviourAnswerSchema,
    access: 'read',
    summary: 'the applied rules against another mode or the desired rules, by what they do to each class of packet',
  },
  probe: {params: probeParams, result: probeResultSchema, access: 'act', summary: 'real connections to a service from the node'},
  sync: {params: syncParams, result: syncResultSchema, access: 'act', summary: 'sync the rules now'},
  'events.subscribe': {params: noParams, result: subscribeResult, access: 'read', summary: 'receive events.sync after each sync'},
};

export const notificationSchemas: {[N in NotificationName]: Schema<NotificationTypes[N]>} = {
  'events.sync': syncEventSchema,
  'events.dropped': eventsDropped,
};

export function isMethodName(name: string): name is MethodName {
  return Object.hasOwn(methodSpecs, name);
}

export function isNotificationName(name: string): name is NotificationName {
  return Object.hasOwn(notificationSchemas, name);
}
