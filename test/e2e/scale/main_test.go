// Package scale_test checks that an agent's memory and API traffic follow
// what its node's pods use, not how many claims and volumes the cluster
// holds: the real binary against a real etcd and kube-apiserver holding
// thousands of PersistentVolume/PersistentVolumeClaim pairs of other
// nodes (scale_test.go).
//
// The control plane runs no PV binder (nor the protection controllers,
// nor the garbage collector): they would work through every foreign pair
// on this machine's two cores for minutes. The tests make their pairs in
// their bound state (e2eutil.BindPair), as the binder leaves them, and
// bind the claims they watch being bound themselves.
//
// After the tests, TestMain reads the audit log: no request of the agents
// was refused, and they never listed or watched claims, volumes or
// attachments but one by one, by name.
package scale_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

var suite e2eutil.Suite

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite, e2eutil.SuiteOptions{
		Name: "scale",
		ControlPlane: e2eutil.ControlPlaneOptions{Controllers: []string{
			"serviceaccount-controller", "serviceaccount-token-controller", "namespace-controller", "root-ca-certificate-publisher-controller",
		}},
		Check: checkScoped,
	}))
}

// checkScoped: nothing the agents did was refused, and nothing they read
// grows with the cluster.
func checkScoped() bool {
	events, err := suite.Cluster.AuditEvents()
	if err != nil {
		fmt.Fprintf(os.Stderr, "audit check: %v\n", err)
		return false
	}
	ok := true
	counts, refused := e2eutil.Requests(events, suite.User)
	for _, e := range refused {
		fmt.Fprintf(os.Stderr, "audit check: FAIL: %s %s by %s was forbidden\n", e.Verb, e.RequestURI, e.UserAgent)
		ok = false
	}
	if bad := e2eutil.UnscopedReads(events, suite.User, "volume-agent/"); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "audit check: FAIL: claims, volumes or attachments listed or watched without a name selector: %v\n", bad)
		ok = false
	}
	e2eutil.PrintRequests(suite.User, counts, nil)
	if ok {
		fmt.Fprintln(os.Stderr, "audit check: ok: nothing refused, no list or watch of claims, volumes or attachments but by name")
	}
	return ok
}
