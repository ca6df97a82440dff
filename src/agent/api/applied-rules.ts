// AppliedRulesCache: the rules read back from the kernel, parsed, per IP family, kept until the
// kernel's ruleset changes (RulesetChanges) so that trace and diff need not read them every time.
import type {IPFamily} from '../../core/model/index.ts';
import type {ParsedRules} from './rules-backend.ts';
import type {RulesetChanges} from './ruleset-changes.ts';

export interface AppliedRules {
  family: IPFamily;
  text: string;
  rules: ParsedRules;
  /** When the kernel was read (ms). */
  readAt: number;
  /** The ruleset generation the reading belongs to. */
  generation: number;
}

export interface AppliedRulesOptions {
  /** The proxy's tables as the kernel tools print them (iptables-save -t filter + -t nat). */
  read(family: IPFamily): Promise<string>;
  parse(text: string): ParsedRules;
  changes: RulesetChanges;
  now(): number;
}

export class AppliedRulesCache {
  readonly #options: AppliedRulesOptions;
  readonly #current = new Map<IPFamily, AppliedRules>();
  readonly #reading = new Map<IPFamily, {generation: number; promise: Promise<AppliedRules>}>();

  constructor(options: AppliedRulesOptions) {
    this.#options = options;
  }

  /** The rules as the kernel holds them now: cached when nothing changed since they were read. */
  async get(family: IPFamily): Promise<AppliedRules> {
    const {changes} = this.#options;
    const generation = changes.generation();
    const cached = this.#current.get(family);
    if (cached && changes.watching() && cached.generation === generation) return cached;
    // Requests that arrive while a reading of the same generation runs share it.
    const reading = this.#reading.get(family);
    if (reading && reading.generation === generation) return reading.promise;
    const promise = this.#read(family, generation).finally(() => {
      if (this.#reading.get(family)?.promise === promise) this.#reading.delete(family);
    });
    this.#reading.set(family, {generation, promise});
    return promise;
  }

  /** The last reading, however old, without touching the kernel. */
  last(family: IPFamily): AppliedRules | undefined {
    return this.#current.get(family);
  }

  async #read(family: IPFamily, generation: number): Promise<AppliedRules> {
    const readAt = this.#options.now();
    const text = await this.#options.read(family);
    const applied: AppliedRules = {family, text, rules: this.#options.parse(text), readAt, generation};
    const known = this.#current.get(family);
    if (!known || known.readAt <= readAt) this.#current.set(family, applied);
    return applied;
  }
}
