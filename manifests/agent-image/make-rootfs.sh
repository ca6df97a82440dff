#!/bin/sh
# The agent image's root filesystem from Debian packages: make-rootfs.sh ROOTFS [SUITE].
# Run by `npm run release` (scripts/release/agent-image.ts) and by manifests/Dockerfile, so that
# both images hold the same files. Needs mmdebstrap and root.
#
# The packages are unpacked, not installed (mmdebstrap --variant=extract): installing needs dpkg,
# a shell and the rest of Debian's essential set inside the image, twice the size of what the
# agent runs (docs/release.md has the figures). What the packages' maintainer scripts would do for the programs the agent runs is done
# below. SOURCE_DATE_EPOCH, when set, is passed on: mmdebstrap then uses it where it writes dates.
set -eu
rootfs=$1
suite=${2:-bookworm}
here=$(cd "$(dirname "$0")" && pwd)
packages=$(grep -v '^#' "$here/packages" | grep -v '^$' | paste -sd, -)

mmdebstrap --quiet --mode=root --variant=extract --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*' \
  --dpkgopt='path-exclude=/usr/lib/aarch64-linux-gnu/gconv/*' \
  --extract-hook='mkdir -p "$1/usr/share/proxyctl-agent" && ls "$1/var/cache/apt/archives" | grep "\.deb$" | LC_ALL=C sort >"$1/usr/share/proxyctl-agent/debian-packages"' \
  "$suite" "$rootfs"

# iptables' postinst: `iptables` and its restore/save are the nf_tables front end (Debian's
# default, through update-alternatives; there is no update-alternatives in the image).
for tool in iptables iptables-restore iptables-save ip6tables ip6tables-restore ip6tables-save; do
  ln -sfn "$(echo "$tool" | sed 's/tables/tables-nft/')" "$rootfs/usr/sbin/$tool"
done
# base-passwd's part: the agent runs as root, and tools that name users find root.
echo 'root:x:0:0:root:/root:/usr/sbin/nologin' >"$rootfs/etc/passwd"
echo 'root:x:0:' >"$rootfs/etc/group"
mkdir -p "$rootfs/root"
# libc-bin's: the dynamic linker's cache.
ldconfig -r "$rootfs"
# What the container runtime provides or mmdebstrap left from this machine and its run.
rm -rf "$rootfs"/dev/* "$rootfs"/var/cache/apt "$rootfs"/var/cache/ldconfig "$rootfs"/var/lib/apt "$rootfs"/var/log/* \
  "$rootfs"/etc/hostname "$rootfs"/etc/resolv.conf "$rootfs"/etc/machine-id
