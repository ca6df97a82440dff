// fetchJsonInNetns: an HTTP GET made from inside a network namespace (a node process started there
// with `ip netns exec`), as a load balancer's health check reaches a node: the status and JSON body,
// or the error code (ECONNREFUSED, ...). Asynchronous, so a server in the calling process can answer.
import {execFile} from 'node:child_process';
import {promisify} from 'node:util';

const execFileAsync = promisify(execFile);

/** status and json when the server answered; error when it could not be reached. */
export interface FetchAnswer {
  status?: number;
  json?: any;
  error?: string;
}

export async function fetchJsonInNetns(netns: string, url: string, timeoutMs = 3000): Promise<FetchAnswer> {
  const script = `fetch(${JSON.stringify(url)}, {signal: AbortSignal.timeout(${timeoutMs})}).then(
    async (response) => console.log(JSON.stringify({status: response.status, json: await response.json()})),
    (error) => console.log(JSON.stringify({error: String(error.cause?.code ?? error.name)})))`;
  const {stdout} = await execFileAsync('ip', ['netns', 'exec', netns, process.execPath, '-e', script], {timeout: timeoutMs + 5000});
  return JSON.parse(stdout) as FetchAnswer;
}
