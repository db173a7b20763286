#!/usr/bin/env bash
# Stops the control plane started by hack/cluster-up.sh (apiserver before
# etcd) and removes its directory, .cluster/ unless --dir DIR is given.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/cluster-up" ./test/cluster/cmd/cluster-up
"$tmp/cluster-up" --down "$@"
