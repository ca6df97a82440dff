// errorText: what anything thrown says, for a log line or an error answer. Every room may import it:
// core imports nothing of ours but itself, and agent, plugin and lab all import core.

/** errorText: an Error's message, or anything else thrown as text. */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
