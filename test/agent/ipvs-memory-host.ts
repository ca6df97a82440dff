// IpvsHost: a node's ipvs-mode state in memory (virtual and real servers, ipsets, kube-ipvs0's
// addresses, the iptables layer), driven and read by the same commands the kernel tools take.
import {ipvsRulesBackend, parseIpvsStateText} from '../../src/agent/api/rules/ipvs.ts';
import {formatIpvsadmRestore, type Ipset, type IpvsVirtualServer, parseIpvsadmSave, virtualServerKey} from '../../src/core/ipvs/index.ts';
import {joinHostPort} from '../../src/core/model/index.ts';
import {HostCommandError, restoreInputText} from '../../src/agent/host/host.ts';
import {ipvsTableHeader, RecordingHost} from './recording-host.ts';
import {isIPv6} from 'node:net';

/** A node's ipvs state in memory, driven by the same commands the kernel tools take. */
export class IpvsHost extends RecordingHost {
  readonly servers = new Map<string, IpvsVirtualServer>();
  readonly sets = new Map<string, Ipset>();
  readonly addresses = new Set<string>();
  device = false;
  /** What `ipvsadm -Lnc` prints. */
  connections = '';
  readonly inputs: {command: string; input: string}[] = [];

  override async ipvsadm(args: string[], input?: string): Promise<string> {
    this.calls.push(`ipvsadm ${args.join(' ')}`);
    if (args[0] === '-Sn') return formatIpvsadmRestore([...this.servers.values()]);
    if (args[0] === '-Lnc')
      return `IPVS connection entries\npro expire state       source             virtual            destination\n${this.connections}`;
    if (args[0] === '-R') {
      this.inputs.push({command: 'ipvsadm -R', input: input!});
      for (const line of input!.trim().split('\n')) this.#ipvsLine(line);
    }
    return '';
  }

  /** How many bytes of the table each read gives ipvsTable's onRead, as the kernel gives a page per read(). */
  tableReadBytes = 256;
  /** Called after each read of the table but the last, as it is read. */
  onTableRead?: (bytesRead: number) => void;

  /** The servers as the kernel's /proc/net/ip_vs spells them: addresses and ports in hex, with connection counts. */
  override async ipvsTable(onRead?: (read: Buffer) => void): Promise<Buffer> {
    this.calls.push('read /proc/net/ip_vs');
    const hexPort = (port: number) => port.toString(16).toUpperCase().padStart(4, '0');
    const lines = [...this.servers.values()].flatMap((server) => [
      `${server.protocol}  ${tableAddress(server.address)}:${hexPort(server.port)} ${server.scheduler} ` +
        (server.persistenceTimeout === undefined ? ' ' : ` persistent ${server.persistenceTimeout * 250} FFFFFFFF`),
      ...server.realServers.map(
        (real) =>
          `  -> ${tableAddress(real.address)}:${hexPort(real.port)}      Masq    ${real.weight}      ${this.activeConnections}          0         `,
      ),
    ]);
    const table = Buffer.from(ipvsTableHeader + lines.map((line) => `${line}\n`).join(''), 'latin1');
    for (let read = this.tableReadBytes; read < table.length; read += this.tableReadBytes) {
      onRead?.(table.subarray(0, read));
      this.onTableRead?.(read);
    }
    return table;
  }

  /** Each real server's ActiveConn in ipvsTable: traffic changes it, not the servers. */
  activeConnections = 0;

  #ipvsLine(line: string): void {
    const words = line.split(/\s+/);
    const protocol = words[1] === '-u' ? 'UDP' : 'TCP';
    const [, address, port] = /^\[?(.*?)\]?:(\d+)$/.exec(words[2])!;
    const key = virtualServerKey({protocol, address, port: Number(port)});
    const option = (flag: string) => (words.includes(flag) ? words[words.indexOf(flag) + 1] : undefined);
    const server = this.servers.get(key);
    const real = option('-r');
    switch (words[0]) {
      case '-A':
        if (server) throw new HostCommandError(['ipvsadm', '-R'], 1, 'Service already exists');
        this.servers.set(key, parseIpvsadmSave(`${line}\n`)[0]);
        return;
      case '-E':
        Object.assign(server!, {
          scheduler: option('-s') ?? server!.scheduler,
          persistenceTimeout: option('-p') === undefined ? undefined : Number(option('-p')),
        });
        return;
      case '-D':
        if (!server) throw new HostCommandError(['ipvsadm', '-R'], 1, 'No such service');
        this.servers.delete(key);
        return;
    }
    const [, realAddress, realPort] = /^\[?(.*?)\]?:(\d+)$/.exec(real!)!;
    const index = server!.realServers.findIndex((candidate) => joinHostPort(candidate.address, candidate.port) === real);
    if (words[0] === '-a') server!.realServers.push({address: realAddress, port: Number(realPort), weight: Number(option('-w') ?? 1)});
    else if (words[0] === '-e') server!.realServers[index].weight = Number(option('-w'));
    else if (words[0] === '-d') server!.realServers.splice(index, 1);
  }

  override async ipset(args: string[], input?: string): Promise<string> {
    this.calls.push(`ipset ${args.join(' ')}`);
    if (args[0] === 'list' && args[1] === '-t')
      return [...this.sets.values()]
        .map((set) =>
          [
            `Name: ${set.name}`,
            `Type: ${set.type}`,
            'Header: family inet hashsize 1024 maxelem 65536',
            `Size in memory: ${200 + 40 * set.entries.length}`,
            'References: 1',
            `Number of entries: ${set.entries.length}`,
          ].join('\n'),
        )
        .join('\n\n');
    if (args[0] === 'save') {
      const named = args[1] === undefined ? undefined : this.sets.get(args[1]);
      if (args[1] !== undefined && !named)
        throw new HostCommandError(['ipset', ...args], 1, 'ipset v7.17: The set with the given name does not exist');
      return (
        (named ? [named] : [...this.sets.values()])
          .map((set) =>
            [`create ${set.name} ${set.type} family inet`, ...set.entries.map((entry) => `add ${set.name} ${entry}`)].join('\n'),
          )
          .join('\n') + '\n'
      );
    }
    if (args[0] === 'destroy') this.sets.delete(args[1]);
    if (args[0] === 'restore') {
      this.inputs.push({command: 'ipset restore', input: input!});
      for (const line of input!.trim().split('\n')) {
        const [op, name, value] = line.split(/\s+/);
        if (op === 'create' && !this.sets.has(name)) this.sets.set(name, {name, type: value, entries: []});
        const set = this.sets.get(name)!;
        if (op === 'add' && !set.entries.includes(value)) set.entries.push(value);
        if (op === 'del') set.entries = set.entries.filter((entry) => entry !== value);
        if (op === 'flush') set.entries = [];
        set.entries.sort();
      }
    }
    return '';
  }

  override async ip(args: string[], input?: string): Promise<string> {
    this.calls.push(`ip ${args.join(' ')}`);
    const command = args.join(' ');
    if (command === 'link show kube-ipvs0' || command === '-j addr show dev kube-ipvs0' || command === '-br addr show dev kube-ipvs0') {
      if (!this.device) throw new HostCommandError(['ip', ...args], 1, 'Device "kube-ipvs0" does not exist.');
      if (command.startsWith('-j'))
        return JSON.stringify([{ifname: 'kube-ipvs0', addr_info: [...this.addresses].map((local) => ({local}))}]);
      if (command.startsWith('-br'))
        return `kube-ipvs0       DOWN           ${[...this.addresses].map((address) => `${address}/32`).join(' ')}\n`;
      return '';
    }
    if (command === 'link add kube-ipvs0 type dummy') this.device = true;
    if (command === 'link del kube-ipvs0') {
      this.device = false;
      this.addresses.clear();
    }
    if (command === '-batch -') {
      this.inputs.push({command: 'ip -batch', input: input!});
      for (const line of input!.trim().split('\n')) {
        const [, op, cidr] = line.split(/\s+/);
        const address = cidr.split('/')[0];
        if (op === 'replace') this.addresses.add(address);
        else if (!this.addresses.delete(address)) throw new HostCommandError(['ip', '-batch', '-'], 1, 'Cannot assign requested address');
      }
    }
    return '';
  }

  /** Keeps the rules as iptables-save prints them (MARK as --set-xmark, the source match first), as the kernel does. */
  override async iptablesRestore(...args: Parameters<RecordingHost['iptablesRestore']>): Promise<void> {
    const [family, rules, options] = args;
    const printed = restoreInputText(rules)
      .replace(/-j MARK --or-mark (\S+)/g, '-j MARK --set-xmark $1/$1')
      .replace(/-j MARK --xor-mark (\S+)/g, '-j MARK --set-xmark $1/0x0')
      .replace(/(-m set --match-set \S+ \S+) (! -s \S+)/g, '$2 $1');
    return super.iptablesRestore(family, printed, options);
  }

  inputsOf(command: string): string[] {
    return this.inputs.filter((entry) => entry.command === command).map((entry) => entry.input);
  }

  /** The node's state for one family, as the API reads it. */
  async applied() {
    return parseIpvsStateText(await ipvsRulesBackend().readApplied!(this, 'IPv4'));
  }
}

/** An address as /proc/net/ip_vs spells it: IPv4 as 8 hex digits, IPv6 in brackets as 8 groups of 4. */
function tableAddress(address: string): string {
  if (!isIPv6(address))
    return address
      .split('.')
      .map((octet) => Number(octet).toString(16).toUpperCase().padStart(2, '0'))
      .join('');
  const [head, tail = ''] = address.split('::');
  const groups = (part: string) => (part === '' ? [] : part.split(':'));
  const missing = 8 - groups(head).length - groups(tail).length;
  const all = address.includes('::') ? [...groups(head), ...Array(missing).fill('0'), ...groups(tail)] : groups(head);
  return `[${all.map((group) => group.padStart(4, '0')).join(':')}]`;
}
