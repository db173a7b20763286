# volume-agent. Targets that mount things (test, e2e, bench, run) need root.
GO          ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
BIN         := bin/volume-agent
# Tests and scripts run `go` themselves: keep the toolchain found above on PATH.
export PATH := $(dir $(GO)):$(PATH)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The control plane and the CSI sidecars for cluster tests are built from Go
# modules and cached outside the repo (see test/tools/build.sh); the first
# build takes minutes.
TOOLS_BIN    = $(shell test/tools/build.sh)
OWNERSHIP_FILES ?= 100000

.PHONY: all build run test deps unit e2e lint bench bench-scale fuzz tools cluster-up cluster-down clean

all: build

# Built as the image builds it (Dockerfile): static, no cgo, so what `make
# bench` measures is what runs on nodes (a cgo build maps libc too: about
# 1.5 MiB more resident memory).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(BIN) ./cmd/volume-agent

# Run the agent in standalone mode on the bundled example manifests.
run: build
	$(GO) build -o bin/runtime-consumer ./examples/runtime-consumer
	examples/run.sh

# Every test: lint, unit, real-mount integration, CSI conformance, the
# end-to-end suites against a real etcd + kube-apiserver, and the operator
# page in headless Chromium (required here: .ci/run installs it). Root is
# required too: a test that needs it fails rather than skips without it.
test: deps lint tools
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) VOLUME_AGENT_REQUIRE_BROWSER=1 VOLUME_AGENT_REQUIRE_ROOT=1 $(GO) test -race -timeout 30m ./...

# What the tests need from the machine (Debian packages, Chromium, loop
# devices), installed when run as root: hack/test-deps.sh.
deps:
	@hack/test-deps.sh

# Tests that need neither root nor a control plane.
unit:
	$(GO) test -race -short ./...

# The end-to-end suites (standalone, cluster mode, CSI, expansion, restarts,
# local volumes, a node without a kubelet with the real CSI sidecars) only.
e2e: tools
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) VOLUME_AGENT_REQUIRE_ROOT=1 $(GO) test -race -timeout 20m ./test/e2e/...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@# The planner stays pure: it imports nothing that touches the machine.
	$(GO) test -count=1 -run '^TestPlannerImportsNothingThatTouchesTheMachine$$' ./reconciler/planner/

# Planner and executor micro-benchmarks, then the end-to-end standalone
# benchmark (500 pods x 4 Memory emptyDirs at once, and arriving at 100 pods
# per second: the agent's CPU for that), the cluster-mode API volumes
# benchmark (500 pods x kube-api-access + configMap + secret against a real
# API server), the cluster-mode readiness benchmark (volumes mounted ->
# VolumesReady condition True, 100 and 500 pods x 4 PVCs), the fsGroup walk
# against the kubelet's own code on 100,000 files (OWNERSHIP_FILES=100000,1000000
# adds the million, much longer); see docs/performance.md. The many-node
# simulation takes longer: make bench-scale.
bench: build tools
	$(GO) test -run '^$$' -bench . -benchmem ./volume/ ./reconciler/planner/ ./operations/ ./source/manifest/ ./internal/atomicdir/ ./ui/ ./ui/timeline/ ./internal/subpath/ ./runtimeapi/server/ ./internal/safefs/ ./status/podstatus/ ./usage/
	$(GO) build -o bin/bench ./test/bench
	bin/bench -agent $(BIN) -pods 500 -volumes 4
	bin/bench -agent $(BIN) -pods 1000 -volumes 4 -idle 5s
	bin/bench -agent $(BIN) -pods 500 -volumes 4 -idle 5s -rate 100 -floor=false
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) bin/bench -scenario api-volumes -agent $(BIN) -pods 500
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) bin/bench -scenario api-volumes -agent $(BIN) -pods 500 -node-credentials
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) bin/bench -scenario readiness -agent $(BIN) -sizes 100,500 -volumes 4
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) bin/bench -scenario ownership -ownership-files $(OWNERSHIP_FILES)

# Many nodes against one API server (test/bench/manynodes, about 10 minutes
# on 2 cores): 20 agents, 20,000 PV/PVC pairs spread over their nodes, 50 pods
# per node; the API server's watches, CPU and memory, each agent's RSS, the
# watch events claim changes cause, bound → mounted. BASELINE=<an older
# volume-agent binary> measures it too, on the same cluster, for comparison;
# SCALE_ARGS adds flags (-pods-per-node 100 -claims-per-pod 10: every claim in
# use). See docs/performance.md.
bench-scale: build tools
	$(GO) build -o bin/bench-manynodes ./test/bench/manynodes
	VOLUME_AGENT_TOOLS_BIN=$(TOOLS_BIN) bin/bench-manynodes -agent $(BIN) $(if $(BASELINE),-baseline $(BASELINE)) $(SCALE_ARGS)

# Every Go fuzz target for FUZZTIME each (`make test` runs only their saved
# corpora in testdata/fuzz); a failing input is saved there.
FUZZTIME ?= 30s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) hack/fuzz.sh

tools:
	@test/tools/build.sh >/dev/null

cluster-up:
	hack/cluster-up.sh

cluster-down:
	hack/cluster-down.sh

clean:
	rm -rf bin
