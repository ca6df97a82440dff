// Installs the Debian packages proxyctl's tests and lab use, when a command is missing.
// Run by `npm test` and `npm run lab` so that one command sets up a fresh machine.
import {execFileSync, spawnSync} from 'node:child_process';

/** Command that must be on PATH -> Debian package that provides it. */
const needed: Record<string, string> = {
  ip: 'iproute2',
  iptables: 'iptables',
  'iptables-restore': 'iptables',
  nft: 'nftables',
  ipset: 'ipset',
  ipvsadm: 'ipvsadm',
  conntrack: 'conntrack',
  // Creates and reads the nfacct objects kube-proxy's iptables mode counts packets in.
  nfacct: 'nfacct',
  // Makes the lab API server's self-signed TLS certificate (kubectl sends its token only over TLS).
  openssl: 'openssl',
};

function onPath(command: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${command}`], {stdio: 'ignore'}).status === 0;
}

/**
 * Optional: the qemu guest that runs the ipvs kernel tests, what builds the agent image for its
 * test (mmdebstrap, umoci, strip), and podman, which that test loads the image into as an
 * operator's runtime would; the tests say so when they skip; a failed install is no error.
 */
const optional: Record<string, string> = {
  'qemu-system-x86_64': 'qemu-system-x86',
  busybox: 'busybox-static',
  cpio: 'cpio',
  mmdebstrap: 'mmdebstrap',
  umoci: 'umoci',
  strip: 'binutils',
  podman: 'podman',
};
const missingOptional = [
  ...new Set(
    Object.entries(optional)
      .filter(([cmd]) => !onPath(cmd))
      .map(([, pkg]) => pkg),
  ),
];
if (missingOptional.length > 0 && process.getuid?.() === 0) {
  console.error(`installing optional Debian packages: ${missingOptional.join(' ')}`);
  spawnSync('apt-get', ['install', '-y', '--no-install-recommends', ...missingOptional], {
    stdio: 'inherit',
    env: {...process.env, DEBIAN_FRONTEND: 'noninteractive'},
  });
}

const missing = [
  ...new Set(
    Object.entries(needed)
      .filter(([cmd]) => !onPath(cmd))
      .map(([, pkg]) => pkg),
  ),
];
if (missing.length === 0) process.exit(0);

if (process.getuid?.() !== 0) {
  console.error(
    `proxyctl needs these Debian packages: ${missing.join(' ')}. Install them as root: apt-get install -y ${missing.join(' ')}`,
  );
  process.exit(0); // root-only tests say they skip; the rest can still run
}

console.error(`installing Debian packages: ${missing.join(' ')}`);
const env = {...process.env, DEBIAN_FRONTEND: 'noninteractive'};
const install = () => spawnSync('apt-get', ['install', '-y', '--no-install-recommends', ...missing], {stdio: 'inherit', env});
if (install().status !== 0) {
  execFileSync('apt-get', ['update'], {stdio: 'inherit', env});
  if (install().status !== 0) {
    console.error(`apt-get install ${missing.join(' ')} failed`);
    process.exit(1);
  }
}
