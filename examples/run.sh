#!/usr/bin/env bash
# Runs volume-agent in standalone mode on the example manifests: prepares the
# host directories they refer to, starts the agent with a root dir under
# /tmp/volume-agent-example, shows what it did, and on Ctrl-C (or after
# $EXAMPLE_DURATION seconds, if set) lets it unmount everything before it
# stops. Needs root (it mounts).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
base=/tmp/volume-agent-example
debug=127.0.0.1:9808

if [ "$(id -u)" -ne 0 ]; then
	echo "run as root: the agent mounts filesystems" >&2
	exit 1
fi
mkdir -p "$base/local/content" "$base/host"
echo "<h1>served from a local PersistentVolume</h1>" >"$base/local/content/index.html"
# The agent watches this copy; the demo tears down by emptying it.
rm -rf "$base/manifests"
cp -r "$here/manifests" "$base/manifests"

"$repo/bin/volume-agent" --node-name example-node --root-dir "$base/root" \
	--pod-manifest-path "$base/manifests" --debug-address "$debug" --metrics-address 127.0.0.1:9809 &
agent=$!

teardown() {
	trap - INT TERM EXIT
	echo
	echo "== removing the manifests; the agent unmounts every volume"
	rm -f "$base/manifests"/*.yaml
	for _ in $(seq 200); do
		[ -z "$(grep " $base/root/" /proc/self/mountinfo)" ] && break
		sleep 0.05
	done
	kill -TERM "$agent" 2>/dev/null || true
	wait "$agent" 2>/dev/null || true
	left=$(grep -c " $base/root/" /proc/self/mountinfo || true)
	echo "== agent stopped; mounts left under $base/root: $left"
}
trap teardown INT TERM EXIT

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
echo
echo "Explore: curl http://$debug/debug/asw | /debug/operations | /debug/api-volumes | /debug/events ; curl http://127.0.0.1:9809/metrics"
echo "Edit or add manifests in $base/manifests and watch the agent follow. Ctrl-C to stop."
if [ -n "${EXAMPLE_DURATION:-}" ]; then
	sleep "$EXAMPLE_DURATION"
else
	wait "$agent"
fi
