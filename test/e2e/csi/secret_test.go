package csi_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// A PV with a nodeStageSecretRef: while the Secret does not exist the
// volume is not staged (a FailedMount event names the secret; the driver is
// never asked), and once it exists the agent GETs it (as its
// ServiceAccount, seen in the audit log) and NodeStageVolume carries its
// data to the driver (seen by a recording proxy in front of the driver).
func TestNodeStageSecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "stage-secret")
	d := e.newDriver("drv", driverOptions{proxy: true})
	suite.CreateCSIDriver(t, d.name, storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)})
	const secret = "stage-creds"
	v := e.claimPV(d, "data", func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: e.ns, Name: secret}
	})
	e.startAgent(agentOptions{args: []string{d.flag()}})

	pod := e.createPod(e.pod("app", e2eutil.ClaimVolume("data", v.claim)))
	e.waitEvent("app", "FailedMount", "reading secret "+e.ns+"/"+secret)
	d.checkCalls(t, map[string]int{"NodeStageVolume": 0})

	data := map[string]string{"username": "alice", "password": "correct horse"}
	if _, err := suite.Admin.CoreV1().Secrets(e.ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret}, StringData: data,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	staging, target := e.stagingPath(v), e.publishPath(pod.UID, v.pv)
	e.waitMounted(staging, target)

	stages := d.proxy.stageRequests(v.handle)
	if len(stages) != 1 || !maps.Equal(stages[0].GetSecrets(), data) {
		var got []map[string]string
		for _, s := range stages {
			got = append(got, s.GetSecrets())
		}
		t.Errorf("NodeStageVolume secrets %v; want one call with %v", got, data)
	}
	e2eutil.Poll(t, 30*time.Second, "the agent's GET of the secret in the audit log", func(context.Context) (bool, string) {
		events, err := suite.Cluster.AuditEvents()
		if err != nil {
			return false, err.Error()
		}
		codes := []int{}
		for _, ev := range events {
			if ev.User.Username == suite.User && ev.Stage == cluster.StageResponseComplete && ev.Verb == "get" &&
				ev.ObjectRef != nil && ev.ObjectRef.Resource == "secrets" && ev.ObjectRef.Namespace == e.ns && ev.ObjectRef.Name == secret &&
				ev.ResponseStatus != nil {
				codes = append(codes, ev.ResponseStatus.Code)
				if ev.ResponseStatus.Code == 200 {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("GETs of the secret by %s answered %v", suite.User, codes)
	})

	e.deletePod("app")
	e.waitGone(target, e.podDir(pod.UID), staging)
	d.waitCalls("NodeUnstageVolume", 1)
	d.waitNoLoopDevices()
}
