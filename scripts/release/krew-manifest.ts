// The krew manifest (proxyctl.yaml) for the plugin archives, and the checks krew makes of one
// (krew's pkg/index/validation: name, apiVersion, kind, version, platforms), plus the ones its
// install makes: each archive's sha256, and the `bin` that the `files` operations put in place.
import {spawnSync} from 'node:child_process';
import {basename, join} from 'node:path';
import {parse, stringify} from 'yaml';
import {sha256OfFile} from './deterministic-tar.ts';
import type {PluginArchive} from './plugin-archive.ts';

export const krewApiVersion = 'krew.googlecontainertools.github.com/v1alpha2';

const shortDescription = 'Trace Services through the rules proxyctl-agent applies';
const description = `proxyctl replaces kube-proxy with an agent (a DaemonSet) that programs the same
iptables, nftables or ipvs rules, and shows what it does. This plugin asks the agents:
\`trace\` follows a Service VIP through the rules really applied on a node to its endpoints,
\`diff\` compares the rules a node should have with those its kernel holds, \`status\` and
\`sync\` do what they say. \`render\` and \`trace --rules\` work offline, on files, with no
cluster: try \`kubectl proxyctl render -f examples/cluster.yaml\` in the plugin's directory.
`;
const caveats = `Every command but render and trace --rules talks to proxyctl-agent, the DaemonSet
that replaces kube-proxy. To run it, apply the manifests of the release (rbac.yaml,
configmap.yaml, daemonset.yaml) with the agent image pushed to your registry, set
KUBERNETES_SERVICE_HOST/PORT in the DaemonSet to your control plane, and bind the Role in
plugin-rbac.yaml (pods list and pods/portforward in kube-system) to the people who use the plugin.
Observe mode watches kube-proxy's own rules and needs no change to kube-proxy.
See docs/release.md and README.md in the project.
`;

export interface KrewManifestOptions {
  version: string;
  homepage: string;
  /** Where the archives are published: each platform's uri is this followed by the archive's name. */
  baseUrl: string;
  archives: PluginArchive[];
}

export function krewManifest({version, homepage, baseUrl, archives}: KrewManifestOptions): string {
  const manifest = {
    apiVersion: krewApiVersion,
    kind: 'Plugin',
    metadata: {name: 'proxyctl'},
    spec: {
      version: `v${version}`,
      homepage,
      shortDescription,
      description,
      caveats,
      platforms: archives.map((archive) => ({
        selector: {matchLabels: {os: archive.platform.os, arch: archive.platform.arch}},
        uri: `${baseUrl.replace(/\/+$/, '')}/${archive.name}`,
        sha256: archive.sha256,
        bin: 'kubectl-proxyctl',
        files: [{from: '*', to: '.'}],
      })),
    },
  };
  return stringify(manifest, {lineWidth: 0});
}

// krew's own rules (pkg/index/validation/validate.go and pkg/installation/semver).
const safePluginName = /^[\w-]+$/;
const windowsForbidden = ['con', 'prn', 'aux', 'nul', ...[1, 2, 3, 4, 5, 6, 7, 8, 9].flatMap((n) => [`com${n}`, `lpt${n}`])];
const semverWithV = /^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$/;
const sha256Pattern = /^[a-f0-9]{64}$/;

interface Platform {
  selector?: {matchLabels?: Record<string, string>; matchExpressions?: {key: string}[]};
  uri?: string;
  sha256?: string;
  bin?: string;
  files?: {from?: string; to?: string}[];
}

function platformProblems(platform: Platform): string[] {
  const problems: string[] = [];
  if (!platform.uri) problems.push('URI has to be set');
  if (!platform.sha256) problems.push('sha256 sum has to be set');
  else if (!sha256Pattern.test(platform.sha256)) problems.push(`sha256 value ${platform.sha256} is not valid, must match ${sha256Pattern}`);
  if (!platform.bin) problems.push('bin has to be set');
  if (!platform.files || platform.files.length === 0) problems.push("can't have a plugin without specifying file operations");
  const selector = platform.selector;
  if (!selector) problems.push('nil selector is not supported');
  else {
    const {matchLabels, matchExpressions} = selector;
    if (matchLabels === undefined && (matchExpressions ?? []).length === 0) problems.push('empty selector is not supported');
    if (matchLabels !== undefined && Object.keys(matchLabels ?? {}).length === 0) problems.push('matchLabels specified but empty');
    if (matchExpressions !== undefined && matchExpressions.length === 0) problems.push('matchExpressions specified but empty');
    for (const key of [...Object.keys(matchLabels ?? {}), ...(matchExpressions ?? []).map((e) => e.key)])
      if (key !== 'os' && key !== 'arch') problems.push(`selector key ${JSON.stringify(key)} not supported`);
  }
  return problems;
}

/**
 * krewManifestProblems returns what krew would refuse in the manifest at `path` (its plugin name is
 * the file's name without .yaml), each naming the platform; `archiveOf(uri)` gives the local file
 * of a platform's archive, whose sha256 and contents are checked too. Empty: krew takes it.
 */
export async function krewManifestProblems(path: string, text: string, archiveOf: (uri: string) => string | undefined): Promise<string[]> {
  const name = basename(path).replace(/\.yaml$/, '');
  const manifest = parse(text) as {apiVersion?: string; kind?: string; metadata?: {name?: string}; spec?: Record<string, unknown>};
  const spec = (manifest.spec ?? {}) as {version?: string; shortDescription?: string; platforms?: Platform[]};
  const problems: string[] = [];
  if (manifest.apiVersion !== krewApiVersion) problems.push(`apiVersion ${JSON.stringify(manifest.apiVersion)} is not ${krewApiVersion}`);
  if (manifest.kind !== 'Plugin') problems.push(`kind ${JSON.stringify(manifest.kind)} is not Plugin`);
  if (!safePluginName.test(name) || windowsForbidden.includes(name.toLowerCase()))
    problems.push(`plugin name ${JSON.stringify(name)} is not allowed`);
  if (manifest.metadata?.name !== name)
    problems.push(`plugin should be named ${JSON.stringify(name)} (the file's name), not ${JSON.stringify(manifest.metadata?.name)}`);
  if (!spec.shortDescription) problems.push('should have a short description');
  if (!spec.version) problems.push('should have a version specified');
  else if (!semverWithV.test(spec.version)) problems.push(`version ${JSON.stringify(spec.version)} is not semver starting with "v"`);
  if (!spec.platforms || spec.platforms.length === 0) problems.push('should have a platform specified');
  for (const platform of spec.platforms ?? []) {
    const label = JSON.stringify(platform.selector?.matchLabels ?? platform.selector ?? {});
    const own = platformProblems(platform);
    if (own.length === 0) own.push(...(await archiveProblems(platform, archiveOf)));
    problems.push(...own.map((problem) => `platform ${label}: ${problem}`));
  }
  return problems;
}

/** What krew's install would find: the archive's sha256, and `bin` in place and executable after `files`. */
async function archiveProblems(platform: Platform, archiveOf: (uri: string) => string | undefined): Promise<string[]> {
  const file = archiveOf(platform.uri ?? '');
  if (!file) return [`no local archive for ${platform.uri}`];
  const sha256 = await sha256OfFile(file);
  if (sha256 !== platform.sha256) return [`sha256 ${platform.sha256} does not match ${file} (${sha256})`];
  const listing = spawnSync('tar', ['-tvzf', file], {encoding: 'utf8'});
  if (listing.status !== 0) return [`${file} is not a tar.gz archive: ${listing.stderr.trim()}`];
  const entries = new Map(
    listing.stdout
      .split('\n')
      .filter(Boolean)
      .map((line) => {
        const fields = line.split(/\s+/);
        return [fields.slice(5).join(' ').replace(/^\.\//, ''), fields[0]] as const;
      }),
  );
  const everythingToRoot = (platform.files ?? []).some((op) => op.from === '*' && (op.to === '.' || op.to === './'));
  const bin = join(platform.bin ?? '').replace(/^\.\//, '');
  if (!everythingToRoot) return [`files ${JSON.stringify(platform.files)}: only {from: "*", to: "."} is checked here`];
  const mode = entries.get(bin);
  if (!mode) return [`bin ${bin} is not in ${file}`];
  if (!/^-..x/.test(mode)) return [`bin ${bin} in ${file} is not executable (${mode})`];
  return [];
}
