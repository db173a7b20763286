#!/usr/bin/env bash
# Runs volume-agent in standalone mode on the example manifests: prepares the
# host directories they refer to, starts the agent with a root dir under
# /tmp/volume-agent-example, shows what it did, and on Ctrl-C (or after
# $EXAMPLE_DURATION seconds, if set) lets it unmount everything before it
# stops. Needs root (it mounts).
#
# Ctrl-C sends SIGINT to the terminal's whole process group: the agent runs
# in a session of its own (setsid), so only this script gets it, and the
# agent is stopped (SIGTERM) once every mount under its root is gone.
#
# EXAMPLE_BASE, EXAMPLE_DEBUG_ADDRESS, EXAMPLE_METRICS_ADDRESS,
# VOLUME_AGENT_BIN and RUNTIME_CONSUMER_BIN override the directory, the
# addresses and the binaries (tests run it that way).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
base=${EXAMPLE_BASE:-/tmp/volume-agent-example}
debug=${EXAMPLE_DEBUG_ADDRESS:-127.0.0.1:9808}
metrics=${EXAMPLE_METRICS_ADDRESS:-127.0.0.1:9809}
agent_bin=${VOLUME_AGENT_BIN:-$repo/bin/volume-agent}
consumer_bin=${RUNTIME_CONSUMER_BIN:-$repo/bin/runtime-consumer}
# How long the agent may take to unmount everything on Ctrl-C.
stop_timeout=${EXAMPLE_STOP_TIMEOUT:-60}

if [ "$(id -u)" -ne 0 ]; then
	echo "run as root: the agent mounts filesystems" >&2
	exit 1
fi
# curl talks to the agent's debug endpoint; minimal Debian images lack it.
if ! command -v curl >/dev/null; then
	echo "installing curl (Debian's package) to talk to the agent's debug endpoint" >&2
	apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends curl >&2
fi
mkdir -p "$base/local/content" "$base/host"
echo "<h1>served from a local PersistentVolume</h1>" >"$base/local/content/index.html"
rm -f "$base/local/content/from-worker.txt"
# The image volume's image: an OCI image layout built from a directory of
# the repository (there is no registry); the runtime unpacks it once.
"$consumer_bin" build-image -from "$here/image/greeting" -layout "$base/image-layout" -ref example.local/greeting:v1 >/dev/null
# The agent watches this copy; the demo tears down by emptying it.
rm -rf "$base/manifests"
mkdir -p "$base/manifests"
for f in "$here"/manifests/*.yaml; do
	sed "s#/tmp/volume-agent-example#$base#g" "$f" >"$base/manifests/$(basename "$f")"
done

mounts_left() { grep -c " $base/root/" /proc/self/mountinfo || true; }

# Its own session: the terminal's SIGINT (Ctrl-C) reaches this script only.
setsid "$agent_bin" --node-name example-node --root-dir "$base/root" \
	--pod-manifest-path "$base/manifests" --debug-address "$debug" --metrics-address "$metrics" &
agent=$!

# teardown removes the manifests, waits until the agent has unmounted
# everything (or died, or $stop_timeout seconds passed, or Ctrl-C was
# pressed again), then stops it.
teardown() {
	local status=$1 hurry=""
	trap - TERM HUP EXIT
	trap 'hurry=1' INT
	echo
	echo "== removing the manifests; the agent unmounts every volume (Ctrl-C again: stop it now, mounts stay)"
	rm -f "$base/manifests"/*.yaml
	local deadline=$((SECONDS + stop_timeout))
	while [ -z "$hurry" ] && [ "$(mounts_left)" -gt 0 ] && [ $SECONDS -lt $deadline ] && kill -0 "$agent" 2>/dev/null; do
		sleep 0.1
	done
	kill -TERM "$agent" 2>/dev/null || true
	wait "$agent" 2>/dev/null || true
	# The agent made its root directory a shared mount (a bind onto
	# itself: this machine's / is not shared) and leaves it, as the kubelet
	# leaves its own; the example takes it away with everything else.
	if [ "$(mounts_left)" -eq 0 ] && grep -q " $base/root " /proc/self/mountinfo; then
		umount "$base/root" 2>/dev/null || true
	fi
	local left
	left=$(mounts_left)
	echo "== agent stopped; mounts left under $base/root: $left"
	if [ "$left" -gt 0 ]; then
		grep " $base/root/" /proc/self/mountinfo | awk '{print "  " $5}' >&2
		status=1
	fi
	exit "$status"
}
trap 'teardown 130' INT
trap 'teardown 143' TERM
trap 'teardown 129' HUP
trap 'teardown $?' EXIT

for _ in $(seq 100); do
	curl -sf "http://$debug/readyz" >/dev/null && break
	sleep 0.1
done
sleep 0.5
echo
echo "== mounts the agent made (from /proc/self/mountinfo)"
grep " $base/root/" /proc/self/mountinfo | awk '{print "  " $5 "  (" $9 ")"}'
echo
echo "== pods (GET http://$debug/debug/dsw)"
curl -s "http://$debug/debug/dsw" | python3 -c '
import json, sys
for p in json.load(sys.stdin)["pods"]:
    print("  %s/%s volumesReady=%s" % (p["namespace"], p["name"], p["volumesReady"]))
    for e in p.get("errors") or []:
        print("    error: %s" % e["message"])
' 2>/dev/null || curl -s "http://$debug/debug/dsw"
echo
echo "== files of the pod \"configured\" (configMap, secret, downward API)"
for f in "$base"/root/pods/*/volumes/kubernetes.io~configmap/config/app.conf \
	"$base"/root/pods/*/volumes/kubernetes.io~downward-api/podinfo/labels; do
	[ -e "$f" ] && { echo "  $f:"; sed 's/^/    /' "$f"; echo; }
done
# The pods' containers, run by an example container runtime that asks the
# agent's runtime API (docs/runtime-api.md) where each volume is.
echo "== containers (examples/runtime-consumer: each command in its own mount namespace, volumes from $base/root/runtime.sock)"
"$consumer_bin" -socket "$base/root/runtime.sock" -manifests "$base/manifests" -timeout 5s \
	-image-layout "$base/image-layout" -image-cache "$base/image-cache" 2>&1 | sed 's/^/  /' || true
echo
echo "Explore: open http://$debug/ in a browser, or run: bin/volume-agent status --address $debug [--watch] [--pod default/web]"
echo "         curl http://$debug/debug/asw | /debug/operations | /debug/api-volumes | /debug/events ; curl http://$metrics/metrics"
echo "Edit or add manifests in $base/manifests and watch the agent follow. Ctrl-C to stop."
if [ -n "${EXAMPLE_DURATION:-}" ]; then
	sleep "$EXAMPLE_DURATION"
else
	wait "$agent"
fi
