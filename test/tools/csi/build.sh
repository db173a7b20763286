#!/usr/bin/env bash
# The recipe of the CSI sidecars (csi-provisioner, csi-attacher,
# csi-resizer): builds whichever of them is missing from the directory
# given, and prints their paths. Run test/tools/build.sh, which chooses that
# directory (keyed by this file, lib.sh and the module).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
out=$1
lock "$out"

# Each reports its module's version (main.version) in its log and --version.
sidecar() { # name, module, package in the module
	build "$out" "$1" "$here" "$2/$3" "-s -w -X main.version=$(modversion "$here/go.mod" "$2")"
}
sidecar csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 cmd/csi-provisioner
sidecar csi-attacher github.com/kubernetes-csi/external-attacher/v4 cmd/csi-attacher
sidecar csi-resizer github.com/kubernetes-csi/external-resizer/v2 cmd/csi-resizer
