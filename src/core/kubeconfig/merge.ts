// Several kubeconfig files merged as kubectl merges $KUBECONFIG's list: files that do not exist are
// skipped; the first file to name a cluster, user or context wins that name, and the first to set
// current-context wins it; relative file paths in an entry are relative to the file it came from.
// Pure: the caller hands in how to read a file, so the plugin and the agent merge the same way.
import {parse as parseYaml} from 'yaml';

type Entry = {name?: unknown; [field: string]: unknown};

export interface MergedKubeconfig {
  /** The merged config, as kubeconfig YAML/JSON that client-node's loadFromString reads. */
  text: string;
  /** The files that existed and were read, in order. */
  files: string[];
}

export class KubeconfigError extends Error {
  override name = 'KubeconfigError';
}

/** The fields of an entry that hold file paths, per list ("cluster" under clusters, "user" under users). */
const pathFields = {clusters: ['certificate-authority'], users: ['client-certificate', 'client-key', 'tokenFile']} as const;

/** kubeconfigPaths splits $KUBECONFIG as kubectl does (":"; empty parts ignored). */
export function kubeconfigPaths(list: string): string[] {
  return list.split(':').filter((path) => path !== '');
}

function directoryOf(path: string): string {
  const slash = path.lastIndexOf('/');
  return slash <= 0 ? (slash === 0 ? '/' : '.') : path.slice(0, slash);
}

function absolute(file: string, path: string): string {
  return path.startsWith('/') ? path : `${directoryOf(file)}/${path}`;
}

export type KubeconfigSource = ({kind: 'files'} & MergedKubeconfig) | {kind: 'in-cluster'};

export interface KubeconfigLookup {
  /** --kubeconfig: this file alone, which must exist. */
  file?: string;
  /** $KUBECONFIG, $HOME, $KUBERNETES_SERVICE_HOST. */
  env: Record<string, string | undefined>;
  /** Reads a file; throws an error with code ENOENT when it does not exist (readFileSync's way). */
  readFile: (path: string) => string;
}

/**
 * findKubeconfig decides where a client's cluster comes from, as kubectl: --kubeconfig; else every
 * file $KUBECONFIG lists that exists; else ~/.kube/config; else the pod's service account when
 * running in a cluster. Nothing found is a KubeconfigError that says so (never a silent localhost).
 */
export function findKubeconfig(lookup: KubeconfigLookup): KubeconfigSource {
  const read = (path: string): string | undefined => {
    try {
      return lookup.readFile(path);
    } catch (error) {
      if ((error as {code?: string}).code === 'ENOENT') return undefined;
      throw new KubeconfigError(`kubeconfig ${path}: cannot read it: ${(error as Error).message}`);
    }
  };
  const {env} = lookup;
  if (lookup.file !== undefined) {
    const merged = mergeKubeconfigs([lookup.file], read);
    if (merged.files.length === 0) throw new KubeconfigError(`kubeconfig ${lookup.file} does not exist`);
    return {kind: 'files', ...merged};
  }
  if (env.KUBECONFIG) {
    const paths = kubeconfigPaths(env.KUBECONFIG);
    const merged = mergeKubeconfigs(paths, read);
    if (merged.files.length > 0) return {kind: 'files', ...merged};
    throw new KubeconfigError(`no kubeconfig: none of the files $KUBECONFIG lists exists (${paths.join(', ') || 'it is empty'})`);
  }
  const home = env.HOME ? `${env.HOME}/.kube/config` : undefined;
  const merged = home ? mergeKubeconfigs([home], read) : undefined;
  if (merged && merged.files.length > 0) return {kind: 'files', ...merged};
  if (env.KUBERNETES_SERVICE_HOST) return {kind: 'in-cluster'};
  throw new KubeconfigError(`no kubeconfig: $KUBECONFIG is not set and ${home ?? '~/.kube/config'} does not exist`);
}

/**
 * mergeKubeconfigs reads `paths` in order with `read` (undefined: the file does not exist) and merges
 * them. Throws KubeconfigError naming the file when one is not a kubeconfig.
 */
export function mergeKubeconfigs(paths: string[], read: (path: string) => string | undefined): MergedKubeconfig {
  const merged: Record<'clusters' | 'users' | 'contexts', Entry[]> = {clusters: [], users: [], contexts: []};
  let currentContext: string | undefined;
  const files: string[] = [];
  for (const file of paths) {
    const text = read(file);
    if (text === undefined) continue;
    files.push(file);
    let document: unknown;
    try {
      document = parseYaml(text) ?? {};
    } catch (error) {
      throw new KubeconfigError(`kubeconfig ${file}: not YAML: ${(error as Error).message.split('\n')[0]}`);
    }
    if (typeof document !== 'object' || Array.isArray(document))
      throw new KubeconfigError(`kubeconfig ${file}: not a kubeconfig (a YAML mapping with clusters, users and contexts)`);
    const config = document as Record<string, unknown>;
    for (const list of ['clusters', 'users', 'contexts'] as const) {
      const entries = config[list] ?? [];
      if (!Array.isArray(entries)) throw new KubeconfigError(`kubeconfig ${file}: ${list} must be a list`);
      for (const entry of entries as Entry[]) {
        if (typeof entry?.name !== 'string') throw new KubeconfigError(`kubeconfig ${file}: an entry of ${list} has no name`);
        if (merged[list].some((known) => known.name === entry.name)) continue;
        merged[list].push(list === 'contexts' ? entry : withAbsolutePaths(file, list, entry));
      }
    }
    const current = config['current-context'];
    if (currentContext === undefined && typeof current === 'string' && current !== '') currentContext = current;
  }
  const out = {apiVersion: 'v1', kind: 'Config', ...merged, ...(currentContext ? {'current-context': currentContext} : {})};
  return {text: JSON.stringify(out), files};
}

function withAbsolutePaths(file: string, list: 'clusters' | 'users', entry: Entry): Entry {
  const key = list === 'clusters' ? 'cluster' : 'user';
  const body = entry[key];
  if (!body || typeof body !== 'object') return entry;
  const copy: Record<string, unknown> = {...(body as Record<string, unknown>)};
  for (const field of pathFields[list]) {
    if (typeof copy[field] === 'string' && copy[field] !== '') copy[field] = absolute(file, copy[field]);
  }
  return {...entry, [key]: copy};
}
