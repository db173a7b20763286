#!/usr/bin/env bash
# The recipe of etcd, kube-apiserver and kube-controller-manager: builds
# whichever of them is missing from the directory given, and prints their
# paths. Run test/tools/build.sh, which chooses that directory (keyed by
# this file, lib.sh and the modules).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
out=$1
lock "$out"

k8s_version=$(modversion "$here/go.mod" k8s.io/kubernetes)
minor=${k8s_version#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
build "$out" etcd "$here/../etcd" . "-s -w"
build "$out" kube-apiserver "$here" k8s.io/kubernetes/cmd/kube-apiserver "$ldflags"
build "$out" kube-controller-manager "$here" k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags"
