// IptablesRuleSource: what the iptables proxier needs from rule rendering (core/iptables), as an
// interface so that the proxier can be tested with hand-written rules and so that the renderer's
// internals stay in core.
import type {IptablesTable} from '../../core/iptables/chains.ts';
import {type RestoreInput, restoreInputText} from '../host/host.ts';
import {ownedChainPrefixes, type SpellRules} from './owned-rules.ts';
import type {IPFamily, ProxyModel, ServicePort} from '../../core/model/index.ts';
import {errorText} from '../../core/error-text.ts';

/** A rule in a built-in chain that sends packets into the proxy's chains (PREROUTING -> KUBE-SERVICES). */
export interface JumpRule {
  table: IptablesTable;
  /** The built-in chain holding the rule, e.g. "PREROUTING". */
  chain: string;
  /** The rule's arguments after the chain name, e.g. ["-m","comment","--comment","kubernetes service portals","-j","KUBE-SERVICES"]. */
  rule: string[];
  position: 'prepend' | 'append';
}

export interface RenderOptions {
  /**
   * Identities (servicePortIdentity) of the service ports whose chains must be rewritten; the
   * others' chains are left as they are. Undefined: a full sync, every chain written.
   */
  changedServicePorts?: Set<string>;
  /**
   * The proxy's chains that exist in the kernel now, per table, so that stale ones can be deleted.
   * Finding those means naming every chain the model uses (a hash per endpoint): without it,
   * nothing is deleted, and the caller deletes what it knows to be stale (see serviceChains).
   */
  existingChains?: Map<IptablesTable, Set<string>>;
  /** In a partial render, the model of the last write: fixed chains the change leaves as they are are not rewritten. */
  previous?: ProxyModel;
  /** Lines to add to a table's part: `start` right after "*table", `end` right before COMMIT. */
  extraLines?: Partial<Record<IptablesTable, {start?: string[]; end?: string[]}>>;
}

export interface IptablesRuleSource {
  /** iptables-restore input (for --noflush) covering the filter and nat tables, whole or in pieces as they are rendered. */
  render(model: ProxyModel, options: RenderOptions): RestoreInput;
  /** The jump rules from built-in chains; the proxier keeps them in place. */
  jumpRules(model: ProxyModel): JumpRule[];
  /**
   * The nat chains of one service port of the model (its KUBE-SVC/SVL/EXT/FW/SEP chains), so that
   * a partial sync can delete those a changed port no longer uses without naming every chain of
   * the model. Without it, partial syncs pass existingChains.
   */
  serviceChains?(model: ProxyModel, port: ServicePort): string[];
  /**
   * Whether `next` writes the rules of service ports that did not change differently from
   * `previous` (kube-proxy's large-cluster mode, which drops rule comments, came or went): a
   * partial write would leave those rules as they were, so the sync must be full.
   */
  rewritesUnchanged?(previous: ProxyModel, next: ProxyModel): boolean;
  /** iptables-save's spelling of the rules of an input (see SpellRules), so that a partial write need not be read back. */
  spellRules?(family: IPFamily, input: string): ReturnType<SpellRules>;
}

/**
 * loadCoreIptablesRules binds to core/iptables (renderIptables, renderJumpRules). It is loaded at
 * run time so that the agent's other parts build and test on their own; a missing or changed
 * module is reported as one clear error.
 */
export async function loadCoreIptablesRules(): Promise<IptablesRuleSource> {
  // Source runs as .ts (type stripping), the build as .js; a computed specifier keeps tsc from
  // requiring the module at build time.
  const specifier = `../../core/iptables/index${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`;
  let module: Record<string, unknown>;
  try {
    module = (await import(specifier)) as Record<string, unknown>;
  } catch (error) {
    throw new Error(`iptables mode: cannot load the rule renderer core/iptables: ${errorText(error)}`);
  }
  const renderIptablesChunks = module.renderIptablesChunks;
  const renderJumpRules = module.renderJumpRules;
  const parseIptablesSave = module.parseIptablesSave;
  const isLargeCluster = module.isLargeCluster as ((model: ProxyModel) => boolean) | undefined;
  if (typeof renderIptablesChunks !== 'function' || typeof renderJumpRules !== 'function') {
    throw new Error('iptables mode: core/iptables does not export renderIptablesChunks and renderJumpRules');
  }
  const render = (model: ProxyModel, options: RenderOptions): Iterable<Uint8Array> =>
    renderIptablesChunks(model, {...options, includeJumps: false}) as Iterable<Uint8Array>;
  return {
    render,
    jumpRules: (model) => readJumpRules(renderJumpRules(model)),
    rewritesUnchanged: typeof isLargeCluster === 'function' ? (previous, next) => isLargeCluster(previous) !== isLargeCluster(next) : undefined,
    spellRules: typeof parseIptablesSave === 'function' ? (family, input) => spellRules(parseIptablesSave as (text: string, options: object) => unknown, family, input) : undefined,
    // The chains a model of this port alone declares: the renderer stays the one place that knows them.
    serviceChains: (model, port) => {
      const chains: string[] = [];
      let nat = false;
      for (const line of restoreInputText(render({...model, servicePorts: [port], problems: []}, {})).split('\n')) {
        if (line.startsWith('*')) nat = line === '*nat';
        else if (nat && line.startsWith(':')) {
          const chain = line.slice(1).split(' ')[0];
          if (ownedChainPrefixes.some((prefix) => chain.startsWith(prefix))) chains.push(chain);
        }
      }
      return chains;
    },
  };
}

/** readJumpRules checks what the renderer gave: a list of {table, chain, rule|args, position?}. */
function readJumpRules(value: unknown): JumpRule[] {
  if (!Array.isArray(value)) throw new Error('core/iptables renderJumpRules did not return a list');
  return value.map((entry, index) => {
    const object = entry as {table?: unknown; chain?: unknown; rule?: unknown; args?: unknown; position?: unknown};
    const rule = Array.isArray(object.rule) ? object.rule : object.args;
    if (typeof object.table !== 'string' || typeof object.chain !== 'string' || !Array.isArray(rule) || !rule.every((word) => typeof word === 'string')) {
      throw new Error(`core/iptables renderJumpRules entry ${index} is not {table, chain, rule}`);
    }
    return {
      table: object.table as IptablesTable,
      chain: object.chain,
      rule: rule as string[],
      position: object.position === 'append' ? 'append' : 'prepend',
    };
  });
}

/** spellRules re-reads restore input with core/iptables' parser, which writes each rule in iptables-save's spelling. */
function spellRules(parse: (text: string, options: object) => unknown, family: IPFamily, input: string): ReturnType<SpellRules> {
  let ruleset: {tables: Map<string, {chains: Map<string, {rules: Array<{text: string}>}>}>};
  try {
    ruleset = parse(input, {family, keepSavedText: false}) as typeof ruleset;
  } catch {
    return undefined;
  }
  const tables = new Map<IptablesTable, Map<string, string[]>>();
  for (const [name, table] of ruleset.tables) {
    tables.set(name as IptablesTable, new Map([...table.chains].map(([chain, {rules}]) => [chain, rules.map((rule) => rule.text)])));
  }
  return tables;
}
