// kube-proxy's published nftables rules (pkg/proxy/nftables/proxier_test.go) as fixtures: the
// objects of a test as YAML, what kube-proxy's table holds for them as nft script text, and the
// settings of kube-proxy's NewFakeProxier, so that a model built here is the one kube-proxy saw.
import {readFileSync} from 'node:fs';
import {join} from 'node:path';
import {buildProxyModel, parseManifests, type ProxyModel} from '../../../src/core/model/index.ts';
import type {NftablesRenderOptions} from '../../../src/core/nftables/render.ts';

export const fixtureDir = join(import.meta.dirname, 'kube-proxy-fixtures');

/** NewFakeProxier's node: name, primary IP and every local address of its interfaces (IPv4). */
export const fakeProxierNode = {
  name: 'test-node',
  ip: '192.168.0.2',
  localAddresses: ['127.0.0.1', '192.168.0.2', '192.168.1.2', '192.168.99.11'],
};

/** NewFakeProxier's render settings: service CIDR 172.30.0.0/16 and the node's addresses. */
export const fakeProxierRenderOptions: NftablesRenderOptions = {
  serviceCIDRs: ['172.30.0.0/16'],
  nodeAddresses: fakeProxierNode.localAddresses,
};

export function fixtureText(name: string): string {
  return readFileSync(join(fixtureDir, name), 'utf8');
}

/** fixtureObjects: the Services and EndpointSlices of a fixture's YAML, optionally of one namespace. */
export function fixtureObjects(name: string, namespace?: string): {services: unknown[]; endpointSlices: unknown[]} {
  const parsed = parseManifests(fixtureText(name), name);
  if (parsed.problems.length > 0) throw new Error(parsed.problems.map((problem) => problem.message).join('\n'));
  const inNamespace = (object: unknown) =>
    namespace === undefined || (object as {metadata?: {namespace?: string}}).metadata?.namespace === namespace;
  return {services: parsed.services.filter(inNamespace), endpointSlices: parsed.endpointSlices.filter(inNamespace)};
}

/**
 * fixtureModel: the model of a fixture's objects with NewFakeProxier's settings (detect-local by
 * the pod CIDR 10.0.0.0/8, nodePortAddresses 192.168.0.2/32 and 2001:db8::1/128, mark bit 14),
 * in kube-proxy's nftables layout.
 */
export function fixtureModel(objects: {services: unknown[]; endpointSlices: unknown[]}): ProxyModel {
  const model = buildProxyModel(objects, {
    family: 'IPv4',
    nodeName: fakeProxierNode.name,
    nodeIPs: [fakeProxierNode.ip],
    clusterCIDRs: ['10.0.0.0/8'],
    config: {nodePortAddresses: ['192.168.0.2/32', '2001:db8::1/128'], masqueradeBit: 14, nftablesLayout: 'kube-proxy'},
  });
  if (model.problems.length > 0) throw new Error(model.problems.map((problem) => problem.message).join('\n'));
  return model;
}

/** kubeProxyTable: base.nft followed by a fixture's per-service part. */
export function kubeProxyTable(name: string): string {
  return `${fixtureText('base.nft')}\n${fixtureText(name)}`;
}

/**
 * sectionOf: the lines of a fixture between "# NAME" and the next "# " header, as kube-proxy's
 * overall test groups each service's rules.
 */
export function sectionOf(name: string, header: string): string {
  const lines = fixtureText(name).split('\n');
  const start = lines.indexOf(`# ${header}`);
  if (start < 0) throw new Error(`${name}: no section "# ${header}"`);
  const end = lines.findIndex((line, index) => index > start && line.startsWith('# '));
  return lines.slice(start + 1, end < 0 ? undefined : end).join('\n');
}

/**
 * tableLines: the `add` commands of a script, one element per line (kube-proxy's test dump writes
 * one element a line, render batches them), without comments, flushes and deletions.
 */
export function tableLines(script: string): string[] {
  return script
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line.startsWith('add '))
    .flatMap((line) => {
      const batch = /^(add element \S+ \S+ \S+) \{ (.*) \}$/.exec(line);
      return batch ? batch[2].split(', ').map((element) => `${batch[1]} { ${element} }`) : [line];
    })
    .sort();
}

/**
 * transactionOrder: a dump of kube-proxy's table as one loadable `nft -f` transaction: objects
 * first, then rules (which jump to chains declared further down in the dump), then elements.
 */
export function transactionOrder(script: string): string {
  const lines = script.split('\n').filter((line) => line.trim() !== '' && !line.startsWith('#'));
  const declared = lines.filter((line) => /^add (table|chain|set|map) /.test(line));
  const rules = lines.filter((line) => line.startsWith('add rule '));
  const elements = lines.filter((line) => line.startsWith('add element '));
  return [...declared, ...rules, ...elements].join('\n') + '\n';
}
