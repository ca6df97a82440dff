// The kernel's table of virtual and real servers (/proc/net/ip_vs) as ipvs mode's looks read it:
// compared without connection counts, and the servers that changed in it spelled as
// `ipvsadm -Sn` prints them, checked against what -Sn printed for the same state.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {parseIpvsadmSave, savedTextSince, serverTableBlocks, serverTableShape} from '../../../src/core/ipvs/index.ts';

// What /proc/net/ip_vs held in Debian's 6.1 kernel for an IPv4 UDP server with affinity, a TCP one
// with two real servers (one of weight 0) and an IPv6 one; connection counts made up.
const kernelTable = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
UDP  0A60000B:0035 rr  persistent 2700000 FFFFFFFF
  -> 0AF40104:0035      Masq    1      12         3         
TCP  0A60000A:0050 rr  
  -> 0AF40103:1F90      Masq    0      0          41        
  -> 0AF40102:1F90      Masq    1      7          0         
TCP  [fd00:0010:0096:0000:0000:0000:0000:0001]:01BB rr 
  -> [fd00:0010:0244:0000:0000:0000:0000:0005]:192B      Masq    1      0          0         
`;

// What `ipvsadm -Sn` printed for the same state.
const printed = `-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 0
-A -u 10.96.0.11:53 -s rr -p 10800
-a -u 10.96.0.11:53 -r 10.244.1.4:53 -m -w 1
-A -t [fd00:10:96::1]:443 -s rr
-a -t [fd00:10:96::1]:443 -r [fd00:10:244::5]:6443 -m -w 1
`;

const before = serverTableShape(kernelTable);

/** The servers `text` holds, as parsed, for comparing a spelled text with a printed one. */
const servers = (text: string) => JSON.stringify(parseIpvsadmSave(text));

describe("the kernel's table of virtual and real servers", () => {
  it('drops the connection counts of real server lines, and nothing else, whatever the spacing', () => {
    const lines = [
      'IP Virtual Server version 1.2.1 (size=4096)',
      '  -> RemoteAddress:Port Forward Weight ActiveConn InActConn',
      'TCP  0A60000A:0050 rr  ',
      '  -> 0AF40103:1F90      Masq    0      0          41        ',
      '  -> 0AF40103:1F90 Masq 0 7 0',
      '  -> 0AF40103:1F90      Masq    1',
      '  -> 0AF40103:1F90      Masq    1      7x         0         ',
      '  -> 0AF40103:1F90      Masq    1      7          0          9',
      '   -> 0AF40103:1F90      Masq    1      7          0         ',
      '  ->',
      '  -> ',
      '',
    ];
    const expected = [
      'IP Virtual Server version 1.2.1 (size=4096)',
      '  -> RemoteAddress:Port Forward Weight ActiveConn InActConn',
      'TCP  0A60000A:0050 rr  ',
      '  -> 0AF40103:1F90      Masq    0',
      '  -> 0AF40103:1F90 Masq 0',
      ...lines.slice(5),
    ];
    assert.equal(serverTableShape(lines.join('\n')), expected.join('\n'));
    assert.equal(serverTableShape(`${lines.join('\n')}\n`), `${expected.join('\n')}\n`);
  });

  it('is compared without its connection counts, and with every weight', () => {
    assert.equal(before, serverTableShape(kernelTable.replace(/ {6}12 {9}3 {9}/, '      0          0         ')));
    assert.match(before, /^ {2}-> 0AF40103:1F90 +Masq +0$/m);
    assert.match(before, /^ {2}-> \[fd00:0010:0244:0000:0000:0000:0000:0005\]:192B +Masq +1$/m);
    assert.match(before, /^UDP {2}0A60000B:0035 rr {2}persistent 2700000 FFFFFFFF$/m, 'a server line is kept whole');
    assert.notEqual(before, serverTableShape(kernelTable.replace('Masq    0 ', 'Masq    1 ')), 'a weight is not a count');
  });

  it("is split into each server's lines, the header in none", () => {
    const blocks = serverTableBlocks(before);
    assert.deepEqual([...blocks.keys()], ['UDP 0A60000B:0035', 'TCP 0A60000A:0050', 'TCP [fd00:0010:0096:0000:0000:0000:0000:0001]:01BB']);
    assert.equal(blocks.get('TCP 0A60000A:0050')!.split('\n').length, 4, 'its line, two real servers, the end');
  });

  it('spells the servers that changed as ipvsadm -Sn prints them, and keeps the printed text of the rest', () => {
    const cases: {what: string; table: string; expected: string}[] = [
      {
        what: 'a real server deleted',
        table: before.replace(/^ {2}-> 0AF40103:1F90 .*\n/m, ''),
        expected: printed.replace('-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 0\n', ''),
      },
      {
        what: 'a weight changed',
        table: before.replace(/(0AF40103:1F90 +Masq +)0/, '$11'),
        expected: printed.replace('10.244.1.3:8080 -m -w 0', '10.244.1.3:8080 -m -w 1'),
      },
      {
        what: 'an IPv6 real server added',
        table: before.replace(/(:192B +Masq +1\n)/, '$1  -> [fd00:0010:0244:0000:0000:0000:0000:0a06]:192B      Masq    1\n'),
        expected: `${printed}-a -t [fd00:10:96::1]:443 -r [fd00:10:244::a06]:6443 -m -w 1\n`,
      },
      {
        what: 'a server added, with its real server',
        table: `${before}SCTP  0A600014:0BB8 wrr  \n  -> 0AF40109:0BB8      Masq    3\n`,
        expected: `${printed}-A --sctp-service 10.96.0.20:3000 -s wrr\n-a --sctp-service 10.96.0.20:3000 -r 10.244.1.9:3000 -m -w 3\n`,
      },
      {
        what: 'a server deleted',
        table: before.replace(/^TCP {2}0A60000A:0050 .*\n(?: {2}->.*\n)*/m, ''),
        expected: printed.replace(/^-[Aa] -t 10\.96\.0\.10:80 .*\n/gm, ''),
      },
    ];
    for (const {what, table, expected} of cases) {
      const spelled = savedTextSince(printed, before, table);
      assert.ok(spelled !== undefined, what);
      assert.equal(servers(spelled), servers(expected), what);
      const serverLines = spelled.split('\n').filter((line) => line.startsWith('-A '));
      assert.equal(new Set(serverLines).size, serverLines.length, `${what}: each server once, its printed lines replaced`);
      assert.ok(
        spelled.includes('-A -u 10.96.0.11:53 -s rr -p 10800\n-a -u 10.96.0.11:53 -r 10.244.1.4:53 -m -w 1\n'),
        `${what}: the rest as printed`,
      );
    }
  });

  it("replaces a changed server's lines only, not those of a server whose address or port begins the same", () => {
    const alike = '-A -t 10.96.0.10:8080 -s rr\n-a -t 10.96.0.10:8080 -r 10.244.1.2:8080 -m -w 1\n-A -t 10.96.0.100:80 -s rr\n';
    const tableAlike = 'TCP  0A60000A:1F90 rr  \n  -> 0AF40102:1F90      Masq    1\nTCP  0A600064:0050 rr  \n';
    const printedBoth = printed + alike;
    const tableBefore = `${before}${tableAlike}`;
    const tableNow = tableBefore.replace(/(0AF40103:1F90 +Masq +)0/, '$11');
    const spelled = savedTextSince(printedBoth, tableBefore, tableNow)!;
    assert.equal(servers(spelled), servers(printedBoth.replace('10.244.1.3:8080 -m -w 0', '10.244.1.3:8080 -m -w 1')));
    assert.ok(spelled.includes(alike), 'the servers that only look alike stay as printed');
  });

  it('spells again a server that changed between the reading of the table and the printing', () => {
    const deleted = printed.replace('-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 0\n', '');
    // Printed after the real server was deleted, the table read before; now it is back.
    assert.equal(servers(savedTextSince(deleted, before.replace(/(0AF40103:1F90 +Masq +)0/, '$11'), before)!), servers(printed));
  });

  it('finds the changed servers of a large table wherever they are, and only those', () => {
    // 40 servers 10.96.0.1-40:80, each with real servers 10.244.0.N:8080 for N in 1..3 (hex).
    const hex = (n: number) => n.toString(16).toUpperCase().padStart(2, '0');
    const block = (s: number, reals = [1, 2, 3]) =>
      `TCP  0A6000${hex(s)}:0050 rr  \n${reals.map((r) => `  -> 0AF400${hex(r)}:1F90      Masq    1\n`).join('')}`;
    const header = kernelTable.split('\n').slice(0, 3).join('\n') + '\n';
    const table = (blocks: string[]) => header + blocks.join('');
    const all = Array.from({length: 40}, (_, i) => block(i + 1));
    const large = table(all);
    // Spelled whole: every server is new since an empty table.
    const whole = (text: string) => savedTextSince('', header, text)!;
    const edits: {what: string; blocks: string[]}[] = [
      {what: 'a real server of the first server deleted', blocks: all.with(0, block(1, [1, 3]))},
      {what: 'a real server of the second server deleted', blocks: all.with(1, block(2, [2, 3]))},
      {what: 'the last real server of a middle server deleted', blocks: all.with(19, block(20, [1, 2]))},
      {what: 'a real server of the last server added', blocks: all.with(39, block(40, [1, 2, 3, 4]))},
      {what: 'the first server deleted', blocks: all.slice(1)},
      {what: 'the last server deleted', blocks: all.slice(0, -1)},
      {what: 'a server added at the end', blocks: [...all, block(41)]},
      {what: 'a server added in the middle', blocks: [...all.slice(0, 20), block(41), ...all.slice(20)]},
      {what: 'two servers far apart changed', blocks: all.with(2, block(3, [1])).with(37, block(38, [3]))},
    ];
    for (const {what, blocks} of edits) {
      const now = table(blocks);
      assert.equal(servers(savedTextSince(whole(large), large, now)!), servers(whole(now)), what);
    }
  });

  it('leaves to ipvsadm -Sn what the table cannot say as it does', () => {
    assert.equal(
      savedTextSince(printed, before, before.replace('persistent 2700000', 'persistent 3600000')),
      undefined,
      'persistence, in ticks',
    );
    assert.equal(savedTextSince(printed, before, `${before}FWM  00000001 rr  \n`), undefined, 'a fwmark service');
    assert.equal(savedTextSince(printed, before, before.replace(/(0AF40102:1F90 +)Masq/, '$1Route')), undefined, 'direct routing');
    assert.equal(
      savedTextSince(printed, before, before.replace('0A60000A:0050 rr  ', '0A60000A:0050 rr ops ')),
      undefined,
      'one-packet scheduling',
    );
  });
});
