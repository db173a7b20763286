package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

// The usage of a pod's emptyDirs is measured (a walk for the disk one,
// statfs for the Memory one) and appears in /metrics and on the page; a
// pod that writes past its sizeLimit and its ephemeral-storage limit gets
// the events and the warnings, and stays ready. The sizeLimit is not
// enforced here (--empty-dir-size-limit=off), so that the pod can write past
// it: TestEmptyDirUsageOfAnImage has it enforced.
func TestEmptyDirUsage(t *testing.T) {
	t.Parallel()
	a := newAgent(t, func(args *[]string) {
		*args = append(*args, "--volume-usage-period", "200ms", "--empty-dir-size-limit", "off")
	})
	hog := newPod("hog", e2eutil.EmptyDirVolume("data", "", "1Mi"), e2eutil.EmptyDirVolume("more", "", ""),
		e2eutil.EmptyDirVolume("mem", corev1.StorageMediumMemory, "8Mi"))
	hog.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("4Mi")}
	calm := newPod("calm", e2eutil.EmptyDirVolume("data", "", "1Mi"))
	a.Write("hog.yaml", hog)
	a.Write("calm.yaml", calm)
	a.Start()
	uids := a.waitReady("hog", "calm")
	write := func(vol, name string, size int) {
		p := filepath.Join(a.volumeDir(uids["hog"], e2eutil.EmptyDirPlugin, vol), name)
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("data", "blob", 2<<20)
	write("more", "blob", 3<<20)
	write("mem", "blob", 1<<20)

	series := func(name, pod, vol string) string {
		return fmt.Sprintf(`%s{namespace="default",pod=%q,volume=%q}`, name, pod, vol)
	}
	e2eutil.PollErr(t, settleTimeout, "usage in /metrics", func() error {
		ms, err := a.Metrics()
		if err != nil {
			return err
		}
		for _, c := range []struct {
			series string
			min    float64
		}{
			{series("volume_agent_volume_used_bytes", "hog", "data"), 2 << 20},
			{series("volume_agent_volume_used_bytes", "hog", "more"), 3 << 20},
			{series("volume_agent_volume_used_bytes", "hog", "mem"), 1 << 20},
			{series("volume_agent_volume_inodes_used", "hog", "data"), 2},
			{series("volume_agent_volume_size_limit_bytes", "hog", "data"), 1 << 20},
			{`volume_agent_pod_local_storage_over_limit{namespace="default",pod="hog",reason="EmptyDirOverLimit",volume="data"}`, 1},
			{`volume_agent_pod_local_storage_over_limit{namespace="default",pod="hog",reason="EphemeralStorageOverLimit",volume=""}`, 1},
		} {
			if v, ok := ms[c.series]; !ok || v < c.min {
				return fmt.Errorf("%s = %v (present %v), want at least %v", c.series, v, ok, c.min)
			}
		}
		if v, ok := ms[series("volume_agent_volume_used_bytes", "calm", "data")]; !ok || v >= 1<<20 {
			return fmt.Errorf("calm's usage %v (present %v)", v, ok)
		}
		for s := range ms {
			if strings.HasPrefix(s, "volume_agent_pod_local_storage_over_limit") && strings.Contains(s, `pod="calm"`) {
				return fmt.Errorf("calm is over a limit: %s", s)
			}
		}
		return nil
	})

	e2eutil.PollErr(t, settleTimeout, "the over-limit events", func() error {
		evs, err := a.Events()
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, e := range evs.Events {
			if e.Object.Name == "hog" && e.Type == "Warning" {
				got[e.Reason] = e.Message
			}
			if e.Object.Name == "calm" && strings.Contains(e.Reason, "OverLimit") {
				return fmt.Errorf("calm got %s: %s", e.Reason, e.Message)
			}
		}
		if !strings.Contains(got["EmptyDirOverLimit"], `Usage of EmptyDir volume "data" exceeds the limit "1Mi".`) ||
			!strings.Contains(got["EphemeralStorageOverLimit"], "exceeds the total limit of containers 4Mi") {
			return fmt.Errorf("hog's warnings: %v", got)
		}
		return nil
	})

	// The runtime API passes the warnings on, the pod still ready.
	e2eutil.PollErr(t, settleTimeout, "the warnings in the runtime API", func() error {
		p, err := a.RuntimeClient().Pod(t.Context(), uids["hog"])
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, w := range p.Warnings {
			got[w.Reason] = w.Volume
		}
		if !p.Ready || len(got) != 2 || got["EmptyDirOverLimit"] != "data" || got["EphemeralStorageOverLimit"] != "" {
			return fmt.Errorf("hog: ready %v, warnings %+v; want ready with both", p.Ready, p.Warnings)
		}
		if calm, err := a.RuntimeClient().Pod(t.Context(), uids["calm"]); err != nil || len(calm.Warnings) > 0 {
			return fmt.Errorf("calm's warnings: %+v (%v)", calm, err)
		}
		return nil
	})

	// The page: hog is ready, its reason says it is over its limit, and
	// each volume shows what it uses.
	e2eutil.PollErr(t, settleTimeout, "the page to show the usage", func() error {
		raw, err := a.GetRaw("/debug/status")
		if err != nil {
			return err
		}
		var page struct {
			Pods []struct {
				Name, State, Reason string
				Volumes             []struct {
					Name  string
					Usage *struct{ UsedBytes, LimitBytes int64 }
				}
			}
		}
		if err := json.Unmarshal([]byte(raw), &page); err != nil {
			return err
		}
		for _, p := range page.Pods {
			if p.Name != "hog" {
				continue
			}
			if p.State != "ready" || !strings.HasPrefix(p.Reason, "EmptyDirOverLimit") && !strings.HasPrefix(p.Reason, "EphemeralStorageOverLimit") {
				return fmt.Errorf("hog: %s, %q; want ready, over its limit", p.State, p.Reason)
			}
			for _, v := range p.Volumes {
				if v.Name == "data" && (v.Usage == nil || v.Usage.UsedBytes < 2<<20 || v.Usage.LimitBytes != 1<<20) {
					return fmt.Errorf("hog's data: usage %+v", v.Usage)
				}
			}
			html, err := a.GetRaw("/pods/default/hog")
			if err != nil {
				return err
			}
			if !strings.Contains(html, "of 1Mi used") {
				return fmt.Errorf("the pod's page does not show data's usage of its limit")
			}
			return nil
		}
		return fmt.Errorf("hog not on the page")
	})
}

// With the sizeLimit enforced by a filesystem image, the image's usage is
// read from it (a statfs, not a walk), the volume without a limit is still
// walked, and a write past the limit fails instead of being reported.
func TestEmptyDirUsageOfAnImage(t *testing.T) {
	t.Parallel()
	a := newAgent(t, func(args *[]string) { *args = append(*args, "--volume-usage-period", "200ms") })
	pod := newPod("imaged", e2eutil.EmptyDirVolume("data", "", "4Mi"), e2eutil.EmptyDirVolume("more", "", ""))
	a.Write("imaged.yaml", pod)
	a.Start()
	uid := a.waitReady("imaged")["imaged"]
	dir := func(vol string) string { return a.volumeDir(uid, e2eutil.EmptyDirPlugin, vol) }
	if err := os.WriteFile(filepath.Join(dir("data"), "blob"), make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir("data"), "past-the-limit"), make([]byte, 2<<20), 0o644); err == nil {
		t.Fatal("writing 5Mi into an emptyDir with sizeLimit 4Mi succeeded")
	}
	if err := os.WriteFile(filepath.Join(dir("more"), "blob"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	e2eutil.PollErr(t, settleTimeout, "the usage of both volumes, each by its method", func() error {
		raw, err := a.GetRaw("/debug/status")
		if err != nil {
			return err
		}
		var page struct {
			Pods []struct {
				Name    string
				Volumes []struct {
					Name  string
					Usage *struct {
						UsedBytes int64
						Method    string
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(raw), &page); err != nil {
			return err
		}
		want := map[string]string{"data": "source", "more": "walk"}
		for _, p := range page.Pods {
			for _, v := range p.Volumes {
				if p.Name != "imaged" || want[v.Name] == "" {
					continue
				}
				if v.Usage == nil || v.Usage.Method != want[v.Name] || v.Usage.UsedBytes < 1<<20 {
					return fmt.Errorf("%s: usage %+v, want at least 1Mi measured by %s", v.Name, v.Usage, want[v.Name])
				}
				delete(want, v.Name)
			}
		}
		if len(want) > 0 {
			return fmt.Errorf("not on the page: %v", want)
		}
		return nil
	})
}
