#!/bin/sh
# Prints the path of Debian's kubectl (package kubernetes-client), unpacked into .cache/debian of the repo.
# The machine's /usr/bin/kubectl may be another version; tests that check kubectl 1.20 use this copy.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
dest="$repo/.cache/debian"
bin="$dest/kubernetes-client/usr/bin/kubectl"
if [ ! -x "$bin" ]; then
  mkdir -p "$dest"
  cd "$dest"
  if ! apt-get download kubernetes-client >&2; then
    apt-get update >&2
    apt-get download kubernetes-client >&2
  fi
  deb=$(ls -t kubernetes-client_*.deb | head -n 1)
  rm -rf kubernetes-client
  dpkg-deb -x "$deb" kubernetes-client
  rm -f "$deb"
fi
echo "$bin"
