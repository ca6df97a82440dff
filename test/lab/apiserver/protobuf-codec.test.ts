// Kubernetes protobuf bodies read into the JSON a client would have sent: written here field by field as
// Go's generated code writes them (non-pointer fields always, empty ones included).
import {describe, it} from 'node:test';
import assert from 'node:assert/strict';
import {decodeProtobufObject} from '../../../src/lab/apiserver/protobuf-codec.ts';
import {ApiError} from '../../../src/lab/apiserver/api-error.ts';

function varint(n: number): Buffer {
  const out: number[] = [];
  let v = BigInt(n) & 0xffffffffffffffffn;
  while (v > 0x7fn) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return Buffer.from(out);
}
const bytes = (field: number, body: Buffer) => Buffer.concat([varint((field << 3) | 2), varint(body.length), body]);
const str = (field: number, text: string) => bytes(field, Buffer.from(text));
const int = (field: number, n: number) => Buffer.concat([varint(field << 3), varint(n)]);
const msg = (field: number, ...parts: Buffer[]) => bytes(field, Buffer.concat(parts));
const mapEntry = (field: number, key: string, value: string) => msg(field, str(1, key), str(2, value));

function envelope(apiVersion: string, kind: string, raw: Buffer): Buffer {
  return Buffer.concat([Buffer.from('k8s\0', 'latin1'), msg(1, str(1, apiVersion), str(2, kind)), bytes(2, raw)]);
}

describe('Kubernetes protobuf request bodies', () => {
  it('reads a Service as kubectl create service sends it: empty non-pointer fields dropped, IntOrString as a number', () => {
    const meta = Buffer.concat([str(1, 'web'), str(2, ''), msg(8), mapEntry(11, 'app', 'web')]);
    const port = Buffer.concat([str(1, '80-8080'), str(2, 'TCP'), int(3, 80), msg(4, int(1, 0), int(2, 8080), str(3, '')), int(5, 0)]);
    const spec = Buffer.concat([msg(1, port), mapEntry(2, 'app', 'web'), str(3, ''), str(4, 'ClusterIP'), str(7, ''), int(13, 0)]);
    const raw = Buffer.concat([msg(1, meta), msg(2, spec), msg(3, msg(1))]);
    assert.deepEqual(decodeProtobufObject(envelope('v1', 'Service', raw)), {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: {name: 'web', labels: {app: 'web'}},
      spec: {ports: [{name: '80-8080', protocol: 'TCP', port: 80, targetPort: 8080}], selector: {app: 'web'}, type: 'ClusterIP'},
      status: {loadBalancer: {}},
    });
  });

  it('keeps the zero of a pointer field (replicas: 0), reads an IntOrString string and a pod template', () => {
    const container = Buffer.concat([str(1, 'web'), str(2, 'nginx'), msg(6, str(1, 'http'), int(3, 8080), str(4, 'TCP'))]);
    const template = Buffer.concat([msg(1, mapEntry(11, 'app', 'web')), msg(2, msg(2, container))]);
    const strategy = msg(4, str(1, 'RollingUpdate'), msg(2, msg(1, int(1, 1), str(3, '25%'))));
    const spec = Buffer.concat([int(1, 0), msg(2, mapEntry(1, 'app', 'web')), msg(3, template), strategy]);
    const decoded = decodeProtobufObject(envelope('apps/v1', 'Deployment', Buffer.concat([msg(1, str(1, 'web')), msg(2, spec)]))) as any;
    assert.equal(decoded.spec.replicas, 0);
    assert.deepEqual(decoded.spec.selector, {matchLabels: {app: 'web'}});
    assert.deepEqual(decoded.spec.template.spec.containers, [
      {name: 'web', image: 'nginx', ports: [{name: 'http', containerPort: 8080, protocol: 'TCP'}]},
    ]);
    assert.deepEqual(decoded.spec.strategy, {type: 'RollingUpdate', rollingUpdate: {maxUnavailable: '25%'}});
  });

  it('reads times as RFC 3339 and SelfSubjectAccessReviews as kubectl auth can-i sends them', () => {
    const meta = Buffer.concat([str(1, 'x'), msg(8, int(1, 1_700_000_000))]);
    const ns = decodeProtobufObject(envelope('v1', 'Namespace', msg(1, meta))) as any;
    assert.equal(ns.metadata.creationTimestamp, '2023-11-14T22:13:20Z');
    const attributes = Buffer.concat([str(1, 'default'), str(2, 'create'), str(3, ''), str(4, ''), str(5, 'pods')]);
    const review = decodeProtobufObject(envelope('authorization.k8s.io/v1', 'SelfSubjectAccessReview', msg(2, msg(1, attributes)))) as any;
    assert.deepEqual(review.spec, {resourceAttributes: {namespace: 'default', verb: 'create', resource: 'pods'}});
  });

  it('answers 415 for what is not Kubernetes protobuf or names an unknown kind, and 400 for a damaged message', () => {
    const status = (body: Buffer) => {
      try {
        decodeProtobufObject(body);
      } catch (err) {
        return (err as ApiError).code;
      }
      return 0;
    };
    assert.equal(status(Buffer.from('{"kind":"Service"}')), 415);
    assert.equal(status(envelope('example.com/v1', 'Widget', Buffer.alloc(0))), 415);
    assert.equal(status(envelope('v1', 'Service', Buffer.from([0x0a, 0x50, 0x01]))), 400);
  });
});
