// The release refuses a Node runtime that is not for its archive's platform: what an executable's
// first bytes say, for the four kinds the archives carry and for what is none of them.
import assert from 'node:assert/strict';
import {readFileSync} from 'node:fs';
import {describe, it} from 'node:test';
import {executablePlatform} from '../../scripts/release/node-runtime.ts';

function elf(machine: number): Buffer {
  const header = Buffer.alloc(20);
  header.writeUInt32BE(0x7f454c46, 0);
  header[4] = 2; // 64-bit
  header[5] = 1; // little-endian
  header.writeUInt16LE(machine, 18);
  return header;
}

function machO(cpu: number): Buffer {
  const header = Buffer.alloc(20);
  header.writeUInt32LE(0xfeedfacf, 0);
  header.writeUInt32LE(cpu, 4);
  return header;
}

describe("a Node runtime's platform, from its binary", () => {
  const cases = [
    {name: 'ELF x86-64', header: elf(0x3e), want: {os: 'linux', arch: 'amd64'}},
    {name: 'ELF aarch64', header: elf(0xb7), want: {os: 'linux', arch: 'arm64'}},
    {name: 'Mach-O x86_64', header: machO(0x01000007), want: {os: 'darwin', arch: 'amd64'}},
    {name: 'Mach-O arm64', header: machO(0x0100000c), want: {os: 'darwin', arch: 'arm64'}},
    {name: 'ELF for another CPU', header: elf(0x28), want: undefined},
    {name: 'a script', header: Buffer.from('#!/bin/sh\necho node\n'), want: undefined},
  ];
  for (const {name, header, want} of cases) it(name, () => assert.deepEqual(executablePlatform(header), want));

  it('the Node this project runs on is what it says', () => {
    const header = readFileSync(process.execPath).subarray(0, 20);
    const arch = process.arch === 'x64' ? 'amd64' : process.arch;
    assert.deepEqual(executablePlatform(header), {os: process.platform, arch});
  });
});
