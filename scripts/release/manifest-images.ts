// The manifests of a release: every YAML file under manifests/ (any directory below it, so that a
// new set of manifests is covered without a change here), with each container image of the agent
// (`image: ...proxyctl-agent[:tag|@digest]`) replaced by the one reference PROXYCTL_IMAGE names.
// Other images and everything else in the files stay as they are, comments included.
import {mkdir, readdir, readFile, writeFile} from 'node:fs/promises';
import {dirname, join, relative} from 'node:path';

/** `image:` (as a key or a list item), an optional quote, the reference, the same quote. */
const imageLine = /^(\s*(?:-\s+)?image:\s*)(["']?)([^"'\s#]+)\2/gm;
const isAgentImage = (reference: string) => /(^|\/)proxyctl-agent(:[^/]*|@sha256:[a-f0-9]+)?$/.test(reference);

export function withAgentImage(text: string, image: string): {text: string; replaced: number} {
  let replaced = 0;
  const result = text.replace(imageLine, (line, prefix: string, quote: string, reference: string) => {
    if (!isAgentImage(reference)) return line;
    replaced++;
    return `${prefix}${quote}${image}${quote}`;
  });
  return {text: result, replaced};
}

async function yamlFiles(dir: string): Promise<string[]> {
  const entries = await readdir(dir, {withFileTypes: true, recursive: true});
  return entries
    .filter((entry) => entry.isFile() && /\.ya?ml$/.test(entry.name))
    .map((entry) => join(entry.parentPath, entry.name))
    .sort();
}

/** writeManifests copies every YAML file of `from` into `to` (same relative paths) with the agent image set; returns the files written and how many images each got. */
export async function writeManifests(from: string, to: string, image: string): Promise<{file: string; images: number}[]> {
  if (!/^[a-z0-9]([\w.:/-]*[\w])?(:[\w][\w.-]{0,127})?(@sha256:[a-f0-9]{64})?$/i.test(image))
    throw new Error(`PROXYCTL_IMAGE ${JSON.stringify(image)} is not an image reference (REGISTRY/NAME:TAG or NAME@sha256:DIGEST)`);
  const written: {file: string; images: number}[] = [];
  for (const source of await yamlFiles(from)) {
    const {text, replaced} = withAgentImage(await readFile(source, 'utf8'), image);
    const target = join(to, relative(from, source));
    await mkdir(dirname(target), {recursive: true});
    await writeFile(target, text);
    written.push({file: relative(from, source), images: replaced});
  }
  return written;
}
