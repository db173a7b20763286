#!/usr/bin/env bash
# Installs what the test suite needs on a Debian machine, when run as root
# and something is missing: e2fsprogs (mkfs.ext4, resize2fs), xfsprogs
# (mkfs.xfs, xfs_growfs), util-linux (losetup, blkid, setsid, unshare) and
# mount, which the volume plugins and the test CSI driver call; curl
# (examples/run.sh, tested by test/e2e/example); Debian's chromium, the real
# browser the operator page is tested in (test/e2e/page). It also makes sure
# loop device nodes exist (some minimal images have only /dev/loop-control).
# `make test` and .ci/run run it; as another user it only says what is
# missing.
set -euo pipefail

missing=()
for cmd in mkfs.ext4 mkfs.xfs losetup blkid setsid unshare curl chromium; do
	command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "test-deps: missing ${missing[*]}; run as root to install them (the tests that need them fail or skip, saying why)" >&2
		exit 0
	fi
	echo "test-deps: installing packages for: ${missing[*]}" >&2
	apt-get update -q >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		e2fsprogs xfsprogs util-linux mount curl chromium >&2
fi
if [ "$(id -u)" -eq 0 ]; then
	modprobe loop 2>/dev/null || true
	for i in $(seq 0 15); do
		[ -e /dev/loop$i ] || mknod -m 660 /dev/loop$i b 7 "$i" 2>/dev/null || true
	done
fi
