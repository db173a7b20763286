#!/usr/bin/env bash
# Starts etcd, kube-apiserver and kube-controller-manager on 127.0.0.1 in the
# background and prints how to reach them. State, kubeconfigs and logs go to
# .cluster/ in the repository root unless --dir DIR is given; other flags:
# --nodes a,b (Nodes to create, default node-1). Stop with hack/cluster-down.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# A cold build of the binaries takes 10-20 minutes; later runs are instant.
if [ -z "${VOLUME_AGENT_TOOLS_BIN:-}" ]; then
	VOLUME_AGENT_TOOLS_BIN=$(test/tools/build.sh)
	export VOLUME_AGENT_TOOLS_BIN
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/cluster-up" ./test/cluster/cmd/cluster-up
# The command detaches; removing its binary afterwards does not affect it.
"$tmp/cluster-up" "$@"
