// AgentApiHandlers: what the agent runtime gives the API server, one async function per method.
import type {MethodName, ParamsOf, ResultOf, SyncEvent} from '../../protocol/methods.ts';

/** Methods the runtime answers; `events.subscribe` is the server's own and uses onSync. */
export type AnsweredMethod = Exclude<MethodName, 'events.subscribe'>;

export type MethodHandlers = {[M in AnsweredMethod]: (params: ParamsOf<M>) => Promise<ResultOf<M>>};

/**
 * AgentApiHandlers answers the plugin. Params arrive checked against the method's schema, with
 * absent params as {}. A handler that throws becomes a JSON-RPC server error (-32000) whose
 * message is the error's message: say what failed and why, as everywhere in the agent.
 */
export interface AgentApiHandlers extends MethodHandlers {
  /** Calls `listener` after every sync until the returned function is called. */
  onSync(listener: (event: SyncEvent) => void): () => void;
}
