// IptablesRuleSource: what the iptables proxier needs from rule rendering (core/iptables), as an
// interface so that the proxier can be tested with hand-written rules and so that the renderer's
// internals stay in core. A render hands back the input and what it does to the tables, so that
// the proxier never reads its own input back.
import {
  type IptablesRenderRecord,
  IptablesSaveSpelling,
  isLargeCluster,
  renderIptablesWrite,
  renderJumpRules,
  type SpelledTable,
} from '../../core/iptables/index.ts';
import type {IPFamily, ProxyModel} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';
import type {RestoreInput} from '../host/host.ts';

/** A rule in a built-in chain that sends packets into the proxy's chains (PREROUTING -> KUBE-SERVICES). */
export interface JumpRule {
  table: 'filter' | 'nat';
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
   * Finding those means naming every chain the model uses (a hash per endpoint); a partial render
   * given `previous` instead deletes those the changed ports no longer use, from those ports alone.
   */
  existingChains?: Map<IptablesTable, Set<string>>;
  /**
   * In a partial render, the model of the last write: fixed chains the change leaves as they are
   * are not rewritten, and the chains the changed ports used and no longer use are deleted.
   */
  previous?: ProxyModel;
  /** Lines to add to a table's part: `start` right after "*table", `end` right before COMMIT. */
  extraLines?: Partial<Record<IptablesTable, {start?: string[]; end?: string[]}>>;
  /** Jump rules to insert at the end of their table's part, once the chains they lead to are filled. */
  insertJumps?: JumpRule[];
}

/**
 * WrittenTable: what a write does to one table, as the renderer tells it: the chains it declares
 * (so replaces) and deletes, the rules of each chain it writes as iptables-save prints them (the
 * per-service chains of a full write by count alone), and the jump rules it inserts.
 */
export type WrittenTable = SpelledTable;

/** RenderedWrite: a restore input, and what it does to the tables. */
export interface RenderedWrite {
  /** iptables-restore input (for --noflush) covering the filter and nat tables, whole or in pieces as they are rendered; taken once. */
  input: RestoreInput;
  /** The chains the input declares (and so replaces or deletes), per table; known once all of `input` has been taken. */
  declaredChains(): Record<'filter' | 'nat', string[]>;
  /**
   * What the write leaves in each table, known once all of `input` has been taken; undefined when
   * the rules cannot be spelled as iptables-save prints them (the proxier then reads the kernel back).
   */
  written(): Record<'filter' | 'nat', WrittenTable> | undefined;
}

export interface IptablesRuleSource {
  /** A restore input and what it does; `written` is asked once (a full render's record is let go after it). */
  render(model: ProxyModel, options: RenderOptions): RenderedWrite;
  /** The jump rules from built-in chains; the proxier keeps them in place. */
  jumpRules(model: ProxyModel): JumpRule[];
  /**
   * Whether `next` writes the rules of service ports that did not change differently from
   * `previous` (kube-proxy's large-cluster mode, which drops rule comments, came or went): a
   * partial write would leave those rules as they were, so the sync must be full.
   */
  rewritesUnchanged?(previous: ProxyModel, next: ProxyModel): boolean;
}

/** coreIptablesRules: the rule source of core/iptables, with a spelling cache per family. */
export function coreIptablesRules(): IptablesRuleSource {
  const spellings = new Map<IPFamily, IptablesSaveSpelling>();
  const spellingOf = (family: IPFamily): IptablesSaveSpelling => {
    let spelling = spellings.get(family);
    if (!spelling) spellings.set(family, (spelling = new IptablesSaveSpelling(family)));
    return spelling;
  };
  return {
    render: (model, options) => {
      const {chunks, record} = renderIptablesWrite(model, {...options, includeJumps: false});
      return {
        input: chunks,
        declaredChains: () => ({filter: record.tables.filter.declared, nat: record.tables.nat.declared}),
        written: () => {
          const spelled = spellingOf(model.family).spell(record);
          // A full render's record (every chain of the tables) is emptied once spelled:
          // the generator that filled it is held until iptables-restore has committed.
          if (options.changedServicePorts === undefined) emptyRecord(record);
          return spelled;
        },
      };
    },
    jumpRules: (model) => renderJumpRules(model),
    rewritesUnchanged: (previous, next) => isLargeCluster(previous) !== isLargeCluster(next),
  };
}

function emptyRecord(record: IptablesRenderRecord): void {
  for (const table of Object.values(record.tables)) {
    table.declared.length = 0;
    table.deleted.length = 0;
    table.rules.clear();
    table.jumps.length = 0;
  }
  record.servicePortChains.clear();
}
