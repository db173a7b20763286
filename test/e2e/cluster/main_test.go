// Package cluster_test tests volume-agent in cluster mode end to end: the
// real binary against a real etcd, kube-apiserver and kube-controller-manager
// (PV binder, ephemeral-volume controller, garbage collector...) from
// test/cluster, with real mounts under a temporary root directory per test.
//
// TestMain (e2eutil.RunSuite) builds cmd/volume-agent once (with -race when
// the tests run with it), starts one control plane for the package and
// creates the RBAC objects rendered from deploy/ (Namespace, ServiceAccount,
// ClusterRole, ClusterRoleBinding) with its ValidatingAdmissionPolicies.
// Every agent runs as that ServiceAccount, with a token bound to its pod on
// its node as in the DaemonSet, never as an administrator, so the suite
// proves that the ClusterRole suffices and the policies let it work; after the
// tests, TestMain reads the audit log and checks that everything it grants
// was used and that nothing the agent did was refused (see checkRBAC).
//
// Each test has its own Node, namespace, root directory and agent process.
// The tests need root (the agent mounts) and skip otherwise, in -short mode,
// with VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane binaries.
// Set VOLUME_AGENT_BINARY to test an agent built elsewhere. For debugging,
// VOLUME_AGENT_E2E_KEEP=1 keeps the control plane's directory (logs, audit
// log) even when the tests pass, and VOLUME_AGENT_E2E_LOG_DIR=DIR collects
// every agent's log.
package cluster_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// suite is what TestMain sets up for every test.
var suite e2eutil.Suite

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite, e2eutil.SuiteOptions{
		Name:      "cluster",
		CSIDriver: true,
		ControlPlane: e2eutil.ControlPlaneOptions{
			Nodes: credentialNodes,
			// ClusterTrustBundles and their projection, and
			// PodCertificateRequests, are beta and off by default in 1.36.
			APIServerArgs: []string{
				"--feature-gates=ClusterTrustBundle=true,ClusterTrustBundleProjection=true,PodCertificateRequest=true",
				"--runtime-config=certificates.k8s.io/v1beta1/clustertrustbundles=true,certificates.k8s.io/v1beta1/podcertificaterequests=true",
			},
			// The deploy/ admission policies are in force and every agent
			// runs with a token bound to its pod (Suite.StartAgent): no
			// agent request may be refused by them either (checkRBAC).
			AdmissionPolicies: true,
		},
		KeepDir: os.Getenv("VOLUME_AGENT_E2E_KEEP") != "",
		Check:   checkRBAC,
	}))
}

// credentialNodes are the nodes whose agents run with the node's own
// credentials (system:node:<name>, --node-kubeconfig).
var credentialNodes = []string{nodeCredsTest + "-node", trustBundleTest + "-node", podCertTest + "-node"}

var recordOnce sync.Once

// recordInputs makes go test's result cache depend on what the binaries
// are built from. go test reuses a passing result while no file or
// environment variable the tests looked at has changed, but the sources are
// only read by `go build`, so a cached pass could hide a broken agent. This
// stats them (and opens a VOLUME_AGENT_BINARY) from within a test: only
// what happens after m.Run starts is recorded.
func recordInputs(t *testing.T) {
	recordOnce.Do(func() {
		if f, err := os.Open(suite.AgentBin); err == nil {
			f.Close()
		}
		root, err := cluster.RepoRoot()
		if err == nil {
			err = statSources(root)
		}
		if err != nil {
			t.Logf("recording the sources for go test's cache: %v", err)
		}
	})
}

// statSources stats the module's Go sources, go.mod, go.sum and manifests.
func statSources(root string) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".mod", ".sum", ".yaml":
			_, err := os.Stat(path)
			return err
		}
		return nil
	})
}

// checkRBAC reads every request the agents' ServiceAccount made during the
// suite. No request may have been refused (403), no secret, configMap,
// claim, volume or attachment may have been listed or watched but one by
// name (e2eutil.UnscopedReads), and every (verb, resource) the ClusterRole
// grants must have been used at least once: a grant the suite never
// exercises is either superfluous or untested.
//
// One kind of 403 is not the ClusterRole's fault: a kube-apiserver that has
// just started serves requests before its RBAC caches are filled and before
// it reports ready, and refuses them (the controller manager's too). Those
// received while TestAPIServerOutage waited for the restarted API server to
// become ready are listed, not counted as failures.
func checkRBAC() bool {
	events, details, err := readAudit()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RBAC check: %v\n", err)
		return false
	}
	counts, refused := e2eutil.Requests(events, suite.User)
	ok := true
	forgiven := 0
	for _, e := range refused {
		d := details[e.AuditID]
		if apiServerStarting(d.RequestReceivedTimestamp) {
			fmt.Fprintf(os.Stderr, "RBAC check: ignored: %s %s by %s was forbidden by an API server still starting (%s)\n",
				e.Verb, e.RequestURI, e.UserAgent, d.RequestReceivedTimestamp.Format(time.RFC3339Nano))
			forgiven++
			continue
		}
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: %s %s by %s was forbidden: %s\n", e.Verb, e.RequestURI, e.UserAgent, d.ResponseStatus.Message)
		ok = false
	}
	if bad := e2eutil.UnscopedReads(events, suite.User, "volume-agent/"); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: secrets, configMaps, claims, volumes or attachments listed or watched without a name selector: %v\n", bad)
		ok = false
	}
	var rules []rbacv1.PolicyRule
	for _, r := range suite.ClusterRoles {
		rules = append(rules, r.Rules...)
	}
	granted := e2eutil.Grants(rules)
	e2eutil.PrintRequests(suite.User, counts, granted)
	if !e2eutil.FullRun() {
		fmt.Fprintln(os.Stderr, "RBAC check: only some tests ran: not checking that every grant was used")
		return ok
	}
	for _, g := range e2eutil.Unused(granted, counts) {
		if where, ok := usedElsewhere[g]; ok {
			fmt.Fprintf(os.Stderr, "RBAC check: %q is not used here; %s\n", g, where)
			continue
		}
		fmt.Fprintf(os.Stderr, "RBAC check: FAIL: the ClusterRole grants %q, which no agent used\n", g)
		ok = false
	}
	if ok {
		fmt.Fprintf(os.Stderr, "RBAC check: ok: all %d grants used, no request refused (%d by a starting API server ignored)\n", len(granted), forgiven)
	}
	return ok
}

// usedElsewhere are grants another suite exercises and checks: an agent
// watches a VolumeAttachment, and reports the node's volumesInUse, only for
// a CSI volume whose driver requires attaching, which only the CSI suite
// has.
var usedElsewhere = map[string]string{
	"patch nodes/status":                     "test/e2e/csi checks that its agents use it",
	"list volumeattachments.storage.k8s.io":  "test/e2e/csi checks that its agents use it",
	"watch volumeattachments.storage.k8s.io": "test/e2e/csi checks that its agents use it",
}

// auditDetails is what checkRBAC reads of an audit.k8s.io/v1 Event besides
// the harness's AuditEvent.
type auditDetails struct {
	AuditID                  string    `json:"auditID"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
	ResponseStatus           struct {
		Message string `json:"message"`
	} `json:"responseStatus"`
}

// readAudit reads the API server's audit log (audit.log in the cluster's
// directory), with the details of each request by audit ID.
func readAudit() ([]cluster.AuditEvent, map[string]auditDetails, error) {
	data, err := os.ReadFile(filepath.Join(suite.Cluster.Dir(), "audit.log"))
	if err != nil {
		return nil, nil, err
	}
	var events []cluster.AuditEvent
	details := map[string]auditDetails{}
	for line := range bytes.Lines(data) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			break // still being written
		}
		var e cluster.AuditEvent
		var d auditDetails
		if err := errors.Join(json.Unmarshal(line, &e), json.Unmarshal(line, &d)); err != nil {
			return nil, nil, fmt.Errorf("audit.log: %w", err)
		}
		events = append(events, e)
		details[d.AuditID] = d
	}
	return events, details, nil
}

// apiServerRestarts are the periods from a StopAPIServer until the
// restarted API server was ready.
var apiServerRestarts struct {
	sync.Mutex
	periods [][2]time.Time
}

func recordRestart(stopped, ready time.Time) {
	apiServerRestarts.Lock()
	defer apiServerRestarts.Unlock()
	apiServerRestarts.periods = append(apiServerRestarts.periods, [2]time.Time{stopped, ready})
}

func apiServerStarting(t time.Time) bool {
	apiServerRestarts.Lock()
	defer apiServerRestarts.Unlock()
	for _, p := range apiServerRestarts.periods {
		if !t.Before(p[0]) && !t.After(p[1]) {
			return true
		}
	}
	return false
}
