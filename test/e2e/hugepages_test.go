package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

func reserveHugePages(t *testing.T, n int) {
	t.Helper()
	requireE2E(t)
	mounttest.ReserveHugePages(t, n)
}

// A HugePages emptyDir of a pod requesting hugepages-2Mi is a hugetlbfs
// with pagesize=2M; a pod requesting two sizes gets the kubelet's error on
// its volume (in /debug/dsw, as an event and on the page) and the first pod
// is unaffected; once both pods are gone nothing is mounted.
func TestHugePagesEmptyDir(t *testing.T) {
	reserveHugePages(t, 4)
	a := newAgent(t)
	huge := newPod("huge", e2eutil.EmptyDirVolume("pages", corev1.StorageMediumHugePages, ""))
	huge.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
		"hugepages-2Mi": resource.MustParse("4Mi"), corev1.ResourceMemory: resource.MustParse("16Mi"),
	}
	huge.Spec.Containers[0].Resources.Requests = huge.Spec.Containers[0].Resources.Limits
	mixed := newPod("mixed", e2eutil.EmptyDirVolume("pages", corev1.StorageMediumHugePages, ""),
		e2eutil.EmptyDirVolume("scratch", corev1.StorageMediumMemory, "1Mi"))
	mixed.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
		"hugepages-2Mi": resource.MustParse("2Mi"), "hugepages-1Gi": resource.MustParse("1Gi"),
		corev1.ResourceMemory: resource.MustParse("16Mi"),
	}
	mixed.Spec.Containers[0].Resources.Requests = mixed.Spec.Containers[0].Resources.Limits
	a.Write("huge.yaml", huge)
	a.Write("mixed.yaml", mixed)
	a.Start()
	uid := a.waitReady("huge")["huge"]

	dir := a.volumeDir(uid, e2eutil.EmptyDirPlugin, "pages")
	m, err := mountAt(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.FSType != "hugetlbfs" {
		t.Errorf("mount at %s: %+v, want hugetlbfs", dir, m)
	}
	if ps, _ := m.SuperOption("pagesize"); ps != "2M" {
		t.Errorf("hugetlbfs pagesize=%q, want 2M", ps)
	}

	const kubeletErr = "can't be used if container requests multiple huge page sizes"
	// The failure is the mount's, so it is on the page (the pod's reason
	// and its volume's) rather than among /debug/dsw's resolution errors.
	e2eutil.PollErr(t, settleTimeout, "the mixed pod's error on the page", func() error {
		raw, err := a.GetRaw("/debug/status")
		if err != nil {
			return err
		}
		var page struct {
			Pods []struct {
				Name, State, Reason string
				Volumes             []struct{ Name, State, Reason string }
			}
		}
		if err := json.Unmarshal([]byte(raw), &page); err != nil {
			return err
		}
		for _, p := range page.Pods {
			if p.Name == "huge" && p.State != "ready" {
				return fmt.Errorf("pod huge: %s, %q; want ready", p.State, p.Reason)
			}
			if p.Name != "mixed" {
				continue
			}
			if p.State == "ready" || !strings.Contains(p.Reason, kubeletErr) {
				return fmt.Errorf("pod mixed: %s, %q; want the kubelet's error", p.State, p.Reason)
			}
			for _, v := range p.Volumes {
				if v.Name == "pages" && strings.Contains(v.Reason, kubeletErr) {
					return nil
				}
			}
			return fmt.Errorf("pod mixed's volumes: %+v", p.Volumes)
		}
		return fmt.Errorf("pods huge and mixed not both on the page: %+v", page.Pods)
	})
	evs, err := a.Events()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Events {
		if e.Object.Name == "mixed" && e.Type == "Warning" && e.Reason == "FailedMount" && strings.Contains(e.Message, kubeletErr) {
			found = true
		}
	}
	if !found {
		t.Errorf("no warning event for pod mixed: %+v", evs.Events)
	}
	if html, err := a.GetRaw("/pods/default/mixed"); err != nil || !strings.Contains(html, "multiple huge page sizes") {
		t.Errorf("the pod's page does not show the error (%v)", err)
	}
	// The neighbour: its volume and its other pod are unaffected.
	d, err := a.DSW()
	if err != nil {
		t.Fatal(err)
	}
	if p := d.Pod("default", "huge"); p == nil || !p.VolumesReady || len(p.Errors) != 0 {
		t.Errorf("pod huge beside the failing one: %+v", p)
	}
	if _, err := mountAt(t, a.volumeDir(d.Pod("default", "mixed").UID, e2eutil.EmptyDirPlugin, "scratch")); err != nil {
		t.Errorf("the mixed pod's other volume: %v", err)
	}

	a.Remove("huge.yaml")
	a.Remove("mixed.yaml")
	e2eutil.PollErr(t, settleTimeout, "nothing mounted once the pods are gone", func() error {
		return noMountsUnder(t, a.Root())
	})
}
