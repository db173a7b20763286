#!/usr/bin/env bash
# Builds the programs the integration tests run from their Go modules into
# caches outside the repo, and prints one directory that holds them all:
#
#   kube/build.sh  etcd, kube-apiserver and kube-controller-manager (modules
#                  test/tools/etcd and test/tools/kube); 10-20 minutes cold
#   csi/build.sh   csi-provisioner, csi-attacher and csi-resizer, the real
#                  CSI sidecars (module test/tools/csi); a few minutes cold
#   peer/build.sh  ownership-peer, the kubelet's fsGroup code for make bench
#                  (module test/tools/kube, its own cache key)
#
# Each group has a cache directory of its own, keyed by what decides its
# binaries: its modules (go.mod, go.sum, wrapper sources) and its recipe (its
# build.sh and lib.sh). A change to one group never rebuilds the other; above
# all, changing the sidecars never rebuilds kube-apiserver. A cached group
# returns at once. The directory printed (VOLUME_AGENT_TOOLS_BIN) holds
# symbolic links into both caches and is named by both keys; it is made aside
# and renamed into place, so nobody ever sees it half made.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
cache_root=${VOLUME_AGENT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volume-agent/tools}

key() { cat "$@" | sha256sum | cut -c1-12; }
k8s_version=$(modversion "$here/kube/go.mod" k8s.io/kubernetes)
kube_key=$(key "$here"/kube/go.mod "$here"/kube/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum "$here"/etcd/main.go \
	"$here"/kube/build.sh "$here"/lib.sh)
csi_key=$(key "$here"/csi/go.mod "$here"/csi/go.sum "$here"/csi/build.sh "$here"/lib.sh)
peer_key=$(key "$here"/kube/go.mod "$here"/kube/go.sum "$here"/kube/ownership-peer/main.go "$here"/peer/build.sh "$here"/lib.sh)

mkdir -p "$cache_root"
# Each recipe prints the paths of its binaries, one a line.
bins=$("$here/kube/build.sh" "$cache_root/$k8s_version-$kube_key/bin")
bins+=$'\n'$("$here/csi/build.sh" "$cache_root/csi-$csi_key/bin")
bins+=$'\n'$("$here/peer/build.sh" "$cache_root/peer-$peer_key/bin")

out="$cache_root/bin-$kube_key-$csi_key-$peer_key"
if [ ! -d "$out" ]; then
	tmp=$(mktemp -d "$cache_root/.bin-XXXXXX")
	chmod 755 "$tmp"
	while read -r bin; do ln -s "$bin" "$tmp/"; done <<<"$bins"
	# Fails only if another run made it meanwhile: the same links.
	mv -T "$tmp" "$out" 2>/dev/null || rm -rf "$tmp"
fi
echo "$out"
