// The addresses the node holds (for the tracer's `-m addrtype --dst-type LOCAL`), read with
// `ip -j address` in the node's network namespace.
import {execFile} from 'node:child_process';

export function readNodeAddresses(netns: string | undefined): Promise<string[]> {
  const args = [...(netns ? ['-n', netns] : []), '-j', 'address', 'show'];
  return new Promise((resolve, reject) => {
    execFile('ip', args, {timeout: 10_000, maxBuffer: 16 * 1024 * 1024}, (error, stdout, stderr) => {
      if (error) {
        reject(new Error(`ip ${args.join(' ')}: ${stderr.trim() || error.message}`));
        return;
      }
      try {
        const links = JSON.parse(stdout) as {addr_info?: {local?: string}[]}[];
        resolve([
          ...new Set(
            links.flatMap((link) => (link.addr_info ?? []).map((info) => info.local).filter((ip): ip is string => typeof ip === 'string')),
          ),
        ]);
      } catch (parseError) {
        reject(new Error(`ip ${args.join(' ')}: unreadable output: ${(parseError as Error).message}`));
      }
    });
  });
}
