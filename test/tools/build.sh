#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kube-controller-manager from their Go modules
# into a cache directory outside the repo, keyed by the tool modules' content,
# and prints that directory. A cold build takes 10-20 minutes on 2 cores; a
# cached one returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=v1.36.3
key=$(cat "$here"/kube/go.mod "$here"/kube/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum "$here"/build.sh | sha256sum | cut -c1-12)
cache_root=${VOLUME_AGENT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volume-agent/tools}
out="$cache_root/$k8s_version-$key"
mkdir -p "$out/bin"

build() { # name, module dir, package, ldflags
	local name=$1 dir=$2 pkg=$3 ldflags=$4
	[ -x "$out/bin/$name" ] && return 0
	echo "building $name into $out/bin (cached after the first time)" >&2
	(cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/bin/$name.tmp" "$pkg")
	mv "$out/bin/$name.tmp" "$out/bin/$name"
}

minor=${k8s_version#v1.}; minor=${minor%%.*}
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
build etcd "$here/etcd" . "-s -w"
build kube-apiserver "$here/kube" k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kube-controller-manager "$here/kube" k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
echo "$out/bin"
