package emptydir

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The page size is the kubelet's choice, with its errors.
func TestPageSize(t *testing.T) {
	for _, tc := range []struct {
		medium v1.StorageMedium
		sizes  string
		want   string
		err    string
	}{
		{medium: "HugePages", sizes: "2Mi", want: "2Mi"},
		{medium: "HugePages", sizes: "1Gi", want: "1Gi"},
		{medium: "HugePages", sizes: "2Mi,2048Ki", want: "2Mi"},
		{medium: "HugePages", sizes: "2Mi,1Gi", err: "medium: HugePages can't be used if container requests multiple huge page sizes"},
		{medium: "HugePages", sizes: "", err: "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"},
		{medium: "HugePages-2Mi", sizes: "1Gi,2Mi", want: "2Mi"},
		{medium: "HugePages-1Gi", sizes: "1Gi,2Mi", want: "1Gi"},
		{medium: "HugePages-1Gi", sizes: "2Mi", err: "medium HugePages-1Gi: hugePages storage requested, but there is no resource request for huge pages"},
		{medium: "HugePages-x", sizes: "2Mi", err: `emptyDir medium "HugePages-x": page size "x"`},
		{medium: "HugePages", sizes: "junk", err: "resource name hugepages-junk is an invalid hugepage name"},
	} {
		got, err := pageSize(tc.medium, tc.sizes)
		if tc.err != "" {
			if err == nil || err.Error()[:min(len(err.Error()), len(tc.err))] != tc.err {
				t.Errorf("%s %q: %v, want error %q", tc.medium, tc.sizes, err, tc.err)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("%s %q: %v %v, want %s", tc.medium, tc.sizes, got.String(), err, tc.want)
		}
	}
}

func TestMountedPageSize(t *testing.T) {
	for opts, want := range map[string]int64{
		"rw,pagesize=2M":          2 << 20,
		"rw,pagesize=1024M":       1 << 30,
		"rw,pagesize=1G,size=8M":  1 << 30,
		"pagesize=64K":            64 << 10,
		"rw,size=1M":              0,
		"rw,pagesize=":            0,
		"rw,pagesize=2Mi-garbage": 0,
	} {
		got, ok := mountedPageSize(opts)
		if got != want || ok != (want != 0) {
			t.Errorf("%q: %d %v, want %d", opts, got, ok, want)
		}
	}
}
