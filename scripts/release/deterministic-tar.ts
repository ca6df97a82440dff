// Archives whose bytes depend only on the files' contents, names and modes: entries sorted by
// name, every mtime SOURCE_DATE_EPOCH, owner root, no atime/ctime, gzip without a name or time.
// Same inputs, same sha256 (the krew manifest and the image's digest rely on it).
import {spawn} from 'node:child_process';
import {createHash} from 'node:crypto';
import {createReadStream, createWriteStream} from 'node:fs';
import {readdir} from 'node:fs/promises';
import {pipeline} from 'node:stream/promises';
import {createGzip} from 'node:zlib';

export interface TarOptions {
  /** Directory whose entries go at the archive's root (no "./" prefix). */
  from: string;
  to: string;
  epoch: number;
  gzip: boolean;
}

const tarFlags = (epoch: number) => [
  '--sort=name',
  `--mtime=@${epoch}`,
  '--owner=0',
  '--group=0',
  '--numeric-owner',
  '--format=posix',
  '--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime',
];

function run(command: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {stdio: ['ignore', 'inherit', 'pipe']});
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk));
    child.on('error', (error) => reject(new Error(`${command}: ${error.message}`)));
    child.on('close', (code) =>
      code === 0 ? resolve() : reject(new Error(`${command} ${args.join(' ')} exited ${code}: ${stderr.trim()}`)),
    );
  });
}

/** writeTar archives `from` into `to`, reproducibly: GNU tar writes, Node's zlib compresses (no name, mtime 0). */
export async function writeTar({from, to, epoch, gzip}: TarOptions): Promise<void> {
  const entries = (await readdir(from)).sort();
  const args = [...tarFlags(epoch), '-C', from, '-cf', '-', '--', ...entries];
  const tar = spawn('tar', args, {stdio: ['ignore', 'pipe', 'pipe']});
  let stderr = '';
  tar.stderr.on('data', (chunk: Buffer) => (stderr += chunk));
  const exited = new Promise<void>((resolve, reject) => {
    tar.on('error', (error) => reject(new Error(`tar: ${error.message}`)));
    tar.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`tar of ${from} into ${to} exited ${code}: ${stderr.trim()}`))));
  });
  const written = gzip ? pipeline(tar.stdout, createGzip({level: 6}), createWriteStream(to)) : pipeline(tar.stdout, createWriteStream(to));
  await Promise.all([written, exited]);
}

export function sha256OfFile(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha256');
    createReadStream(path)
      .on('data', (chunk) => hash.update(chunk))
      .on('error', reject)
      .on('end', () => resolve(hash.digest('hex')));
  });
}

export {run as runTool};
