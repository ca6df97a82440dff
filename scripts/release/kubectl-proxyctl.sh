#!/bin/sh
# kubectl proxyctl from a release archive: the plugin's bundle (dist/plugin/) on the Node runtime
# that came with it (node/bin/node), whatever node is on PATH or none. krew links this file from
# its bin directory, hence the links followed to find the archive's directory.
self=$0
while [ -L "$self" ]; do
  link=$(readlink "$self")
  case $link in
    /*) self=$link ;;
    *) self=${self%/*}/$link ;;
  esac
done
case $self in
  */*) here=${self%/*} ;;
  *) here=. ;;
esac
exec "$here/node/bin/node" "$here/dist/plugin/kubectl-proxyctl.js" "$@"
