// The kernel's table of virtual and real servers (/proc/net/ip_vs) as ipvs mode's looks read it:
// compared without connection counts, and the servers that changed in it spelled as
// `ipvsadm -Sn` prints them, checked against what -Sn printed for the same state.
import assert from 'node:assert/strict';
import {describe, it} from 'node:test';
import {
  parseIpvsadmSave,
  savedTextSince,
  ServerTableComparison,
  ServerTableShaper,
  serverTableBlocks,
  serverTableShape,
  serverTableShapeBytes,
} from '../../../src/core/ipvs/index.ts';

/** savedTextSince of tables given as text, as serverTableShapeBytes gives them as bytes. */
const spelledSince = (printed: string, before: string, now: string) =>
  savedTextSince(printed, Buffer.from(before, 'latin1'), Buffer.from(now, 'latin1'));
/** The text savedTextSince spells. */
const since = (printed: string, before: string, now: string) => spelledSince(printed, before, now)?.text;
/** The servers it names as changed, sorted. */
const changedSince = (printed: string, before: string, now: string) =>
  [...(spelledSince(printed, before, now)?.changedServers ?? [])].sort();

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
/** The TCP servers, as ipvsadm names them, that one text has and the other has not the same, sorted. */
const serversChanged = (a: string, b: string) => {
  const spelled = (text: string) => new Set(parseIpvsadmSave(text).map((server) => JSON.stringify(server)));
  const [inA, inB] = [spelled(a), spelled(b)];
  const differing = [...inA].filter((server) => !inB.has(server)).concat([...inB].filter((server) => !inA.has(server)));
  const named = differing
    .map((server) => JSON.parse(server) as {address: string; port: number})
    .map(({address, port}) => `-t ${address}:${port}`);
  return [...new Set(named)].sort();
};

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
    const cases: {what: string; table: string; expected: string; changed: string[]}[] = [
      {
        what: 'a real server deleted',
        table: before.replace(/^ {2}-> 0AF40103:1F90 .*\n/m, ''),
        expected: printed.replace('-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 0\n', ''),
        changed: ['-t 10.96.0.10:80'],
      },
      {
        what: 'a weight changed',
        table: before.replace(/(0AF40103:1F90 +Masq +)0/, '$11'),
        expected: printed.replace('10.244.1.3:8080 -m -w 0', '10.244.1.3:8080 -m -w 1'),
        changed: ['-t 10.96.0.10:80'],
      },
      {
        what: 'an IPv6 real server added',
        table: before.replace(/(:192B +Masq +1\n)/, '$1  -> [fd00:0010:0244:0000:0000:0000:0000:0a06]:192B      Masq    1\n'),
        expected: `${printed}-a -t [fd00:10:96::1]:443 -r [fd00:10:244::a06]:6443 -m -w 1\n`,
        changed: ['-t [fd00:10:96::1]:443'],
      },
      {
        what: 'a server added, with its real server',
        table: `${before}SCTP  0A600014:0BB8 wrr  \n  -> 0AF40109:0BB8      Masq    3\n`,
        expected: `${printed}-A --sctp-service 10.96.0.20:3000 -s wrr\n-a --sctp-service 10.96.0.20:3000 -r 10.244.1.9:3000 -m -w 3\n`,
        changed: ['--sctp-service 10.96.0.20:3000'],
      },
      {
        what: 'a server deleted',
        table: before.replace(/^TCP {2}0A60000A:0050 .*\n(?: {2}->.*\n)*/m, ''),
        expected: printed.replace(/^-[Aa] -t 10\.96\.0\.10:80 .*\n/gm, ''),
        changed: ['-t 10.96.0.10:80'],
      },
    ];
    for (const {what, table, expected, changed} of cases) {
      const spelled = since(printed, before, table);
      assert.ok(spelled !== undefined, what);
      assert.deepEqual(changedSince(printed, before, table), changed, `${what}: the server named as changed`);
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
    const spelled = since(printedBoth, tableBefore, tableNow)!;
    assert.equal(servers(spelled), servers(printedBoth.replace('10.244.1.3:8080 -m -w 0', '10.244.1.3:8080 -m -w 1')));
    assert.ok(spelled.includes(alike), 'the servers that only look alike stay as printed');
  });

  it('spells again a server that changed between the reading of the table and the printing', () => {
    const deleted = printed.replace('-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 0\n', '');
    // Printed after the real server was deleted, the table read before; now it is back.
    assert.equal(servers(since(deleted, before.replace(/(0AF40103:1F90 +Masq +)0/, '$11'), before)!), servers(printed));
  });

  it('finds the changed servers of a large table wherever they are, and only those', () => {
    // N servers 10.96.S.S:80, each with real servers 10.244.0.R:8080 for R in 1..3 (hex): 40 servers
    // fit in a few pages, 1,200 take dozens, compared a page at a time before byte by byte.
    const hex = (n: number, width = 2) => n.toString(16).toUpperCase().padStart(width, '0');
    const block = (s: number, reals = [1, 2, 3]) =>
      `TCP  0A60${hex(s, 4)}:0050 rr  \n${reals.map((r) => `  -> 0AF400${hex(r)}:1F90      Masq    1\n`).join('')}`;
    const header = kernelTable.split('\n').slice(0, 3).join('\n') + '\n';
    const table = (blocks: string[]) => header + blocks.join('');
    // Spelled whole: every server is new since an empty table.
    const whole = (text: string) => since('', header, text)!;
    for (const count of [40, 1200]) {
      const all = Array.from({length: count}, (_, i) => block(i + 1));
      const large = table(all);
      const middle = count / 2;
      const edits: {what: string; blocks: string[]}[] = [
        {what: 'a real server of the first server deleted', blocks: all.with(0, block(1, [1, 3]))},
        {what: 'a real server of the second server deleted', blocks: all.with(1, block(2, [2, 3]))},
        {what: 'the last real server of a middle server deleted', blocks: all.with(middle, block(middle + 1, [1, 2]))},
        {what: 'a real server of the last server added', blocks: all.with(count - 1, block(count, [1, 2, 3, 4]))},
        {what: 'the first server deleted', blocks: all.slice(1)},
        {what: 'the last server deleted', blocks: all.slice(0, -1)},
        {what: 'a server added at the end', blocks: [...all, block(count + 1)]},
        {what: 'a server added in the middle', blocks: [...all.slice(0, middle), block(count + 1), ...all.slice(middle)]},
        {what: 'two servers far apart changed', blocks: all.with(2, block(3, [1])).with(count - 3, block(count - 2, [3]))},
        // Beyond 16 servers, their lines are found in one walk over the printed text.
        {what: 'every 50th server changed at once', blocks: all.map((lines, s) => (s % 50 === 0 ? block(s + 1, [2]) : lines))},
      ];
      // Every 97th server's weight changed, one at a time.
      for (let s = 0; s < count; s += 97)
        edits.push({what: `the weight of server ${s + 1} changed`, blocks: all.with(s, block(s + 1).replace('Masq    1', 'Masq    2'))});
      const tables = edits.map(({what, blocks}) => ({what, now: table(blocks)}));
      const printed = whole(large);
      for (const {what, now} of tables) {
        assert.equal(servers(since(printed, large, now)!), servers(whole(now)), `${count} servers: ${what}`);
        assert.deepEqual(
          changedSince(printed, large, now),
          serversChanged(printed, whole(now)),
          `${count} servers: ${what}: named as changed`,
        );
      }
    }
  });

  it('finds a change on either side of a page boundary, counted from either end', () => {
    // The tables are compared a page (4,096 bytes) at a time from each end, then byte by byte. A
    // real server's hex digit is moved onto a boundary, or a byte either side, by spaces at the
    // end of the header (counted from the start) or of the last server's line (from the end).
    const hex = (n: number, width: number) => n.toString(16).toUpperCase().padStart(width, '0');
    const blocks = Array.from(
      {length: 1200},
      (_, s) =>
        `TCP  0A60${hex(s + 1, 4)}:0050 rr  \n${[1, 2, 3].map((r) => `  -> 0AF4${hex(s * 4 + r, 4)}:1F90      Masq    1\n`).join('')}`,
    );
    const [first, ...rest] = kernelTable.split('\n').slice(0, 3);
    const tableWith = (headPad: number, tailPad: number) =>
      [first + ' '.repeat(headPad), ...rest].join('\n') +
      '\n' +
      blocks.slice(0, -1).join('') +
      blocks.at(-1)!.replace(' rr  \n', ` rr  ${' '.repeat(tailPad)}\n`);
    // A digit of a real server's hex address or port: after "-> ", before the line's next space.
    const isRealServerDigit = (table: string, at: number) => {
      const arrow = table.lastIndexOf('-> ', at);
      return /[0-9A-F]/.test(table[at]) && arrow > table.lastIndexOf('\n', at) && !table.slice(arrow + 3, at).includes(' ');
    };
    const flipped = (table: string, at: number) => table.slice(0, at) + (table[at] === 'A' ? 'B' : 'A') + table.slice(at + 1);
    const whole = (text: string) => since('', '', text)!;
    const cases: {what: string; before: string; now: string}[] = [];
    for (const page of [1, 2, 3, 20])
      for (const offset of [-1, 0, 1]) {
        const at = page * 4096 + offset;
        const padded = tableWith(64, 64);
        let digit = at;
        while (!isRealServerDigit(padded, digit)) digit++;
        const fromHead = tableWith(64 - (digit - at), 64);
        cases.push({what: `byte ${at} from the start`, before: fromHead, now: flipped(fromHead, at)});
        // From the end: the digit `at` bytes before the last byte.
        let back = padded.length - 1 - at;
        while (!isRealServerDigit(padded, back)) back--;
        const fromTail = tableWith(64, 64 - (padded.length - 1 - at - back));
        // With a change near the start too, so that the one from the end is found by the tail alone.
        const nearStart = fromTail.indexOf('-> ') + 3;
        cases.push({
          what: `byte ${at} from the end`,
          before: fromTail,
          now: flipped(flipped(fromTail, fromTail.length - 1 - at), nearStart),
        });
      }
    for (const {what, before, now} of cases) assert.equal(servers(since(whole(before), before, now)!), servers(whole(now)), what);
  });

  it('finds a change after one in the header of a table that begins with an empty line', () => {
    const table = `\n${before}`;
    const now = table.replace('version 1.2.1', 'version 1.2.2').replace(/(0AF40103:1F90 +Masq +)0/, '$11');
    assert.equal(servers(since(printed, table, now)!), servers(printed.replace('10.244.1.3:8080 -m -w 0', '10.244.1.3:8080 -m -w 1')));
  });

  it('leaves to ipvsadm -Sn what the table cannot say as it does', () => {
    assert.equal(since(printed, before, before.replace('persistent 2700000', 'persistent 3600000')), undefined, 'persistence, in ticks');
    assert.equal(since(printed, before, `${before}FWM  00000001 rr  \n`), undefined, 'a fwmark service');
    assert.equal(since(printed, before, before.replace(/(0AF40102:1F90 +)Masq/, '$1Route')), undefined, 'direct routing');
    assert.equal(since(printed, before, before.replace('0A60000A:0050 rr  ', '0A60000A:0050 rr ops ')), undefined, 'one-packet scheduling');
  });
});

describe('the table compared as it is read', () => {
  /** The table read `chunk` bytes at a time into one buffer, as readProcFile gives it: the shape after each read, and at the end. */
  const readInChunks = (table: string, chunk: number, onShape: (shape: Buffer) => void = () => {}) => {
    const bytes = Buffer.from(table, 'latin1');
    const shaper = new ServerTableShaper();
    for (let read = chunk; read < bytes.length; read += chunk) onShape(shaper.more(bytes.subarray(0, read)));
    return shaper.end(bytes);
  };

  it('shapes the lines read whole as it goes, to the shape of the table read at once', () => {
    for (const table of [kernelTable, kernelTable.trimEnd(), `\n${kernelTable}`])
      for (const chunk of [1, 2, 7, 64, 100, table.length])
        assert.equal(
          readInChunks(table, chunk).toString('latin1'),
          serverTableShapeBytes(Buffer.from(table, 'latin1')).toString('latin1'),
          `${chunk}`,
        );
  });

  /** ServerTableComparison of `now` with `before` as it is read: what it spelled, after how many bytes, and whether that was the only difference. */
  const compared = (now: string, chunk = 16) => {
    const comparison = new ServerTableComparison(Buffer.from(before, 'latin1'), printed);
    let spelled: {text: string; servers: string[]; after: number} | undefined;
    const shape = readInChunks(now, chunk, (soFar) => {
      const changed = comparison.more(soFar);
      if (changed) {
        assert.equal(spelled, undefined, 'one server spelled');
        spelled = {text: changed.text, servers: [...changed.changedServers], after: soFar.length};
      }
    });
    return {spelled, only: comparison.differsOnlyInSpelled(shape), shape};
  };

  it('names a server changed in place once its block is read, before the rest of the table, as savedTextSince spells it', () => {
    const now = serverTableShape(kernelTable.replace(/(0AF40103:1F90 +Masq +)0/, '$11'));
    const {spelled, only, shape} = compared(now);
    assert.deepEqual(spelled?.servers, ['-t 10.96.0.10:80']);
    assert.ok(spelled.after <= now.indexOf('  -> [fd00'), `named after ${spelled.after} bytes, before the IPv6 server's real server`);
    assert.equal(servers(spelled.text), servers(since(printed, before, now)!));
    assert.equal(only, true);
    assert.equal(shape.toString('latin1'), now);
  });

  it('names a real server removed, and a changed server that is the last, once the table ends', () => {
    const removed = compared(serverTableShape(kernelTable.replace(/ {2}-> 0AF40102:1F90 .*\n/, '')));
    assert.deepEqual(removed.spelled?.servers, ['-t 10.96.0.10:80']);
    assert.equal(servers(removed.spelled.text), servers(printed.replace('-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1\n', '')));
    assert.equal(removed.only, true);
    // The last server's block ends with the table: it is not sure until the read ends, and left to savedTextSince.
    const last = compared(serverTableShape(kernelTable.replace(/(0000:0005\]:192B +Masq +)1/, '$12')));
    assert.equal(last.spelled, undefined);
    assert.equal(last.only, false);
  });

  it('names no server where one is added or removed, and says when more than the one named changed', () => {
    const added = serverTableShape(
      kernelTable.replace(
        'TCP  0A60000A:0050',
        'TCP  0A60000C:0050 rr  \n  -> 0AF40109:1F90      Masq    1      0          0         \nTCP  0A60000A:0050',
      ),
    );
    assert.deepEqual(compared(added), {spelled: undefined, only: false, shape: Buffer.from(added, 'latin1')});
    const removed = serverTableShape(kernelTable.replace(/TCP {2}0A60000A:0050[^]*?(?=TCP)/, ''));
    assert.equal(compared(removed).spelled, undefined);
    const both = compared(
      serverTableShape(kernelTable.replace(/(0AF40103:1F90 +Masq +)0/, '$11').replace(/(0000:0005\]:192B +Masq +)1/, '$12')),
    );
    assert.deepEqual(both.spelled?.servers, ['-t 10.96.0.10:80']);
    assert.equal(both.only, false);
    // A table that goes on past the one before differs there.
    assert.equal(
      compared(serverTableShape(kernelTable.replace(/(0AF40103:1F90 +Masq +)0/, '$11')) + 'TCP  0A60000C:0050 rr  \n').only,
      false,
    );
  });

  it('leaves to the end what it cannot spell', () => {
    const persistence = compared(serverTableShape(kernelTable.replace(/(0AF40104:0035 +Masq +)1/, '$12')));
    assert.equal(persistence.spelled, undefined, 'a server with persistence: its timeout is in ticks');
    assert.equal(persistence.only, false);
  });

  it('names only a server that changed, and says it was the only one only when it was, whatever changed and moved', () => {
    let seed = 7;
    const random = (below: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % below);
    const hex = (value: number, digits: number) => value.toString(16).toUpperCase().padStart(digits, '0');
    const block = (server: number, reals: number[]) =>
      `TCP  0A60${hex(server, 4)}:0050 rr  \n${reals.map((real) => `  -> 0AF4${hex(real, 4)}:1F90      Masq    1\n`).join('')}`;
    const header = 'IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n';
    const tableOf = (table: Array<[number, number[]]>) => header + table.map(([server, reals]) => block(server, reals)).join('');
    const printedOf = (table: Array<[number, number[]]>) =>
      table
        .map(([server, reals]) => {
          const words = `-t 10.96.${server >> 8}.${server & 255}:80`;
          return `-A ${words} -s rr\n${reals.map((real) => `-a ${words} -r 10.244.${real >> 8}.${real & 255}:8080 -m -w 1\n`).join('')}`;
        })
        .join('');
    for (let round = 0; round < 400; round++) {
      const serversBefore: Array<[number, number[]]> = Array.from({length: 1 + random(6)}, (_, index) => [
        index + 1,
        Array.from({length: random(4)}, (_, real) => 10 * index + real),
      ]);
      const now = serversBefore.map(([server, reals]): [number, number[]] => [server, [...reals]]);
      for (let edits = 1 + random(3); edits > 0; edits--) {
        const which = random(now.length + 1);
        switch (random(5)) {
          case 0: // a real server added or removed in place
            if (which < now.length) {
              if (now[which][1].length > 0 && random(2) === 0) now[which][1].splice(random(now[which][1].length), 1);
              else now[which][1].push(100 + random(50));
            }
            break;
          case 1: // a server removed
            if (which < now.length && now.length > 1) now.splice(which, 1);
            break;
          case 2: // a server added
            now.splice(which, 0, [50 + random(20), [200 + random(50)]]);
            break;
          default: // a server deleted and added again elsewhere, maybe with other real servers
            if (which < now.length) {
              const [moved] = now.splice(which, 1);
              if (random(2) === 0) moved[1].push(300 + random(50));
              now.splice(random(now.length + 1), 0, moved);
            }
        }
      }
      // One table holds a server once.
      const seen = new Set<number>();
      const unique = now.filter(([server]) => !seen.has(server) && seen.add(server));
      const [beforeTable, nowTable, printedBefore] = [tableOf(serversBefore), tableOf(unique), printedOf(serversBefore)];
      const comparison = new ServerTableComparison(Buffer.from(beforeTable, 'latin1'), printedBefore);
      const shaper = new ServerTableShaper();
      const bytes = Buffer.from(nowTable, 'latin1');
      const chunk = 1 + random(40);
      let spelled: ReturnType<ServerTableComparison['more']>;
      for (let read = chunk; read < bytes.length; read += chunk) spelled ??= comparison.more(shaper.more(bytes.subarray(0, read)));
      const shape = shaper.end(bytes);
      const whole = savedTextSince(printedBefore, Buffer.from(beforeTable, 'latin1'), shape)!;
      const what = `round ${round}: ${JSON.stringify(serversBefore)} -> ${JSON.stringify(unique)}, read ${chunk} bytes at a time`;
      if (spelled) {
        assert.equal(spelled.changedServers.size, 1, what);
        const [named] = spelled.changedServers;
        assert.ok(whole.changedServers.has(named), `${what}: ${named} did not change`);
        const linesOf = (text: string) =>
          text
            .split('\n')
            .filter((line) => line.includes(`${named} `) || line.endsWith(named))
            .sort();
        assert.deepEqual(linesOf(spelled.text), linesOf(whole.text), what);
      }
      const only = comparison.differsOnlyInSpelled(Buffer.from(shape));
      assert.equal(only, spelled !== undefined && whole.changedServers.size === 1, what);
      if (only) assert.equal(servers(spelled!.text), servers(whole.text), what);
    }
  });
});
