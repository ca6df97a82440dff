// Partial renders (only changed service ports' chains) and the deletion of chains the model no
// longer needs, as kube-proxy's MinimizeIPTablesRestore partial syncs do.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {buildProxyModel, changedServicePorts, servicePortIdentity, type ProxyModel} from '../../../src/core/model/index.ts';
import {
  endpointChainName,
  renderIptables,
  renderIptablesWrite,
  serviceExternalChainName,
  servicePortChainName,
} from '../../../src/core/iptables/index.ts';
import {node, service, slice} from '../model/cluster-objects.ts';

const web = {key: 'default/web:http', protocol: 'TCP'} as const;
const api = {key: 'default/api:http', protocol: 'TCP'} as const;

function model(webEndpoints: string[], options: {withApi?: boolean} = {}): ProxyModel {
  const services = [service('web', {clusterIP: '10.96.0.10'})];
  const slices = [
    slice(
      'web-1',
      'web',
      webEndpoints.map((ip) => ({ip})),
    ),
  ];
  if (options.withApi !== false) {
    services.push(service('api', {clusterIP: '10.96.0.20'}));
    slices.push(slice('api-1', 'api', [{ip: '10.244.1.9'}]));
  }
  return buildProxyModel({services, endpointSlices: slices, node: node('node-1')}, {family: 'IPv4', clusterCIDRs: ['10.244.0.0/16']});
}

function declaredNat(text: string): string[] {
  const nat = text.slice(text.indexOf('*nat'));
  return nat
    .split('\n')
    .filter((line) => line.startsWith(':'))
    .map((line) => line.slice(1).split(' ')[0]);
}

function natLines(text: string): string[] {
  return text.slice(text.indexOf('*nat')).split('\n');
}

/** Every proxy chain a full render of the model creates, per table, as the kernel would list them. */
function chainsOf(m: ProxyModel): Map<'filter' | 'nat', Set<string>> {
  const text = renderIptables(m);
  const filter = text
    .slice(0, text.indexOf('*nat'))
    .split('\n')
    .filter((line) => line.startsWith(':'))
    .map((line) => line.slice(1).split(' ')[0]);
  return new Map([
    ['filter', new Set(filter)],
    ['nat', new Set(declaredNat(text))],
  ]);
}

describe('partial render', () => {
  it('declares and writes only the changed service ports chains, and the fixed chains in full', () => {
    const before = model(['10.244.1.5', '10.244.2.5']);
    const after = model(['10.244.1.5', '10.244.2.5', '10.244.2.6']);
    const changed = changedServicePorts(before, after);
    assert.deepEqual([...changed], [servicePortIdentity(web)]);

    const text = renderIptables(after, {changedServicePorts: changed});
    const webChains = [
      servicePortChainName(web),
      ...['10.244.1.5:8080', '10.244.2.5:8080', '10.244.2.6:8080'].map((ep) => endpointChainName(web, ep)),
    ];
    assert.deepEqual(declaredNat(text), ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', ...webChains]);
    const apiChain = servicePortChainName(api);
    assert.ok(!text.includes(`-A ${apiChain} `), 'the unchanged service chain is left as it is');
    assert.ok(!text.includes(`-A ${endpointChainName(api, '10.244.1.9:8080')} `));
    // KUBE-SERVICES is rewritten whole, so it still leads to the unchanged service.
    assert.ok(
      natLines(text).includes(
        `-A KUBE-SERVICES -m comment --comment "default/api:http cluster IP" -m tcp -p tcp -d 10.96.0.20 --dport 80 -j ${apiChain}`,
      ),
    );
    assert.equal(natLines(text).filter((line) => line.startsWith(`-A ${servicePortChainName(web)} `)).length, 4);
  });

  it('writes the same lines as a full render for the changed ports', () => {
    const after = model(['10.244.1.5', '10.244.2.6']);
    const full = renderIptables(after).split('\n');
    const partial = renderIptables(after, {changedServicePorts: new Set([servicePortIdentity(web)])}).split('\n');
    const apiNames = [servicePortChainName(api), endpointChainName(api, '10.244.1.9:8080')];
    const notApi = (line: string): boolean => !apiNames.some((name) => line.startsWith(`-A ${name} `) || line.startsWith(`:${name} `));
    assert.deepEqual(partial, full.filter(notApi));
  });

  it('given the previous model, leaves the fixed chains out when the change leaves them as they are', () => {
    const before = model(['10.244.1.5', '10.244.2.5']);
    const after = model(['10.244.1.5', '10.244.2.6']);
    const text = renderIptables(after, {changedServicePorts: changedServicePorts(before, after), previous: before});
    const webChains = [servicePortChainName(web), ...['10.244.1.5:8080', '10.244.2.6:8080'].map((ep) => endpointChainName(web, ep))];
    const gone = endpointChainName(web, '10.244.2.5:8080');
    assert.deepEqual(declaredNat(text), [...webChains, gone], 'KUBE-SERVICES and the other fixed chains are neither flushed nor rewritten');
    assert.ok(natLines(text).includes(`-X ${gone}`), 'the chain the changed port no longer uses is deleted');
    assert.ok(!text.includes('-A KUBE-SERVICES ') && !text.includes('-A KUBE-POSTROUTING ') && !text.includes('-A KUBE-FORWARD '));
    assert.equal(text.slice(0, text.indexOf('*nat')), '*filter\nCOMMIT\n', 'nothing in filter');
    assert.deepEqual(
      natLines(text).filter((line) => line.startsWith('-A ')),
      natLines(renderIptables(after, {changedServicePorts: changedServicePorts(before, after)})).filter((line) =>
        webChains.some((chain) => line.startsWith(`-A ${chain} `)),
      ),
    );
  });

  it('given the previous model, still writes the fixed chains when the change alters them', () => {
    const fixedChainsWritten = (before: ProxyModel, after: ProxyModel): boolean =>
      declaredNat(renderIptables(after, {changedServicePorts: changedServicePorts(before, after), previous: before})).includes(
        'KUBE-SERVICES',
      );
    assert.ok(
      fixedChainsWritten(model(['10.244.1.5']), model([])),
      'the last endpoint gone: KUBE-SERVICES loses the jump, filter gains the REJECT',
    );
    assert.ok(fixedChainsWritten(model([]), model(['10.244.1.5'])), 'the first endpoint back');
    assert.ok(fixedChainsWritten(model(['10.244.1.5'], {withApi: false}), model(['10.244.1.5'])), 'a service added');
    assert.ok(fixedChainsWritten(model(['10.244.1.5']), model(['10.244.1.5'], {withApi: false})), 'a service removed');
  });

  it('writes no service chain at all when nothing changed, only the fixed chains', () => {
    const m = model(['10.244.1.5']);
    const text = renderIptables(m, {changedServicePorts: new Set()});
    assert.deepEqual(declaredNat(text), ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ']);
    assert.equal(natLines(text).filter((line) => line.startsWith('-A KUBE-SERVICES ')).length, 3);
  });
});

describe('stale chains', () => {
  it('flushes and deletes the chain of an endpoint that went away, keeping unchanged services chains', () => {
    const before = model(['10.244.1.5', '10.244.2.5']);
    const after = model(['10.244.1.5']);
    const gone = endpointChainName(web, '10.244.2.5:8080');
    const text = renderIptables(after, {changedServicePorts: changedServicePorts(before, after), existingChains: chainsOf(before)});
    const lines = natLines(text);
    assert.ok(declaredNat(text).includes(gone), 'declaring the chain flushes it');
    assert.deepEqual(
      lines.filter((line) => line.startsWith('-X ')),
      [`-X ${gone}`],
    );
    assert.ok(!declaredNat(text).includes(servicePortChainName(api)), 'an unchanged chain is neither flushed nor deleted');
    // The final KUBE-NODEPORTS jump still ends KUBE-SERVICES.
    const services = lines.filter((line) => line.startsWith('-A KUBE-SERVICES '));
    assert.match(services[services.length - 1], /-j KUBE-NODEPORTS$/);
  });

  it('deletes every chain of a removed service, flushing all of them before any deletion', () => {
    const before = model(['10.244.1.5']);
    const after = model(['10.244.1.5'], {withApi: false});
    const changed = changedServicePorts(before, after);
    assert.deepEqual([...changed], [servicePortIdentity(api)]);
    const text = renderIptables(after, {changedServicePorts: changed, existingChains: chainsOf(before)});
    const apiChains = [endpointChainName(api, '10.244.1.9:8080'), servicePortChainName(api)].sort();
    const lines = natLines(text);
    assert.deepEqual(
      lines.filter((line) => line.startsWith('-X ')),
      apiChains.map((chain) => `-X ${chain}`),
    );
    const lastDeclaration = Math.max(...apiChains.map((chain) => lines.indexOf(`:${chain} - [0:0]`)));
    assert.ok(lastDeclaration >= 0 && lastDeclaration < lines.indexOf(`-X ${apiChains[0]}`));
    assert.ok(!text.includes('default/api:http cluster IP'));
  });

  it('deletes leftovers of older kube-proxy versions and never touches chains that are not per-service', () => {
    const m = model(['10.244.1.5']);
    const existing = chainsOf(m);
    existing
      .get('nat')!
      .add('KUBE-XLB-OLDCHAINOLDCHAIN')
      .add('KUBE-SVC-STALESTALESTALE1')
      .add('DOCKER')
      .add('KUBE-MARK-DROP')
      .add('CNI-HOSTPORT-DNAT');
    existing.get('filter')!.add('KUBE-FIREWALL').add('DOCKER-USER').add('KUBE-PROXY-CANARY');
    const text = renderIptables(m, {existingChains: existing});
    assert.deepEqual(
      text.split('\n').filter((line) => line.startsWith('-X ')),
      ['-X KUBE-SVC-STALESTALESTALE1', '-X KUBE-XLB-OLDCHAINOLDCHAIN'],
    );
    for (const foreign of ['DOCKER', 'KUBE-MARK-DROP', 'CNI-HOSTPORT-DNAT', 'DOCKER-USER', 'KUBE-PROXY-CANARY']) {
      assert.ok(!text.includes(`:${foreign} `), `${foreign} is not flushed`);
    }
  });

  it('deletes nothing when the kernel holds exactly what the model needs', () => {
    const m = model(['10.244.1.5', '10.244.2.5']);
    assert.ok(!renderIptables(m, {existingChains: chainsOf(m)}).includes('-X '));
  });

  it('keeps an EXT chain while the service still uses it', () => {
    const nodePort = service('web', {
      type: 'NodePort',
      ports: [{name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080}],
    });
    const m = buildProxyModel(
      {services: [nodePort], endpointSlices: [slice('web-1', 'web', [{ip: '10.244.1.5'}])], node: node('node-1')},
      {family: 'IPv4'},
    );
    const existing = chainsOf(m);
    assert.ok(existing.get('nat')!.has(serviceExternalChainName(web)));
    assert.ok(!renderIptables(m, {existingChains: existing, changedServicePorts: new Set()}).includes('-X '));
  });
});

describe('the render record', () => {
  /** Renders to text and returns the text with the record the renderer kept of it. */
  function write(m: ProxyModel, options: Parameters<typeof renderIptablesWrite>[1]) {
    const rendered = renderIptablesWrite(m, options);
    const text = Buffer.concat([...rendered.chunks]).toString('utf8');
    return {text, record: rendered.record};
  }

  it('tells the chains declared and deleted, and the rules of every chain, as the text has them', () => {
    const before = model(['10.244.1.5', '10.244.2.5']);
    const after = model(['10.244.1.5', '10.244.2.6']);
    const {text, record} = write(after, {changedServicePorts: changedServicePorts(before, after), previous: before});
    assert.deepEqual(record.tables.nat.declared, declaredNat(text));
    assert.deepEqual(record.tables.nat.deleted, [endpointChainName(web, '10.244.2.5:8080')]);
    const ruleLines = natLines(text).filter((line) => line.startsWith('-A '));
    assert.deepEqual([...record.tables.nat.rules.values()].flat(), ruleLines, 'a partial render keeps every rule line');
    assert.deepEqual(record.tables.filter.declared, []);
    assert.deepEqual([...record.servicePortChains.keys()], [servicePortIdentity(web)]);
    assert.deepEqual(record.servicePortChains.get(servicePortIdentity(web)), [
      servicePortChainName(web),
      ...['10.244.1.5:8080', '10.244.2.6:8080'].map((ep) => endpointChainName(web, ep)),
    ]);
  });

  it('in a full render counts the per-service chains rules and keeps the fixed chains lines', () => {
    const m = model(['10.244.1.5', '10.244.2.5']);
    const {text, record} = write(m, {});
    assert.equal(record.tables.nat.rules.get(endpointChainName(web, '10.244.1.5:8080')), 2);
    assert.equal(
      record.tables.nat.rules.get(servicePortChainName(web)),
      natLines(text).filter((line) => line.startsWith(`-A ${servicePortChainName(web)} `)).length,
    );
    assert.deepEqual(
      record.tables.nat.rules.get('KUBE-SERVICES'),
      natLines(text).filter((line) => line.startsWith('-A KUBE-SERVICES ')),
    );
    assert.deepEqual(
      record.tables.filter.rules.get('KUBE-FORWARD'),
      text.split('\n').filter((line) => line.startsWith('-A KUBE-FORWARD ')),
    );
    assert.equal(renderIptables(m), text, 'the record changes nothing in the text');
  });

  it('inserts the jump rules it is given at the end of their table, and records them', () => {
    const m = model(['10.244.1.5']);
    const jump = {
      table: 'nat' as const,
      chain: 'PREROUTING',
      rule: ['-m', 'comment', '--comment', 'kubernetes service portals', '-j', 'KUBE-SERVICES'],
      position: 'prepend' as const,
    };
    const {text, record} = write(m, {insertJumps: [jump]});
    assert.match(text, /-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\nCOMMIT\n$/);
    assert.deepEqual(record.tables.nat.jumps, [jump]);
    assert.deepEqual(record.tables.filter.jumps, []);
  });
});
