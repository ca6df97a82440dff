// What the proxiers and their bookkeeping share, and what they tell the agent and its API: the
// result of a sync, and what a write of iptables rules left in the kernel.
import type {IPFamily} from '../../core/model/index.ts';
import type {IptablesTable} from '../../core/iptables/chains.ts';

/** FamilySyncResult: what one sync of one IP family did (not protocol/'s SyncResult, the answer to the plugin's sync call). */
export interface FamilySyncResult {
  family: IPFamily;
  kind: 'full' | 'partial' | 'unchanged';
  changedServicePorts: number;
  drift: boolean;
}

/** SyncOutcome: one sync of every family, as told to onSync listeners (the agent API streams it). */
export interface SyncOutcome {
  /** Clock time (ms) the sync started and how long it took. */
  startedAt: number;
  durationMs: number;
  ok: boolean;
  /** Per family; empty when the sync failed. */
  results: FamilySyncResult[];
  /** The proxy's rules in the kernel after the sync, per table, all families together. */
  rules: {filter: number; nat: number};
  error?: string;
}

/** ChainsWritten: the chains of one table a partial write declared (so replaced or deleted), and what they hold now. */
export interface ChainsWritten {
  table: IptablesTable;
  declared: string[];
  /** The declared chains that exist after the write. */
  chains: string[];
  /** Their rules, as iptables-save prints them. */
  rules: string[];
}

/** WrittenRules: what one write left in the kernel, as the proxier knows it without a new reading. */
export type WrittenRules =
  /** The tables read back after the write (filter, then nat, as iptables-save -t prints them); reading started at `readStartedAt`. */
  | {kind: 'read'; text: string; readStartedAt: number}
  /** The chains a partial write replaced; every other rule is as before the write. */
  | {kind: 'chains'; tables: ChainsWritten[]; writtenAt: number};

/**
 * Told before each iptables-restore and after it (`written` undefined when what it left is not
 * known), and of each reading of the tables taken with no write in flight (the drift check's),
 * with when it started.
 */
export interface RulesWriteListener {
  started(family: IPFamily): void;
  ended(family: IPFamily, written: WrittenRules | undefined): void;
  reading?(family: IPFamily, text: string, startedAt: number): void;
  /**
   * Resolves true when the listener knows that nothing but the writes it was told of changed the
   * rules since `since` (ms): a drift check need not read them then.
   */
  untouchedSince?(since: number): Promise<boolean>;
  /**
   * The rules the kernel holds now, as the listener knows them or reads them (through the
   * proxier's readApplied), parsed by its backend: a drift check that takes them shares one
   * reading and one parse with the requests that come meanwhile. `readAt`: when they were read.
   */
  rulesNow?(family: IPFamily): Promise<{rules: unknown; readAt: number}>;
}
