#!/usr/bin/env bash
# Runs every Go fuzz target of the module (func FuzzXxx in a _test.go file)
# for FUZZTIME each (default 30s), one after the other; stops at the first
# failure, whose input go test saves under the package's testdata/fuzz/.
# `make test` runs only the saved corpora (plain go test); this explores.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
targets=$(grep -rE --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]+' . |
	sed -E 's#^\./(.*)/[^/]+_test\.go:func (Fuzz.*)#\1 \2#' | sort -u)
if [ -z "$targets" ]; then
	echo "no fuzz targets" >&2
	exit 1
fi
while read -r dir fn; do
	echo "== $fn (./$dir, $FUZZTIME)"
	"$GO" test -run '^$' -fuzz "^${fn}\$" -fuzztime "$FUZZTIME" "./$dir"
done <<<"$targets"
