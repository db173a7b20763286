#!/usr/bin/env bash
# The recipe of ownership-peer (the kubelet's fsGroup code, for test/bench;
# its source is kube/ownership-peer, in the kube module so it runs the very
# release the control plane is built from): builds it if missing from the
# directory given, and prints its path. A group of its own, so changing it
# never rebuilds kube-apiserver.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
out=$1
lock "$out"
build "$out" ownership-peer "$here/../kube" ./ownership-peer "-s -w"
